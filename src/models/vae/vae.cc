#include "models/vae/vae.h"

namespace atelier {

namespace {

constexpr float kLogvarMin = -30.0f;  // DiagonalGaussianDistribution's clamp
constexpr float kLogvarMax = 20.0f;

Error bad_input(const std::string& m) { return Error(invalid_argument("vae: " + m)); }

Tensor scalar(float v, Device dev) { return Tensor::full({1}, v, dev); }

// f32 and contiguous (the cast writes a packed copy; a channels-last f32 tensor is packed by ops::contiguous).
Tensor to_f32(const Tensor& x) { return x.dtype() == DType::F32 ? ops::contiguous(x) : ops::cast(x, DType::F32); }

}  // namespace

Status Vae::bind(VaeParamSource& source) {
  const int L = config_.latent_channels;
  encoder_.bind(source, config_);
  decoder_.bind(source, config_);
  if (config_.use_quant_conv) source.conv(quant_conv_, "quant_conv", 2 * L, 2 * L, 1);
  if (config_.use_post_quant_conv) source.conv(post_quant_conv_, "post_quant_conv", L, L, 1);
  return Status::ok();
}

Expected<Vae> Vae::load(const WeightStore& store, VaeLayout layout, const VaeConfig& config, Device device, DType dtype) {
  ATELIER_RETURN_IF_ERROR(config.validate());
  Vae vae;
  vae.config_ = config;
  vae.device_ = device;
  vae.dtype_ = dtype;
  WeightLoader loader(store, device, dtype, vae_key_map(layout, config.num_levels()), vae_key_prefix(layout));
  VaeLoaderParamSource source(loader);
  ATELIER_RETURN_IF_ERROR(catch_status([&] { return vae.bind(source); }));
  if (Status st = loader.finish(); !st)
    return Status(st.code(), "VAE (" + std::string(vae_layout_name(layout)) + " layout): " + st.message());
  return vae;
}

Expected<Vae> Vae::random(const VaeConfig& config, uint64_t seed, Device device, DType dtype) {
  ATELIER_RETURN_IF_ERROR(config.validate());
  Vae vae;
  vae.config_ = config;
  vae.device_ = device;
  vae.dtype_ = dtype;
  VaeRandomParamSource source(seed, device, dtype);
  ATELIER_RETURN_IF_ERROR(catch_status([&] { return vae.bind(source); }));
  return vae;
}

// --- decode --------------------------------------------------------------------------------------

// z [B, latent, h, w] on any device/dtype -> same on this model's device, in the compute dtype.
Tensor Vae::prepare_latents(const Tensor& z) const {
  if (z.dim() != 4 || z.size(1) != config_.latent_channels)
    throw bad_input("decode expects latents [B, " + std::to_string(config_.latent_channels) + ", h, w], got " + shape_str(z.shape()));
  Tensor x = z.to(device_);
  return x.dtype() == dtype_ ? x : ops::cast(x, dtype_);
}

// z [B, latent, h, w] prepared -> image [B, out, f*h, f*w] in the compute dtype
Tensor Vae::decode_prepared(const Tensor& z) const {
  const Tensor x = post_quant_conv_.weight.defined() ? post_quant_conv_(z) : z;
  return decoder_(x);
}

Tensor Vae::decode(const Tensor& z) const { return to_f32(decode_prepared(prepare_latents(z))); }

// --- encode --------------------------------------------------------------------------------------

VaeMoments Vae::encode(const Tensor& image) const {
  if (image.dim() != 4 || image.size(1) != config_.in_channels || image.size(2) < 1 || image.size(3) < 1)
    throw bad_input("encode expects images [B, " + std::to_string(config_.in_channels) + ", H, W], got " + shape_str(image.shape()));
  Tensor x = image.to(device_);
  if (x.dtype() != dtype_) x = ops::cast(x, dtype_);
  Tensor moments = encoder_(x);
  if (quant_conv_.weight.defined()) moments = quant_conv_(moments);
  moments = to_f32(moments);
  const auto halves = ops::chunk(moments, 2, 1);  // mean, logvar
  Tensor logvar = ops::binary(halves[1], scalar(kLogvarMin, device_), BinaryOp::kMax);
  logvar = ops::binary(logvar, scalar(kLogvarMax, device_), BinaryOp::kMin);
  VaeMoments m;
  m.mean = ops::contiguous(halves[0]);
  m.std = ops::unary(ops::affine(logvar, 0.5f), UnaryOp::kExp);
  return m;
}

// --- pipeline conveniences -----------------------------------------------------------------------

Tensor Vae::latents_to_image(const Tensor& latents, const VaeTiling* tiling) const {
  Tensor z = to_f32(latents.to(device_));
  z = ops::div(z, scalar(config_.scaling_factor, device_));  // division, as the pipelines do (not * 1/s)
  if (config_.shift_factor != 0.0f) z = ops::add(z, scalar(config_.shift_factor, device_));
  return tiling ? decode_tiled(z, *tiling) : decode(z);
}

Tensor Vae::image_to_latents(const Tensor& image, const Tensor& noise) const {
  VaeMoments m = encode(image);
  Tensor sample = m.mean;
  if (noise.defined()) {
    if (noise.shape() != m.mean.shape())
      throw bad_input("noise " + shape_str(noise.shape()) + " does not match the latent shape " + shape_str(m.mean.shape()));
    sample = ops::add(m.mean, ops::mul(m.std, to_f32(noise.to(device_))));
  }
  if (config_.shift_factor != 0.0f) sample = ops::sub(sample, scalar(config_.shift_factor, device_));
  return ops::mul(sample, scalar(config_.scaling_factor, device_));
}

}  // namespace atelier
