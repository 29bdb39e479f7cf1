#include "models/clip/clip_text_model.h"

#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

namespace atelier {

namespace {

// transformers pools at argmax(ids) when the config carries this eos_token_id (pre-#24773 configs: OpenAI's
// CLIP, SD 1.x); the EOT token has the highest id of CLIP's vocabulary, so argmax finds it.
constexpr int64_t kLegacyEosTokenId = 2;


// ids [B, S] i32/i64 on any device -> row-major host values.
std::vector<int64_t> id_values(const Tensor& ids) {
  Tensor host = ops::contiguous(ids.device().is_cpu() ? ids : ids.to(Device::cpu()));
  std::vector<int64_t> out(size_t(host.numel()));
  if (host.dtype() == DType::I32) {
    const int32_t* p = host.data<int32_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  } else {
    const int64_t* p = host.data<int64_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  }
  return out;
}

// Position pooled for one sequence, as transformers picks it (torch's argmax returns the first maximum).
int64_t pooling_position(const int64_t* ids, int64_t seq, int64_t eos_token_id) {
  int64_t best = 0;
  for (int64_t t = 1; t < seq; ++t) {
    const bool better = eos_token_id == kLegacyEosTokenId ? ids[t] > ids[best]
                                                          : (ids[t] == eos_token_id && ids[best] != eos_token_id);
    if (better) best = t;
  }
  return best;
}

// Binds one encoder layer's tensors. OpenCLIP fuses q, k, v into in_proj [3D, D]; q/k/v become views of it.
void load_layer(WeightLoader w, ClipLayout layout, const ClipTextConfig& c, ClipEncoderLayer& l) {
  const int64_t d = c.hidden_size;
  w.layer_norm(l.layer_norm1, "layer_norm1", d, c.layer_norm_eps);
  w.layer_norm(l.layer_norm2, "layer_norm2", d, c.layer_norm_eps);
  if (layout == ClipLayout::kOpenClip) {
    Tensor in_w, in_b;
    w.tensor(in_w, "self_attn.in_proj_weight", {3 * d, d});
    w.tensor(in_b, "self_attn.in_proj_bias", {3 * d});
    if (in_w.defined() && in_b.defined()) {
      Linear* parts[] = {&l.q_proj, &l.k_proj, &l.v_proj};
      for (int i = 0; i < 3; ++i) *parts[i] = Linear{in_w.narrow(0, i * d, d), in_b.narrow(0, i * d, d)};
    }
  } else {
    w.linear(l.q_proj, "self_attn.q_proj", d, d);
    w.linear(l.k_proj, "self_attn.k_proj", d, d);
    w.linear(l.v_proj, "self_attn.v_proj", d, d);
  }
  w.linear(l.out_proj, "self_attn.out_proj", d, d);
  w.linear(l.fc1, "mlp.fc1", d, c.intermediate_size);
  w.linear(l.fc2, "mlp.fc2", c.intermediate_size, d);
}

// The text projection as a transformers Linear weight [proj, D]; undefined when the checkpoint has none.
Status load_projection(const WeightStore& store, ClipLayout layout, const ClipTextConfig& c, Device device,
                       DType dtype, Linear& projection) {
  const std::string key = clip_projection_key(layout);
  if (key.empty() || !store.contains(key)) return Status::ok();
  WeightLoader w(store, device, dtype);
  if (layout == ClipLayout::kOpenClip) {
    // OpenCLIP applies it as x @ P with P [D, proj]: the Linear weight is its transpose.
    Tensor p;
    w.tensor(p, key, {c.hidden_size, c.projection_dim});
    ATELIER_RETURN_IF_ERROR(w.finish());
    projection.weight = ops::contiguous(p.transpose(0, 1));
  } else {
    w.tensor(projection.weight, key, {c.projection_dim, c.hidden_size});
    ATELIER_RETURN_IF_ERROR(w.finish());
  }
  return Status::ok();
}

}  // namespace

Expected<ClipTextModel> ClipTextModel::load(const WeightStore& store, ClipLayout layout, const ClipTextConfig& config,
                                            Device device, DType dtype, std::optional<int> default_skip) {
  ATELIER_RETURN_IF_ERROR(config.validate());
  if (!backend_available(device)) return unsupported("CLIP text encoder: device " + device.str() + " is not available");
  if (device.is_cpu() && dtype != DType::F32)
    return unsupported("CLIP text encoder: the CPU backend computes in f32, not " + std::string(dtype_name(dtype)));
  ClipTextModel m;
  m.config_ = config;
  m.device_ = device;
  m.dtype_ = dtype;
  // SD 2.x conditions on OpenCLIP's penultimate layer (its config says layer: "penultimate").
  m.default_skip_ = default_skip.value_or(layout == ClipLayout::kOpenClip ? 2 : 1);
  if (m.default_skip_ < 1 || m.default_skip_ > config.num_hidden_layers)
    return invalid_argument("CLIP text encoder: default_skip " + std::to_string(m.default_skip_) + " is outside 1.." +
                            std::to_string(config.num_hidden_layers));
  return catch_expected<ClipTextModel>([&]() -> Expected<ClipTextModel> {
    const int64_t d = config.hidden_size;
    WeightLoader w(store, device, dtype, clip_key_map(layout), clip_tower_prefix(store, layout));
    w.embedding(m.token_embedding_, "embeddings.token_embedding", config.vocab_size, d);
    w.tensor(m.position_embedding_, "embeddings.position_embedding.weight", {config.max_position_embeddings, d});
    // Layers past the default skip never run: they are not loaded (nor required).
    m.layers_.resize(size_t(config.num_hidden_layers - (m.default_skip_ - 1)));
    for (size_t i = 0; i < m.layers_.size(); ++i)
      load_layer(w.scope("encoder.layers." + std::to_string(i)), layout, config, m.layers_[i]);
    w.layer_norm(m.final_layer_norm_, "final_layer_norm", d, config.layer_norm_eps);
    ATELIER_RETURN_IF_ERROR(w.finish());
    ATELIER_RETURN_IF_ERROR(load_projection(store, layout, config, device, dtype, m.text_projection_));
    m.causal_mask_ = m.causal_mask(config.max_position_embeddings);
    m.set_graph_options(default_graph_options());
    return m;
  });
}

int ClipTextModel::max_clip_skip() const { return int(layers_.size()) + 1; }

Expected<int> ClipTextModel::layers_for_skip(int clip_skip) const {
  if (clip_skip < 1 || clip_skip > max_clip_skip())
    return invalid_argument("CLIP text encoder: clip_skip " + std::to_string(clip_skip) + " is outside 1.." +
                            std::to_string(max_clip_skip()) + " (1 = last layer, 2 = penultimate, ...)");
  return int(layers_.size()) - (clip_skip - 1);
}

Status ClipTextModel::check_ids(const Tensor& ids) const {
  if (ids.dim() != 2 || (ids.dtype() != DType::I32 && ids.dtype() != DType::I64))
    return invalid_argument("CLIP text encoder: token ids must be [batch, tokens] i32 or i64, got " +
                            shape_str(ids.shape()) + " " + std::string(dtype_name(ids.dtype())));
  if (ids.size(0) < 1 || ids.size(1) < 1 || ids.size(1) > config_.max_position_embeddings)
    return invalid_argument("CLIP text encoder: " + std::to_string(ids.size(1)) + " tokens per sequence; this model takes 1.." +
                            std::to_string(config_.max_position_embeddings));
  for (int64_t id : id_values(ids))
    if (id < 0 || id >= config_.vocab_size)
      return invalid_argument("CLIP text encoder: token id " + std::to_string(id) + " is outside the vocabulary (0.." +
                              std::to_string(config_.vocab_size - 1) + ")");
  return Status::ok();
}

Tensor ClipTextModel::embed(const Tensor& ids) const {
  const int64_t batch = ids.size(0), seq = ids.size(1);
  Tensor flat = ops::contiguous(ids.device() == device_ ? ids : ids.to(device_)).reshape({batch * seq});
  Tensor tokens = token_embedding_(flat).reshape({batch, seq, config_.hidden_size});
  return ops::add(tokens, position_embedding_.narrow(0, 0, seq));  // positions 0..S-1 broadcast over the batch
}

Tensor ClipTextModel::causal_mask(int64_t seq) const {
  if (causal_mask_.defined()) {
    const int64_t longest = causal_mask_.size(2);
    return seq == longest ? causal_mask_ : ops::contiguous(causal_mask_.narrow(2, 0, seq).narrow(3, 0, seq));
  }
  // Additive: a token attends to itself and the tokens before it.
  std::vector<float> m(size_t(seq * seq), 0.0f);
  for (int64_t i = 0; i < seq; ++i)
    for (int64_t j = i + 1; j < seq; ++j) m[size_t(i * seq + j)] = -std::numeric_limits<float>::infinity();
  Tensor mask = Tensor::from_vector(m, {1, 1, seq, seq});
  return device_.is_cpu() ? mask : mask.to(device_);
}

Tensor ClipTextModel::layer_forward(const ClipEncoderLayer& l, const Tensor& x, const Tensor& mask) const {
  Tensor h = l.layer_norm1(x);
  Tensor attn = ops::multi_head_attention(l.q_proj(h), l.k_proj(h), l.v_proj(h), config_.num_attention_heads, 0, mask);
  Tensor y = l.out_proj.with_residual(attn, x);
  Tensor m = l.fc1(l.layer_norm2(y), config_.hidden_act);
  return l.fc2.with_residual(m, std::move(y));
}

Tensor ClipTextModel::pool(const Tensor& host_ids, const Tensor& last) const {
  const std::vector<int64_t> ids = id_values(host_ids);
  const int64_t batch = host_ids.size(0), seq = host_ids.size(1);
  std::vector<Tensor> rows;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t at = pooling_position(ids.data() + b * seq, seq, config_.eos_token_id);
    rows.push_back(last.select(0, b).narrow(0, at, 1));  // [1, D]
  }
  return ops::concat(rows, 0);
}

