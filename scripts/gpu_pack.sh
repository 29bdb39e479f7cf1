#!/usr/bin/env bash
# Packs what one GPU run needs into DEST/.gpupack/ (about 40 MB): atelier-gpu.tar.xz with the GPU test binary
# and the CUDA micro-benchmark (built first), the libraries they load (collected by ../shared/tools/devicepack)
# and the sd15-tiny fixture files the GPU tests read; plus gpu_check.sh, which runs it all. DEST is the
# checkout the device tool sends (default: this one); nothing else in it is touched (its own .devicepack
# stays as it is). Then one device call runs everything:
#   device run: carry [".gpupack"], command "bash .gpupack/gpu_check.sh", timeout_s 600
#
#   [BUILD_DIR=build] scripts/gpu_pack.sh [DEST]     (BUILD_DIR configured with -DATELIER_CUDA=ON)
#
# The device tool refuses a carry whose working tree (tracked files: ~22 MB, most of it models/demo; plus the
# pack, ~45 MB) passes 64 MiB. models/demo is not needed there: untrack it for the call, then restore it:
#   git rm -r -q --cached models/demo && echo models/demo/ >> .git/info/exclude     # before the call
#   git reset -q models/demo && sed -i '/^models\/demo\/$/d' .git/info/exclude       # after it
# Restore it before any commit: `git rm --cached` stages the deletion, and a plain `git commit` then deletes
# models/demo from the repository (session 16 had to rewrite a commit that did).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dest=$(cd "${1:-$root}" && pwd)
BUILD_DIR=${BUILD_DIR:-$root/build}
FIXTURES=${ATELIER_FIXTURES:-$root/../shared/fixtures}
DEVICEPACK=${DEVICEPACK:-$root/../shared/tools/devicepack}

cmake --build "$BUILD_DIR" --target atelier_gpu_tests cuda_ops_bench atelier

# devicepack writes .devicepack/ at the top of the git checkout it runs in: give it a scratch one.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$work" init -q
stage=$work/stage
mkdir -p "$stage/bin/tests" "$stage/bin/bench" "$stage/fixtures"
# GPU_PACK_TESTS_BIN=FILE packs FILE as the test binary instead (e.g. one built with a kernel deliberately broken,
# to see the tests fail on it: a mutation check), beside the unchanged atelier.
# GPU_PACK_NO_TESTS=1 leaves it out (with GPU_PACK_NO_ATELIER=1: a pack of cuda_ops_bench alone, ~20 MB).
[[ ${GPU_PACK_NO_TESTS:-0} == 1 ]] || cp "${GPU_PACK_TESTS_BIN:-$BUILD_DIR/tests/atelier_gpu_tests}" "$stage/bin/tests/atelier_gpu_tests"
# (unet_step_bench is left out: `atelier bench` measures the same, and each binary carries every kernel.)
# GPU_PACK_NO_BENCH=1 leaves cuda_ops_bench out too (~14 MB packed): with GPU_PACK_SD_ONLY=1 the pack is then ~51 MB,
# what fits beside the checkout in the device tool's 64 MiB since session 48 (gpu_check.sh skips the benchmark).
[[ ${GPU_PACK_NO_BENCH:-0} == 1 ]] || cp "$BUILD_DIR/bench/cuda_ops_bench" "$stage/bin/bench/"
# GPU_PACK_NO_ATELIER=1 leaves the atelier binary out (~20 MB packed): a call of kernel tests and cuda_ops_bench only.
[[ ${GPU_PACK_NO_ATELIER:-0} == 1 ]] || cp "$BUILD_DIR/atelier" "$stage/bin/"
# Host symbol tables are not needed there (the device code, in .nv_fatbin, is kept): a smaller carry.
strip --strip-unneeded "$stage/bin/"atelier "$stage/bin/tests/"* "$stage/bin/bench/"* 2> /dev/null || true
# Only the files the GPU tests open (the whole fixture folder would not fit the 64 MiB a call may carry).
src="$FIXTURES/sd15-tiny"
if [[ -d $src ]]; then
  # (Made only here: an empty sd15-tiny folder in the pack turns the model tests' skips into failures.)
  mkdir -p "$stage/fixtures/sd15-tiny/model"
  cp "$src/golden.safetensors" "$src/case.json" "$stage/fixtures/sd15-tiny/"
  cp -r "$src/model/unet" "$src/model/text_encoder" "$src/model/vae" "$src/model/tokenizer" "$src/model/scheduler" \
    "$src/model/model_index.json" "$stage/fixtures/sd15-tiny/model/"
  # vocab.json + merges.txt hold the same BPE model; tokenizer.json is only read when they are absent.
  rm -f "$stage/fixtures/sd15-tiny/model/tokenizer/tokenizer.json"
