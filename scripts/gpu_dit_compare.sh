#!/usr/bin/env bash
# On a GPU machine (after gpu_check.sh unpacked the pack, or with BUILD_DIR set): the DiT benches of
# gpu_dit_bench.sh against execution switches — CUDA graphs off (ATELIER_GRAPHS=0) and 32 cuBLASLt heuristic
# candidates timed per GEMM shape instead of 8 (ATELIER_GEMM_CANDIDATES=32) — with nvidia-smi's power and
# clock samples during the FLUX bf16 run (is a long GEMM-bound step held back by the power limit?), and
# SD 1.5 batch 8 with the same GEMM switch. Reports in $OUT (default /tmp/gpu_bench).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source "$here/gpu_bench_env.sh"

nvidia-smi dmon -s pc -d 1 > "$out/dmon_flux.txt" 2>&1 &
dmon=$!
bench flux_1024 --config flux --warmup 2
kill $dmon 2>/dev/null
echo "=== power (W) and SM clock (MHz) samples during flux_1024 (nvidia-smi dmon)"
awk '$1 ~ /^[0-9]+$/ {printf "%s/%s ", $2, $(NF-1)}' "$out/dmon_flux.txt"
echo
ATELIER_GRAPHS=0 bench flux_1024_nographs --config flux --warmup 2
ATELIER_GEMM_CANDIDATES=32 bench flux_1024_cand32 --config flux --warmup 2
bench flux_1024_fp8 --config flux --warmup 2 --fp8
ATELIER_GEMM_CANDIDATES=32 bench flux_1024_fp8_cand32 --config flux --warmup 2 --fp8
bench zimage_1024 --config zimage --warmup 2
ATELIER_GRAPHS=0 bench zimage_1024_nographs --config zimage --warmup 2
bench zimage_1024_fp8 --config zimage --warmup 2 --fp8
bench sd15_b8 --config sd15 --steps 10 --batch 8 --warmup 2
ATELIER_GEMM_CANDIDATES=32 bench sd15_b8_cand32 --config sd15 --steps 10 --batch 8 --warmup 2
# Op breakdown of an eager FP8 FLUX step (the stacked modulation GEMV among the GEMMs by shape).
for v in "" _fp8; do
  flag=${v:+--fp8}
  gemm=linear
  [[ -n $v ]] && gemm=linear_fp8
  ATELIER_GRAPHS=0 bench flux${v}_trace --config flux --steps 2 --warmup 1 $flag --trace "$out/flux${v}_events.trace.json"
  /usr/bin/env python3 bench/trace_ops.py "$out/flux${v}_events.trace.json" --call model_call > "$out/flux${v}_ops.txt" 2>&1
  /usr/bin/env python3 bench/trace_ops.py "$out/flux${v}_events.trace.json" --call model_call --shapes $gemm --top 40 \
    > "$out/flux${v}_gemm_shapes.txt" 2>&1
  rm -f "$out/flux${v}_events.trace.json"
done