GraphRunner::Options ClipTextModel::default_graph_options() {
  const char* env = std::getenv("ATELIER_TEXT_GRAPHS");
  return {.max_entries = 6, .enabled = !(env && std::string(env) == "0"), .batch_buckets = {1, 2, 4, 8, 16, 32, 64}};
}

GraphRunner& ClipTextModel::graphs(int clip_skip) const {
  const Expected<int> depth = layers_for_skip(clip_skip);
  ATELIER_CHECK(depth.has_value(), depth.status().message());
  return *graphs_[size_t(*depth)];
}

void ClipTextModel::set_graph_options(GraphRunner::Options options) {
  graphs_.clear();
  for (size_t depth = 0; depth <= layers_.size(); ++depth) graphs_.push_back(std::make_shared<GraphRunner>(options));
}

Tensor ClipTextModel::run(const Tensor& ids, int depth) const {
  const Tensor mask = causal_mask(ids.size(1));
  Tensor x = embed(ids);
  for (int i = 0; i < depth; ++i) x = layer_forward(layers_[size_t(i)], x, mask);
  return final_layer_norm_(x);
}

Expected<Tensor> ClipTextModel::forward(const Tensor& ids, int clip_skip) const {
  ATELIER_ASSIGN_OR_RETURN(const int depth, layers_for_skip(clip_skip));
  ATELIER_RETURN_IF_ERROR(check_ids(ids));
  return catch_expected<Tensor>([&]() -> Expected<Tensor> {
    // The ids are the recording's input; the mask and the weights outlive it. A recording is per depth
    // (graphs_), since the runner tells calls apart by their inputs' shapes only.
    return graphs_[size_t(depth)]->run({ids}, device_, [this, depth](const std::vector<Tensor>& in) { return run(in[0], depth); });
  });
}

