"""Stable Diffusion 1.x modules written from scratch (no diffusers), for the Atelier demo model.

Each module's state_dict() keys and shapes are exactly those of diffusers' UNet2DConditionModel and
AutoencoderKL and of transformers' CLIPTextModel, and the forward passes compute what those classes compute,
so the exported folder loads in any SD 1.x tool and in Atelier (src/models/*). Only the features SD 1.x uses
are written: epsilon UNet with conv proj_in/out, GEGLU feed-forward, positional timesteps; KL VAE with a
single-head mid attention; CLIP text tower with quick_gelu and a causal mask.

Works with torch 1.13 (CPU test machine) and torch 2.x (the GPU machine).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------------------
# The demo model's configuration (see models/demo/README.md). 128x128 images, a VAE that downsamples by 4
# (three levels), 32x32x4 latents.
IMAGE_SIZE = 128
TEXT_CONFIG = dict(vocab_size=None, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                   num_attention_heads=4, max_position_embeddings=77, layer_norm_eps=1e-5, hidden_act="quick_gelu")
# The UNet's fp16 file must stay under 16 MiB (the largest file the GPU machine hands back): 7.4 M params, 14.8 MB.
# Cross-attention at 16x16 and 8x8 only (and plain conv blocks at 32x32, 32 channels): 20 CFG steps stay a
# few seconds on a CPU (~0.2 GFLOP per image per step).
UNET_CONFIG = dict(sample_size=32, in_channels=4, out_channels=4, block_out_channels=[32, 96, 160],
                   down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
                   up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
                   layers_per_block=2, attention_head_dim=4, cross_attention_dim=128, norm_num_groups=32,
                   norm_eps=1e-5)
VAE_CONFIG = dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=[32, 64, 64],
                  layers_per_block=1, norm_num_groups=32, sample_size=IMAGE_SIZE)
TOY_TEXT = dict(TEXT_CONFIG, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
TOY_UNET = dict(UNET_CONFIG, block_out_channels=[32, 32, 64], cross_attention_dim=32, layers_per_block=1,
                attention_head_dim=2)
TOY_VAE = dict(VAE_CONFIG, block_out_channels=[32, 32, 32])


def _sdpa(q, k, v, causal=False):
    """Attention over [B, heads, N, d] tensors (causal: each query sees keys up to its own position); torch 2's
    fused kernel when there, else the plain formula (torch 1.13)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        w = w.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.matmul(w.softmax(dim=-1), v)


# ------------------------------------------------------------------------------------------------- UNet --
class ResnetBlock2D(nn.Module):
    def __init__(self, cin, cout, temb_ch, groups, eps):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=eps)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb_ch, cout) if temb_ch else None
        self.norm2 = nn.GroupNorm(groups, cout, eps=eps)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, temb=None):  # x [B, cin, H, W], temb [B, temb_ch] -> [B, cout, H, W]
        h = self.conv1(F.silu(self.norm1(x)))
        if self.time_emb_proj is not None:
            h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.conv_shortcut(x) if self.conv_shortcut is not None else x) + h


class Attention(nn.Module):
    """diffusers' Attention for the UNet transformer: q/k/v without bias, to_out.0 with bias."""

    def __init__(self, dim, ctx_dim, heads):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(ctx_dim, dim, bias=False)
        self.to_v = nn.Linear(ctx_dim, dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])

    def forward(self, x, ctx=None):  # x [B, N, dim], ctx [B, M, ctx_dim] -> [B, N, dim]
        ctx = x if ctx is None else ctx
        b, n, d = x.shape
        split = lambda t: t.reshape(b, t.shape[1], self.heads, d // self.heads).transpose(1, 2)
        o = _sdpa(split(self.to_q(x)), split(self.to_k(ctx)), split(self.to_v(ctx)))
        return self.to_out[0](o.transpose(1, 2).reshape(b, n, d))


class GEGLU(nn.Module):
    def __init__(self, dim, inner):
        super().__init__()
        self.proj = nn.Linear(dim, inner * 2)

    def forward(self, x):
        h, gate = self.proj(x).chunk(2, dim=-1)
        return h * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim):
        super().__init__()
        # net.1 is diffusers' Dropout (no weights); ModuleList keeps the indices of the keys.
        self.net = nn.ModuleList([GEGLU(dim, 4 * dim), nn.Identity(), nn.Linear(4 * dim, dim)])

    def forward(self, x):
        return self.net[2](self.net[0](x))


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, ctx_dim, heads):
        super().__init__()
        self.norm1, self.attn1 = nn.LayerNorm(dim), Attention(dim, dim, heads)
        self.norm2, self.attn2 = nn.LayerNorm(dim), Attention(dim, ctx_dim, heads)
        self.norm3, self.ff = nn.LayerNorm(dim), FeedForward(dim)

    def forward(self, x, ctx):  # x [B, N, dim], ctx [B, M, ctx_dim]
        x = x + self.attn1(self.norm1(x))
        x = x + self.attn2(self.norm2(x), ctx)
        return x + self.ff(self.norm3(x))


