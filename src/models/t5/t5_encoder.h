// The T5 v1.1 encoder (transformers' T5EncoderModel), FLUX's and SD3's text_encoder_2: pre-norm blocks with
// RMS layer norms (no mean subtraction, no bias), self-attention WITHOUT score scaling plus a learned
// relative-position bias (bidirectional buckets, computed by the first block and shared by all), a gated-GELU
// (tanh approximation) feed-forward, and a final RMS norm. FluxPipeline runs it without an attention mask, so
// padding tokens are attended like any other; forward() does the same.
//
// Layout: transformers' names (shared.weight or encoder.embed_tokens.weight, encoder.block.N.layer.0.SelfAttention.{q,k,v,o},
// layer.1.DenseReluDense.{wi_0,wi_1,wo}, encoder.final_layer_norm), with or without a leading "text_encoders.t5xxl.transformer."
// style prefix given by the caller.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/common/layers.h"
#include "models/common/weights.h"

namespace atelier {

struct T5Config {
  int64_t vocab_size = 32128;
  int64_t d_model = 4096;
  int64_t d_kv = 64;
  int64_t d_ff = 10240;
  int num_layers = 24;
  int num_heads = 64;
  int relative_attention_num_buckets = 32;
  int relative_attention_max_distance = 128;
  float layer_norm_epsilon = 1e-6f;
  bool gated = true;  // feed_forward_proj "gated-gelu" (v1.1); "relu" (original T5) is not gated
  UnaryOp act = UnaryOp::kGeluTanh;

  // transformers' config.json; errors name what is unsupported.
  static Expected<T5Config> from_json(const nlohmann::json& j);
  static Expected<T5Config> from_file(const std::string& path);
  // From the weights alone (a single file without config): widths and depth from the shapes; heads from the
  // relative attention bias; T5 v1.1 defaults for the rest.
  static Expected<T5Config> detect(const WeightStore& store, const std::string& prefix = "");
};

struct T5Block {
  RMSNorm attn_norm;           // layer.0.layer_norm
  Linear q, k, v, o;           // layer.0.SelfAttention.*, no bias
  RMSNorm ff_norm;             // layer.1.layer_norm
  Linear wi_0, wi_1, wo;       // layer.1.DenseReluDense.* (wi for the ungated relu variant), no bias
};

class T5Encoder {
 public:
  // Keys are read under `prefix` (e.g. "" for a transformers folder). The CPU backend needs dtype f32.
  static Expected<T5Encoder> load(const WeightStore& store, const T5Config& config, Device device,
                                  DType dtype = DType::F32, const std::string& prefix = "");

  const T5Config& config() const { return config_; }
  Device device() const { return device_; }

  // ids [B, S] i32/i64 (host or device) -> last_hidden_state [B, S, d_model] on the model's device.
  Expected<Tensor> forward(const Tensor& ids) const;

 private:
  // Additive attention bias [1, H, S, S] for sequence length S (the first block's relative_attention_bias).
  Tensor position_bias(int64_t seq) const;
  // x [B, S, D], bias [1, H, S, S] -> [B, S, D]
  Tensor block_forward(const T5Block& b, const Tensor& x, const Tensor& bias) const;

  T5Config config_;
  Device device_;
  Embedding shared_;
  Tensor relative_attention_bias_;  // [num_buckets, H]
  std::vector<T5Block> blocks_;
  RMSNorm final_norm_;
};

// transformers' _relative_position_bucket for the bidirectional (encoder) case, with its float32 log:
// relative_position = key index - query index.
int t5_relative_position_bucket(int64_t relative_position, int num_buckets, int max_distance);

}  // namespace atelier