Expected<ClipTextOutput> ClipTextModel::forward_with_pooled(const Tensor& ids, const ClipPooledOptions& options) const {
  ATELIER_ASSIGN_OR_RETURN(const int depth, layers_for_skip(options.clip_skip));
  ATELIER_RETURN_IF_ERROR(check_ids(ids));
  return catch_expected<ClipTextOutput>([&]() -> Expected<ClipTextOutput> {
    const Tensor mask = causal_mask(ids.size(1));
    Tensor x = embed(ids);
    Tensor at_depth = x;  // the embeddings when every layer is skipped
    for (size_t i = 0; i < layers_.size(); ++i) {
      x = layer_forward(layers_[i], x, mask);
      if (int(i) + 1 == depth) at_depth = x;
    }
    ClipTextOutput out;
    const Tensor last = final_layer_norm_(x);
    if (!options.hidden_final_norm) out.hidden = at_depth;
    else out.hidden = depth == int(layers_.size()) ? last : final_layer_norm_(at_depth);
    out.pooled = pool(ids, last);
    if (options.project && has_projection()) out.pooled = text_projection_(out.pooled);
    return out;
  });
}

Expected<Tensor> apply_emphasis(const Tensor& hidden, const Tensor& weights) {
  if (hidden.dim() != 3 || weights.dim() != 2 || weights.size(0) != hidden.size(0) || weights.size(1) != hidden.size(1))
    return invalid_argument("apply_emphasis: expected hidden [B, S, D] and weights [B, S], got " +
                            shape_str(hidden.shape()) + " and " + shape_str(weights.shape()));
  return catch_expected<Tensor>([&]() -> Expected<Tensor> {
    const std::vector<float> z = hidden.to_vector();
    const std::vector<float> w = weights.to_vector();
    const int64_t dim = hidden.size(2);
    // Means over the whole tensor (every sample, token and channel), before and after weighting.
    double before = 0.0, after = 0.0;
    for (size_t t = 0; t < w.size(); ++t) {
      double token_sum = 0.0;
      for (int64_t c = 0; c < dim; ++c) token_sum += z[t * size_t(dim) + size_t(c)];
      before += token_sum;
      after += token_sum * double(float(w[t]));
    }
    const double count = double(hidden.numel());
    const float mean_before = float(before / count), mean_after = float(after / count);
    Tensor factors = Tensor::from_vector(w, {weights.size(0), weights.size(1), 1});
    if (hidden.dtype() != DType::F32) factors = ops::cast(factors, hidden.dtype());
    if (!hidden.device().is_cpu()) factors = factors.to(hidden.device());
    Tensor scaled = ops::mul(hidden, factors);
    // A zero mean after weighting has no rescale that restores the original; keep the weighted tensor.
    if (mean_after == 0.0f || mean_before == mean_after) return scaled;
    return ops::affine(scaled, mean_before / mean_after);
  });
}

}  // namespace atelier
