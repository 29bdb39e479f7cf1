#!/usr/bin/env bash
# Trains the demo model on the GPU machine in one command (~8 minutes), from the repository root:
#   OUT=/some/dir bash tools/demo_model/gpu_train.sh [extra train.py flags]
# Writes $OUT/demo/model (the diffusers folder to commit as models/demo), $OUT/demo/train.log,
# $OUT/demo/train_stats.json and $OUT/demo/heldout_samples.png (the 50 held-out prompts' torch samples); prints progress and, at the end, the held-out adherence measured with the torch
# model (DDIM 20 steps, CFG 7; the engine's own figure comes from bench/demo_adherence afterwards).
set -euo pipefail
: "${OUT:?set OUT to the output folder}"
MINUTES="${DEMO_MINUTES:-7.5}"
mkdir -p "$OUT/demo"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
python3 -c 'import torch, numpy; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "numpy", numpy.__version__)'
python3 -u tools/demo_model/train.py --minutes "$MINUTES" --out "$OUT/demo" --batch 256 --vae-batch 64 \
  --log-every 200 --verbose-eval "$@" 2>&1 | tee "$OUT/demo/train.log"
rm -rf "$OUT/demo/tokenizer_src"
du -ab "$OUT/demo/model" | sort -n | tail -12
