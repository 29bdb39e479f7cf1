#!/usr/bin/env bash
# Rebuilds the demo model's diffusers folder from gpu_train.sh's flat output:
#   bash tools/demo_model/unpack.sh FROM_DIR [TO_DIR=models/demo]
# (TO_DIR keeps its other files, e.g. the model card README.md.)
set -euo pipefail
FROM="${1:?usage: unpack.sh FROM_DIR [TO_DIR]}"
TO="${2:-models/demo}"
mkdir -p "$TO"
tar -C "$TO" -xf "$FROM/model_meta.tar"
install -m 644 "$FROM/text_encoder.safetensors" "$TO/text_encoder/model.safetensors"
install -m 644 "$FROM/unet.safetensors" "$TO/unet/diffusion_pytorch_model.safetensors"
install -m 644 "$FROM/vae.safetensors" "$TO/vae/diffusion_pytorch_model.safetensors"
find "$TO" -type f | sort | xargs ls -l
