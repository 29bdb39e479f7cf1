#include "models/qwen3/qwen3_encoder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "io/json_util.h"

namespace atelier {
namespace {

constexpr const char* kContext = "text_encoder/config.json";
// The most attention heads a config may ask for (Qwen3 models have 16-64).
constexpr int64_t kMaxHeads = 4096;


Tensor on_device(const Tensor& host, Device dev) { return dev.is_cpu() ? host : host.to(dev); }

// cos and sin tables [S, 1, hd] of transformers' default RoPE, in f32 as torch computes them:
// inv_freq[i] = 1 / theta^(2i / hd), angle = position * inv_freq, emb = concat(angles, angles).
std::pair<Tensor, Tensor> rope_tables(int64_t seq, int64_t hd, double theta) {
  const int64_t half = hd / 2;
  std::vector<float> inv(size_t(half), 0.0f);
  for (int64_t i = 0; i < half; ++i) inv[size_t(i)] = 1.0f / std::pow(float(theta), float(2 * i) / float(hd));
  std::vector<float> c(size_t(seq * hd)), s(size_t(seq * hd));
  for (int64_t p = 0; p < seq; ++p)
    for (int64_t i = 0; i < hd; ++i) {
      const float angle = float(p) * inv[size_t(i % half)];
      c[size_t(p * hd + i)] = std::cos(angle);
      s[size_t(p * hd + i)] = std::sin(angle);
    }
  return {Tensor::from_vector(c, {seq, 1, hd}), Tensor::from_vector(s, {seq, 1, hd})};
}

// Additive mask [B, 1, S, S]: causal, and padded keys hidden. A padded query still sees itself, so that no
// row is fully masked (its output is dropped anyway).
Tensor attention_mask(const std::vector<int32_t>& mask, int64_t batch, int64_t seq) {
  std::vector<float> m(size_t(batch * seq * seq), 0.0f);
  const float kHidden = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < seq; ++i)
      for (int64_t j = 0; j < seq; ++j) {
        const bool visible = j <= i && (mask[size_t(b * seq + j)] != 0 || i == j);
        if (!visible) m[size_t((b * seq + i) * seq + j)] = kHidden;
      }
  return Tensor::from_vector(m, {batch, 1, seq, seq});
}

std::vector<int32_t> int_values(const Tensor& t) {
  Tensor host = ops::contiguous(t.device().is_cpu() ? t : t.to(Device::cpu()));
  std::vector<int32_t> out(size_t(host.numel()));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = host.dtype() == DType::I64 ? int32_t(host.data<int64_t>()[i]) : host.data<int32_t>()[i];
  return out;
}

}  // namespace

Expected<Qwen3Config> Qwen3Config::from_json(const nlohmann::json& j) {
  Qwen3Config c;
  ATELIER_ASSIGN_OR_RETURN(c.vocab_size, get_int(j, "vocab_size", c.vocab_size, kContext));
  ATELIER_ASSIGN_OR_RETURN(c.hidden_size, get_int(j, "hidden_size", c.hidden_size, kContext));
  ATELIER_ASSIGN_OR_RETURN(c.intermediate_size, get_int(j, "intermediate_size", c.intermediate_size, kContext));
  ATELIER_ASSIGN_OR_RETURN(int64_t layers, get_int(j, "num_hidden_layers", c.num_hidden_layers, kContext));
  ATELIER_ASSIGN_OR_RETURN(int64_t heads, get_int(j, "num_attention_heads", c.num_attention_heads, kContext));
  ATELIER_ASSIGN_OR_RETURN(int64_t kv_heads, get_int(j, "num_key_value_heads", heads, kContext));
  // Checked before narrowing to int: 1e12 layers read as a negative count.
  if (layers > kMaxLayerCount || heads > kMaxHeads || kv_heads > kMaxHeads)
    return invalid_argument(std::string(kContext) + ": num_hidden_layers must be at most " + std::to_string(kMaxLayerCount) +
                            " and the head counts at most " + std::to_string(kMaxHeads));
  c.num_hidden_layers = int(layers), c.num_attention_heads = int(heads), c.num_key_value_heads = int(kv_heads);
  ATELIER_ASSIGN_OR_RETURN(c.head_dim, get_int(j, "head_dim", heads > 0 ? c.hidden_size / heads : 0, kContext));
  ATELIER_ASSIGN_OR_RETURN(double eps, get_number(j, "rms_norm_eps", c.rms_norm_eps, kContext));
  c.rms_norm_eps = float(eps);
  ATELIER_ASSIGN_OR_RETURN(c.max_position_embeddings, get_int(j, "max_position_embeddings", c.max_position_embeddings, kContext));
  ATELIER_ASSIGN_OR_RETURN(c.rope_theta, get_number(j, "rope_theta", c.rope_theta, kContext));
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || !j.at(key).is_object()) continue;
    const auto& rp = j.at(key);
    ATELIER_ASSIGN_OR_RETURN(c.rope_theta, get_number(rp, "rope_theta", c.rope_theta, kContext));
    ATELIER_ASSIGN_OR_RETURN(std::string type, get_string(rp, "rope_type", "default", kContext));
    if (type != "default") return unsupported(std::string(kContext) + ": rope_type '" + type + "' is not supported (only 'default')");
  }
  ATELIER_RETURN_IF_ERROR(c.validate());
  return c;
}

