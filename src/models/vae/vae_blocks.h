// The KL autoencoder's building blocks (diffusers' ResnetBlock2D, Downsample2D, Upsample2D, the mid
// block's single-head spatial attention) and its Encoder / Decoder. Parameters are bound from a
// VaeParamSource: a checkpoint (through a WeightLoader and the layout's key map) or a seeded random
// initialiser (benchmarks and tests without weights), so both build the exact same structure.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "models/common/layers.h"
#include "models/common/weights.h"
#include "models/vae/vae_config.h"

namespace atelier {

// Where parameters come from. Keys are canonical (diffusers) names relative to the VAE.
class VaeParamSource {
 public:
  virtual ~VaeParamSource() = default;
  // Square k x k conv, in -> out channels; pad -1 = k/2.
  virtual void conv(Conv2d& c, const std::string& key, int64_t in, int64_t out, int k, int stride = 1, int pad = -1) = 0;
  virtual void linear(Linear& l, const std::string& key, int64_t in, int64_t out) = 0;
  virtual void group_norm(GroupNorm& n, const std::string& key, int64_t channels, int groups, float eps) = 0;
};

// Binds from a checkpoint; problems accumulate in the loader (see WeightLoader::finish).
class VaeLoaderParamSource final : public VaeParamSource {
 public:
  explicit VaeLoaderParamSource(WeightLoader& loader) : loader_(loader) {}
  void conv(Conv2d& c, const std::string& key, int64_t in, int64_t out, int k, int stride, int pad) override {
    loader_.conv(c, key, in, out, k, stride, pad);
  }
  void linear(Linear& l, const std::string& key, int64_t in, int64_t out) override { loader_.linear(l, key, in, out); }
  void group_norm(GroupNorm& n, const std::string& key, int64_t channels, int groups, float eps) override {
    loader_.group_norm(n, key, channels, groups, eps);
  }

 private:
  WeightLoader& loader_;
};

// PyTorch's default initialisation shape (uniform in +-1/sqrt(fan_in) for weights and biases, unit
// GroupNorm affine), drawn from a seeded engine: deterministic random models of any size.
class VaeRandomParamSource final : public VaeParamSource {
 public:
  VaeRandomParamSource(uint64_t seed, Device device, DType dtype = DType::F32) : rng_(seed), device_(device), dtype_(dtype) {}
  void conv(Conv2d& c, const std::string& key, int64_t in, int64_t out, int k, int stride, int pad) override;
  void linear(Linear& l, const std::string& key, int64_t in, int64_t out) override;
  void group_norm(GroupNorm& n, const std::string& key, int64_t channels, int groups, float eps) override;

 private:
  Tensor uniform(const Shape& shape, float bound);
  std::mt19937_64 rng_;
  Device device_;
  DType dtype_;
};

// GroupNorm -> SiLU -> conv3x3 -> GroupNorm -> SiLU -> conv3x3, plus the input (through a 1x1 conv when
// the channel count changes).
struct VaeResnet {
  GroupNorm norm1, norm2;
  Conv2d conv1, conv2;
  Conv2d conv_shortcut;  // weight undefined when in == out
  void bind(VaeParamSource& p, const std::string& key, int64_t in, int64_t out, int groups);
  // x [B, in, H, W] -> [B, out, H, W]
  Tensor operator()(const Tensor& x) const;
};

// diffusers' Attention with _from_deprecated_attn_block: GroupNorm, then one head of width C over the
// H*W positions, output projection, residual. q/k/v are fused into one [3C, C] projection at load.
struct VaeAttention {
  GroupNorm norm;
  Linear qkv;       // [3C, C] (to_q; to_k; to_v stacked)
  Linear proj_out;  // to_out.0
  void bind(VaeParamSource& p, const std::string& key, int64_t channels, int groups);
  // x [B, C, H, W] -> [B, C, H, W]
  Tensor operator()(const Tensor& x) const;
};

// resnet -> (attention) -> resnet at the lowest resolution.
struct VaeMidBlock {
  VaeResnet resnet0, resnet1;
  std::optional<VaeAttention> attention;
  void bind(VaeParamSource& p, const std::string& key, int64_t channels, int groups, bool add_attention);
  // x [B, C, H, W] -> same
  Tensor operator()(const Tensor& x) const;
};

// One resolution level: resnets, then an optional stride-2 conv (encoder) or nearest x2 + conv (decoder).
struct VaeLevel {
  std::vector<VaeResnet> resnets;
  std::optional<Conv2d> resample;
  bool upsample = false;
  // x [B, in, H, W] -> [B, out, H', W'] with H' = H/2, H, or 2H
  Tensor operator()(const Tensor& x) const;
};

// image [B, in_channels, H, W] -> [B, 2 * latent_channels, H/f, W/f] (mean and log-variance, before quant_conv)
struct VaeEncoder {
  Conv2d conv_in, conv_out;
  std::vector<VaeLevel> down;
  VaeMidBlock mid;
  GroupNorm norm_out;
  void bind(VaeParamSource& p, const VaeConfig& c);
  Tensor operator()(const Tensor& x) const;
};

// latents [B, latent_channels, h, w] (after post_quant_conv) -> image [B, out_channels, h*f, w*f]
struct VaeDecoder {
  Conv2d conv_in, conv_out;
  VaeMidBlock mid;
  std::vector<VaeLevel> up;  // diffusers order: up[0] is the lowest resolution
  GroupNorm norm_out;
  void bind(VaeParamSource& p, const VaeConfig& c);
  Tensor operator()(const Tensor& z) const;
};

}  // namespace atelier
