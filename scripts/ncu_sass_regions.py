#!/usr/bin/env python3
"""Where one kernel's warps wait, by stretch of its code, from Nsight Compute's source page.

Reads `ncu -i REPORT.ncu-rep --page source --csv --print-source sass > K.csv` (a report taken with
`--section SourceCounters --section WarpStateStats`), and prints:
  - the stall reasons over the whole kernel (share of the warp samples);
  - the kernel cut into regions at every instruction matching --cut (by default the block barriers, the mbarrier
    waits, the wgmma waits and the exits): each region's share of the samples, its executed warp instructions, its
    top stall reasons and its first and last instructions, so the phases of a kernel (staging, statistics, merge,
    apply; a GEMM's mainloop and epilogue) can be told apart without reading thousands of lines;
  - the instructions with the most samples.
Sessions 55-56 read the grid group norm and the GEGLU product this way (docs/performance.md, "Session 56").

  /usr/bin/python3 scripts/ncu_sass_regions.py K.csv [--cut REGEX] [--top 20] [--min-share 1.0]
"""
import argparse
import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
DEFAULT_CUT = r"BAR\.SYNC|SYNCS\.PHASECHK|WARPGROUP\.DEPBAR|DEPBAR\.LE|EXIT"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read(lines):
    """(kernel name, [instruction dicts]) from the CSV's lines: a kernel-name row, the header row, then one row per
    instruction. Raises ValueError where the columns the summary needs are missing."""
    rows = list(csv.reader(lines))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        raise ValueError("no 'Address' header row: not an ncu --page source --csv file")
    header = rows[start]
    for column in ("Source", SAMPLES, EXECUTED):
        if column not in header:
            raise ValueError(f"column '{column}' missing: take the report with --section SourceCounters")
    name = rows[start - 1][1] if start > 0 and len(rows[start - 1]) > 1 else "?"
    stalls = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    instructions = []
    for r in rows[start + 1:]:
        if len(r) != len(header):
            continue
        d = dict(zip(header, r))
        instructions.append({"source": d["Source"].strip(), "samples": number(d[SAMPLES]),
                             "executed": number(d[EXECUTED]),
                             "stalls": {s[len("stall_"):]: number(d[s]) for s in stalls}})
    return name, instructions


def regions(instructions, cut):
    """[(first index, last index)] cut after every instruction whose source matches `cut`."""
    pattern, out, first = re.compile(cut), [], 0
    for i, ins in enumerate(instructions):
        if pattern.search(ins["source"]):
            out.append((first, i))
            first = i + 1
    if first < len(instructions):
        out.append((first, len(instructions) - 1))
    return out


def top_stalls(instructions, n=3):
    total = collections.Counter()
    for ins in instructions:
        total.update(ins["stalls"])
    return [(k, v) for k, v in total.most_common(n) if v > 0]


def report(name, instructions, cut, top, min_share):
    all_samples = sum(i["samples"] for i in instructions) or 1.0
    lines = [f"kernel  {name[:110]}", f"samples {all_samples:.0f} over {len(instructions)} instructions"]
    lines.append("stalls  " + ", ".join(f"{k} {100 * v / all_samples:.1f}%" for k, v in top_stalls(instructions, 8)))
    lines.append(f"regions (cut after /{cut}/; those under {min_share}% of the samples left out)")
    for first, last in regions(instructions, cut):
        part = instructions[first:last + 1]
        share = 100 * sum(i["samples"] for i in part) / all_samples
        if share < min_share:
            continue
        executed = sum(i["executed"] for i in part)
        stalls = ", ".join(f"{k} {v:.0f}" for k, v in top_stalls(part))
        lines.append(f"  [{first:5d}-{last:5d}] {share:5.1f}%  {executed:12.0f} instr  {stalls}")
        lines.append(f"      {part[0]['source'][:60]}  ..  {part[-1]['source'][:60]}")
    lines.append(f"top {top} instructions by samples")
    ranked = sorted(range(len(instructions)), key=lambda i: -instructions[i]["samples"])[:top]
    for i in ranked:
        ins = instructions[i]
        stalls = ", ".join(f"{k} {v:.0f}" for k, v in top_stalls([ins], 2))
        lines.append(f"  {i:5d} {100 * ins['samples'] / all_samples:5.1f}%  {ins['source'][:56]:56s}  x{ins['executed']:.0f}  {stalls}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--cut", default=DEFAULT_CUT, help="regex: a region ends after each matching instruction")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--min-share", type=float, default=1.0, help="regions under this %% of the samples are left out")
    args = parser.parse_args()
    try:
        with open(args.csv, newline="") as f:
            name, instructions = read(f)
    except (OSError, ValueError) as e:
        print(f"ncu_sass_regions: {e}", file=sys.stderr)
        return 1
    print("\n".join(report(name, instructions, args.cut, args.top, args.min_share)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
