#include "models/t5/t5_encoder.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/json_util.h"

namespace atelier {

namespace {

constexpr const char* kSharedKey = "shared.weight";
constexpr const char* kEmbedKey = "encoder.embed_tokens.weight";
constexpr const char* kBiasKey = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";

std::string block_key(int i) { return "encoder.block." + std::to_string(i); }

// ids [B, S] i32/i64 on any device -> host i64 values, row-major.
std::vector<int64_t> host_ids(const Tensor& ids) {
  Tensor h = ops::contiguous(ids.device().is_cpu() ? ids : ids.to(Device::cpu()));
  std::vector<int64_t> out(size_t(h.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = h.dtype() == DType::I32 ? h.data<int32_t>()[i] : h.data<int64_t>()[i];
  }
  return out;
}

}  // namespace

int t5_relative_position_bucket(int64_t relative_position, int num_buckets, int max_distance) {
  // Bidirectional: half the buckets for keys after the query, half for keys before (or at) it.
  const int half = num_buckets / 2;
  int bucket = relative_position > 0 ? half : 0;
  const int64_t n = relative_position < 0 ? -relative_position : relative_position;
  const int max_exact = half / 2;
  if (n < max_exact) return bucket + int(n);
  // Logarithmic buckets up to max_distance, in float32 as torch computes them, truncated toward zero.
  const float ratio = std::log(float(n) / float(max_exact));
  const float scaled = ratio / float(std::log(double(max_distance) / max_exact)) * float(half - max_exact);
  const int64_t large = std::min<int64_t>(max_exact + int64_t(scaled), half - 1);
  return bucket + int(large);
}

Expected<T5Config> T5Config::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return invalid_argument("T5 config: expected a JSON object");
  T5Config c;
  std::string ff = "relu";
  Status st = catch_status([&]() -> Status {
    constexpr const char* kContext = "T5 config";
    read_config_field(j, "vocab_size", c.vocab_size, kContext);
    read_config_field(j, "d_model", c.d_model, kContext);
    read_config_field(j, "d_kv", c.d_kv, kContext);
    read_config_field(j, "d_ff", c.d_ff, kContext);
    read_config_field(j, "num_layers", c.num_layers, kContext);
    read_config_field(j, "num_heads", c.num_heads, kContext);
    read_config_field(j, "relative_attention_num_buckets", c.relative_attention_num_buckets, kContext);
    read_config_field(j, "relative_attention_max_distance", c.relative_attention_max_distance, kContext);
    read_config_field(j, "layer_norm_epsilon", c.layer_norm_epsilon, kContext);
    read_config_field(j, "feed_forward_proj", ff, kContext);
    return Status::ok();
  });
  if (!st) return st;
  if (ff == "gated-gelu") {
    c.gated = true, c.act = UnaryOp::kGeluTanh;
  } else if (ff == "relu") {
    c.gated = false, c.act = UnaryOp::kRelu;
  } else if (ff == "gated-relu") {
    c.gated = true, c.act = UnaryOp::kRelu;
  } else {
    return unsupported("T5 feed_forward_proj '" + ff + "' is not supported (gated-gelu, gated-relu, relu)");
  }
  if (c.num_heads < 1 || c.d_kv < 1 || c.num_layers < 1 || c.num_layers > kMaxLayerCount)
    return invalid_argument("T5 config: num_heads and d_kv must be positive, num_layers 1.." + std::to_string(kMaxLayerCount));
  return c;
}

Expected<T5Config> T5Config::from_file(const std::string& path) {
  ATELIER_ASSIGN_OR_RETURN(auto j, read_json_file(path));
  auto c = from_json(j);
  if (!c) return prefixed(c.status(), path);
  return c;
}

Expected<T5Config> T5Config::detect(const WeightStore& store, const std::string& prefix) {
  T5Config c;
  auto emb = store.shape(prefix + kSharedKey);
  if (!emb) emb = store.shape(prefix + kEmbedKey);
  const auto bias = store.shape(prefix + kBiasKey);
  const auto q = store.shape(prefix + block_key(0) + ".layer.0.SelfAttention.q.weight");
  const auto wi = store.shape(prefix + block_key(0) + ".layer.1.DenseReluDense.wi_0.weight");
  if (!emb || !bias || !q || !wi) return not_found("no T5 encoder weights found (expected " + prefix + kSharedKey + ")");
  if (!shape_is(emb, 2) || !shape_is(bias, 2) || !shape_is(q, 2) || !shape_is(wi, 2) || (*q)[0] % (*bias)[1] != 0)
    return corrupt("T5 encoder weights (" + prefix + "): the embedding, the relative attention bias [buckets, heads], q and wi "
                   "must be matrices of positive sizes, q's rows a multiple of the heads");
  c.vocab_size = (*emb)[0], c.d_model = (*emb)[1];
  c.relative_attention_num_buckets = int((*bias)[0]), c.num_heads = int((*bias)[1]);
  c.d_kv = (*q)[0] / c.num_heads;
  c.d_ff = (*wi)[0];
  c.num_layers = 0;
  while (store.contains(prefix + block_key(c.num_layers) + ".layer.0.layer_norm.weight")) ++c.num_layers;
  return c;
}

Expected<T5Encoder> T5Encoder::load(const WeightStore& store, const T5Config& c, Device device, DType dtype,
                                    const std::string& prefix) {
  T5Encoder m;
  m.config_ = c;
  m.device_ = device;
  WeightLoader w(store, device, dtype, {}, prefix);
  // T5EncoderModel saves the tied table as shared.weight; some exports keep only encoder.embed_tokens.
  w.embedding(m.shared_, w.has(kSharedKey) ? "shared" : "encoder.embed_tokens", c.vocab_size, c.d_model);
  const int64_t inner = c.d_kv * c.num_heads;
  w.tensor(m.relative_attention_bias_, kBiasKey, {c.relative_attention_num_buckets, c.num_heads});
  m.blocks_.resize(size_t(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    WeightLoader b = w.scope(block_key(i));
    T5Block& blk = m.blocks_[size_t(i)];
    b.rms_norm(blk.attn_norm, "layer.0.layer_norm", c.d_model, c.layer_norm_epsilon);
    b.linear(blk.q, "layer.0.SelfAttention.q", c.d_model, inner, false);
    b.linear(blk.k, "layer.0.SelfAttention.k", c.d_model, inner, false);
    b.linear(blk.v, "layer.0.SelfAttention.v", c.d_model, inner, false);
    b.linear(blk.o, "layer.0.SelfAttention.o", inner, c.d_model, false);
    b.rms_norm(blk.ff_norm, "layer.1.layer_norm", c.d_model, c.layer_norm_epsilon);
    b.linear(blk.wi_0, c.gated ? "layer.1.DenseReluDense.wi_0" : "layer.1.DenseReluDense.wi", c.d_model, c.d_ff, false);
    if (c.gated) b.linear(blk.wi_1, "layer.1.DenseReluDense.wi_1", c.d_model, c.d_ff, false);
    b.linear(blk.wo, "layer.1.DenseReluDense.wo", c.d_ff, c.d_model, false);
  }
  w.rms_norm(m.final_norm_, "encoder.final_layer_norm", c.d_model, c.layer_norm_epsilon);
  ATELIER_RETURN_IF_ERROR(w.finish());
  return m;
}

Tensor T5Encoder::position_bias(int64_t seq) const {
  Tensor host = Tensor::empty({seq * seq}, DType::I32);
  int32_t* buckets = host.data<int32_t>();
  for (int64_t i = 0; i < seq; ++i) {
    for (int64_t j = 0; j < seq; ++j) {
      buckets[i * seq + j] = t5_relative_position_bucket(j - i, config_.relative_attention_num_buckets,
                                                         config_.relative_attention_max_distance);
    }
  }
  const Tensor ids = host.to(device_);
  Tensor bias = ops::embedding(ids, relative_attention_bias_);  // [S*S, H]
  return ops::contiguous(bias.reshape({seq, seq, config_.num_heads}).permute({2, 0, 1})).unsqueeze(0);
}

Tensor T5Encoder::block_forward(const T5Block& b, const Tensor& x, const Tensor& bias) const {
  const int64_t batch = x.size(0), seq = x.size(1), heads = config_.num_heads, dk = config_.d_kv;
  const Tensor h = b.attn_norm(x);
  auto split = [&](const Tensor& t) { return t.reshape({batch, seq, heads, dk}).permute({0, 2, 1, 3}); };
  // T5 folds the 1/sqrt(d) scaling into its initialisation: scores are plain dot products.
  constexpr float kNoScaling = 1.0f;
  Tensor a = ops::attention(split(b.q(h)), split(b.k(h)), split(b.v(h)), bias, kNoScaling);
  a = ops::contiguous(a.permute({0, 2, 1, 3})).reshape({batch, seq, heads * dk});
  Tensor y = b.o.with_residual(a, x);
  const Tensor f = b.ff_norm(y);
  Tensor inner = b.wi_0(f, config_.act);
  if (config_.gated) inner = ops::mul(inner, b.wi_1(f));
  return b.wo.with_residual(inner, std::move(y));
}

Expected<Tensor> T5Encoder::forward(const Tensor& ids) const {
  if (ids.dim() != 2) return invalid_argument("T5 encoder: ids must be [batch, seq], got " + shape_str(ids.shape()));
  if (ids.dtype() != DType::I32 && ids.dtype() != DType::I64) return invalid_argument("T5 encoder: ids must be i32 or i64");
  for (int64_t id : host_ids(ids)) {
    if (id < 0 || id >= config_.vocab_size) {
      return invalid_argument("T5 encoder: token id " + std::to_string(id) + " outside the vocabulary of " +
                              std::to_string(config_.vocab_size));
    }
  }
  Tensor out;
  Status st = catch_status([&] {
    const int64_t batch = ids.size(0), seq = ids.size(1);
    Tensor x = shared_(ops::contiguous(ids.to(device_)).reshape({batch * seq})).reshape({batch, seq, config_.d_model});
    const Tensor bias = position_bias(seq);
    for (const T5Block& b : blocks_) x = block_forward(b, x, bias);
    out = final_norm_(x);
    return Status::ok();
  });
  if (!st) return st;
  return out;
}

}  // namespace atelier
