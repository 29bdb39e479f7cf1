#!/usr/bin/env bash
# On a GPU machine, after gpu_check.sh has unpacked the pack (or with BUILD_DIR set): `atelier bench` on the
# built-in SD 1.5 configuration (random weights) in the shapes of issue 3's targets, with CUDA graphs on and
# off, NVML utilisation sampled by nvidia-smi during the batch-1 run, and a traced tiny-model generation.
# JSON reports and logs go to $OUT (or /tmp/gpu_bench).
#   device run: carry [".gpupack"], command "bash .gpupack/gpu_check.sh; bash .gpupack/gpu_bench.sh"
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source "$here/gpu_bench_env.sh"

nvidia-smi dmon -s u -d 1 > "$out/dmon_b1.txt" 2>&1 &
dmon=$!
bench sd15_b1 --config sd15 --steps 20 --batch 1 --warmup 2 --ceiling
kill $dmon 2>/dev/null
# GPU_BENCH_QUICK=1: the issue-target runs only (no comparison variants, no server run, no tiny models).
quick=${GPU_BENCH_QUICK:-0}
# Without cuDNN's graph-API convolutions and without its SDPA node: what each gives the replayed step.
ATELIER_CUDNN_GRAPH=0 bench sd15_b1_legacy_conv --config sd15 --steps 20 --batch 1 --warmup 2
ATELIER_CUDNN_SDPA=0 bench sd15_b1_flash_only --config sd15 --steps 20 --batch 1 --warmup 2
# Group norms merged inside their apply kernel (off by default until measured; docs/cuda.md).
ATELIER_GN_APPLY_MERGE=1 bench sd15_b1_gn_apply_merge --config sd15 --steps 20 --batch 1 --warmup 2
if [[ $quick != 1 ]]; then
  ATELIER_GRAPHS=0 bench sd15_b1_nographs --config sd15 --steps 20 --batch 1 --warmup 2
  ATELIER_CONV_NHWC=0 bench sd15_b1_nchw --config sd15 --steps 20 --batch 1 --warmup 2
fi
if [[ $quick != 1 && -d $fixtures/sd15-tiny/model/tokenizer ]]; then
  echo "=== server: 64 concurrent 512x512 requests vs one at a time (builtin:sd15, random weights)"
  /usr/bin/env python3 bench/serve_gpu_bench.py --atelier "$atelier" --launcher "${run[*]:-}" \
    --tokenizer "$fixtures/sd15-tiny/model/tokenizer" --devices 0 --concurrent 64 2> "$out/serve_bench.err" | tee "$out/serve_bench.json"
  tail -3 "$out/serve_bench.err"
fi
# Where the time goes: an eager run traced (op ranges with CUDA-event device times), summed by op name.
ATELIER_GRAPHS=0 bench sd15_trace --config sd15 --steps 3 --batch 1 --warmup 1 --trace "$out/sd15_events.trace.json"
/usr/bin/env python3 bench/trace_ops.py "$out/sd15_events.trace.json" --call unet 2>&1 | tee "$out/sd15_ops.txt"
bench sd15_b8 --config sd15 --steps 10 --batch 8 --warmup 2
ATELIER_GN_APPLY_MERGE=1 bench sd15_b8_gn_apply_merge --config sd15 --steps 10 --batch 8 --warmup 2
bench sd15_1024 --config sd15 --steps 10 --batch 1 --width 1024 --height 1024 --warmup 2
# FLUX.1-dev (28 steps) and Z-Image-Turbo (8 steps) at 1024², built-in full-size configurations, bf16 and fp8.
OUT=$out bash "$here/gpu_dit_bench.sh"
echo "=== NVML utilisation during sd15_b1 (nvidia-smi dmon, %)"
awk '$1 ~ /^[0-9]+$/ {print $2}' "$out/dmon_b1.txt" | tr '\n' ' '
echo
if [[ $quick != 1 && -d $fixtures/sd15-tiny/model ]]; then
  echo "=== traced tiny generation"
  "${run[@]}" "$atelier" generate --model "$fixtures/sd15-tiny/model" --device cuda --width 128 --height 128 --steps 20 \
    --seed 1 --prompt "a red circle" --output "$out/tiny.png" --trace "$out/tiny_trace.json" 2>&1 | tail -3
  bench tiny --model "$fixtures/sd15-tiny/model" --width 128 --height 128 --steps 20 --warmup 2
fi

# FLUX and Z-Image tiny models on both devices: the CUDA image against the CPU image (bf16 on CUDA).
for fam in flux-tiny zimage-tiny; do
  [[ $quick != 1 && -d $fixtures/$fam/model ]] || continue
  echo "=== $fam: generate on cuda and cpu"
  # f32 on both (exactness of the CUDA kernels); bf16 is CUDA's default and is generated too, for a look.
  for dev in cuda cpu; do
    "${run[@]}" "$atelier" generate --model "$fixtures/$fam/model" --device $dev --dtype f32 --width 128 --height 128 --steps 4 \
      --seed 7 --prompt "a red circle on a blue background" --output "$out/$fam-$dev.png" 2>&1 | tail -2
  done
  "${run[@]}" "$atelier" generate --model "$fixtures/$fam/model" --device cuda --width 128 --height 128 --steps 4 \
    --seed 7 --prompt "a red circle on a blue background" --output "$out/$fam-cuda-bf16.png" 2>&1 | tail -1
  /usr/bin/env python3 - "$out/$fam-cuda.png" "$out/$fam-cpu.png" <<'PY' 2>&1 | tail -2
import sys
import numpy as np
from PIL import Image
a, b = (np.asarray(Image.open(p).convert("RGB"), np.int16) for p in sys.argv[1:3])
d = np.abs(a - b)
print(f"  cuda vs cpu: max |diff| {d.max()} / 255, mean {d.mean():.3f}")
PY
done

# The device tool brings back a few files only: everything in one archive.
tmp_tar=$(mktemp /tmp/bench_results.XXXXXX.tar.gz)  # written outside $out: tar warns when its folder changes
(cd "$out" && tar -czf "$tmp_tar" --exclude=bench_results.tar.gz --exclude='*.trace.json' .) && mv "$tmp_tar" "$out/bench_results.tar.gz"
ls -la "$out/bench_results.tar.gz"
