"""Parity inputs/outputs for an exported demo model: proves the torch modules (model.py) compute what Atelier's
engine computes with the same fp16 weights, before any GPU time is spent.

  python3 tools/demo_model/parity.py MODEL_DIR OUT.safetensors
  ATELIER_DEMO_PARITY=OUT.safetensors ATELIER_DEMO_PARITY_MODEL=MODEL_DIR \
      ./build/tests/atelier_tests --gtest_filter='DemoParity*'

Writes fixed inputs (token ids of a caption, a latent, timesteps, an image) and the torch outputs of the text
encoder, UNet, VAE decoder and VAE encoder (mean), computed in float32 from the fp16 weights.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import export  # noqa: E402
import shapes  # noqa: E402


@torch.no_grad()
def main(model_dir, out_path):
    te, unet, vae, _ = export.load_exported(model_dir)
    tok = bpe.CaptionTokenizer(os.path.join(model_dir, "tokenizer"))
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([tok("two small yellow stars on a purple background"), tok("")], dtype=torch.int64)
    ctx = te(ids)
    side = unet.cfg["sample_size"]
    z = torch.randn(2, 4, side, side, generator=g)
    t = torch.tensor([999.0, 321.0])
    eps = unet(z, t, ctx)
    img_side = vae.cfg["sample_size"]
    rng = __import__("numpy").random.RandomState(0)
    scenes, _ = shapes.sample_batch(rng, 1, shapes.all_triples(), img_side)
    image = shapes.render(scenes, w=img_side)
    dec_in = z[:1] * 0.5
    dec = vae.decode(dec_in)
    mean, _ = vae.encode(image)
    export.save_safetensors({"ids": ids.to(torch.int32), "context": ctx, "latent": z, "timesteps": t, "eps": eps,
                             "decode_in": dec_in, "decoded": dec, "image": image, "encoded_mean": mean}, out_path)
    print("wrote", out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
