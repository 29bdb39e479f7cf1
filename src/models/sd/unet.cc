#include "models/sd/unet.h"

#include "backend/ops.h"

#include <algorithm>
#include <cmath>

#include "core/trace.h"
#include "models/common/weights.h"
#include "models/sd/unet_keymap_compvis.h"

namespace atelier {
namespace {

constexpr double kMaxPeriod = 10000.0;  // get_timestep_embedding's max_period
constexpr int kResnetKernel = 3;

// --- deterministic random parameters ------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Uniform values whose scale keeps activations O(1) through many layers: matrices and kernels get
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (torch's default init), norm gains 1 + U(-0.1, 0.1), biases U(-0.05, 0.05).
// Each tensor's stream depends only on the seed and its name, so it does not depend on build order.
Tensor random_parameter(const std::string& key, const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F32);
  float* data = t.data<float>();
  const int64_t n = t.numel();
  float center = 0.0f, bound = 0.05f;
  if (shape.size() >= 2) {
    bound = float(1.0 / std::sqrt(double(n / shape[0])));
  } else if (ends_with(key, ".weight")) {
    center = 1.0f;
    bound = 0.1f;
  }
  const uint64_t stream = splitmix64(seed ^ fnv1a(key));
  constexpr double kTwoPow53 = 9007199254740992.0;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const double u = double(splitmix64(stream + uint64_t(i)) >> 11) / kTwoPow53;  // [0, 1)
    data[i] = center + bound * float(2.0 * u - 1.0);
  }
  return t;
}

// --- building blocks of the network from the config -------------------------------------------------

struct BlockSpec {  // what the transformers of one level look like
  bool attention;
  int64_t cross_dim;
  int heads;
  int depth;
  bool only_cross;
};

void build_level_modules(std::vector<ResnetBlock>& resnets, std::vector<Transformer2D>& attentions,
                         const ParamSource& p, const std::vector<int64_t>& resnet_in, int64_t out,
                         const UNetConfig& c, const BlockSpec& spec) {
  resnets.resize(resnet_in.size());
  attentions.resize(spec.attention ? resnet_in.size() : 0);
  for (size_t j = 0; j < resnet_in.size(); ++j) {
    resnets[j].build(p.scope("resnets." + std::to_string(j)), resnet_in[j], out, c.time_embed_dim,
                     c.norm_num_groups, c.norm_eps);
    if (spec.attention)
      attentions[j].build(p.scope("attentions." + std::to_string(j)), out, spec.cross_dim, spec.heads, spec.depth,
                          c.norm_num_groups, spec.only_cross);
  }
}

}  // namespace

std::vector<float> timestep_frequencies(int half, float freq_shift) {
  // torch: exponent = (-ln(max_period) as f32) * arange(half) / (half - shift), then exp, all in f32.
  // exp goes through double and rounds once, i.e. correctly rounded, which is what torch's vectorised f32
  // kernels (<= 1 ulp) give in all but rare cases.
  const float neg_log_period = float(-std::log(kMaxPeriod));
  std::vector<float> freqs(half);
  for (int i = 0; i < half; ++i) {
    const float exponent = (neg_log_period * float(i)) / (float(half) - freq_shift);
    freqs[i] = float(std::exp(double(exponent)));
  }
  return freqs;
}

Tensor timestep_embedding(const std::vector<float>& timesteps, int dim, bool flip_sin_to_cos, float freq_shift) {
  const int half = dim / 2;
  const std::vector<float> freqs = timestep_frequencies(half, freq_shift);
  const int64_t batch = int64_t(timesteps.size());
  Tensor out = Tensor::zeros({batch, dim});
  float* o = out.data<float>();
  const int sin_at = flip_sin_to_cos ? half : 0, cos_at = flip_sin_to_cos ? 0 : half;
  for (int64_t b = 0; b < batch; ++b) {
    for (int i = 0; i < half; ++i) {
      const float arg = timesteps[b] * freqs[i];
      o[b * dim + sin_at + i] = float(std::sin(double(arg)));
      o[b * dim + cos_at + i] = float(std::cos(double(arg)));
    }
  }
  return out;
}