Expected<Qwen3Config> Qwen3Config::from_file(const std::string& path) {
  ATELIER_ASSIGN_OR_RETURN(auto j, read_json_file(path));
  return from_json(j);
}

Status Qwen3Config::validate() const {
  if (vocab_size < 1 || hidden_size < 1 || intermediate_size < 1 || head_dim < 2 || head_dim % 2 != 0)
    return invalid_argument("Qwen3 config: sizes must be positive and head_dim even");
  if (num_hidden_layers < 2) return invalid_argument("Qwen3 config: hidden_states[-2] needs at least 2 layers");
  if (!(rms_norm_eps > 0.0f) || !std::isfinite(rms_norm_eps))
    return invalid_argument("Qwen3 config: rms_norm_eps must be a finite number > 0");
  if (num_attention_heads < 1 || num_key_value_heads < 1 || num_attention_heads % num_key_value_heads != 0)
    return invalid_argument("Qwen3 config: num_attention_heads must be a multiple of num_key_value_heads");
  return Status::ok();
}

Expected<Qwen3Encoder> Qwen3Encoder::load(const WeightStore& store, const Qwen3Config& config, Device device, DType dtype) {
  ATELIER_RETURN_IF_ERROR(config.validate());
  if (!backend_available(device)) return unsupported("Qwen3 text encoder: device " + device.str() + " is not available");
  if (device.is_cpu() && dtype != DType::F32)
    return unsupported("Qwen3 text encoder: the CPU backend computes in f32, not " + std::string(dtype_name(dtype)));
  Qwen3Encoder m;
  m.config_ = config;
  m.device_ = device;
  return catch_expected<Qwen3Encoder>([&]() -> Expected<Qwen3Encoder> {
    const std::string prefix = store.contains("model.embed_tokens.weight") ? "model." : "";
    WeightLoader w(store, device, dtype, {}, prefix);
    const int64_t d = config.hidden_size, hd = config.head_dim, ff = config.intermediate_size;
    const int64_t q_out = config.num_attention_heads * hd, kv_out = config.num_key_value_heads * hd;
    w.embedding(m.embed_tokens_, "embed_tokens", config.vocab_size, d);
    m.layers_.resize(size_t(config.num_hidden_layers - 1));  // the last layer never feeds hidden_states[-2]
    for (size_t i = 0; i < m.layers_.size(); ++i) {
      WeightLoader s = w.scope("layers." + std::to_string(i));
      Qwen3Layer& l = m.layers_[i];
      s.rms_norm(l.input_layernorm, "input_layernorm", d, config.rms_norm_eps);
      s.rms_norm(l.post_attention_layernorm, "post_attention_layernorm", d, config.rms_norm_eps);
      s.linear(l.q_proj, "self_attn.q_proj", d, q_out, false);
      s.linear(l.k_proj, "self_attn.k_proj", d, kv_out, false);
      s.linear(l.v_proj, "self_attn.v_proj", d, kv_out, false);
      s.linear(l.o_proj, "self_attn.o_proj", q_out, d, false);
      s.rms_norm(l.q_norm, "self_attn.q_norm", hd, config.rms_norm_eps);
      s.rms_norm(l.k_norm, "self_attn.k_norm", hd, config.rms_norm_eps);
      s.linear(l.gate_proj, "mlp.gate_proj", d, ff, false);
      s.linear(l.up_proj, "mlp.up_proj", d, ff, false);
      s.linear(l.down_proj, "mlp.down_proj", ff, d, false);
    }
    ATELIER_RETURN_IF_ERROR(w.finish());
    return m;
  });
}

Tensor rope_rotate_half(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int last = int(x.dim()) - 1;
  const int64_t half = x.size(-1) / 2;
  Tensor rotated = ops::concat({ops::affine(x.narrow(last, half, half), -1.0f), x.narrow(last, 0, half)}, last);
  return ops::add(ops::mul(x, cos), ops::mul(rotated, sin));
}

