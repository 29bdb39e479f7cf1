#!/usr/bin/env bash
# Session 50's experiment, written while no device came: the wgmma attention's other block shapes
# (ATELIER_WGMMA_ATTENTION_SHAPE, docs/cuda.md "Session 50") against the default, on the card a call gets.
# Runs their parity tests, the d40/d80 attention kernels' in-step times per shape (CFG and 16 rows, from
# `bench --trace` through trace_gaps.py), an A/B of the CFG step, and on an H200 the standing figures. Each run has
# a timeout, so a shape that hangs costs its minute, not the call. From a pack's checkout (scripts/gpu_pack.sh):
#   device run: carry [".gpupack"], command "bash .gpupack/gpu_attention_shapes.sh", timeout_s 600
# SHAPES="2x128L 3x64L" (default: 2x128L 3x64L 2x64L) picks the shapes; AB="2x128L" the one A/B'd against the default.
# shellcheck disable=SC2154  # run, atelier: set by gpu_bench_env.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
here=$(basename "$(dirname "$0")")
export OUT=${OUT:-/tmp/gpu_shapes}
mkdir -p "$OUT"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "card: ${card:-none}"
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0)) s"; }
[[ -f .gpupack/atelier-gpu.tar.xz && ! -x .devicepack/bin/atelier ]] && tar -xJf .gpupack/atelier-gpu.tar.xz
# shellcheck source=scripts/gpu_bench_env.sh
source "$here/gpu_bench_env.sh"
export ATELIER_FIXTURES=${ATELIER_FIXTURES:-$(pwd)/.devicepack/fixtures}
tests=.devicepack/bin/tests/atelier_gpu_tests
read -r -a shapes <<< "${SHAPES:-2x128L 3x64L 2x64L}"
echo "=== tests ($(el))"
timeout 120 stdbuf -oL -eL "${run[@]}" "$tests" \
  --gtest_filter='CudaWgmmaAttention.*:CudaShortKvAttention.*:CudaModels.Sd*:CudaGraph*:CudaLaunchBatch*' 2>&1 |
  grep -E "^\[  |FAIL|Failure|Expected|Which|error" | grep -v "^\[ RUN" | tail -20
for cfg in "CFG:--steps 4 --warmup 2" "16 rows:--batch 8 --steps 3 --warmup 2"; do
  name=${cfg%%:*}
  read -r -a args <<< "${cfg#*:}"
  for sh in default "${shapes[@]}"; do
    echo "=== $name, $sh: attention kernels in the step ($(el))"
    timeout 60 env ATELIER_WGMMA_ATTENTION_SHAPE="$sh" "${run[@]}" "$atelier" bench --device cuda --config sd15 "${args[@]}" \
      --trace "$OUT/t.json" > /dev/null 2>&1 &&
      python3 "$here/trace_gaps.py" "$OUT/t.json" --top 0 --kernels 'attention_wgmma_kernel<(40|80)' |
      sed -n '/^kernels matching/,$p' | head -8
    rm -f "$OUT/t.json"
  done
done
echo "=== A/B of the CFG step ($(el))"
timeout 150 bash "$here/gpu_ab.sh" -n 2 - "ATELIER_WGMMA_ATTENTION_SHAPE=${AB:-2x128L}" -- --config sd15 --steps 20 --warmup 2 2>&1 |
  tail -5
if [[ $card == *H200* && $(($(date +%s) - t0)) -lt 260 ]]; then
  echo "=== standing ($(el))"
  timeout 200 bash "$here/gpu_standing.sh" 2>&1 | grep -v "^card"
fi
echo "=== done ($(el))"
