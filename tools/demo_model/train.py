"""Trains the Atelier demo model (SD 1.x architecture, tiny) on procedural shapes, time-boxed, and exports it.

  python3 tools/demo_model/train.py --minutes 7.5 --out OUT            (GPU: the real model)
  python3 tools/demo_model/train.py --toy --minutes 1.5 --out /tmp/toy (CPU: a smoke test at toy scale)

Phases, sharing the --minutes budget: (1) the KL VAE (L1 + L2 reconstruction, small KL), (2) its latent
scale (1 / std of the latents), (3) UNet + text encoder jointly on latents (epsilon or v prediction, SD 1.5's
scaled_linear betas, 10% empty captions for classifier-free guidance, EMA of the weights), (4) export of
the EMA weights in fp16 as a diffusers folder OUT/model, (5) if time is left, a quick adherence estimate
with the torch model (DDIM 20 steps, CFG 7) on the held-out prompts. Data is rendered on the fly on the
training device (shapes_torch: one signed-distance pass per pixel; --render ss keeps shapes.py's 4x4
supersampling); scenes are sampled and captions tokenized by worker processes, which hand over small arrays.
After the held-out prompts, 20 prompts from the training distribution are evaluated too: a model that fails
those does not draw yet; one that passes them but not the held-out ones does not generalise.
"""
import argparse
import copy
import json
import math
import os
import multiprocessing as mp
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import export  # noqa: E402
import model as M  # noqa: E402
import shapes  # noqa: E402
import shapes_torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
KL_WEIGHT = 1e-6
CAPTION_DROPOUT = 0.1
EMA_DECAY = 0.999
WARMUP_STEPS = 200
LR_FLOOR = 0.1  # cosine decay to this fraction of the peak over the UNet phase


def log(t0, msg):
    print("[%6.1fs] %s" % (time.time() - t0, msg), flush=True)


def _batch_worker(q, seed, batch, size, tok, triples):
    """Worker process: scene sampling + tokenization on the CPU, queued as numpy arrays (or the exception)."""
    try:
        rng = np.random.RandomState(seed)
        while True:
            scenes, caps = shapes.sample_batch(rng, batch, triples, size)
            caps = ["" if rng.rand() < CAPTION_DROPOUT else c for c in caps]
            ids = np.array([tok(c) for c in caps], np.int64)
            q.put((shapes.scene_arrays(scenes), ids))
    except Exception as e:  # handed to the training loop, which re-raises it
        q.put(e)


class Batches:
    """Worker processes sample scenes (numpy, ~0.5 ms each: too slow for one thread at GPU speed); the
    training loop renders them on its device."""

    def __init__(self, seed, batch, size, tokenizer, triples, workers, render="sdf"):
        self.render = shapes_torch.render_arrays if render == "sdf" else shapes.render_arrays
        ctx = mp.get_context("fork")
        self.q = ctx.Queue(maxsize=4 * workers)
        self.procs = [ctx.Process(target=_batch_worker, args=(self.q, seed * 1000 + i, batch, size, tokenizer, triples),
                                  daemon=True) for i in range(workers)]
        for p in self.procs:
            p.start()

    def next(self, device, size, n=None):
        """-> images [n, 3, size, size] in [-1, 1], token ids [n, 77] (n: at most the workers' batch)."""
        item = self.q.get()
        if isinstance(item, Exception):
            raise item
        arrays, ids = item
        arrays, ids = [x[:n] for x in arrays], ids[:n]  # render only what is used
        return self.render(*arrays, w=size, device=device), torch.from_numpy(ids).to(device)

    def close(self):
        for p in self.procs:
            p.terminate()


def autocast(device):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def cosine_lr(peak, start, deadline):
    """The learning rate now on a cosine from `peak` at `start` to LR_FLOOR * peak at `deadline` (wall time)."""
    frac = min((time.time() - start) / max(deadline - start, 1e-6), 1.0)
    return peak * (LR_FLOOR + (1 - LR_FLOOR) * 0.5 * (1 + math.cos(math.pi * frac)))


def set_lr(opt, lr):
    for g in opt.param_groups:
        g["lr"] = lr