void UNet::build(const ParamSource& p) {
  const UNetConfig& c = config_;
  const int n = c.levels();
  const int64_t c0 = c.block_out_channels[0], temb = c.time_embed_dim;
  const int half = int(c0 / 2);
  freqs_ = Tensor::from_vector(timestep_frequencies(half, float(c.freq_shift)), {1, half});
  if (!device_.is_cpu()) freqs_ = freqs_.to(device_);
  p.linear(time_linear_1_, "time_embedding.linear_1", c0, temb);
  p.linear(time_linear_2_, "time_embedding.linear_2", temb, temb);
  p.conv(conv_in_, "conv_in", c.in_channels, c0, c.conv_in_kernel);

  down_.resize(n);
  int64_t out = c0;
  for (int i = 0; i < n; ++i) {
    const int64_t in = out;
    out = c.block_out_channels[i];
    const ParamSource s = p.scope("down_blocks." + std::to_string(i));
    std::vector<int64_t> resnet_in(c.layers_per_block[i], out);
    resnet_in[0] = in;
    const BlockSpec spec{c.down_has_attention(i), c.cross_attention_dim[i], c.num_attention_heads[i],
                         c.transformer_layers_per_block[i], c.only_cross_attention[i]};
    build_level_modules(down_[i].resnets, down_[i].attentions, s, resnet_in, out, c, spec);
    if (i + 1 < n) {
      s.conv(down_[i].downsampler, "downsamplers.0.conv", out, out, kResnetKernel, /*stride=*/2, c.downsample_padding);
      down_[i].pad_before_downsample = c.downsample_padding == 0;
    }
  }

  if (c.has_mid_block()) {
    const ParamSource s = p.scope("mid_block");
    const BlockSpec spec{true, c.cross_attention_dim[n - 1], c.num_attention_heads[n - 1],
                         c.transformer_layers_per_block[n - 1], false};
    mid_.resnets.resize(2);
    mid_.attentions.resize(1);
    for (int j = 0; j < 2; ++j) {
      mid_.resnets[j].build(s.scope("resnets." + std::to_string(j)), out, out, temb, c.norm_num_groups, c.norm_eps);
      mid_.resnets[j].output_scale = c.mid_block_scale_factor;
    }
    mid_.attentions[0].build(s.scope("attentions.0"), out, spec.cross_dim, spec.heads, spec.depth, c.norm_num_groups, false);
  }

  // Up block u works at level L = n - 1 - u. Its resnets take the running tensor (the previous block's
  // output, then its own) concatenated with a skip: the level's own outputs, and last the output of the
  // level above (or conv_in's for the top level).
  up_.resize(n);
  int64_t prev = out;
  for (int u = 0; u < n; ++u) {
    const int level = c.up_level(u);
    const int64_t level_out = c.block_out_channels[level];
    const int64_t skip_above = c.block_out_channels[std::max(level - 1, 0)];
    const int count = c.layers_per_block[level] + 1;
    std::vector<int64_t> resnet_in(count);
    for (int j = 0; j < count; ++j)
      resnet_in[j] = (j == 0 ? prev : level_out) + (j == count - 1 ? skip_above : level_out);
    const ParamSource s = p.scope("up_blocks." + std::to_string(u));
    const BlockSpec spec{c.up_has_attention(u), c.cross_attention_dim[level], c.num_attention_heads[level],
                         c.reverse_transformer_layers_per_block[u], c.only_cross_attention[level]};
    build_level_modules(up_[u].resnets, up_[u].attentions, s, resnet_in, level_out, c, spec);
    if (u + 1 < n) s.conv(up_[u].upsampler, "upsamplers.0.conv", level_out, level_out, kResnetKernel);
    prev = level_out;
  }

  p.group_norm(norm_out_, "conv_norm_out", c0, c.norm_num_groups, c.norm_eps);
  p.conv(conv_out_, "conv_out", c0, c.out_channels, c.conv_out_kernel);
  stack_shared_projections();
}