Tensor Qwen3Encoder::layer_forward(const Qwen3Layer& l, const Tensor& x, const Tensor& cos, const Tensor& sin,
                                   const Tensor& mask) const {
  const int64_t b = x.size(0), s = x.size(1), hd = config_.head_dim;
  const int64_t h = config_.num_attention_heads, hk = config_.num_key_value_heads;
  Tensor n = l.input_layernorm(x);
  Tensor q = rope_rotate_half(l.q_norm(l.q_proj(n).reshape({b, s, h, hd})), cos, sin);
  Tensor k = rope_rotate_half(l.k_norm(l.k_proj(n).reshape({b, s, hk, hd})), cos, sin);
  Tensor v = l.v_proj(n).reshape({b, s, hk, hd});
  Tensor attn = ops::attention(q.permute({0, 2, 1, 3}), k.permute({0, 2, 1, 3}), v.permute({0, 2, 1, 3}), mask);
  attn = ops::contiguous(attn.permute({0, 2, 1, 3})).reshape({b, s, h * hd});
  Tensor y = l.o_proj.with_residual(attn, x);
  Tensor m = l.post_attention_layernorm(y);
  Tensor gated = ops::mul(l.gate_proj(m, UnaryOp::kSilu), l.up_proj(m));
  return l.down_proj.with_residual(gated, std::move(y));
}

Expected<Tensor> Qwen3Encoder::hidden_penultimate(const Tensor& ids, const Tensor& mask) const {
  if (ids.dim() != 2 || (ids.dtype() != DType::I32 && ids.dtype() != DType::I64) || mask.shape() != ids.shape())
    return invalid_argument("Qwen3 text encoder: ids must be [batch, tokens] i32/i64 with a mask of the same shape, got " +
                            shape_str(ids.shape()) + " and " + shape_str(mask.shape()));
  const int64_t batch = ids.size(0), seq = ids.size(1);
  const std::vector<int32_t> id_list = int_values(ids), mask_list = int_values(mask);
  for (int32_t id : id_list)
    if (id < 0 || id >= config_.vocab_size)
      return invalid_argument("Qwen3 text encoder: token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                              std::to_string(config_.vocab_size - 1) + ")");
  return catch_expected<Tensor>([&]() -> Expected<Tensor> {
    auto [cos_h, sin_h] = rope_tables(seq, config_.head_dim, config_.rope_theta);
    const Tensor cos = on_device(cos_h, device_), sin = on_device(sin_h, device_);
    const Tensor amask = on_device(attention_mask(mask_list, batch, seq), device_);
    Tensor flat = ops::contiguous(ids.device() == device_ ? ids : ids.to(device_)).reshape({batch * seq});
    Tensor x = embed_tokens_(flat).reshape({batch, seq, config_.hidden_size});
    for (const Qwen3Layer& l : layers_) x = layer_forward(l, x, cos, sin, amask);
    return x;
  });
}

Expected<Tensor> Qwen3Encoder::encode_features(const std::vector<int32_t>& ids, const std::vector<int32_t>& mask) const {
  if (ids.empty() || ids.size() != mask.size())
    return invalid_argument("Qwen3 text encoder: ids and mask must be non-empty and of one length");
  // Padding on the right (the tokenizer's: a prefix of 1s, then 0s) is not run: the attention is causal, so
  // the kept rows never see the padded positions, and their features are the same without them (a prompt of
  // 40 tokens padded to 512 costs 40 positions, not 512).
  size_t len = ids.size();
  const size_t first_pad = size_t(std::find(mask.begin(), mask.end(), 0) - mask.begin());
  if (first_pad > 0 && std::all_of(mask.begin() + std::ptrdiff_t(first_pad), mask.end(), [](int32_t v) { return v == 0; }))
    len = first_pad;
  Tensor id_t = Tensor::empty({1, int64_t(len)}, DType::I32);
  Tensor mask_t = Tensor::empty({1, int64_t(len)}, DType::I32);
  std::copy(ids.begin(), ids.begin() + std::ptrdiff_t(len), id_t.data<int32_t>());
  std::copy(mask.begin(), mask.begin() + std::ptrdiff_t(len), mask_t.data<int32_t>());
  ATELIER_ASSIGN_OR_RETURN(Tensor hidden, hidden_penultimate(id_t, mask_t));
  // Padding removed: the pipeline keeps the rows where the mask is 1 (a prefix, as padding is on the right).
  std::vector<Tensor> rows;
  for (size_t i = 0; i < len; ++i)
    if (mask[i]) rows.push_back(hidden.select(0, 0).narrow(0, int64_t(i), 1));
  if (rows.empty()) return invalid_argument("Qwen3 text encoder: the mask selects no token");
  return catch_expected<Tensor>([&]() -> Expected<Tensor> { return ops::concat(rows, 0); });
}

}  // namespace atelier
