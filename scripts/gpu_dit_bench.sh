#!/usr/bin/env bash
# On a GPU machine: `atelier bench` on the built-in full-size FLUX.1-dev (28 steps) and Z-Image-Turbo (8 steps)
# configurations at 1024², in bf16 and with the transformer blocks in FP8 (--fp8), plus a traced step of each
# (op breakdown through bench/trace_ops.py). Called by gpu_bench.sh; alone (after gpu_check.sh unpacked the
# pack, or with BUILD_DIR set): OUT=/dir bash scripts/gpu_dit_bench.sh. JSON reports and logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_bench}
mkdir -p "$out"
if [[ -x .devicepack/bin/atelier ]]; then
  run=(.devicepack/run)
  atelier=.devicepack/bin/atelier
else
  run=()
  atelier=${BUILD_DIR:-build}/atelier
fi
for name in libcudnn.so.9 libcublasLt.so.13 libcublas.so.13; do
  if ! ldconfig -p 2>/dev/null | grep -q "$name"; then
    found=$(find /usr/local/cuda/lib64 /usr/lib /opt -name "$name" 2>/dev/null | head -1)
    [[ -n $found ]] && export LD_LIBRARY_PATH="$(dirname "$found"):${LD_LIBRARY_PATH:-}"
  fi
done

dit_bench() {  # dit_bench NAME ARGS...: one JSON report and its summary line
  local name=$1
  shift
  echo "=== bench $name: $*"
  "${run[@]}" "$atelier" bench --device cuda "$@" --json > "$out/$name.json" 2> "$out/$name.err" ||
    { echo "bench $name failed:"; tail -5 "$out/$name.err"; return; }
  /usr/bin/env python3 - "$out/$name.json" <<'PY' 2>&1 | tail -3
import json, sys
r = json.load(open(sys.argv[1]))
u = r.get("unet_ms", {})
st = r.get("stages_s", {})
print(f"  model call ms min {u.get('min', 0):.2f} median {u.get('median', 0):.2f}; {r.get('unet_tflops_per_s', 0):.1f} TFLOP/s; "
      f"GPU busy {r.get('gpu_busy_pct')}%; NVML {r.get('nvml_util_pct')}%; {r.get('s_per_image', 0):.3f} s/image; "
      f"denoise {st.get('denoise')} s, VAE decode {st.get('vae_decode')} s; peak {r.get('peak_bytes_reserved', 0)/2**30:.1f} GiB")
PY
}

for c in flux zimage; do
  dit_bench ${c}_1024 --config $c --warmup 1
  dit_bench ${c}_1024_fp8 --config $c --warmup 1 --fp8
done
# Where a traced step spends its device time (eager; tracing adds a little), bf16 and fp8.
for c in flux zimage; do
  for v in "" _fp8; do
    flag=${v:+--fp8}
    dit_bench ${c}${v}_trace --config $c --steps 2 --warmup 1 $flag --trace "$out/${c}${v}_events.trace.json"
    /usr/bin/env python3 bench/trace_ops.py "$out/${c}${v}_events.trace.json" --call model_call > "$out/${c}${v}_ops.txt" 2>&1
    head -14 "$out/${c}${v}_ops.txt"
  done
done
