#include "models/sd/unet_blocks.h"

namespace atelier {
namespace {

constexpr float kTransformerNormEps = 1e-6f;  // Transformer2DModel's GroupNorm (fixed in diffusers)
constexpr float kLayerNormEps = 1e-5f;        // BasicTransformerBlock's LayerNorms
constexpr int kFeedForwardMult = 4;           // GEGLU inner width = 4 * dim

}  // namespace

// --- ParamSource ------------------------------------------------------------------------------------

ParamSource ParamSource::scope(const std::string& name) const {
  ParamSource p = *this;
  p.scope_ = scope_.empty() ? name : scope_ + "." + name;
  return p;
}

void ParamSource::tensor(Tensor& field, const std::string& key, const Shape& shape) const {
  (*fill_)(field, scope_.empty() ? key : scope_ + "." + key, shape);
}

void ParamSource::linear(Linear& l, const std::string& key, int64_t in, int64_t out, bool bias) const {
  tensor(l.weight, key + ".weight", {out, in});
  if (bias) tensor(l.bias, key + ".bias", {out});
}

void ParamSource::conv(Conv2d& c, const std::string& key, int64_t in, int64_t out, int k, int stride, int pad) const {
  tensor(c.weight, key + ".weight", {out, in, k, k});
  tensor(c.bias, key + ".bias", {out});
  c.params.stride_h = c.params.stride_w = stride;
  c.params.pad_h = c.params.pad_w = pad < 0 ? k / 2 : pad;
}

void ParamSource::group_norm(GroupNorm& n, const std::string& key, int64_t channels, int groups, float eps) const {
  tensor(n.weight, key + ".weight", {channels});
  tensor(n.bias, key + ".bias", {channels});
  n.groups = groups;
  n.eps = eps;
}

void ParamSource::layer_norm(LayerNorm& n, const std::string& key, int64_t dim, float eps) const {
  tensor(n.weight, key + ".weight", {dim});
  tensor(n.bias, key + ".bias", {dim});
  n.eps = eps;
}

// --- ResnetBlock --------------------------------------------------------------------------------------

void ResnetBlock::build(const ParamSource& p, int64_t in, int64_t out, int64_t temb, int groups, float eps) {
  p.group_norm(norm1, "norm1", in, groups, eps);
  p.conv(conv1, "conv1", in, out, 3);
  p.linear(time_emb_proj, "time_emb_proj", temb, out);
  p.group_norm(norm2, "norm2", out, groups, eps);
  p.conv(conv2, "conv2", out, out, 3);
  if (in != out) p.conv(conv_shortcut, "conv_shortcut", in, out, 1);
}

namespace {
// The input as one tensor: the residual of a block without a shortcut convolution.
const Tensor& as_tensor(const Tensor& x) { return x; }
const Tensor& as_tensor(const ops::ChannelConcat& x) { return x.joined(); }
}  // namespace

// X: a Tensor or an ops::ChannelConcat (x [B, in, H, W] either way) -> [B, out, H, W]
template <class X>
Tensor ResnetBlock::forward_impl(const X& x, const UNetConditioning& cond) const {
  // [B, out]: one time bias per sample and channel (a view of the stacked projection where there is one)
  const int64_t out_channels = time_emb_proj.out_features();
  const Tensor t = cond.time_proj.defined() && time_col >= 0 ? cond.time_proj.narrow(1, time_col, out_channels)
                                                              : time_emb_proj(cond.temb_act).reshape({x.size(0), out_channels});
  const Tensor h = conv1(norm1(x, UnaryOp::kSilu));
  // diffusers adds the time bias to h and normalises the sum; norm2 is the sum's only reader, so the bias joins
  // there (no pass over h of its own; in f32 inside the norm instead of one more 16-bit rounding of h + t).
  // The residual joins in conv2's output pass (diffusers adds it after: the same sum, rounded once more there); a
  // shortcut convolution's products join conv2's own where the device can (ops::conv2d_with_shortcut).
  const Tensor h2 = norm2(h, UnaryOp::kSilu, t);
  Tensor out = conv_shortcut.weight.defined() ? conv2.with_shortcut(h2, conv_shortcut, x) : conv2(h2, as_tensor(x));
  // diffusers divides by output_scale_factor; only SD variants with a factor other than 1 pay for it.
  if (output_scale != 1.0f) out = ops::div(out, Tensor::full({1}, output_scale, out.device()));
  return out;
}

Tensor ResnetBlock::forward(const Tensor& x, const UNetConditioning& cond) const { return forward_impl(x, cond); }
Tensor ResnetBlock::forward(const ops::ChannelConcat& x, const UNetConditioning& cond) const { return forward_impl(x, cond); }

// --- Attention ----------------------------------------------------------------------------------------

void Attention::build(const ParamSource& p, int64_t dim, int64_t kv_dim, int num_heads, bool self_attention) {
  p.linear(to_q, "to_q", dim, dim, /*bias=*/false);
  p.linear(to_k, "to_k", kv_dim, dim, /*bias=*/false);
  p.linear(to_v, "to_v", kv_dim, dim, /*bias=*/false);
  p.linear(to_out, "to_out.0", dim, dim);
  heads = num_heads;
  // A source that lists keys only (no tensors) leaves them undefined: stack_linears fuses nothing then.
  if (self_attention) stack_linears(to_qkv, {&to_q, &to_k, &to_v});
}

Tensor Attention::attend(const Tensor& x, const Tensor& kv, const Tensor& kv_proj) const {
  if (kv.defined() && kv_proj.defined() && k_col >= 0) {
    const int64_t dim = to_k.out_features();
    return ops::multi_head_attention(to_q(x), kv_proj.narrow(2, k_col, dim), kv_proj.narrow(2, v_col, dim), heads);
  }
  if (!kv.defined() && to_qkv.weight.defined()) {
    const Tensor qkv = to_qkv(x);  // [B, S, 3 dim]; q, k, v are views of it
    const int64_t dim = to_q.out_features();
    return ops::multi_head_attention(qkv.narrow(2, 0, dim), qkv.narrow(2, dim, dim), qkv.narrow(2, 2 * dim, dim), heads);
  }
  const Tensor& src = kv.defined() ? kv : x;
  return ops::multi_head_attention(to_q(x), to_k(src), to_v(src), heads);
}

// --- TransformerBlock ---------------------------------------------------------------------------------

void TransformerBlock::build(const ParamSource& p, int64_t dim, int64_t cross_dim, int heads, bool only_cross) {
  only_cross_attention = only_cross;
  p.layer_norm(norm1, "norm1", dim, kLayerNormEps);
  attn1.build(p.scope("attn1"), dim, only_cross ? cross_dim : dim, heads, /*self_attention=*/!only_cross);
  p.layer_norm(norm2, "norm2", dim, kLayerNormEps);
  attn2.build(p.scope("attn2"), dim, cross_dim, heads, /*self_attention=*/false);
  p.layer_norm(norm3, "norm3", dim, kLayerNormEps);
  const int64_t inner = kFeedForwardMult * dim;
  p.linear(ff_in, "ff.net.0.proj", dim, 2 * inner);
  p.linear(ff_out, "ff.net.2", inner, dim);
}

// h is taken: each residual branch accumulates onto its buffer in place where the caller kept no other handle.
Tensor TransformerBlock::forward(Tensor h, const UNetConditioning& cond) const {
  Tensor a = only_cross_attention ? attn1.attend(norm1(h), cond.context, cond.context_kv) : attn1.attend(norm1(h), Tensor());
  h = attn1.to_out.with_residual(a, std::move(h));
  a = attn2.attend(norm2(h), cond.context, cond.context_kv);
  h = attn2.to_out.with_residual(a, std::move(h));
  const Tensor g = ff_in.glu(norm3(h), UnaryOp::kGelu);  // GEGLU: value * gelu(gate)
  return ff_out.with_residual(g, std::move(h));
}

// --- Transformer2D ------------------------------------------------------------------------------------

void Transformer2D::build(const ParamSource& p, int64_t channels, int64_t cross_dim, int heads, int depth,
                          int groups, bool only_cross) {
  p.group_norm(norm, "norm", channels, groups, kTransformerNormEps);
  p.linear(proj_in, "proj_in", channels, channels);
  blocks.resize(depth);
  for (int d = 0; d < depth; ++d)
    blocks[d].build(p.scope("transformer_blocks." + std::to_string(d)), channels, cross_dim, heads, only_cross);
  p.linear(proj_out, "proj_out", channels, channels);
}

Tensor Transformer2D::forward(const Tensor& x, const UNetConditioning& cond) const {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  // [B, C, H, W] -> [B, H*W, C]: one token per pixel (a view, no copy, of a channels-last image).
  const auto tokens = [&](const Tensor& img) { return ops::contiguous(img.permute({0, 2, 3, 1})).reshape({b, h * w, c}); };
  Tensor seq = proj_in(tokens(norm(x)));
  for (const auto& blk : blocks) seq = blk.forward(std::move(seq), cond);
  seq = proj_out.with_residual(seq, tokens(x));
  return seq.reshape({b, h, w, c}).permute({0, 3, 1, 2});  // channels-last view of the tokens
}

// --- Down / mid / up blocks ---------------------------------------------------------------------------

Tensor DownBlock::forward(const Tensor& x, const UNetConditioning& cond, std::vector<Tensor>& skips) const {
  Tensor h = x;
  for (size_t j = 0; j < resnets.size(); ++j) {
    h = resnets[j].forward(h, cond);
    if (!attentions.empty()) h = attentions[j].forward(h, cond);
    skips.push_back(h);
  }
  if (downsampler.weight.defined()) {
    if (pad_before_downsample) h = ops::pad2d(h, 0, 1, 0, 1);
    h = downsampler(h);
    skips.push_back(h);
  }
  return h;
}

Tensor MidBlock::forward(const Tensor& x, const UNetConditioning& cond) const {
  Tensor h = resnets[0].forward(x, cond);
  for (size_t j = 0; j < attentions.size(); ++j) {
    h = attentions[j].forward(h, cond);
    h = resnets[j + 1].forward(h, cond);
  }
  return h;
}

Tensor UpBlock::forward(const Tensor& x, const UNetConditioning& cond, std::vector<Tensor>& skips) const {
  Tensor h = x;
  for (size_t j = 0; j < resnets.size(); ++j) {
    ATELIER_CHECK(!skips.empty(), "UNet up block ran out of skip connections");
    // [h, skip] along channels, never written where the device reads both where they lie
    h = resnets[j].forward(ops::ChannelConcat(h, skips.back()), cond);
    skips.pop_back();
    if (!attentions.empty()) h = attentions[j].forward(h, cond);
  }
  if (upsampler.weight.defined()) {
    ATELIER_CHECK(!skips.empty(), "UNet upsampler has no skip connection to take its size from");
    const int64_t height = skips.back().size(2), width = skips.back().size(3);
    // 2x - 1 (an odd size on the way down): the convolution sees the cropped tensor's zero padding
    h = height == 2 * h.size(2) && width == 2 * h.size(3) ? upsampler.upsampled2x(h) : upsampler(upsample_nearest_to(h, height, width));
  }
  return h;
}

Tensor upsample_nearest_to(const Tensor& x, int64_t height, int64_t width) {
  Tensor up = ops::upsample_nearest2d(x, 2);
  if (up.size(2) == height && up.size(3) == width) return up;
  // torch picks source row floor(i * h / H); for H = 2h - 1 that is floor(i / 2), i.e. 2x then crop.
  ATELIER_CHECK(height <= up.size(2) && height >= up.size(2) - 1 && width <= up.size(3) && width >= up.size(3) - 1,
                "upsample target " + std::to_string(height) + "x" + std::to_string(width) + " is not 2x or 2x-1 of " +
                    shape_str(x.shape()));
  return ops::contiguous(up.narrow(2, 0, height).narrow(3, 0, width));
}

}  // namespace atelier