else
  echo "gpu_pack: $src not found: the model tests will report themselves skipped" >&2
fi
# FLUX and Z-Image tiny folders: gpu_bench.sh generates with them on both devices and compares the images
# (GPU_PACK_SD_ONLY=1 leaves them out when the pack must be smaller).
families=(flux-tiny zimage-tiny)
[[ ${GPU_PACK_SD_ONLY:-0} == 1 ]] && families=()
for fam in "${families[@]}"; do
  [[ -d $FIXTURES/$fam/model ]] && mkdir -p "$stage/fixtures/$fam" && cp -r "$FIXTURES/$fam/model" "$stage/fixtures/$fam/"
done
# FLUX's CLIP tokenizer reads vocab.json + merges.txt as SD's does, its T5 tokenizer spiece.model: 4 MB less to carry.
if [[ -d $stage/fixtures/flux-tiny/model ]]; then
  chmod -R u+w "$stage/fixtures/flux-tiny/model"
  rm -f "$stage/fixtures/flux-tiny/model/tokenizer/tokenizer.json" "$stage/fixtures/flux-tiny/model/tokenizer_2/tokenizer.json"
fi
(cd "$work" && "$DEVICEPACK" --max-mb 400 "$stage/bin" "$stage/fixtures")
# CUPTI (kernel tracing: bench --kernels, --trace) is opened with dlopen, so ldd does not list it: add it by hand
# (~1.5 MB packed) where the toolkit has it; without it those report that tracing is unavailable.
cupti=$(ls "${CUDA_HOME:-/usr/local/cuda}"/lib64/libcupti.so.[0-9]* 2> /dev/null | head -1 || true)
[[ -n $cupti ]] && cp -L "$cupti" "$work/.devicepack/lib/"

mkdir -p "$dest/.gpupack"
exclude=$(cd "$dest" && realpath -m "$(git rev-parse --git-path info/exclude)")
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpupack/' "$exclude" 2>/dev/null || echo '/.gpupack/' >> "$exclude"
# xz: the binaries (fatbins for two architectures) pack to half of what gzip gives.
rm -f "$dest/.gpupack/atelier-gpu.tar.gz"
XZ_OPT="-T0 -9" tar -C "$work" -cJf "$dest/.gpupack/atelier-gpu.tar.xz" .devicepack
cp "$root/scripts/gpu_check.sh" "$root/scripts/gpu_bench.sh" "$root/scripts/gpu_dit_bench.sh" "$root/scripts/gpu_bench_env.sh" \
  "$root/scripts/gpu_session.sh" "$root/scripts/gpu_dit_compare.sh" "$root/scripts/gpu_ab.sh" "$root/scripts/gpu_standing.sh" \
  "$root/scripts/trace_gaps.py" \
  "$dest/.gpupack/"
echo "gpu_pack: $(du -sm "$dest/.gpupack" | cut -f1) MiB in $dest/.gpupack"
echo "  run on the GPU machine with: carry [\".gpupack\"], command \"bash .gpupack/gpu_check.sh\", timeout_s 600"
