#!/usr/bin/env python3
"""Server throughput on a GPU: `atelier serve` with the built-in full-size SD 1.5 (random weights, the real
CLIP tokenizer) answering N concurrent 512x512 requests, against the same requests one at a time.

Standard library only (it runs on the GPU machine's python3). Prints a JSON report:
  sequential_s_per_image  requests sent one after the other (each waits for the previous result)
  concurrent_s_per_image  N requests submitted at once (the scheduler batches them step by step)
  speedup                 sequential / concurrent time per image
  nvml_util_pct           nvidia-smi utilisation samples during the concurrent phase
  engine_busy             per worker: seconds inside model calls / wall time of the concurrent phase
  worker_timeline         per worker, concurrent phase: idle seconds before its first busy span (ramp-up),
                          between spans and after its last (tail), and the samples of each model call
  worker_busy             per worker, concurrent phase: seconds and counts of admissions (text encoding),
                          model calls and VAE decodes, prompt cache hits and misses
  sequential_stages_s     the one-at-a-time phase per request, from the server's own histograms: queue wait,
                          each stage (text encoding, model calls, VAE decode, image encoding) and the server's
                          end-to-end latency; the client's time per image less that latency is the transport
                          (HTTP, server-sent events, base64)
  concurrent_stages_s     the same sums over the concurrent phase divided by its images: a device stage's share
                          is its wall time per image; image encoding (a host pool beside the device), queue
                          waits and latencies overlap, so they are means per request, not shares of the wall

Every request has its own prompt (a shared negative prompt, as clients send), so the server's prompt cache
saves the negative prompt's encoding and nothing else.

  python3 bench/serve_gpu_bench.py --atelier build/atelier --tokenizer DIR [--devices 0] [--concurrent 64]
"""
import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.request


def call(base, method, path, body=None, timeout=600):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


POLL_S = 0.0  # > 0: clients poll their job this often (--poll-ms) instead of reading its events


def with_seed(body, seed):
    """The request with its own seed and its own prompt (the seed names the study)."""
    return dict(body, seed=seed, prompt=body["prompt"].rsplit(" ", 1)[0] + f" {seed}")


def run_job(base, body):
    """Submits a job and waits for its end: on its server-sent events (what a client of the native API does;
    one blocked read per job), or by polling GET /v1/jobs/{id} every --poll-ms when that is set."""
    job = call(base, "POST", "/v1/jobs", body)
    if POLL_S > 0:
        while True:
            j = call(base, "GET", f"/v1/jobs/{job['id']}?images=0")
            if j["state"] in ("done", "failed", "cancelled"):
                if j["state"] != "done":
                    raise RuntimeError(f"job {job['id']} {j['state']}: {j.get('error')}")
                return j
            time.sleep(POLL_S)
    with urllib.request.urlopen(base + f"/v1/jobs/{job['id']}/events", timeout=600) as r:
        event = ""
        for raw in r:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event in ("done", "failed", "cancelled"):
                if event != "done":
                    raise RuntimeError(f"job {job['id']} {event}: {line[5:].strip()}")
                return json.loads(line[5:])
    raise RuntimeError(f"job {job['id']}: the event stream ended before the job did")


def histogram_sums(stats):
    """{series name: (sum, count)} of every histogram of seconds in /v1/stats, a stage's series named by its label."""
    out = {}
    for name, fam in stats.get("metrics", {}).items():
        for ser in fam.get("series", []):
            if "sum" not in ser or not name.endswith("_seconds"):
                continue
            label = ",".join(f"{v}" for v in ser.get("labels", {}).values())
            key = name.replace("atelier_", "") + (f"{{{label}}}" if label else "")
            out[key] = (ser["sum"], ser["count"])
    return out


