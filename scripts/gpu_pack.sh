#!/usr/bin/env bash
# Packs what one GPU run needs into .gpupack/atelier-gpu.tar.gz (about 30 MB): the GPU test binary and the
# CUDA micro-benchmark (built here first), the libraries they load (through ../shared/tools/devicepack), and
# the sd15-tiny fixture files the GPU tests read. Then, on the GPU machine, one call runs everything:
#   device run: carry [".gpupack"], command "scripts/gpu_check.sh"
#
#   scripts/gpu_pack.sh            (BUILD_DIR=build by default; configure it with -DATELIER_CUDA=ON first)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
FIXTURES=${ATELIER_FIXTURES:-$root/../shared/fixtures}
DEVICEPACK=${DEVICEPACK:-$root/../shared/tools/devicepack}

cmake --build "$BUILD_DIR" --target atelier_gpu_tests cuda_ops_bench

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin/tests" "$stage/bin/bench" "$stage/fixtures/sd15-tiny/model"
cp "$BUILD_DIR/tests/atelier_gpu_tests" "$stage/bin/tests/"
cp "$BUILD_DIR/bench/cuda_ops_bench" "$stage/bin/bench/"
# Only the files the GPU tests open (the whole fixture folder would not fit the 64 MiB a call may carry).
src="$FIXTURES/sd15-tiny"
if [[ -d $src ]]; then
  cp "$src/golden.safetensors" "$src/case.json" "$stage/fixtures/sd15-tiny/"
  cp -r "$src/model/unet" "$src/model/text_encoder" "$stage/fixtures/sd15-tiny/model/"
else
  echo "gpu_pack: $src not found: the model tests will report themselves skipped" >&2
fi

# devicepack copies the binaries (stripped) and their non-CUDA libraries into .devicepack/; the pack may be
# larger than one call carries uncompressed, so it is compressed below.
"$DEVICEPACK" --max-mb 400 "$stage/bin" "$stage/fixtures"
mkdir -p .gpupack
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpupack/' "$exclude" 2>/dev/null || echo '/.gpupack/' >> "$exclude"
grep -qx '/.devicepack/' "$exclude" 2>/dev/null || echo '/.devicepack/' >> "$exclude"
tar -czf .gpupack/atelier-gpu.tar.gz .devicepack
echo "gpu_pack: $(du -m .gpupack/atelier-gpu.tar.gz | cut -f1) MiB in .gpupack/atelier-gpu.tar.gz"
echo "  run on the GPU machine with: carry [\".gpupack\"], command \"scripts/gpu_check.sh\""
