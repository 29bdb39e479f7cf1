#!/usr/bin/env bash
# On a GPU machine: prints nvidia-smi, runs the GPU tests (ctest label `gpu`: the atelier_gpu_tests binary,
# one process per test) with their output and a summary, then the CUDA micro-benchmarks
# (bench/cuda_ops_bench.cc), and exits non-zero when a test failed. Logs also go to $OUT (the device tool's
# return folder) or /tmp/gpu_check.
#
#   From a pack made by scripts/gpu_pack.sh:  device run, carry [".gpupack"], command "bash .gpupack/gpu_check.sh"
#                                             (gpu_pack.sh puts a copy of this script there)
#   From a build tree on a machine with a GPU: BUILD_DIR=build scripts/gpu_check.sh   (runs ctest -L gpu)
# Extra arguments select tests (e.g. --gtest_filter='CudaOps.Flash*'); BENCH=0 skips the micro-benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"

echo "=== nvidia-smi"
nvidia-smi 2>&1 || echo "(nvidia-smi failed)"

if [[ -f .gpupack/atelier-gpu.tar.xz && ! -x .devicepack/bin/tests/atelier_gpu_tests ]]; then
  tar -xJf .gpupack/atelier-gpu.tar.xz
fi
if [[ -x .devicepack/bin/tests/atelier_gpu_tests ]]; then
  run=(.devicepack/run)
  tests=.devicepack/bin/tests/atelier_gpu_tests
  bench=.devicepack/bin/bench/cuda_ops_bench
  fixtures=$(pwd)/.devicepack/fixtures
  build=""
else
  run=()
  build=${BUILD_DIR:-build}
  tests=$build/tests/atelier_gpu_tests
  bench=$build/bench/cuda_ops_bench
  fixtures=$(pwd)/../shared/fixtures
fi
[[ -x $tests ]] || { echo "gpu_check: $tests not found (run scripts/gpu_pack.sh, or build with -DATELIER_CUDA=ON)"; exit 2; }
export ATELIER_FIXTURES=${ATELIER_FIXTURES:-$fixtures}

# cuDNN is loaded at run time and cuBLAS at start-up: where the loader does not find them (e.g. only inside a
# Python environment's nvidia/* packages), put their folders on the library path.
add_lib_dir() {
  local name=$1 found
  if ! ldconfig -p 2>/dev/null | grep -q "$name"; then
    found=$(find /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib /opt -name "$name" 2>/dev/null | head -1)
    if [[ -n $found ]]; then
      export LD_LIBRARY_PATH="$(dirname "$found"):${LD_LIBRARY_PATH:-}"
      echo "gpu_check: $name from $(dirname "$found")"
    else
      echo "gpu_check: $name not found"
    fi
  fi
}
add_lib_dir libcudnn.so.9
add_lib_dir libcublasLt.so.13
add_lib_dir libcublas.so.13

echo "=== GPU tests (label gpu)"
: > "$out/gpu_tests.log"
if [[ -n $build && -f $build/tests/CTestTestfile.cmake ]] && command -v ctest > /dev/null && [[ $# -eq 0 ]]; then
  ctest --test-dir "$build" -L gpu --output-on-failure -V --timeout 600 2>&1 | tee "$out/gpu_tests.log"
  status=${PIPESTATUS[0]}
else
  # One process per test, as ctest runs them: a crash or a hang in one test cannot hide the others' results.
  mapfile -t names < <("${run[@]}" "$tests" --gtest_list_tests "$@" | awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}')
  passed=() failed=() skipped=()
  for name in "${names[@]}"; do
    timeout 150 "${run[@]}" "$tests" --gtest_color=no --gtest_filter="$name" 2>&1 | tee -a "$out/gpu_tests.log" > "$out/.one.log"
    rc=${PIPESTATUS[0]}
    cat "$out/.one.log"
    if [[ $rc -ne 0 ]]; then failed+=("$name (exit $rc)")
    elif grep -q '^\[  SKIPPED \]' "$out/.one.log"; then skipped+=("$name")
    else passed+=("$name"); fi
  done
  rm -f "$out/.one.log"
  {
    echo "=== GPU test summary: ${#passed[@]} passed, ${#skipped[@]} skipped, ${#failed[@]} failed"
    for n in "${skipped[@]}"; do echo "  skipped: $n"; done
    for n in "${failed[@]}"; do echo "  FAILED:  $n"; done
  } | tee -a "$out/gpu_tests.log"
  status=$(( ${#failed[@]} > 0 ? 1 : 0 ))
  (( ${#names[@]} > 0 )) || status=2
fi

if [[ ${BENCH:-1} != 0 && ! -x $bench ]]; then
  echo "=== no cuda_ops_bench in this pack (GPU_PACK_NO_BENCH=1): micro-benchmarks skipped"
elif [[ ${BENCH:-1} != 0 ]]; then  # BENCH=0: tests only
  echo "=== CUDA micro-benchmarks"
  "${run[@]}" "$bench" 2>&1 | tee "$out/cuda_ops_bench.txt"
  # The convolutions again on cuDNN's legacy API (graph-API path off), for the comparison in docs/cuda.md.
  echo "=== convolutions with ATELIER_CUDNN_GRAPH=0"
  ATELIER_CUDNN_GRAPH=0 "${run[@]}" "$bench" 2>&1 | grep -E "^\| conv|^device" | tee "$out/cuda_ops_bench_legacy_conv.txt"
fi

echo "=== gpu_check: tests exited with status $status"
exit "$status"