void UNet::stack_shared_projections() {
  std::vector<ResnetBlock*> resnets;
  std::vector<Attention*> cross;  // attentions whose keys and values come from the context
  const auto visit = [&](std::vector<ResnetBlock>& rs, std::vector<Transformer2D>& ts) {
    for (auto& r : rs) resnets.push_back(&r);
    for (auto& t : ts)
      for (auto& b : t.blocks) {
        if (b.only_cross_attention) cross.push_back(&b.attn1);
        cross.push_back(&b.attn2);
      }
  };
  for (auto& d : down_) visit(d.resnets, d.attentions);
  visit(mid_.resnets, mid_.attentions);
  for (auto& u : up_) visit(u.resnets, u.attentions);
  // A source that lists keys only (no tensors) leaves the weights undefined: nothing to stack then.
  const bool bound = std::all_of(resnets.begin(), resnets.end(), [](const ResnetBlock* r) {
    return r->time_emb_proj.weight.defined() && r->time_emb_proj.bias.defined();
  }) && std::all_of(cross.begin(), cross.end(), [](const Attention* a) { return a->to_k.weight.defined() && a->to_v.weight.defined(); });
  if (!bound) return;
  // Each block keeps where its columns of the stacked output start (its part is a view of those rows).
  std::vector<Linear*> time_parts;
  for (ResnetBlock* r : resnets) time_parts.push_back(&r->time_emb_proj);
  if (stack_linears(time_proj_, time_parts)) {
    int64_t col = 0;
    for (ResnetBlock* r : resnets) {
      r->time_col = col;
      col += r->time_emb_proj.out_features();
    }
  }
  std::vector<Linear*> kv_parts;
  for (Attention* a : cross) {
    kv_parts.push_back(&a->to_k);
    kv_parts.push_back(&a->to_v);
  }
  if (stack_linears(context_kv_, kv_parts)) {
    int64_t col = 0;
    for (Attention* a : cross) {
      a->k_col = col;
      a->v_col = col + a->to_k.out_features();
      col = a->v_col + a->to_v.out_features();
    }
  }
}

Expected<UNet> UNet::load(const WeightStore& store, UNetLayout layout, const UNetConfig& config, Device device,
                          DType dtype) {
  ATELIER_RETURN_IF_ERROR(config.validate());
  KeyMap map;
  std::string prefix;
  if (layout == UNetLayout::kCompVis) {
    map = compvis_unet_key_map(config);
    if (store.any_with_prefix(kCompVisUNetPrefix)) prefix = kCompVisUNetPrefix;
  }
  WeightLoader loader(store, device, dtype, map, prefix);
  UNet unet(config, device, dtype);
  ParamSource p([&loader](Tensor& field, const std::string& key, const Shape& shape) { loader.tensor(field, key, shape); });
  ATELIER_RETURN_IF_ERROR(catch_status([&] {
    unet.build(p);
    return Status::ok();
  }));
  ATELIER_RETURN_IF_ERROR(loader.finish());
  return unet;
}

Expected<UNet> UNet::random(const UNetConfig& config, uint64_t seed, Device device, DType dtype) {
  ATELIER_RETURN_IF_ERROR(config.validate());
  UNet unet(config, device, dtype);
  ParamSource p([&](Tensor& field, const std::string& key, const Shape& shape) {
    Tensor t = random_parameter(key, shape, seed);
    if (dtype != DType::F32) t = ops::cast(t, dtype);
    field = device.is_cpu() ? t : t.to(device);
  });
  ATELIER_RETURN_IF_ERROR(catch_status([&] {
    unet.build(p);
    return Status::ok();
  }));
  return unet;
}

Expected<std::vector<std::pair<std::string, Shape>>> UNet::parameter_shapes(const UNetConfig& config) {
  ATELIER_RETURN_IF_ERROR(config.validate());
  std::vector<std::pair<std::string, Shape>> out;
  UNet unet(config, Device::cpu(), DType::F32);
  unet.build(ParamSource([&out](Tensor&, const std::string& key, const Shape& shape) { out.emplace_back(key, shape); }));
  return out;
}

