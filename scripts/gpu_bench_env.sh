# Sourced (from the repository root) by gpu_bench.sh and gpu_dit_bench.sh, in scripts/ or in a pack's
# .gpupack/: which atelier binary to run (the pack's, or a build tree's), the CUDA libraries on the loader
# path, and `bench NAME ARGS...`: one `atelier bench --device cuda ARGS --json` report in $out with its summary
# line on the log. Reports go to $out: $OUT, or /tmp/gpu_bench.
out=${OUT:-/tmp/gpu_bench}
mkdir -p "$out"
# A pack's loader wrapper (.devicepack/run) is there whether or not the pack holds atelier (GPU_PACK_NO_ATELIER=1
# packs only the test binary and cuda_ops_bench, which need it as much: without it they miss the pack's libraries).
if [[ -x .devicepack/run ]]; then
  run=(.devicepack/run)
  atelier=.devicepack/bin/atelier
  fixtures=$(pwd)/.devicepack/fixtures
else
  run=()
  atelier=${BUILD_DIR:-build}/atelier
  fixtures=$(pwd)/../shared/fixtures
fi
# Every run plans each shape afresh, as before choices were kept across processes (backend/choice_store.h): an A/B
# of a switch that changes a candidate kernel must not take the other setting's stored choice. Set it to a folder
# to measure the stored path.
export ATELIER_PLAN_CACHE=${ATELIER_PLAN_CACHE:-0}
for name in libcudnn.so.9 libcublasLt.so.13 libcublas.so.13; do
  if ! ldconfig -p 2>/dev/null | grep -q "$name"; then
    found=$(find /usr/local/cuda/lib64 /usr/lib /opt -name "$name" 2>/dev/null | head -1)
    [[ -n $found ]] && export LD_LIBRARY_PATH="$(dirname "$found"):${LD_LIBRARY_PATH:-}"
  fi
done

bench() {  # bench NAME ARGS...
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
print(f"  model call ms min {u.get('min', 0):.3f} median {u.get('median', 0):.3f}; {r.get('unet_tflops_per_s', 0):.1f} TFLOP/s "
      f"({r.get('pct_of_ceiling') or 0:.1f}% of ceiling); GPU busy {r.get('gpu_busy_pct')}%; NVML {r.get('nvml_util_pct')}%; "
      f"{r.get('it_per_s', 0):.1f} it/s; {r.get('s_per_image', 0):.4f} s/image; text {st.get('text_encode')} s, denoise "
      f"{st.get('denoise')} s, VAE decode {st.get('vae_decode')} s; peak {r.get('peak_bytes_reserved', 0)/2**30:.2f} GiB")
PY
}
