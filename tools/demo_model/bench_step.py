"""Where a demo training step's time goes, measured on the training device in well under a minute:
scene sampling (one CPU process), rendering (sdf vs supersampled), VAE encode, and a full UNet + text
encoder training step (bf16 autocast, AdamW), per batch size and memory format. Run it before a long run:

  python3 tools/demo_model/bench_step.py                 (GPU: real config, batches 256 and 512)
  python3 tools/demo_model/bench_step.py --toy --batches 8   (CPU smoke test)

The training loop's images/s is about batch / (max(data, 0) + encode + step) ms, with data overlapped only
for the CPU part (sampling runs in worker processes; rendering runs on the device, in line).
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M  # noqa: E402
import shapes  # noqa: E402
import shapes_torch  # noqa: E402
from train import autocast  # noqa: E402


def timed(fn, device, reps):
    """Mean seconds per call of fn() after one warm-up call, synchronising the device around the reps."""
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.time()
    for _ in range(reps):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.time() - t) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--toy", action="store_true")
    ap.add_argument("--batches", default="256,512")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="also time a torch.compile'd UNet")
    a = ap.parse_args()
    dev = a.device
    if dev.startswith("cuda"):
        torch.backends.cudnn.benchmark = True
    size = 64 if a.toy else M.IMAGE_SIZE
    tcfg, ucfg, vcfg = (M.TOY_TEXT, M.TOY_UNET, M.TOY_VAE) if a.toy else (M.TEXT_CONFIG, M.UNET_CONFIG, M.VAE_CONFIG)
    ucfg, vcfg, tcfg = dict(ucfg, sample_size=size // 4), dict(vcfg, sample_size=size), dict(tcfg, vocab_size=512)
    reps = 2 if a.toy else a.reps
    rng = np.random.RandomState(0)
    t = time.time()
    scenes, _ = shapes.sample_batch(rng, 256, shapes.training_triples(), size)
    print("scene sampling, one CPU process: %.0f scenes/s" % (256 / (time.time() - t)), flush=True)
    vae = M.AutoencoderKL(vcfg).to(dev).eval().requires_grad_(False)
    acp = M.scaled_linear_alphas_cumprod().to(dev)
    for b in (int(x) for x in a.batches.split(",")):
        arrays = shapes.scene_arrays([scenes[i % len(scenes)] for i in range(b)])
        r_sdf = timed(lambda: shapes_torch.render_arrays(*arrays, w=size, device=dev), dev, reps)
        r_ss = timed(lambda: shapes.render_arrays(*arrays, w=size, device=dev), dev, max(1, reps // 4))
        x = shapes_torch.render_arrays(*arrays, w=size, device=dev)

        def encode():
            with torch.no_grad(), autocast(dev):
                return vae.encode(x)[0].float()
        enc = timed(encode, dev, reps)
        z0 = encode()
        ids = torch.randint(0, 512, (b, 77), device=dev)
        for cl in (False, True):
            for comp in ((False, True) if a.compile else (False,)):
                te, unet = M.CLIPTextModel(tcfg).to(dev), M.UNet2DConditionModel(ucfg).to(dev)
                fmt = torch.channels_last if cl else torch.contiguous_format
                unet = unet.to(memory_format=fmt)
                fwd = torch.compile(unet) if comp else unet
                params = list(te.parameters()) + list(unet.parameters())
                opt = torch.optim.AdamW(params, lr=1e-4)

                def step():
                    t_ = torch.randint(0, 1000, (b,), device=dev)
                    noise = torch.randn_like(z0)
                    ab = acp[t_][:, None, None, None]
                    zt = (ab.sqrt() * z0 + (1 - ab).sqrt() * noise).contiguous(memory_format=fmt)
                    with autocast(dev):
                        pred = fwd(zt, t_, te(ids))
                    loss = F.mse_loss(pred.float(), noise)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    opt.step()
                st = timed(step, dev, reps)
                total = r_sdf + enc + st
                print("batch %d%s%s: render sdf %.1f ms (ss %.1f ms), vae encode %.1f ms, unet step %.1f ms"
                      " -> ~%.0f img/s (with ss render ~%.0f)" % (
                          b, " channels_last" if cl else "", " compiled" if comp else "", 1e3 * r_sdf, 1e3 * r_ss,
                          1e3 * enc, 1e3 * st, b / total, b / (r_ss + enc + st)), flush=True)


if __name__ == "__main__":
    main()
