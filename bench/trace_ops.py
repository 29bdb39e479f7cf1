#!/usr/bin/env python3
"""Where one model call spends its device time, from an `atelier generate|bench --trace FILE` trace.

  python3 bench/trace_ops.py TRACE [--call unet|transformer] [--top 25] [--shapes OP]

Takes the last range named CALL that has device times (pid 2: CUDA-event spans), sums the device time of the op
ranges inside it by op name, and adds each op's FLOPs (from the host ranges of the same call, pid 1) so that
every line shows its achieved TFLOP/s. --shapes OP lists that op's calls by operand shapes instead (the host
ranges' details, each with its device time). Only the standard library: it runs on the GPU
machine as is.
"""
import argparse
import collections
import json
import sys

HOST_PID, DEVICE_PID = 1, 2  # trace.cc: host ranges, device ranges


def last_call(events, pid, name):
    calls = [e for e in events if e.get("pid") == pid and e.get("ph") == "X" and e["name"] == name]
    return calls[-1] if calls else None


def ops_inside(events, pid, call):
    t0, t1 = call["ts"], call["ts"] + call["dur"]
    return [e for e in events if e.get("pid") == pid and e.get("ph") == "X" and e.get("cat") == "op"
            and t0 <= e["ts"] and e["ts"] + e["dur"] <= t1]


def by_shapes(host_ops, op, top):
    """Device time, FLOPs and TFLOP/s of `op`'s calls (those made by model code: depth 0) grouped by the host
    range's detail (operand shapes); each host range carries its device time (args.device_us; on the CPU, where
    there is none, its host duration is the op's time)."""
    by = collections.defaultdict(lambda: [0, 0.0, 0])
    for h in host_ops:
        args = h.get("args", {})
        if h["name"] != op or args.get("depth", 0) != 0:
            continue
        key = args.get("detail", "")
        by[key][0] += 1
        by[key][1] += float(args.get("device_us", h["dur"]))
        by[key][2] += int(args.get("flops", 0))
    if not by:
        sys.exit(f"no '{op}' ranges in the call")
    total_us = sum(v[1] for v in by.values())
    print(f"{op}: {sum(v[0] for v in by.values())} calls, {total_us / 1e3:.2f} ms of device time")
    for key, (n, us, flops) in sorted(by.items(), key=lambda kv: -kv[1][1])[:top]:
        rate = f"{flops / (us * 1e-6) / 1e12:7.1f} TFLOP/s" if flops and us else ""
        print(f"  {n:4d} x {us / n:8.1f} us = {us / 1e3:8.3f} ms {100 * us / total_us:5.1f}%  {rate}  {key}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--call", default="unet", help="name of the model-call range (unet, transformer)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--shapes", metavar="OP", help="break OP's device time down by operand shapes")
    a = ap.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    dev_call = last_call(events, DEVICE_PID, a.call)
    if not dev_call:
        sys.exit(f"no device-timed '{a.call}' ranges in {a.trace}")
    by = collections.defaultdict(lambda: [0, 0.0, 0])  # calls, device us, flops
    dev_ops = ops_inside(events, DEVICE_PID, dev_call)
    for e in dev_ops:
        by[e["name"]][0] += 1
        by[e["name"]][1] += e["dur"]
    host_call = last_call(events, HOST_PID, a.call)
    if a.shapes:
        return by_shapes(ops_inside(events, HOST_PID, host_call) if host_call else [], a.shapes, a.top)
    if host_call:
        for e in ops_inside(events, HOST_PID, host_call):
            if e["name"] in by:
                by[e["name"]][2] += int(e.get("args", {}).get("flops", 0))
    total_us = sum(v[1] for v in by.values())
    print(f"last '{a.call}' call: {dev_call['dur'] / 1e3:.2f} ms device span, {len(dev_ops)} op ranges, "
          f"sum of op device time {total_us / 1e3:.2f} ms")
    for name, (n, us, flops) in sorted(by.items(), key=lambda kv: -kv[1][1])[:a.top]:
        rate = f"{flops / (us * 1e-6) / 1e12:7.1f} TFLOP/s" if flops and us else ""
        print(f"  {name:28s} {n:5d} calls {us / 1e3:9.3f} ms {100 * us / total_us:5.1f}%  {rate}")


if __name__ == "__main__":
    main()
