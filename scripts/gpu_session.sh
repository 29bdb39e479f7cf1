#!/usr/bin/env bash
# A session's first device call in one command: the GPU tests (gpu_check.sh) on the second GPU while the
# issue-target benches (gpu_bench.sh with GPU_BENCH_QUICK=1: SD 1.5 batch 1/8 and 1024², the FLUX and
# Z-Image benches and traces of gpu_dit_bench.sh) run on the first; on a one-GPU machine one after the other.
# Logs and reports go to $OUT (check/, bench/ and its bench_results.tar.gz); the summaries are printed.
#
#   BUILD_DIR=build-cuda scripts/gpu_pack.sh .     # here, then:
#   device run, kind nvidia-h200-x2: carry [".gpupack"], command "bash .gpupack/gpu_session.sh", timeout_s 600
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
if [[ -f .gpupack/atelier-gpu.tar.xz && ! -x .devicepack/bin/atelier ]]; then tar -xJf .gpupack/atelier-gpu.tar.xz; fi
out=${OUT:-/tmp/gpu_session}
mkdir -p "$out/check" "$out/bench"
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
test_gpu=0
(( gpus > 1 )) && test_gpu=1
(CUDA_VISIBLE_DEVICES=$test_gpu OUT=$out/check bash "$here/gpu_check.sh" > "$out/check.log" 2>&1
 echo "gpu_check exit status $?" >> "$out/check.log"
 # The model goldens and graph replay again with the switches that are off by default (docs/cuda.md).
 CUDA_VISIBLE_DEVICES=$test_gpu ATELIER_GN_APPLY_MERGE=1 ATELIER_FIXTURES=$PWD/.devicepack/fixtures .devicepack/run \
   .devicepack/bin/tests/atelier_gpu_tests --gtest_filter='CudaModels.*:CudaGraph*' > "$out/check_gn_apply_merge.log" 2>&1
 echo "gpu_check exit status $? (CudaModels.*:CudaGraph* with ATELIER_GN_APPLY_MERGE=1)" >> "$out/check.log") &
checks=$!
(( gpus > 1 )) || wait "$checks"
CUDA_VISIBLE_DEVICES=0 OUT=$out/bench GPU_BENCH_QUICK=1 bash "$here/gpu_bench.sh" > "$out/bench.log" 2>&1
wait "$checks"
echo "=== GPU tests (GPU $test_gpu)"
grep -E "=== GPU test summary|  (skipped|FAILED):|=== gpu_check: tests exited|gpu_check exit status" "$out/check.log" | tail -20
echo "=== benches (GPU 0)"
grep -E "^=== bench|model call ms|failed" "$out/bench.log"
