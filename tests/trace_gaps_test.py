#!/usr/bin/env python3
"""scripts/trace_gaps.py on a trace built here: a recorded call of four kernels (one gap of 2 us, one of 6 us after
a memset) preceded by two eager kernels 5 us apart, and an earlier call it must not look at; then the errors for a
trace without the call. Exits 1 with the differences, 0 when all hold (ctest: scripts.trace_gaps)."""
import importlib.util
import json
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("trace_gaps", ROOT / "scripts" / "trace_gaps.py")
trace_gaps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(trace_gaps)


def kernel(name, ts, dur, graph=True):
    e = {"cat": "kernel", "ph": "X", "pid": 2, "tid": 15, "name": name, "ts": ts, "dur": dur, "args": {}}
    if graph:
        e["args"]["graph"] = 2
    return e


def call(ts, dur):
    return {"cat": "call", "ph": "X", "pid": 2, "tid": 1, "name": "unet", "ts": ts, "dur": dur}


EVENTS = [
    call(0, 50), kernel("void old_kernel<int>(int)", 10, 20),
    call(1000, 200),
    kernel("lincomb_kernel<float>", 1000, 2, graph=False), kernel("copy_segments_kernel", 1007, 2, graph=False),
    kernel("void atelier::cuda::(anonymous namespace)::conv<(atelier::cuda::(anonymous namespace)::Epi)2, 1>(Params)", 1010, 40),
    kernel("[memset]", 1052, 1),
    kernel("cudnn_sdpa_kernel", 1059, 30),
    kernel("void norm_kernel<float>(float const*)", 1089, 10),
]

failures = []


def check(what, ok):
    if not ok:
        failures.append(what)


lines = trace_gaps.analyse(EVENTS, "unet", 5)
text = "\n".join(lines)
check("six kernels and copies, 85 us of their time in a 99 us span",
      "6 kernels and copies, 0.085 ms of their time in a 0.099 ms span" in lines[0])
check("gaps 5 + 1 + 2 + 6 = 14 us, 8 of them next to the one memset",
      "0.014 ms between consecutive ones; 0.008 ms next to the 1 memsets" in lines[1])
check("the largest pair first: memset -> cudnn_sdpa_kernel, 6 us", "6.0      1     6.00  [memset] -> cudnn_sdpa_kernel" in lines[3])
check("names without parameters or namespaces, template arguments kept",
      "conv<(Epi)2, 1> -> [memset]" in text and "(Params)" not in text)
check("the earlier call's kernel left out", "old_kernel" not in text)
check("the eager kernels and the 6 us of gaps next to them (5 between them, 1 before the recording)",
      "2 kernels outside the recording (0.004 ms), 0.006 ms of gaps next to them" in text)
found = trace_gaps.matching(EVENTS, "unet", "SDPA|norm")
check("two kernels match, 40 us", "2 launches, 0.040 ms" in found[0])
check("by name, the largest sum first, without parameters",
      len(found) == 4 and found[2].split()[:5] == ["1", "30.00", "30.00", "30.00", "30.0"] and found[2].endswith("cudnn_sdpa_kernel")
      and found[3].endswith("norm_kernel<float>"))
check("the earlier call's kernels and the other names left out", not any("old_kernel" in l or "conv" in l for l in found))
try:
    trace_gaps.analyse(EVENTS, "vae", 5)
    check("a missing call raises", False)
except ValueError as e:
    check("a missing call names it", "'vae'" in str(e))

with tempfile.TemporaryDirectory() as d:
    path = pathlib.Path(d) / "trace.json"
    path.write_text(json.dumps({"traceEvents": EVENTS}))
    check("the command line runs and exits 0", trace_gaps.main([str(path), "--top", "2"]) == 0)
    check("with --kernels too", trace_gaps.main([str(path), "--kernels", "sdpa"]) == 0)
    check("a bad pattern exits 1", trace_gaps.main([str(path), "--kernels", "("]) == 1)
    check("a missing file exits 1", trace_gaps.main([str(path) + ".missing"]) == 1)

if failures:
    print("trace_gaps_test: failed:\n  " + "\n  ".join(failures) + "\noutput was:\n" + text)
    sys.exit(1)
print("trace_gaps_test: all checks passed\n" + text)
