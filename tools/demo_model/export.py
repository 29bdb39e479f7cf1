"""Writes the demo model as a diffusers folder (fp16 safetensors + configs + the CLIP tokenizer files).

safetensors is written by hand (8-byte little-endian header length, JSON header, raw little-endian data) so
the tools need no package beyond torch and numpy.
"""
import json
import os
import struct

import numpy as np
import torch

import model as M

_DTYPES = {torch.float16: ("F16", np.float16), torch.float32: ("F32", np.float32), torch.int64: ("I64", np.int64),
           torch.int32: ("I32", np.int32)}
_FROM_NAME = {"F16": np.float16, "F32": np.float32, "I64": np.int64, "I32": np.int32, "BF16": None}


def save_safetensors(tensors, path):
    """tensors: {name: torch.Tensor} -> one .safetensors file (keys sorted, data 8-byte aligned)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        tag, np_dtype = _DTYPES[t.dtype]
        data = t.numpy().astype(np_dtype, copy=False).tobytes()
        header[name] = {"dtype": tag, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """-> {name: torch.Tensor} (F16/F32/I32/I64 only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=_FROM_NAME[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def _write_json(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def _fp16(module):
    return {k: v.detach().to(torch.float16) for k, v in module.state_dict().items()}


def export_diffusers(out_dir, text_encoder, unet, vae, vae_scaling_factor, tokenizer_dir, prediction="epsilon"):
    """Writes out_dir/{model_index.json, text_encoder, tokenizer, unet, vae, scheduler} with fp16 weights;
    prediction: "epsilon" or "v" (the scheduler config's prediction_type)."""
    for sub in ("text_encoder", "tokenizer", "unet", "vae", "scheduler"):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
    _write_json(M.MODEL_INDEX_JSON, os.path.join(out_dir, "model_index.json"))
    scheduler = dict(M.SCHEDULER_JSON, prediction_type="v_prediction" if prediction == "v" else "epsilon")
    _write_json(scheduler, os.path.join(out_dir, "scheduler", "scheduler_config.json"))
    vocab = json.load(open(os.path.join(tokenizer_dir, "vocab.json")))
    _write_json(M.text_json(text_encoder.cfg, vocab["<|startoftext|>"], vocab["<|endoftext|>"]),
                os.path.join(out_dir, "text_encoder", "config.json"))
    _write_json(M.unet_json(unet.cfg), os.path.join(out_dir, "unet", "config.json"))
    _write_json(M.vae_json(vae.cfg, float(vae_scaling_factor)), os.path.join(out_dir, "vae", "config.json"))
    save_safetensors(_fp16(text_encoder), os.path.join(out_dir, "text_encoder", "model.safetensors"))
    save_safetensors(_fp16(unet), os.path.join(out_dir, "unet", "diffusion_pytorch_model.safetensors"))
    save_safetensors(_fp16(vae), os.path.join(out_dir, "vae", "diffusion_pytorch_model.safetensors"))
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"):
        src = os.path.join(tokenizer_dir, name)
        if os.path.exists(src):
            with open(src, "rb") as a, open(os.path.join(out_dir, "tokenizer", name), "wb") as b:
                b.write(a.read())


def exported_prediction(model_dir):
    """The UNet target an exported folder was trained for: "v" (scheduler prediction_type v_prediction) or "epsilon"."""
    with open(os.path.join(model_dir, "scheduler", "scheduler_config.json")) as f:
        return "v" if json.load(f).get("prediction_type") == "v_prediction" else "epsilon"


def load_exported(model_dir):
    """The torch modules of an exported folder, in float32 (for parity checks and evaluation)."""
    tcfg = json.load(open(os.path.join(model_dir, "text_encoder", "config.json")))
    ucfg = json.load(open(os.path.join(model_dir, "unet", "config.json")))
    vcfg = json.load(open(os.path.join(model_dir, "vae", "config.json")))
    te = M.CLIPTextModel({k: tcfg[k] for k in M.TEXT_CONFIG})
    unet = M.UNet2DConditionModel({k: ucfg[k] for k in M.UNET_CONFIG})
    vae = M.AutoencoderKL({k: vcfg[k] for k in M.VAE_CONFIG})
    for mod, path in ((te, "text_encoder/model.safetensors"), (unet, "unet/diffusion_pytorch_model.safetensors"),
                      (vae, "vae/diffusion_pytorch_model.safetensors")):
        sd = {k: v.float() for k, v in load_safetensors(os.path.join(model_dir, path)).items()}
        mod.load_state_dict(sd, strict=True)
        mod.eval()
    return te, unet, vae, float(vcfg["scaling_factor"])
