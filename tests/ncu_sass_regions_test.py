#!/usr/bin/env python3
"""scripts/ncu_sass_regions.py on a source page built here: six instructions in three regions (a load loop ending at
a barrier, a wgmma wait, an exit) with known samples and stall reasons; then a file without the sampling column and
one that is not a source page at all. Exits 1 with the differences, 0 when all hold (ctest: scripts.ncu_sass_regions)."""
import importlib.util
import io
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("ncu_sass_regions", ROOT / "scripts" / "ncu_sass_regions.py")
regions_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(regions_mod)

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_long_sb",
          "stall_barrier", "stall_wait", "stall_long_sb (Not Issued)"]
ROWS = [  # source, samples, executed, long_sb, barrier, wait
    ("LDG.E R2, [R4.64]", "10", "1,000", "2", "0", "8"),
    ("FADD R3, R2, R1", "30", "1,000", "30", "0", "0"),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", "20", "100", "0", "20", "0"),
    ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24", "5", "200", "0", "0", "5"),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x0", "15", "200", "0", "15", "0"),
    ("EXIT", "20", "100", "0", "0", "20"),
]


def page(header, rows):
    out = io.StringIO()
    out.write('"Kernel Name","void k<int>(int)",\n')
    out.write(",".join(f'"{h}"' for h in header) + "\n")
    for i, r in enumerate(rows):
        out.write(",".join(f'"{v}"' for v in (f"0x{i:04x}",) + r + ("0",)) + "\n")
    out.seek(0)
    return out


failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")


name, instructions = regions_mod.read(page(HEADER, ROWS))
check("kernel name", name, "void k<int>(int)")
check("instructions", len(instructions), 6)
check("executed parsed with thousands separators", instructions[0]["executed"], 1000.0)
check("stall columns without the not-issued ones", sorted(instructions[0]["stalls"]), ["barrier", "long_sb", "wait"])
check("regions", regions_mod.regions(instructions, regions_mod.DEFAULT_CUT), [(0, 2), (3, 4), (5, 5)])
check("top stalls", regions_mod.top_stalls(instructions, 2), [("barrier", 35.0), ("wait", 33.0)])
lines = regions_mod.report(name, instructions, regions_mod.DEFAULT_CUT, 2, 1.0)
text = "\n".join(lines)
check("first region's share and instructions", "[    0-    2]  60.0%          2100 instr" in text, True)
check("second region", "[    3-    4]  20.0%" in text, True)
check("top instruction first", lines[-2].split()[:2], ["1", "30.0%"])
# A region under --min-share is left out.
check("min share", "[    5-    5]" in "\n".join(regions_mod.report(name, instructions, regions_mod.DEFAULT_CUT, 2, 25.0)), False)
for header, why in ((HEADER[:2] + HEADER[3:], "Warp Stall Sampling"), (["Kernel", "Time"], "not an ncu")):
    try:
        regions_mod.read(page(header, []))
        failures.append(f"no error for a page without {why}")
    except ValueError as e:
        check(f"error names {why}", why in str(e), True)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("ncu_sass_regions: all checks hold")
