#!/usr/bin/env python3
"""Where the device idles inside a model call, from an `atelier bench|generate --trace FILE` trace.

Takes the last call of the given name (default: unet) on the device track, its kernels (and the queue's copies and
memsets, which CUPTI reports beside them), and prints: the kernels, their summed time and span; the idle time
between consecutive ones; how much of it sits next to a memset; the kernel pairs whose gaps add up to the most; and
the eager kernels in the window (the step boundary's work, outside the recording) with the gaps next to them.
Session 47 found the replayed step's memset nodes this way (docs/cuda.md).

  /usr/bin/python3 scripts/trace_gaps.py TRACE.json [--call unet] [--top 12]
"""
import argparse
import collections
import json
import re
import statistics
import sys

MEMSET = "[memset]"


def short(name):
    """A kernel's name without its parameter list (the last bracketed group), return type and our namespaces."""
    name = re.sub(r"^void ", "", name).replace("atelier::cuda::(anonymous namespace)::", "").replace("atelier::", "")
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return name[:60]


def device_events(events, category):
    return sorted((e for e in events if e.get("cat") == category and e.get("ph") == "X"), key=lambda e: e["ts"])


def last_call_kernels(events, call_name):
    """The last call named `call_name` on the device track and the kernels inside it, or raises ValueError."""
    calls = [e for e in events if e.get("cat") == "call" and e.get("name") == call_name and e.get("pid") == 2]
    if not calls:
        raise ValueError(f"no '{call_name}' call on the device track (pid 2); is the trace from --trace?")
    call = max(calls, key=lambda e: e["ts"])
    kernels = device_events(events, "kernel")
    mine = [k for k in kernels if call["ts"] <= k["ts"] < call["ts"] + call["dur"]]
    if not mine:
        raise ValueError(f"the last '{call_name}' call holds no kernels")
    return call, mine


def matching(events, call_name, pattern):
    """Lines for the last call's kernels whose short names match `pattern`: launches, median/min/max us, sum."""
    _, mine = last_call_kernels(events, call_name)
    regex = re.compile(pattern, re.IGNORECASE)
    groups = collections.defaultdict(list)
    for k in mine:
        if regex.search(short(k["name"])):
            groups[short(k["name"])].append(k["dur"])
    lines = [f"kernels matching '{pattern}': {sum(len(d) for d in groups.values())} launches, "
             f"{sum(sum(d) for d in groups.values()) / 1e3:.3f} ms",
             "  count  median us  min us  max us  sum us  kernel"]
    for name, durs in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {len(durs):5d} {statistics.median(durs):10.2f} {min(durs):7.2f} {max(durs):7.2f} {sum(durs):7.1f}  {name}")
    return lines


def analyse(events, call_name, top):
    """The report's lines for the last call named `call_name` (device track), or raises ValueError."""
    call, mine = last_call_kernels(events, call_name)
    busy = sum(k["dur"] for k in mine)
    span = mine[-1]["ts"] + mine[-1]["dur"] - mine[0]["ts"]
    gaps, next_to_memset = 0.0, 0.0
    pairs = collections.defaultdict(lambda: [0, 0.0])
    for a, b in zip(mine, mine[1:]):
        gap = max(0.0, b["ts"] - (a["ts"] + a["dur"]))
        gaps += gap
        if MEMSET in (a["name"], b["name"]):
            next_to_memset += gap
        pair = pairs[(short(a["name"]), short(b["name"]))]
        pair[0] += 1
        pair[1] += gap
    memsets = sum(1 for k in mine if k["name"] == MEMSET)
    lines = [
        f"call              '{call_name}' at {call['ts']:.0f} us: {len(mine)} kernels and copies, {busy / 1e3:.3f} ms of their time "
        f"in a {span / 1e3:.3f} ms span",
        f"gaps              {gaps / 1e3:.3f} ms between consecutive ones; {next_to_memset / 1e3:.3f} ms next to the {memsets} memsets",
        "  gaps us  count  mean us  before -> after",
    ]
    for (a, b), (count, total) in sorted(pairs.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"  {total:7.1f} {count:6d} {total / count:8.2f}  {a} -> {b}")
    # Eager work inside the window (kernels without a recording's "graph" mark: a step boundary's sampler update,
    # input copies and the like, where the calls overlap on the device track) and the gaps next to it.
    eager = [k for k in mine if k["name"] != MEMSET and "graph" not in k.get("args", {})]
    if eager and len(eager) < len(mine):
        near = sum(max(0.0, b["ts"] - (a["ts"] + a["dur"])) for a, b in zip(mine, mine[1:])
                   if a in eager or b in eager)
        lines.append(f"eager             {len(eager)} kernels outside the recording ({sum(k['dur'] for k in eager) / 1e3:.3f} ms), "
                     f"{near / 1e3:.3f} ms of gaps next to them: the step boundary")
    return lines


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--call", default="unet", help="the call range to look at (default: unet)")
    parser.add_argument("--top", type=int, default=12, help="kernel pairs to list (default: 12)")
    parser.add_argument("--kernels", metavar="REGEX", help="also list the call's kernels whose names match, by name")
    args = parser.parse_args(argv)
    try:
        with open(args.trace, encoding="utf-8") as f:
            data = json.load(f)
        events = data["traceEvents"] if isinstance(data, dict) else data
        print("\n".join(analyse(events, args.call, args.top)))
        if args.kernels:
            print("\n".join(matching(events, args.call, args.kernels)))
    except (OSError, ValueError, KeyError, re.error) as e:
        print(f"trace_gaps: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
