#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum[,...]`) by kernel: calls, total
device time, share, and the mean of any other metric asked for (e.g. dram__throughput.avg.pct_of_peak_sustained_elapsed).

One UNet call's kernels, in a replayed-free eager run (docs/performance.md, "How the figures are measured"):
  ATELIER_GRAPHS=0 ATELIER_CUDA_PROFILE_RANGE=unet:1 ncu --profile-from-start off --clock-control none \\
      --cache-control none --csv --metrics gpu__time_duration.sum atelier bench --device cuda --config sd15 \\
      --steps 1 --warmup 1 --trace /tmp/t.json > k.csv
  python3 bench/ncu_summary.py k.csv [--top 40] [--group-by short|full]
(the trace flag turns the range timer on; ATELIER_CUDA_PROFILE_RANGE=NAME:SKIP picks the range.)
"""
import argparse
import collections
import csv
import re
import sys


def short_name(name):
    """Kernel name without template arguments and parameters: 'group_apply_nhwc_kernel'."""
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*$", "", name)
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).replace("void ", "").strip().split("::")[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--group-by", choices=["short", "full"], default="short")
    a = ap.parse_args()
    lines = [l for l in open(a.csv, errors="replace") if l.startswith('"')]
    kernels = collections.OrderedDict()  # ID -> {name, metrics}
    for row in csv.DictReader(lines):
        k = kernels.setdefault(row["ID"], {"name": row["Kernel Name"], "m": {}})
        try:
            k["m"][row["Metric Name"]] = (float(row["Metric Value"].replace(",", "")), row["Metric Unit"])
        except ValueError:
            pass
    if not kernels:
        sys.exit("no kernels in " + a.csv)
    agg = collections.defaultdict(lambda: {"calls": 0, "ns": 0.0, "other": collections.defaultdict(list)})
    total = 0.0
    for k in kernels.values():
        t, unit = k["m"].get("gpu__time_duration.sum", (0.0, "ns"))
        ns = t * {"ns": 1, "nsecond": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(unit, 1)
        key = short_name(k["name"]) if a.group_by == "short" else k["name"]
        g = agg[key]
        g["calls"] += 1
        g["ns"] += ns
        total += ns
        for name, (v, _) in k["m"].items():
            if name != "gpu__time_duration.sum":
                g["other"][name].append(v)
    print(f"{len(kernels)} kernels, {total / 1e6:.3f} ms of device time")
    for key, g in sorted(agg.items(), key=lambda kv: -kv[1]["ns"])[: a.top]:
        extra = " ".join(f"{n.split('.')[0]}={sum(v) / len(v):.1f}" for n, v in g["other"].items())
        print(f"{g['ns'] / 1e6:9.3f} ms {100 * g['ns'] / total:5.1f}% {g['calls']:5d}x  {key[:110]}  {extra}")


if __name__ == "__main__":
    main()