Status UNet::check_inputs(const Tensor& x, const Tensor& timesteps, const Tensor& context) const {
  const UNetConfig& c = config_;
  if (!x.defined() || x.dim() != 4 || x.size(1) != c.in_channels || x.size(0) < 1 || x.size(2) < 1 || x.size(3) < 1)
    return invalid_argument("UNet input must be [B, " + std::to_string(c.in_channels) + ", h, w], got " +
                            (x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor")));
  const int64_t batch = x.size(0);
  if (!timesteps.defined() || timesteps.dim() != 1 || (timesteps.size(0) != batch && timesteps.size(0) != 1))
    return invalid_argument("UNet timesteps must be [B] (one per sample) or [1] with B = " + std::to_string(batch) +
                            ", got " + (timesteps.defined() ? shape_str(timesteps.shape()) : std::string("none")));
  if (!context.defined() || context.dim() != 3 || context.size(0) != batch || context.size(1) < 1)
    return invalid_argument("UNet context must be [" + std::to_string(batch) + ", S, D], got " +
                            (context.defined() ? shape_str(context.shape()) : std::string("none")));
  for (int i = 0; i < c.levels(); ++i)
    if (context.size(2) != c.cross_attention_dim[i])
      return invalid_argument("UNet context width " + std::to_string(context.size(2)) + " does not match the model's " +
                              "cross_attention_dim " + std::to_string(c.cross_attention_dim[i]));
  if (x.device() != device_ || context.device() != device_)
    return invalid_argument("UNet inputs must be on " + device_.str() + " (the weights' device)");
  return Status::ok();
}

Expected<Tensor> UNet::forward(const Tensor& x, const Tensor& timesteps, const Tensor& context,
                               GraphRunner::Result result) const {
  ATELIER_RETURN_IF_ERROR(check_inputs(x, timesteps, context));
  // Every UNet call is one trace range wherever it is called from (pipeline, batcher, bench); the pipeline
  // names it stage::kUnet.
  trace::Scope range("unet", trace::Category::kCall);
  Tensor out;
  ATELIER_RETURN_IF_ERROR(catch_status([&] {
    // On a device that records its work (CUDA) the call is replayed as one graph from the second call of a
    // shape on; elsewhere this is a plain call.
    out = graphs_->run({x, timesteps, context}, device_,
                       [this](const std::vector<Tensor>& in) { return run(in[0], in[1], in[2]); }, result);
    return Status::ok();
  }));
  return out;
}

// timesteps [B] or [1] f32 on any device -> [batch, block_out_channels[0]] in the UNet's dtype on the weights'
// device. The same arithmetic as timestep_embedding (f32 products t * freq, then sin and cos), but as an op on the
// device (one kernel on CUDA), so a UNet call needs no host round trip and can be captured as one CUDA graph whose
// input is the timesteps tensor.
Tensor UNet::device_timestep_features(const Tensor& timesteps, int64_t batch) const {
  Tensor t = ops::contiguous(timesteps.dtype() == DType::F32 ? timesteps : ops::cast(timesteps, DType::F32));
  if (t.device() != device_) t = t.to(device_);
  return ops::timestep_features(t, freqs_, config_.flip_sin_to_cos, config_.block_out_channels[0], batch, dtype_);
}

Tensor UNet::run(const Tensor& x_in, const Tensor& timesteps, const Tensor& context_in) const {
  const UNetConfig& c = config_;
  const int64_t batch = x_in.size(0);
  const auto in_dtype = [&](const Tensor& t) { return t.dtype() == dtype_ ? t : ops::cast(t, dtype_); };

  const Tensor features = device_timestep_features(timesteps, batch);
  const Tensor temb = time_linear_2_(time_linear_1_(features, UnaryOp::kSilu));
  UNetConditioning cond;
  cond.temb_act = ops::silu(temb);  // every resnet applies SiLU before its time projection
  cond.context = in_dtype(context_in);
  if (time_proj_.weight.defined()) cond.time_proj = time_proj_(cond.temb_act);
  if (context_kv_.weight.defined()) cond.context_kv = context_kv_(cond.context);

  Tensor h = in_dtype(x_in);
  if (c.center_input_sample) h = ops::affine(h, 2.0f, -1.0f);
  h = conv_in_(h);
  std::vector<Tensor> skips{h};
  for (const auto& d : down_) h = d.forward(h, cond, skips);
  if (c.has_mid_block()) h = mid_.forward(h, cond);
  for (const auto& u : up_) h = u.forward(h, cond, skips);
  ATELIER_CHECK(skips.empty(), "UNet left skip connections unused");
  h = conv_out_(norm_out_(h, UnaryOp::kSilu));
  // f32 and contiguous whatever the activations' layout (samplers combine whole tensors).
  return h.dtype() == DType::F32 ? ops::contiguous(h) : ops::cast(h, DType::F32);
}

}  // namespace atelier