class Transformer2DModel(nn.Module):
    def __init__(self, ch, ctx_dim, heads, groups):
        super().__init__()
        self.norm = nn.GroupNorm(groups, ch, eps=1e-6)
        self.proj_in = nn.Conv2d(ch, ch, 1)
        self.transformer_blocks = nn.ModuleList([BasicTransformerBlock(ch, ctx_dim, heads)])
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x, ctx):  # x [B, C, H, W], ctx [B, M, ctx_dim] -> [B, C, H, W]
        b, c, h, w = x.shape
        t = self.proj_in(self.norm(x)).permute(0, 2, 3, 1).reshape(b, h * w, c)
        for blk in self.transformer_blocks:
            t = blk(t, ctx)
        return self.proj_out(t.reshape(b, h, w, c).permute(0, 3, 1, 2)) + x


class Downsample(nn.Module):
    def __init__(self, ch, padding):
        super().__init__()
        self.padding = padding
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=padding)

    def forward(self, x):
        if self.padding == 0:  # the VAE pads right/bottom only
            x = F.pad(x, (0, 1, 0, 1))
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class UNetBlock(nn.Module):
    """CrossAttnDownBlock2D / DownBlock2D / CrossAttnUpBlock2D / UpBlock2D (same keys, one class)."""

    def __init__(self, resnets, attentions, down=None, up=None):
        super().__init__()
        self.resnets = nn.ModuleList(resnets)
        if attentions:
            self.attentions = nn.ModuleList(attentions)
        if down is not None:
            self.downsamplers = nn.ModuleList([down])
        if up is not None:
            self.upsamplers = nn.ModuleList([up])

    def layer(self, i, x, temb, ctx):
        x = self.resnets[i](x, temb)
        return self.attentions[i](x, ctx) if hasattr(self, "attentions") else x


class UNetMidBlock(nn.Module):
    def __init__(self, ch, temb_ch, ctx_dim, heads, groups, eps):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(ch, ch, temb_ch, groups, eps) for _ in range(2)])
        self.attentions = nn.ModuleList([Transformer2DModel(ch, ctx_dim, heads, groups)])

    def forward(self, x, temb, ctx):
        x = self.resnets[0](x, temb)
        return self.resnets[1](self.attentions[0](x, ctx), temb)


