#!/usr/bin/env bash
# Builds Atelier and runs the whole test suite (ctest). The README's test command; .ci/run calls it.
# CUDA sources are compiled when nvcc is present (ATELIER_CUDA defaults to ON then); GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$JOBS"
# ctest runs JOBS tests at once and each CPU test uses every core through OpenMP: with OpenMP's default
# spin-waiting, oversubscribed threads burn their time slices spinning (a demo-model generation took 5-8x
# longer that way on the 2-core CI machine). Passive waiting hands the core over instead.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" ${CTEST_ARGS:-}