def train_vae(vae, data, a, deadline, t0):
    opt = torch.optim.AdamW(vae.parameters(), lr=a.vae_lr, weight_decay=0.0)
    step, start, loss = 0, time.time(), None
    while time.time() < deadline:
        # Cosine decay to LR_FLOOR: the colour precision the checker needs comes late, at small steps.
        set_lr(opt, cosine_lr(a.vae_lr, start, deadline))
        x, _ = data.next(a.device, a.size, a.vae_batch)
        with autocast(a.device):
            mean, logvar = vae.encode(x)
            z = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
            rec = vae.decode(z)
        rec = rec.float()
        kl = 0.5 * (mean.float() ** 2 + logvar.float().exp() - 1 - logvar.float()).mean()
        loss = F.l1_loss(rec, x) + F.mse_loss(rec, x) + KL_WEIGHT * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % a.log_every == 0:
            log(t0, "vae step %d loss %.4f kl %.1f  %.0f img/s" % (step, loss.item(), kl.item(),
                                                               step * x.shape[0] / (time.time() - start)))
        if a.vae_target and step % a.vae_check_every == 0:
            # Stop as soon as the round trip is good enough: the rest of the budget is the UNet's.
            vae.eval()
            passed = vae_roundtrip_check(vae, a, t0)
            vae.train()
            if passed >= a.vae_target:
                break
    log(t0, "vae done: %d steps, last loss %.4f" % (step, float("nan") if loss is None else loss.item()))
    return step


