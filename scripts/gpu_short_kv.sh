#!/usr/bin/env bash
# The pending check of the short-key attention kernel at head dims <= 128 (cuda_attention_short.cu, session 49, off by
# default until this has run): its tests and the attention tests beside it, the SDPA race's choices, traces of the CFG
# step under five block shapes (4 warps with the one-wave grid, 1 or 4 tiles a warp; 8 and 16 warps), and A/B against the default at CFG, 16 rows and 1024². What to do with the figures:
# docs/cuda.md, "Session 49". Run from a pack's checkout (after `GPU_PACK_SD_ONLY=1 scripts/gpu_pack.sh`):
#   device run: carry [".gpupack"], command "bash .gpupack/gpu_short_kv.sh", timeout_s 600
# shellcheck disable=SC2154  # run, atelier: set by gpu_bench_env.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
here=$(basename "$(dirname "$0")")
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0)) s"; }
left() { [[ $(($(date +%s) - t0)) -lt $1 ]]; }
[[ -f .gpupack/atelier-gpu.tar.xz && ! -x .devicepack/bin/atelier ]] && tar -xJf .gpupack/atelier-gpu.tar.xz
# shellcheck source=scripts/gpu_bench_env.sh
source "$here/gpu_bench_env.sh"
ATELIER_FIXTURES=$(pwd)/.devicepack/fixtures
export ATELIER_FIXTURES
tests=.devicepack/bin/tests/atelier_gpu_tests
on=ATELIER_SHORT_KV_ATTENTION=all
# A setting's NAME=VALUE pairs (comma-separated; - for none) as env's arguments.
settings() { [[ $1 == - ]] || tr ',' '\n' <<<"$1"; }
echo "=== tests ($(el))"
timeout 240 stdbuf -oL -eL "${run[@]}" "$tests" --gtest_filter='CudaShortKvAttention.*:CudaOps.FlashAttentionMatchesCpu:CudaOps.Attention*:CudaOps.CudnnSdpaMatchesCpu:CudaWgmmaAttention.*' 2>&1 |
  grep -E "^\[  |FAIL|Failure|Expected|Which|error|rel L2 .*>" | grep -v "^\[ RUN" | tail -30
echo "=== the SD goldens and graph replay with the kernel on ($(el))"
env "$on" timeout 120 stdbuf -oL -eL "${run[@]}" "$tests" --gtest_filter='CudaModels.*:CudaLaunchBatch.Sd*:CudaGraph.UnetReplayEqualsEager' 2>&1 |
  grep -E "^\[  |FAIL|Failure|Expected|error" | grep -v "^\[ RUN" | tail -12
for s in - "$on"; do
  echo "=== choices [$s] ($(el))"
  mapfile -t vars < <(settings "$s")
  env "${vars[@]}" ATELIER_CUDNN_LOG=1 "${run[@]}" "$atelier" bench --device cuda --config sd15 --steps 2 --warmup 1 2>&1 |
    grep "\[cudnn sdpa\]" | head -16
done
for s in - "$on" "$on,ATELIER_SHORT_KV_TILES=1" "$on,ATELIER_SHORT_KV_TILES=4" "$on,ATELIER_SHORT_KV_WARPS=8" \
  "$on,ATELIER_SHORT_KV_WARPS=16"; do
  echo "=== trace CFG [$s] ($(el))"
  tag=$(echo "$s" | tr -c 'A-Za-z0-9\n' _)
  mapfile -t vars < <(settings "$s")
  env "${vars[@]}" "${run[@]}" "$atelier" bench --device cuda --config sd15 --steps 4 --warmup 2 \
    --trace "$OUT/cfg_$tag.json" >/dev/null 2>&1 || continue
  # The attention kernels of the last call, by name (median us in the replayed step), where the machine has Python.
  command -v python3 >/dev/null &&
    python3 "$here/trace_gaps.py" "$OUT/cfg_$tag.json" --top 0 --kernels 'attention|sdpa|fmha|flash' | sed -n '/^kernels matching/,$p'
  xz -T0 "$OUT/cfg_$tag.json"
done
echo "=== A/B CFG ($(el))"
bash "$here/gpu_ab.sh" -n 3 - "$on" -- --config sd15 --steps 20 --warmup 2 2>&1 | tail -3
echo "=== A/B 16 rows ($(el))"
left 420 && bash "$here/gpu_ab.sh" -n 2 - "$on" -- --config sd15 --batch 8 --steps 10 --warmup 2 2>&1 | tail -3
echo "=== A/B 1024² ($(el))"
left 480 && bash "$here/gpu_ab.sh" -n 1 - "$on" -- --config sd15 --width 1024 --height 1024 --steps 10 --warmup 2 2>&1 | tail -3
echo "=== done ($(el))"