class TimestepEmbedding(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(cin, cout), nn.Linear(cout, cout)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


def timestep_features(t, dim):
    """diffusers' Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0): t [B] -> [B, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    e = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(e), torch.sin(e)], dim=-1)


class UNet2DConditionModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        boc, g, eps, L = cfg["block_out_channels"], cfg["norm_num_groups"], cfg["norm_eps"], cfg["layers_per_block"]
        heads, ctx, temb = cfg["attention_head_dim"], cfg["cross_attention_dim"], 4 * boc[0]
        self.conv_in = nn.Conv2d(cfg["in_channels"], boc[0], 3, padding=1)
        self.time_embedding = TimestepEmbedding(boc[0], temb)
        self.down_blocks = nn.ModuleList()
        cout = boc[0]
        for i, kind in enumerate(cfg["down_block_types"]):
            cin, cout = cout, boc[i]
            res = [ResnetBlock2D(cin if j == 0 else cout, cout, temb, g, eps) for j in range(L)]
            att = [Transformer2DModel(cout, ctx, heads, g) for _ in range(L)] if kind.startswith("CrossAttn") else []
            down = Downsample(cout, 1) if i < len(boc) - 1 else None
            self.down_blocks.append(UNetBlock(res, att, down=down))
        self.mid_block = UNetMidBlock(boc[-1], temb, ctx, heads, g, eps)
        self.up_blocks = nn.ModuleList()
        rev = list(reversed(boc))
        prev = rev[0]
        for i, kind in enumerate(cfg["up_block_types"]):
            cout, cin = rev[i], rev[min(i + 1, len(boc) - 1)]
            res = []
            for j in range(L + 1):
                skip = cin if j == L else cout
                res.append(ResnetBlock2D((prev if j == 0 else cout) + skip, cout, temb, g, eps))
            att = [Transformer2DModel(cout, ctx, heads, g) for _ in range(L + 1)] if kind.startswith("CrossAttn") else []
            up = Upsample(cout) if i < len(boc) - 1 else None
            self.up_blocks.append(UNetBlock(res, att, up=up))
            prev = cout
        self.conv_norm_out = nn.GroupNorm(g, boc[0], eps=eps)
        self.conv_out = nn.Conv2d(boc[0], cfg["out_channels"], 3, padding=1)

    def forward(self, x, t, ctx):  # x [B, 4, h, w], t [B], ctx [B, 77, ctx_dim] -> eps [B, 4, h, w]
        temb = self.time_embedding(timestep_features(t, self.cfg["block_out_channels"][0]).to(x.dtype))
        x = self.conv_in(x)
        skips = [x]
        for blk in self.down_blocks:
            for i in range(len(blk.resnets)):
                x = blk.layer(i, x, temb, ctx)
                skips.append(x)
            if hasattr(blk, "downsamplers"):
                x = blk.downsamplers[0](x)
                skips.append(x)
        x = self.mid_block(x, temb, ctx)
        for blk in self.up_blocks:
            for i in range(len(blk.resnets)):
                x = blk.layer(i, torch.cat([x, skips.pop()], dim=1), temb, ctx)
            if hasattr(blk, "upsamplers"):
                x = blk.upsamplers[0](x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


# -------------------------------------------------------------------------------------------------- VAE --
class VaeAttention(nn.Module):
    """The VAE mid-block attention: one head over all channels, group norm in front, residual."""

    def __init__(self, ch, groups):
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, ch, eps=1e-6)
        self.to_q, self.to_k, self.to_v = nn.Linear(ch, ch), nn.Linear(ch, ch), nn.Linear(ch, ch)
        self.to_out = nn.ModuleList([nn.Linear(ch, ch)])

    def forward(self, x):  # [B, C, H, W]
        b, c, h, w = x.shape
        t = self.group_norm(x).reshape(b, c, h * w).transpose(1, 2)
        o = _sdpa(self.to_q(t)[:, None], self.to_k(t)[:, None], self.to_v(t)[:, None])[:, 0]
        return self.to_out[0](o).transpose(1, 2).reshape(b, c, h, w) + x


class VaeMid(nn.Module):
    def __init__(self, ch, groups):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(ch, ch, 0, groups, 1e-6) for _ in range(2)])
        self.attentions = nn.ModuleList([VaeAttention(ch, groups)])

    def forward(self, x):
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        boc, g, L = cfg["block_out_channels"], cfg["norm_num_groups"], cfg["layers_per_block"]
        self.conv_in = nn.Conv2d(cfg["in_channels"], boc[0], 3, padding=1)
        self.down_blocks = nn.ModuleList()
        cout = boc[0]
        for i in range(len(boc)):
            cin, cout = cout, boc[i]
            res = [ResnetBlock2D(cin if j == 0 else cout, cout, 0, g, 1e-6) for j in range(L)]
            self.down_blocks.append(UNetBlock(res, [], down=Downsample(cout, 0) if i < len(boc) - 1 else None))
        self.mid_block = VaeMid(boc[-1], g)
        self.conv_norm_out = nn.GroupNorm(g, boc[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(boc[-1], 2 * cfg["latent_channels"], 3, padding=1)

    def forward(self, x):  # [B, 3, H, W] -> [B, 2 * latent, H/f, W/f]
        x = self.conv_in(x)
        for blk in self.down_blocks:
            for r in blk.resnets:
                x = r(x)
            if hasattr(blk, "downsamplers"):
                x = blk.downsamplers[0](x)
        return self.conv_out(F.silu(self.conv_norm_out(self.mid_block(x))))


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        boc, g, L = cfg["block_out_channels"], cfg["norm_num_groups"], cfg["layers_per_block"]
        rev = list(reversed(boc))
        self.conv_in = nn.Conv2d(cfg["latent_channels"], rev[0], 3, padding=1)
        self.mid_block = VaeMid(rev[0], g)
        self.up_blocks = nn.ModuleList()
        cout = rev[0]
        for i in range(len(boc)):
            cin, cout = cout, rev[i]
            res = [ResnetBlock2D(cin if j == 0 else cout, cout, 0, g, 1e-6) for j in range(L + 1)]
            self.up_blocks.append(UNetBlock(res, [], up=Upsample(cout) if i < len(boc) - 1 else None))
        self.conv_norm_out = nn.GroupNorm(g, boc[0], eps=1e-6)
        self.conv_out = nn.Conv2d(boc[0], cfg["out_channels"], 3, padding=1)

    def forward(self, z):  # [B, latent, h, w] -> [B, 3, H, W]
        x = self.mid_block(self.conv_in(z))
        for blk in self.up_blocks:
            for r in blk.resnets:
                x = r(x)
            if hasattr(blk, "upsamplers"):
                x = blk.upsamplers[0](x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class AutoencoderKL(nn.Module):
    SCALING_FACTOR = 0.18215  # replaced at export by the measured 1 / std of the latents

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.encoder, self.decoder = Encoder(cfg), Decoder(cfg)
        L = cfg["latent_channels"]
        self.quant_conv = nn.Conv2d(2 * L, 2 * L, 1)
        self.post_quant_conv = nn.Conv2d(L, L, 1)

    def encode(self, x):  # x [B, 3, H, W] in [-1, 1] -> (mean, logvar) [B, latent, H/f, W/f]
        mean, logvar = self.quant_conv(self.encoder(x)).chunk(2, dim=1)
        return mean, logvar.clamp(-30.0, 20.0)

    def decode(self, z):  # z [B, latent, h, w] (unscaled) -> [B, 3, H, W]
        return self.decoder(self.post_quant_conv(z))


# ------------------------------------------------------------------------------------------------- CLIP --
class ClipAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):  # x [B, N, d], causal
        b, n, d = x.shape
        split = lambda t: t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)
        o = _sdpa(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)), causal=True)
        return self.out_proj(o.transpose(1, 2).reshape(b, n, d))


class ClipMlp(nn.Module):
    def __init__(self, d, inner):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, inner), nn.Linear(inner, d)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(h * torch.sigmoid(1.702 * h))  # quick_gelu


class ClipLayer(nn.Module):
    def __init__(self, d, inner, heads, eps):
        super().__init__()
        self.self_attn, self.layer_norm1 = ClipAttention(d, heads), nn.LayerNorm(d, eps=eps)
        self.mlp, self.layer_norm2 = ClipMlp(d, inner), nn.LayerNorm(d, eps=eps)

    def forward(self, x):
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class ClipEmbeddings(nn.Module):
    def __init__(self, vocab, d, positions):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, d)
        self.position_embedding = nn.Embedding(positions, d)


class ClipEncoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.ModuleList([ClipLayer(cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                                               cfg["layer_norm_eps"]) for _ in range(cfg["num_hidden_layers"])])


class ClipTextTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embeddings = ClipEmbeddings(cfg["vocab_size"], cfg["hidden_size"], cfg["max_position_embeddings"])
        self.encoder = ClipEncoder(cfg)
        self.final_layer_norm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["layer_norm_eps"])


class CLIPTextModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.text_model = ClipTextTransformer(cfg)

    def forward(self, ids):  # ids [B, N] int64 -> last_hidden_state [B, N, d]
        tm = self.text_model
        n = ids.shape[1]
        x = tm.embeddings.token_embedding(ids) + tm.embeddings.position_embedding.weight[:n][None]
        for layer in tm.encoder.layers:
            x = layer(x)
        return tm.final_layer_norm(x)


# --------------------------------------------------------------------------------------------- configs --
DIFFUSERS_VERSION = "0.40.0"


def unet_json(cfg):
    return {"_class_name": "UNet2DConditionModel", "_diffusers_version": DIFFUSERS_VERSION, "act_fn": "silu",
            "attention_head_dim": cfg["attention_head_dim"], "block_out_channels": cfg["block_out_channels"],
            "center_input_sample": False, "cross_attention_dim": cfg["cross_attention_dim"],
            "down_block_types": cfg["down_block_types"], "downsample_padding": 1, "flip_sin_to_cos": True,
            "freq_shift": 0, "in_channels": cfg["in_channels"], "layers_per_block": cfg["layers_per_block"],
            "mid_block_scale_factor": 1, "mid_block_type": "UNetMidBlock2DCrossAttn",
            "norm_eps": cfg["norm_eps"], "norm_num_groups": cfg["norm_num_groups"],
            "out_channels": cfg["out_channels"], "sample_size": cfg["sample_size"],
            "up_block_types": cfg["up_block_types"], "use_linear_projection": False,
            "upcast_attention": False, "only_cross_attention": False}


def vae_json(cfg, scaling_factor):
    n = len(cfg["block_out_channels"])
    return {"_class_name": "AutoencoderKL", "_diffusers_version": DIFFUSERS_VERSION, "act_fn": "silu",
            "block_out_channels": cfg["block_out_channels"], "down_block_types": ["DownEncoderBlock2D"] * n,
            "up_block_types": ["UpDecoderBlock2D"] * n, "in_channels": cfg["in_channels"],
            "out_channels": cfg["out_channels"], "latent_channels": cfg["latent_channels"],
            "layers_per_block": cfg["layers_per_block"], "norm_num_groups": cfg["norm_num_groups"],
            "sample_size": cfg["sample_size"], "scaling_factor": scaling_factor, "force_upcast": False,
            "mid_block_add_attention": True, "use_quant_conv": True, "use_post_quant_conv": True}


def text_json(cfg, bos_id, eos_id):
    return {"architectures": ["CLIPTextModel"], "model_type": "clip_text_model", "attention_dropout": 0.0,
            "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id,
            "hidden_act": cfg["hidden_act"], "hidden_size": cfg["hidden_size"],
            "intermediate_size": cfg["intermediate_size"], "layer_norm_eps": cfg["layer_norm_eps"],
            "max_position_embeddings": cfg["max_position_embeddings"],
            "num_attention_heads": cfg["num_attention_heads"], "num_hidden_layers": cfg["num_hidden_layers"],
            "projection_dim": cfg["hidden_size"], "vocab_size": cfg["vocab_size"], "torch_dtype": "float16"}


# SD 1.5's scheduler settings (the sampler is chosen per request; these give the noise schedule).
SCHEDULER_JSON = {"_class_name": "PNDMScheduler", "_diffusers_version": DIFFUSERS_VERSION, "beta_end": 0.012,
                  "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
                  "num_train_timesteps": 1000, "prediction_type": "epsilon", "set_alpha_to_one": False,
                  "skip_prk_steps": True, "steps_offset": 1, "trained_betas": None}

MODEL_INDEX_JSON = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": DIFFUSERS_VERSION,
                    "feature_extractor": [None, None], "image_encoder": [None, None],
                    "requires_safety_checker": False, "safety_checker": [None, None],
                    "scheduler": ["diffusers", "PNDMScheduler"],
                    "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
                    "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"]}


def scaled_linear_alphas_cumprod(n=1000, beta_start=0.00085, beta_end=0.012):
    betas = torch.linspace(beta_start ** 0.5, beta_end ** 0.5, n, dtype=torch.float64) ** 2
    return torch.cumprod(1.0 - betas, dim=0).float()
