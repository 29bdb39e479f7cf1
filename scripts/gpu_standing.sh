#!/usr/bin/env bash
# The standing SD 1.5 figures of docs/performance.md on the card a device call got: the CFG step (three runs), 16
# rows (two), 1024² (one) and the kernel-level busy share of a batch-1 loop (`bench --kernels`). The standing is
# stated for an H200: on another card it prints the card and stops (the call then costs only its start-up), unless
# ANY_CARD=1. Run from a pack's checkout (after scripts/gpu_pack.sh):
#   device run: carry [".gpupack"], command "bash .gpupack/gpu_standing.sh", timeout_s 300
# shellcheck disable=SC2154  # run, atelier: set by gpu_bench_env.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
here=$(basename "$(dirname "$0")")
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "card: ${name:-none}"
if [[ $name != *H200* && ${ANY_CARD:-0} != 1 ]]; then
  echo "not an H200: the standing figures are the H200's, nothing run (ANY_CARD=1 runs them anyway)"
  exit 0
fi
[[ -f .gpupack/atelier-gpu.tar.xz && ! -x .devicepack/bin/atelier ]] && tar -xJf .gpupack/atelier-gpu.tar.xz
# shellcheck source=scripts/gpu_bench_env.sh
source "$here/gpu_bench_env.sh"
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0)) s"; }
echo "=== CFG step, 512² ($(el))"
bash "$here/gpu_ab.sh" -n 3 - -- --config sd15 --steps 20 --warmup 2 2>&1 | tail -4
echo "=== 16 rows ($(el))"
bash "$here/gpu_ab.sh" -n 2 - -- --config sd15 --batch 8 --steps 10 --warmup 2 2>&1 | tail -3
echo "=== 1024² ($(el))"
bash "$here/gpu_ab.sh" -n 1 - -- --config sd15 --width 1024 --height 1024 --steps 10 --warmup 2 2>&1 | tail -2
echo "=== kernels of the CFG step ($(el))"
"${run[@]}" "$atelier" bench --device cuda --config sd15 --steps 20 --warmup 2 --kernels 2>&1 | sed -n '/^kernels  /,$p' | head -12
echo "=== done ($(el))"
