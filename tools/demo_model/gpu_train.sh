#!/usr/bin/env bash
# Trains the demo model on the GPU machine in one command (~8 minutes), from the repository root:
#   OUT=/some/dir bash tools/demo_model/gpu_train.sh [extra train.py flags]
# Prints progress and, at the end, the held-out adherence measured with the torch model (DDIM 20 steps,
# CFG 7; the engine's own figure comes from bench/demo_adherence afterwards).
#
# The device machine returns at most 8 files, each directly under $OUT (or one folder down) and under
# 16 MiB, so the diffusers folder is trained into a scratch folder and handed back flat (7 files):
#   $OUT/model_meta.tar                     configs + tokenizer (every model file but the weights)
#   $OUT/{text_encoder,unet,vae}.safetensors  the fp16 weights
#   $OUT/train.log  $OUT/train_stats.json  $OUT/heldout_samples.png
# heldout_samples.png: rows 1-5 the 50 held-out prompts, rows 6-7 the 20 training-distribution prompts.
# Extra flags go to train.py and win over the defaults below (e.g. --batch 512, --vae-frac 0.3, --render ss).
# tools/demo_model/unpack.sh $OUT models/demo  rebuilds the folder.
set -euo pipefail
: "${OUT:?set OUT to the output folder}"
MINUTES="${DEMO_MINUTES:-7.5}"
PY="${PYTHON:-python3}"
WORK="${DEMO_WORK:-/tmp/atelier_demo_train}"
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
"$PY" -c 'import torch, numpy; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "numpy", numpy.__version__)'
"$PY" -u tools/demo_model/train.py --minutes "$MINUTES" --out "$WORK" --batch 256 --vae-batch 64 \
  --log-every 200 --verbose-eval "$@" 2>&1 | tee "$OUT/train.log"
M="$WORK/model"
tar -C "$M" -cf "$OUT/model_meta.tar" --exclude='*.safetensors' .
cp "$M/text_encoder/model.safetensors" "$OUT/text_encoder.safetensors"
cp "$M/unet/diffusion_pytorch_model.safetensors" "$OUT/unet.safetensors"
cp "$M/vae/diffusion_pytorch_model.safetensors" "$OUT/vae.safetensors"
cp "$WORK/train_stats.json" "$OUT/"
[ -f "$WORK/heldout_samples.png" ] && cp "$WORK/heldout_samples.png" "$OUT/"
ls -l "$OUT"
