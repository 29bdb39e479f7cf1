// The Qwen3 text encoder of Z-Image (transformers' Qwen3Model): pre-norm decoder layers with grouped-query
// attention, per-head RMS norm of q and k (QK norm), rotary position embeddings (rotate-half form, theta
// from the config), RMSNorm and a SwiGLU MLP. Z-Image conditions on hidden_states[-2] — the output of the
// second-to-last layer, before any final norm — so the last layer and the final norm are never loaded.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/common/layers.h"
#include "models/common/weights.h"

namespace atelier {

struct Qwen3Config {
  // Defaults are transformers' Qwen3Config defaults.
  int64_t vocab_size = 151936;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 22016;
  int num_hidden_layers = 32;
  int num_attention_heads = 32;
  int num_key_value_heads = 32;
  int64_t head_dim = 128;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 32768;

  // From config.json (rope_theta at the top level or in rope_parameters / rope_scaling).
  static Expected<Qwen3Config> from_json(const nlohmann::json& j);
  static Expected<Qwen3Config> from_file(const std::string& path);
  Status validate() const;
};

struct Qwen3Layer {
  RMSNorm input_layernorm, post_attention_layernorm;
  Linear q_proj, k_proj, v_proj, o_proj;  // no biases
  RMSNorm q_norm, k_norm;                 // over head_dim
  Linear gate_proj, up_proj, down_proj;
};

class Qwen3Encoder {
 public:
  // Loads the layers that hidden_states[-2] needs. Keys with or without a leading "model." are accepted.
  // The CPU backend needs dtype f32.
  static Expected<Qwen3Encoder> load(const WeightStore& store, const Qwen3Config& config, Device device,
                                     DType dtype = DType::F32);

  const Qwen3Config& config() const { return config_; }
  Device device() const { return device_; }

  // ids [B, S] i32/i64, mask [B, S] i32 (1 = token, 0 = padding) -> hidden_states[-2] [B, S, D] (rows of
  // padding included). Positions are 0..S-1, as transformers uses them without explicit position ids.
  Expected<Tensor> hidden_penultimate(const Tensor& ids, const Tensor& mask) const;
  // One prompt: ids and mask [S] -> the features of the unpadded tokens [L, D], L = number of 1s in mask.
  Expected<Tensor> encode_features(const std::vector<int32_t>& ids, const std::vector<int32_t>& mask) const;

 private:
  // x [B, S, D], cos/sin [S, 1, hd], mask [B, 1, S, S] -> [B, S, D]
  Tensor layer_forward(const Qwen3Layer& l, const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& mask) const;

  Qwen3Config config_;
  Device device_;
  Embedding embed_tokens_;
  std::vector<Qwen3Layer> layers_;  // num_hidden_layers - 1 of them
};

// Rotary embedding in transformers' rotate-half form: x [B, S, H, hd], cos/sin [S, 1, hd] -> same as x:
// x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., hd/2:], x[..., :hd/2]).
Tensor rope_rotate_half(const Tensor& x, const Tensor& cos, const Tensor& sin);

}  // namespace atelier