def per_request(before, after, n):
    """Seconds per request of each histogram over a phase of n requests (those that moved)."""
    b, a = histogram_sums(before), histogram_sums(after)
    return {k: round((s - b.get(k, (0, 0))[0]) / n, 4) for k, (s, c) in sorted(a.items()) if c != b.get(k, (0, 0))[1]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--atelier", required=True)
    ap.add_argument("--launcher", default="", help="a command to run the binary through (e.g. .devicepack/run)")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--devices", default="0")
    ap.add_argument("--concurrent", type=int, default=64)
    ap.add_argument("--sequential", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--poll-ms", type=float, default=0, help="poll every N ms instead of reading the job's events")
    ap.add_argument("--stats-out", default="", help="also write the server's /v1/stats after the concurrent phase here")
    ap.add_argument("--server-args", default="", help="more arguments for `atelier serve`, e.g. \"--host-threads 1\"")
    a = ap.parse_args()
    global POLL_S
    POLL_S = a.poll_ms / 1000

    server = subprocess.Popen(a.launcher.split() + [a.atelier, "serve", "--model", "sd15=builtin:sd15", "--tokenizer", a.tokenizer,
                               "--devices", a.devices, "--port", "0", "--max-queue", str(4 * a.concurrent),
                               "--max-batch", str(a.max_batch), "--http-threads", str(2 * a.concurrent + 8)]
                              + a.server_args.split(),
                              stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    try:
        line = server.stdout.readline()
        if "listening on" not in line:
            sys.exit(f"server did not start: {line!r}")
        base = line.split("listening on", 1)[1].strip()
        body = {"prompt": "a lighthouse at dusk, oil painting, study 0", "negative_prompt": "blurry", "width": a.size,
                "height": a.size, "steps": a.steps, "cfg_scale": 7, "sampler": "euler", "seed": 1}
        t = time.time()
        run_job(base, body)  # loads the model on every worker, records the graphs of batch 1
        load_s = time.time() - t
        # Warm the batched shapes of every worker: max_batch concurrent jobs per device (the router spreads
        # them, so each worker sees batches up to max_batch), twice (a graph per batch size is recorded on
        # its second use). Otherwise a second worker tunes and records its shapes inside the timed phase.
        workers = len(a.devices.split(","))
        for rnd in range(2):
            threads = [threading.Thread(target=run_job, args=(base, with_seed(body, 100 + 100 * rnd + i)))
                       for i in range(a.max_batch * workers)]
            for th in threads: th.start()
            for th in threads: th.join()

        seq_stats0 = call(base, "GET", "/v1/stats")
        t = time.time()
        for i in range(a.sequential):  # prompts of their own (the warm-up's are cached): each pays its encoding
            run_job(base, with_seed(body, 500 + i))
        seq = (time.time() - t) / a.sequential
        seq_stages = per_request(seq_stats0, call(base, "GET", "/v1/stats"), a.sequential)

        util = []
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                         capture_output=True, text=True, timeout=5).stdout
                    util.append([float(x) for x in out.split()])
                except Exception:
                    pass
                time.sleep(0.5)

        sampler = threading.Thread(target=sample)
        sampler.start()
        errors = []

        def one(i):
            try:
                run_job(base, with_seed(body, 1000 + i))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(str(e))

        stats0 = call(base, "GET", "/v1/stats")
        workers0 = stats0.get("workers", [])
        clock0 = stats0.get("clock_s", 0.0)
        busy0 = [w.get("busy_seconds", 0) for w in workers0]
        t = time.time()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(a.concurrent)]
        for th in threads: th.start()
        for th in threads: th.join()
        conc_total = time.time() - t
        stats = call(base, "GET", "/v1/stats")
        if a.stats_out:
            with open(a.stats_out, "w") as f:
                json.dump({"clock0_s": clock0, "stats": stats}, f)
        stop.set()
        sampler.join()
        conc = conc_total / a.concurrent
        busy = [round((w.get("busy_seconds", 0) - b0) / conc_total, 3) for w, b0 in zip(stats.get("workers", []), busy0)]
        worker_busy = [{k: round(v - w0.get("busy", {}).get(k, 0), 3) for k, v in w.get("busy", {}).items()}
                       for w, w0 in zip(stats.get("workers", []), workers0)]
        steady = util[2:-2] if len(util) > 6 else util
        # Each worker's timeline over the concurrent phase (server clock): idle before its first span (ramp-up),
        # between spans (gaps) and after its last span (tail, up to the closing /v1/stats read).
        clock1 = stats.get("clock_s", 0.0)
        worker_timeline = []
        for w in stats.get("workers", []):
            spans = [sp for sp in w.get("timeline", []) if sp[0] >= clock0]
            if not spans:
                worker_timeline.append(None)
                continue
            gaps = sum(max(0.0, b[0] - a_[1]) for a_, b in zip(spans, spans[1:]))
            calls = [sp for sp in spans if sp[2] == "model_call"]
            worker_timeline.append({"ramp_s": round(spans[0][0] - clock0, 3), "tail_s": round(clock1 - spans[-1][1], 3),
                                    "gaps_s": round(gaps, 3), "spans": len(spans),
                                    "rows_per_call": [sp[3] for sp in calls]})
        report = {
            "devices": a.devices, "poll_ms": a.poll_ms, "size": a.size, "steps": a.steps, "max_batch": a.max_batch,
            "first_request_s": round(load_s, 2),
            "sequential_s_per_image": round(seq, 4), "sequential_stages_s": seq_stages, "concurrent": a.concurrent,
            "concurrent_total_s": round(conc_total, 2), "concurrent_s_per_image": round(conc, 4),
            "images_per_min_concurrent": round(60 / conc, 1), "speedup": round(seq / conc, 2),
            "concurrent_stages_s": per_request(stats0, stats, a.concurrent),
            "errors": errors[:5], "error_count": len(errors),
            "nvml_util_pct_mean": [round(sum(g) / len(g), 1) for g in zip(*steady)] if steady else None,
            "engine_busy": busy,
            "worker_busy": worker_busy,
            "worker_timeline": worker_timeline,
            "worker_graphs": [w.get("graphs") for w in stats.get("workers", [])],
            "host_profile": [{k: [v["count"] - w0.get("host_profile", {}).get(k, {}).get("count", 0),
                                  round(v["seconds"] - w0.get("host_profile", {}).get(k, {}).get("seconds", 0), 3)]
                              for k, v in w.get("host_profile", {}).items()}
                             for w, w0 in zip(stats.get("workers", []), workers0)],
            "device_counters": [{k: round(v - w0.get("device_counters", {}).get(k, 0), 3) for k, v in w.get("device_counters", {}).items()}
                                for w, w0 in zip(stats.get("workers", []), workers0)],
            "batch_size_hist": stats.get("metrics", {}).get("atelier_batch_size", {}),
        }
        print(json.dumps(report, indent=1))
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
