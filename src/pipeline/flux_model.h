// A loaded FLUX.1 model: CLIP-L (pooled output) and T5 (token states) with their tokenizers, the FLUX
// transformer, the 16-channel VAE and the flow-matching scheduler config.
//
// Sources:
//   - a diffusers folder (model_index.json with _class_name "FluxPipeline"): every component from its folder;
//   - Black Forest Labs' single transformer file (flux1-dev.safetensors layout, optionally under ComfyUI's
//     "model.diffusion_model." prefix), with the other parts given separately: `vae` (ae.safetensors or a
//     diffusers vae/ folder), `clip_l` and `t5` (a transformers model file or folder). Tokenizers are looked
//     up beside the text encoders (the folder itself, or a sibling tokenizer/ / tokenizer_2/ folder), or given
//     by `clip_tokenizer` / `t5_tokenizer`. The scheduler is FLUX.1-dev's (dynamic shifting) when the
//     transformer has a guidance embedder and FLUX.1-schnell's (shift 1) otherwise.
// Any of vae / clip_l / t5 given for a diffusers folder replaces that folder's component.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "models/clip/clip_text_model.h"
#include "models/flux/flux_transformer.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/vae.h"
#include "sampling/flow_match.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace atelier {

struct FluxLoadOptions {
  std::string vae;              // ae.safetensors / diffusers vae folder
  std::string clip_l;           // CLIP-L text encoder file or folder
  std::string t5;               // T5 encoder file or folder
  std::string clip_tokenizer;   // CLIP tokenizer folder when none sits beside clip_l
  std::string t5_tokenizer;     // spiece.model (or its folder) when none sits beside t5
  std::string transformer_config;  // diffusers transformer config.json for a BFL file (else detected)
  Device device = Device::cpu();
  // Compute dtype; unset: the transformer and VAE in default_model_dtype(device) (f32 on the CPU, bf16 on
  // CUDA) and the text encoders in f32 (they run once per prompt, and T5's activations are range-sensitive).
  // Set: every component in it, except that f16 keeps the VAE in f32 (its activations overflow f16, as SD's do).
  std::optional<DType> dtype;
  bool compute_hash = true;
  // The text encoders leave the device after each request's prompts are encoded (T5-XXL is 9.5 GB in bf16,
  // 19 GB in f32: freed for the denoising activations and the VAE on a smaller card) and are loaded again from
  // the same files for the next request.
  bool offload = false;
  // The transformer's block projections in FP8 e4m3 with per-row scales (FluxTransformer::quantize_fp8,
  // `--dtype fp8`); everything else in the compute dtype above.
  bool fp8 = false;
};

struct FluxModel {
  std::string path;
  std::string name;
  std::string layout;  // "diffusers" | "single-file (BFL)"
  std::string hash;    // first 10 hex digits of the SHA-256 of the transformer weights (A1111 "Model hash")
  int default_size = 1024;

  std::optional<ClipTokenizer> clip_tokenizer;
  std::optional<ClipTextModel> clip;
  std::optional<T5Tokenizer> t5_tokenizer;
  std::optional<T5Encoder> t5;
  std::optional<FluxTransformer> transformer;
  std::optional<Vae> vae;
  // Loads clip/t5 (and their tokenizers) from the files the model was loaded from: at load, and again after an
  // offload. offload_text_encoders: FluxLoadOptions::offload. text_mu guards both encoders' presence.
  std::function<Status(FluxModel&)> load_text_encoders;
  bool offload_text_encoders = false;
  std::shared_ptr<std::mutex> text_mu = std::make_shared<std::mutex>();
  sampling::FlowMatchConfig scheduler;
  nlohmann::json scheduler_json;  // the scheduler config as read (or the built-in defaults)
};

// Whether `path` holds a FLUX model: a diffusers folder whose model_index.json names FluxPipeline, or a
// .safetensors file with BFL transformer keys. Never fails: unreadable paths are "not FLUX".
bool is_flux_model(const std::string& path);

// The dtypes FluxLoadOptions resolve to for the transformer, the text encoders and the VAE.
DType flux_model_dtype(const FluxLoadOptions& options);
DType flux_text_dtype(const FluxLoadOptions& options);
DType flux_vae_dtype(const FluxLoadOptions& options);

Expected<std::shared_ptr<FluxModel>> load_flux_model(const std::string& path, const FluxLoadOptions& options = {});

}  // namespace atelier
