#include "models/vae/vae_blocks.h"

#include <cmath>

#include "backend/ops.h"

namespace atelier {

namespace {

constexpr float kNormEps = 1e-6f;  // every GroupNorm of AutoencoderKL (resnet_eps)

std::string idx(const std::string& key, const char* part, size_t i) { return key + "." + part + "." + std::to_string(i); }

}  // namespace

// --- random parameters ---------------------------------------------------------------------------

Tensor VaeRandomParamSource::uniform(const Shape& shape, float bound) {
  std::uniform_real_distribution<float> dist(-bound, bound);
  std::vector<float> v(size_t(numel_of(shape)));
  for (float& x : v) x = dist(rng_);
  Tensor t = Tensor::from_vector(v, shape);
  if (dtype_ != DType::F32) t = ops::cast(t, dtype_);
  return t.to(device_);
}

void VaeRandomParamSource::conv(Conv2d& c, const std::string&, int64_t in, int64_t out, int k, int stride, int pad) {
  const float bound = 1.0f / std::sqrt(float(in * k * k));
  c.weight = uniform({out, in, k, k}, bound);
  c.bias = uniform({out}, bound);
  c.params.stride_h = c.params.stride_w = stride;
  c.params.pad_h = c.params.pad_w = pad < 0 ? k / 2 : pad;
}

void VaeRandomParamSource::linear(Linear& l, const std::string&, int64_t in, int64_t out) {
  const float bound = 1.0f / std::sqrt(float(in));
  l.weight = uniform({out, in}, bound);
  l.bias = uniform({out}, bound);
}

void VaeRandomParamSource::group_norm(GroupNorm& n, const std::string&, int64_t channels, int groups, float eps) {
  n.weight = Tensor::full({channels}, 1.0f, device_);
  n.bias = Tensor::full({channels}, 0.0f, device_);
  n.groups = groups;
  n.eps = eps;
}

// --- resnet --------------------------------------------------------------------------------------

void VaeResnet::bind(VaeParamSource& p, const std::string& key, int64_t in, int64_t out, int groups) {
  p.group_norm(norm1, key + ".norm1", in, groups, kNormEps);
  p.conv(conv1, key + ".conv1", in, out, 3);
  p.group_norm(norm2, key + ".norm2", out, groups, kNormEps);
  p.conv(conv2, key + ".conv2", out, out, 3);
  if (in != out) p.conv(conv_shortcut, key + ".conv_shortcut", in, out, 1);
}

Tensor VaeResnet::operator()(const Tensor& x) const {
  const Tensor h = conv1(norm1(x, UnaryOp::kSilu));
  // dropout is 0 at inference, output_scale_factor 1 in the VAE; the residual joins in conv2's output pass, a
  // shortcut convolution's products conv2's own where the device can (ops::conv2d_with_shortcut)
  const Tensor h2 = norm2(h, UnaryOp::kSilu);
  return conv_shortcut.weight.defined() ? conv2.with_shortcut(h2, conv_shortcut, x) : conv2(h2, x);
}

// --- attention -----------------------------------------------------------------------------------

void VaeAttention::bind(VaeParamSource& p, const std::string& key, int64_t channels, int groups) {
  p.group_norm(norm, key + ".group_norm", channels, groups, kNormEps);
  Linear q, k, v;
  p.linear(q, key + ".to_q", channels, channels);
  p.linear(k, key + ".to_k", channels, channels);
  p.linear(v, key + ".to_v", channels, channels);
  p.linear(proj_out, key + ".to_out.0", channels, channels);
  // A missing projection is already recorded by the loader; fuse only complete sets.
  if (q.weight.defined() && k.weight.defined() && v.weight.defined() && q.bias.defined() && k.bias.defined() && v.bias.defined()) {
    qkv.weight = ops::concat({q.weight, k.weight, v.weight}, 0);
    qkv.bias = ops::concat({q.bias, k.bias, v.bias}, 0);
  }
}

Tensor VaeAttention::operator()(const Tensor& x) const {
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  // [B, C, H, W] -> [B, HW, C] (a view, no copy, of a channels-last image)
  const auto tokens = [&](const Tensor& img) { return ops::contiguous(img.permute({0, 2, 3, 1})).reshape({B, H * W, C}); };
  const Tensor fused = qkv(tokens(norm(x)));  // [B, HW, 3C]
  // One head of width C: views [B, 1, HW, C] into the fused projection (unit last-dim stride).
  auto head = [&](int i) { return fused.narrow(2, i * C, C).unsqueeze(1); };
  const Tensor attended = ops::attention(head(0), head(1), head(2));  // scale 1/sqrt(C)
  const Tensor out = proj_out.with_residual(attended.reshape({B, H * W, C}), tokens(x));  // [B, HW, C]
  return out.reshape({B, H, W, C}).permute({0, 3, 1, 2});  // channels-last view
}

// --- mid block and levels ------------------------------------------------------------------------

void VaeMidBlock::bind(VaeParamSource& p, const std::string& key, int64_t channels, int groups, bool add_attention) {
  resnet0.bind(p, key + ".resnets.0", channels, channels, groups);
  if (add_attention) {
    attention.emplace();
    attention->bind(p, key + ".attentions.0", channels, groups);
  }
  resnet1.bind(p, key + ".resnets.1", channels, channels, groups);
}

Tensor VaeMidBlock::operator()(const Tensor& x) const {
  Tensor h = resnet0(x);
  if (attention) h = (*attention)(h);
  return resnet1(h);
}

Tensor VaeLevel::operator()(const Tensor& x) const {
  Tensor h = x;
  for (const auto& r : resnets) h = r(h);
  if (!resample) return h;
  if (upsample) return resample->upsampled2x(h);
  // Downsample2D with padding 0: pad right and bottom by one, then a stride-2 valid conv.
  return (*resample)(ops::pad2d(h, 0, 1, 0, 1));
}

// --- encoder / decoder ---------------------------------------------------------------------------

void VaeEncoder::bind(VaeParamSource& p, const VaeConfig& c) {
  const auto& ch = c.block_out_channels;
  const int g = c.norm_num_groups;
  p.conv(conv_in, "encoder.conv_in", c.in_channels, ch[0], 3);
  down.assign(ch.size(), {});
  int64_t in = ch[0];
  for (size_t i = 0; i < ch.size(); ++i) {
    const std::string key = idx("encoder", "down_blocks", i);
    for (int j = 0; j < c.layers_per_block; ++j) {
      down[i].resnets.emplace_back();
      down[i].resnets.back().bind(p, idx(key, "resnets", j), j == 0 ? in : ch[i], ch[i], g);
    }
    if (i + 1 < ch.size()) {
      down[i].resample.emplace();
      p.conv(*down[i].resample, key + ".downsamplers.0.conv", ch[i], ch[i], 3, /*stride=*/2, /*pad=*/0);
    }
    in = ch[i];
  }
  mid.bind(p, "encoder.mid_block", ch.back(), g, c.mid_block_add_attention);
  p.group_norm(norm_out, "encoder.conv_norm_out", ch.back(), g, kNormEps);
  p.conv(conv_out, "encoder.conv_out", ch.back(), 2 * c.latent_channels, 3);  // double_z: mean and logvar
}

Tensor VaeEncoder::operator()(const Tensor& x) const {
  Tensor h = conv_in(x);
  for (const auto& level : down) h = level(h);
  h = mid(h);
  return conv_out(norm_out(h, UnaryOp::kSilu));
}

void VaeDecoder::bind(VaeParamSource& p, const VaeConfig& c) {
  const std::vector<int> rev(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  const int g = c.norm_num_groups;
  p.conv(conv_in, "decoder.conv_in", c.latent_channels, rev[0], 3);
  mid.bind(p, "decoder.mid_block", rev[0], g, c.mid_block_add_attention);
  up.assign(rev.size(), {});
  int64_t in = rev[0];
  for (size_t i = 0; i < rev.size(); ++i) {
    const std::string key = idx("decoder", "up_blocks", i);
    for (int j = 0; j < c.layers_per_block + 1; ++j) {
      up[i].resnets.emplace_back();
      up[i].resnets.back().bind(p, idx(key, "resnets", j), j == 0 ? in : rev[i], rev[i], g);
    }
    if (i + 1 < rev.size()) {
      up[i].resample.emplace();
      up[i].upsample = true;
      p.conv(*up[i].resample, key + ".upsamplers.0.conv", rev[i], rev[i], 3);
    }
    in = rev[i];
  }
  p.group_norm(norm_out, "decoder.conv_norm_out", rev.back(), g, kNormEps);
  p.conv(conv_out, "decoder.conv_out", rev.back(), c.out_channels, 3);
}

Tensor VaeDecoder::operator()(const Tensor& z) const {
  Tensor h = conv_in(z);
  h = mid(h);
  for (const auto& level : up) h = level(h);
  return conv_out(norm_out(h, UnaryOp::kSilu));
}

}  // namespace atelier