def edge_weights(x, weight):
    """[B, 3, H, W] images -> [B, 1, H, W]: 1 + weight on pixels within one pixel of a colour edge (where a
    small star's points and a triangle's corners are, which flat-area losses barely see)."""
    gx = (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().amax(1, keepdim=True)
    gy = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().amax(1, keepdim=True)
    edge = torch.zeros_like(x[:, :1])
    edge[:, :, :, 1:] += gx
    edge[:, :, :, :-1] += gx
    edge[:, :, 1:, :] += gy
    edge[:, :, :-1, :] += gy
    edge = F.max_pool2d((edge > 0.05).float(), 3, stride=1, padding=1)
    return 1.0 + weight * edge


def finetune_decoder(vae, data, a, deadline, t0):
    """The decoder (and post_quant_conv) only, the encoder frozen: the latent space a resumed UNet learnt
    stays exactly the same while reconstructions sharpen; edge pixels weigh more (edge_weights). The best
    decoder by round trip (vae_roundtrip_check every --vae-check-every steps) is kept."""
    frozen = {id(p) for p in list(vae.encoder.parameters()) + list(vae.quant_conv.parameters())}
    params = [p for p in vae.parameters() if id(p) not in frozen]
    for p in vae.parameters():
        p.requires_grad_(id(p) not in frozen)
    opt = torch.optim.AdamW(params, lr=a.decoder_lr, weight_decay=0.0)
    best = (vae_roundtrip_check(vae.eval(), a, t0), copy.deepcopy(vae.decoder.state_dict()),
            copy.deepcopy(vae.post_quant_conv.state_dict()))
    vae.decoder.train()
    step, start = 0, time.time()
    while time.time() < deadline:
        set_lr(opt, cosine_lr(a.decoder_lr, start, deadline))
        x, _ = data.next(a.device, a.size, a.vae_batch)
        with torch.no_grad(), autocast(a.device):
            mean, logvar = vae.encode(x)
            z = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
        with autocast(a.device):
            rec = vae.decode(z.float())
        w = edge_weights(x, a.edge_weight)
        err = rec.float() - x
        loss = (w * (err.abs() + err * err)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % a.vae_check_every == 0:
            passed = vae_roundtrip_check(vae.eval(), a, t0)
            vae.decoder.train()
            if passed > best[0]:
                best = (passed, copy.deepcopy(vae.decoder.state_dict()), copy.deepcopy(vae.post_quant_conv.state_dict()))
    vae.decoder.load_state_dict(best[1])
    vae.post_quant_conv.load_state_dict(best[2])
    vae.eval().requires_grad_(False)
    log(t0, "decoder fine-tune done: %d steps, kept the round trip of %d/50" % (step, best[0]))
    return best[0]


@torch.no_grad()
def latent_scale(vae, data, a):
    vals = []
    for _ in range(4):
        x, _ = data.next(a.device, a.size)
        with autocast(a.device):
            vals.append(vae.encode(x)[0].float())
    return 1.0 / torch.cat(vals).std().item()


@torch.no_grad()
def vae_roundtrip_check(vae, a, t0, n=50):
    """Share of training-distribution images that still pass the checker after encode + decode: an upper
    bound for the model's adherence (a VAE that blurs shapes caps it)."""
    import check
    rng = np.random.RandomState(12345)
    scenes, _ = shapes.sample_batch(rng, n, shapes.all_triples(), a.size)
    x = shapes.render(scenes, w=a.size, device=a.device)
    with autocast(a.device):
        rec = vae.decode(vae.encode(x)[0]).float()
    ok = sum(check.check(shapes.to_uint8(r), s.caption())[0] for r, s in zip(rec, scenes))
    log(t0, "vae round trip: L1 %.4f, checker passes %d/%d" % ((rec - x).abs().mean().item(), ok, n))
    return ok


def save_grid(images, path, cols=10):
    from PIL import Image
    h, w, _ = images[0].shape
    rows = (len(images) + cols - 1) // cols
    grid = np.zeros((rows * h, cols * w, 3), np.uint8)
    for i, im in enumerate(images):
        grid[(i // cols) * h:(i // cols + 1) * h, (i % cols) * w:(i % cols + 1) * w] = im
    Image.fromarray(grid).save(path)


def ema_update(ema, live, decay):
    """ema = decay * ema + (1 - decay) * live, in a few fused launches where torch has them."""
    with torch.no_grad():
        e, p = list(ema.parameters()), [q.detach() for q in live.parameters()]
        if hasattr(torch, "_foreach_mul_"):
            torch._foreach_mul_(e, decay)
            torch._foreach_add_(e, p, alpha=1 - decay)
        else:
            for a, b in zip(e, p):
                a.mul_(decay).add_(b, alpha=1 - decay)


def training_target(prediction, z0, noise, ab):
    """What the UNet learns to output: the noise (epsilon) or v = sqrt(ab) noise - sqrt(1 - ab) z0.
    z0, noise [B, 4, h, w]; ab [B, 1, 1, 1] (alphas_cumprod at each sample's timestep)."""
    if prediction == "v":
        return ab.sqrt() * noise - (1 - ab).sqrt() * z0
    return noise


def x0_and_eps(prediction, z, out, a_t):
    """The model output `out` at latent z and alphas_cumprod a_t -> (x0, epsilon) estimates."""
    if prediction == "v":
        return a_t.sqrt() * z - (1 - a_t).sqrt() * out, a_t.sqrt() * out + (1 - a_t).sqrt() * z
    return (z - (1 - a_t).sqrt() * out) / a_t.sqrt(), out


def train_unet(te, unet, vae, scale, data, a, deadline, t0):
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    unet = unet.to(memory_format=fmt)  # NHWC convs can be faster under bf16 (bench_step.py measures it)
    params = list(te.parameters()) + list(unet.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.01, betas=(0.9, 0.99))
    ema_te, ema_unet = copy.deepcopy(te).eval(), copy.deepcopy(unet).eval()
    acp = M.scaled_linear_alphas_cumprod().to(a.device)
    start, step, seen = time.time(), 0, 0
    run_loss = None
    fwd = torch.compile(unet) if a.compile else unet
    while time.time() < deadline:
        peak = cosine_lr(a.lr, start, deadline) if a.lr_decay == "cosine" else a.lr
        lr = peak * min(1.0, (step + 1) / a.warmup)
        set_lr(opt, lr)
        probe = (step + 1) % a.log_every == 0 and a.device.startswith("cuda")
        if probe:  # how much of a step the data costs: synchronised only on logging steps
            torch.cuda.synchronize()
            td = time.time()
        x, ids = data.next(a.device, a.size)
        if probe:
            torch.cuda.synchronize()
            data_ms = 1000 * (time.time() - td)
        with torch.no_grad(), autocast(a.device):
            mean, logvar = vae.encode(x)
            z0 = (mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)).float() * scale
        t = torch.randint(0, 1000, (x.shape[0],), device=a.device)
        noise = torch.randn_like(z0)
        if a.offset_noise > 0:
            # Offset noise: a per-sample, per-channel constant in the noise, so that training also destroys
            # (and the model learns to set) the latent mean, i.e. flat background colours; with SD's
            # schedule 7% of the signal survives the last timestep and sampling from zero-mean noise
            # otherwise draws averaged, pale colours (models/demo/README.md, second run).
            noise = noise + a.offset_noise * torch.randn(z0.shape[0], z0.shape[1], 1, 1, device=z0.device)
        ab = acp[t][:, None, None, None]
        zt = (ab.sqrt() * z0 + (1 - ab).sqrt() * noise).contiguous(memory_format=fmt)
        with autocast(a.device):
            pred = fwd(zt, t, te(ids))
        loss = F.mse_loss(pred.float(), training_target(a.prediction, z0, noise, ab))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        seen += x.shape[0]
        decay = min(EMA_DECAY, (1 + step) / (10 + step))
        ema_update(ema_te, te, decay)
        ema_update(ema_unet, unet, decay)
        # A running mean kept on the device: reading a loss every step would stall the CPU on the GPU.
        run_loss = loss.detach() if run_loss is None else 0.98 * run_loss + 0.02 * loss.detach()
        if step % a.log_every == 0:
            el = time.time() - start
            msg = "unet step %d loss %.4f (avg %.4f) lr %.2e  %.0f img/s" % (step, loss.item(), run_loss.item(), lr, seen / el)
            if probe:
                msg += "  (data %.1f ms of %.1f ms/step)" % (data_ms, 1000 * el / step)
            log(t0, msg)
    run_loss = float("nan") if run_loss is None else run_loss.item()
    log(t0, "unet done: %d steps, %d images, avg loss %.4f" % (step, seen, run_loss))
    return ema_te, ema_unet, step, seen, run_loss


@torch.no_grad()
def sample(te, unet, vae, scale, tok, prompts, device, steps=20, cfg=7.0, seed=0, latent=32, prediction="epsilon"):
    """DDIM (eta 0), SD's 'leading' spacing with steps_offset 1; -> uint8 HWC images."""
    acp = M.scaled_linear_alphas_cumprod().to(device)
    ts = (np.arange(steps) * (1000 // steps))[::-1] + 1
    g = torch.Generator(device="cpu").manual_seed(seed)
    z = torch.randn(len(prompts), 4, latent, latent, generator=g).to(device)
    cond = te(torch.tensor([tok(p) for p in prompts], device=device))
    unc = te(torch.tensor([tok("")] * len(prompts), device=device))
    ctx = torch.cat([unc, cond])
    for i, t in enumerate(ts):
        with autocast(device):
            e = unet(torch.cat([z, z]), torch.full((2 * len(prompts),), int(t), device=device), ctx).float()
        eu, ec = e.chunk(2)
        a_t = acp[t]
        a_prev = acp[ts[i + 1]] if i + 1 < len(ts) else acp[0]
        x0, eps = x0_and_eps(prediction, z, eu + cfg * (ec - eu), a_t)
        z = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
    with autocast(device):
        img = vae.decode(z / scale).float()
    return [shapes.to_uint8(im) for im in img]


def training_prompts(n=20, seed=99):
    """Prompts of seen (colour, shape, background) triples, size always named, some positions."""
    rng = np.random.RandomState(seed)
    return [shapes.sample_scene(rng, shapes.training_triples()).caption(rng, name_size=True) for _ in range(n)]


def evaluate(te, unet, vae, scale, tok, a, t0, deadline, prompts, name, all_imgs):
    """Adherence on `prompts` (torch, DDIM 20, CFG 7). Samples are appended to all_imgs and the grid
    OUT/heldout_samples.png rewritten after every chunk, so whatever was drawn is on disk even if a later
    chunk fails or the deadline cuts it short."""
    import check
    passed, done = 0, 0
    for i in range(0, len(prompts), 10):
        if time.time() > deadline:
            break
        imgs = sample(te, unet, vae, scale, tok, prompts[i:i + 10], a.device, latent=a.size // 4,
                      prediction=a.prediction)
        all_imgs += imgs
        save_grid(all_imgs, os.path.join(a.out, "heldout_samples.png"))
        for p, im in zip(prompts[i:i + 10], imgs):
            ok, _, got = check.check(im, p)
            passed += int(ok)
            done += 1
            if not ok and a.verbose_eval:
                print("  FAIL %s -> %s" % (p, got))
    if done:
        log(t0, "%s adherence (torch, DDIM 20, CFG 7): %d/%d = %.0f%%" % (name, passed, done, 100.0 * passed / done))
    return passed, done


def write_stats(stats, a):
    # numpy scalars (the checker's counts) as plain numbers: json cannot write np.int64.
    stats = {k: (v.item() if hasattr(v, "item") else v) for k, v in stats.items()}
    with open(os.path.join(a.out, "train_stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    return stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder; the model goes to OUT/model")
    ap.add_argument("--minutes", type=float, default=7.5, help="wall-time budget for everything")
    ap.add_argument("--toy", action="store_true", help="tiny config, 64 px, CPU-sized batches")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vae-batch", type=int, default=64)
    ap.add_argument("--vae-frac", type=float, default=0.25, help="share of the budget for the VAE")
    ap.add_argument("--eval-frac", type=float, default=0.08, help="share kept for export + evaluation")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--offset-noise", type=float, default=0.1, help="std of the per-channel noise offset (0: off)")
    ap.add_argument("--vae-lr", type=float, default=1e-3)
    ap.add_argument("--vae-target", type=int, default=0,
                    help="end the VAE phase early once its round trip passes this many of 50 images (0: never)")
    ap.add_argument("--vae-check-every", type=int, default=400, help="VAE steps between round-trip checks")
    ap.add_argument("--decoder-minutes", type=float, default=0.0,
                    help="after the VAE phase (or --resume), fine-tune the decoder alone this long (encoder frozen)")
    ap.add_argument("--decoder-lr", type=float, default=3e-4)
    ap.add_argument("--edge-weight", type=float, default=4.0, help="extra loss weight of edge pixels in the decoder fine-tune")
    ap.add_argument("--lr-decay", choices=["cosine", "none"], default="cosine",
                    help="UNet learning rate over the phase: cosine to 10%%, or constant (a run continued later)")
    ap.add_argument("--warmup", type=int, default=WARMUP_STEPS, help="UNet learning-rate warm-up steps")
    ap.add_argument("--resume", metavar="DIR",
                    help="continue from an exported folder: its VAE and latent scale are kept (no VAE phase), "
                         "its EMA text encoder and UNet become the live and EMA weights (AdamW restarts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)),
                    help="scene-sampling processes")
    ap.add_argument("--render", choices=["sdf", "ss"], default="sdf",
                    help="sdf: shapes_torch's one-pass renderer; ss: shapes.py's 4x4 supersampling (the old path)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--compile", action="store_true", help="torch.compile the UNet (only where seen to work)")
    ap.add_argument("--channels-last", action="store_true", help="UNet in channels_last (try bench_step.py first)")
    ap.add_argument("--prediction", choices=["epsilon", "v"], default=None,
                    help="UNet target: the noise, or v (sqrt(ab) noise - sqrt(1-ab) x0), whose loss at high noise "
                         "weighs the layout (positions) as much as the details; written to the scheduler config "
                         "(default: the resumed model's, else epsilon)")
    ap.add_argument("--p-position", type=float, default=shapes.P_POSITION,
                    help="share of single-shape captions that name a position")
    ap.add_argument("--verbose-eval", action="store_true")
    ap.add_argument("--no-eval", action="store_true", help="skip the adherence estimate")
    a = ap.parse_args()
    t0 = time.time()
    end = t0 + a.minutes * 60
    torch.manual_seed(a.seed)
    if a.device.startswith("cuda"):
        torch.backends.cudnn.benchmark = True
        try:  # fp32 leftovers outside autocast; the flag's spelling moves between torch versions
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        except (AttributeError, RuntimeError):
            pass
    tcfg, ucfg, vcfg = (M.TOY_TEXT, M.TOY_UNET, M.TOY_VAE) if a.toy else (M.TEXT_CONFIG, M.UNET_CONFIG, M.VAE_CONFIG)
    a.size = 64 if a.toy else M.IMAGE_SIZE
    ucfg = dict(ucfg, sample_size=a.size // 4)
    vcfg = dict(vcfg, sample_size=a.size)
    if a.toy:
        a.batch, a.vae_batch, a.log_every = min(a.batch, 8), min(a.vae_batch, 8), min(a.log_every, 10)
    if a.toy:  # the one-pass renderer must keep drawing what shapes.py's supersampling draws
        diff, worst = shapes_torch.mean_abs_diff(n=32, w=a.size)
        log(t0, "render check: sdf vs supersampled mean abs diff %.2f/255 (worst image %.2f/255)" % (255 * diff, 255 * worst))
        assert diff < shapes_torch.MAX_MEAN_ABS_DIFF
    if a.prediction is None:  # a resumed model keeps its target unless told otherwise
        a.prediction = export.exported_prediction(a.resume) if a.resume else "epsilon"
    shapes.P_POSITION = a.p_position  # before the worker processes fork
    tok_dir = os.path.join(a.out, "tokenizer_src")
    bpe.write(tok_dir)
    tok = bpe.CaptionTokenizer(tok_dir)
    tcfg = dict(tcfg, vocab_size=len(tok.vocab))
    data = Batches(a.seed, a.batch, a.size, tok, shapes.training_triples(), a.workers, a.render)
    if a.resume:
        te, unet, vae, scale = export.load_exported(a.resume)
        te, unet, vae = (m.to(a.device).train() for m in (te, unet, vae))
        with open(os.path.join(a.resume, "tokenizer", "vocab.json")) as f1, open(os.path.join(tok_dir, "vocab.json")) as f2:
            assert json.load(f1) == json.load(f2), "the resumed model's vocabulary is not bpe.py's"
        log(t0, "resumed from %s (latent scaling factor %.4f)" % (a.resume, scale))
    else:
        te, unet, vae = (m.to(a.device) for m in (M.CLIPTextModel(tcfg), M.UNet2DConditionModel(ucfg), M.AutoencoderKL(vcfg)))
    log(t0, "device %s, torch %s; params: text %.2fM unet %.2fM vae %.2fM; image %d px" % (
        a.device, torch.__version__, *(sum(p.numel() for p in m.parameters()) / 1e6 for m in (te, unet, vae)), a.size))
    if not a.resume:
        budget = end - time.time()
        vae_deadline = time.time() + a.vae_frac * budget
        train_vae(vae, data, a, vae_deadline, t0)
    vae.eval().requires_grad_(False)
    if a.decoder_minutes > 0:
        finetune_decoder(vae, data, a, time.time() + 60 * a.decoder_minutes, t0)
    if not a.resume:
        scale = latent_scale(vae, data, a)
        log(t0, "latent scaling factor %.4f" % scale)
    vae_ok = vae_roundtrip_check(vae, a, t0)
    unet_deadline = end - a.eval_frac * (end - t0)
    ema_te, ema_unet, steps, seen, final_loss = train_unet(te, unet, vae, scale, data, a, unet_deadline, t0)
    data.close()
    stats = {"resumed_from": a.resume, "vae_roundtrip_passed": vae_ok, "unet_final_loss": final_loss, "unet_steps": steps, "images_seen": seen, "batch": a.batch, "minutes": a.minutes, "prediction": a.prediction, "p_position": a.p_position,
             "latent_scaling_factor": scale, "torch": torch.__version__, "device": a.device}
    write_stats(stats, a)  # on disk first: the evaluation or the export may still fail
    # The sample grid comes before the export (it says most about a failed run); an evaluation error is
    # logged, never allowed to cost the weights.
    try:
        evaluate_all(ema_te, ema_unet, vae, scale, tok, a, t0, end, stats)
    except Exception:
        import traceback
        traceback.print_exc()
        log(t0, "evaluation failed (above); exporting anyway")
    model_dir = os.path.join(a.out, "model")
    export.export_diffusers(model_dir, ema_te.float(), ema_unet.float(), vae.float(), scale, tok_dir, a.prediction)
    log(t0, "exported %s" % model_dir)
    stats = write_stats(stats, a)
    log(t0, "done: %s" % json.dumps(stats))


def evaluate_all(ema_te, ema_unet, vae, scale, tok, a, t0, end, stats):
    """Held-out, then training-distribution adherence; fills `stats` and rewrites train_stats.json."""
    if not a.no_eval:
        # One grid (the device machine hands back at most 8 files): rows 1-5 the 50 held-out prompts,
        # rows 6-7 the 20 training-distribution prompts.
        models, grid = (ema_te, ema_unet, vae, scale, tok, a, t0), []
        passed, done = evaluate(*models, end + 15, shapes.heldout_prompts(), "held-out", grid)
        stats.update(heldout_passed=passed, heldout_evaluated=done)
        write_stats(stats, a)
        grid += [np.zeros_like(grid[0])] * (-len(grid) % 10) if grid else []  # start a fresh row
        passed, done = evaluate(*models, end + 30, training_prompts(), "training-distribution", grid)
        stats.update(train_dist_passed=passed, train_dist_evaluated=done)
        write_stats(stats, a)


if __name__ == "__main__":
    main()
