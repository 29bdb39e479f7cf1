// Configuration of a CLIP text encoder: the SD 1.x text encoder (HF CLIPTextModel, CLIP ViT-L/14, quick_gelu)
// and SD 2.x's OpenCLIP ViT-H/14 text tower (gelu). Read from transformers' config.json when the model comes
// as a folder, or inferred from the tensor shapes of a single-file checkpoint that has no config.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/status.h"

namespace atelier {

class WeightStore;

struct ClipTextConfig {
  // Defaults are transformers' CLIPTextConfig defaults (used for fields a config.json leaves out).
  int64_t vocab_size = 49408;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 2048;
  int64_t projection_dim = 512;
  int num_hidden_layers = 12;
  int num_attention_heads = 8;
  int64_t max_position_embeddings = 77;
  UnaryOp hidden_act = UnaryOp::kQuickGelu;
  float layer_norm_eps = 1e-5f;
  // Pooling position rule of transformers: eos_token_id 2 (the value in OpenAI's and SD 1.x's configs)
  // means "argmax of the ids" (the EOT token has the highest id); any other value means "first position
  // whose id equals eos_token_id".
  int64_t eos_token_id = 49407;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  // From a transformers config.json object (CLIPTextConfig, or a CLIPConfig holding "text_config").
  static Expected<ClipTextConfig> from_json(const nlohmann::json& j);
  static Expected<ClipTextConfig> from_file(const std::string& path);

  // Infers the configuration from the shapes of the tensors whose keys start with `prefix` (the text tower's
  // prefix, e.g. "text_model.", "cond_stage_model.transformer.text_model.", "cond_stage_model.model.").
  // Both naming schemes are recognised: transformers' (quick_gelu, CLIP-L) and OpenCLIP's (gelu).
  // Heads: hidden/64 (CLIP's head size; CLIP-L 768 -> 12, OpenCLIP-H 1024 -> 16); for a hidden size that is
  // not a multiple of 64 (tiny test models) `fallback_heads` is used, and 0 there is an error.
  static Expected<ClipTextConfig> detect(const WeightStore& store, const std::string& prefix, int fallback_heads = 0);

  // Checks sizes are positive and divisible; the message names the offending field.
  Status validate() const;
};

// "quick_gelu" | "gelu" | "gelu_new" | "gelu_pytorch_tanh" -> the op; anything else -> unsupported.
Expected<UnaryOp> clip_activation_from_name(const std::string& name);

}  // namespace atelier
