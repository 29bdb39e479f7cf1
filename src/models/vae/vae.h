// The KL autoencoder (diffusers' AutoencoderKL) of Stable Diffusion 1.x/2.x, FLUX and Z-Image.
//
//   decode(z)   z [B, latent, h, w], already unscaled (z / scaling_factor + shift_factor)
//               -> image [B, 3, f*h, f*w] in about [-1, 1], unclamped (f = 8 for every published model)
//   encode(x)   x [B, 3, H, W] in [-1, 1] -> {mean, std} [B, latent, H/f, W/f]
//
// The pipeline normally uses the wrappers latents_to_image / image_to_latents, which apply the
// config's scaling and shift exactly as the diffusers pipelines do.
// Forward passes throw atelier::Error (code kInvalidArgument) for inputs of the wrong shape; the public
// entry points (pipeline, CLI) turn that into a Status.
#pragma once
#include <cstdint>

#include "models/vae/vae_blocks.h"
#include "models/vae/vae_config.h"
#include "models/vae/vae_keymaps.h"

namespace atelier {

struct VaeMoments {
  Tensor mean;  // [B, latent, H/f, W/f]
  Tensor std;   // exp(0.5 * clamp(logvar, -30, 20)), same shape
};

// diffusers' tiled decode: tiles of `tile_latent` latent pixels overlapping by `overlap` of a tile,
// decoded one by one, neighbours blended linearly over the overlap (blend_v / blend_h). Bounds the
// decoder's memory for large images; the result differs slightly from an untiled decode because
// GroupNorm statistics and attention are then per tile.
struct VaeTiling {
  int tile_latent = 64;   // diffusers: sample_size / 8 (64 for SD 1.5's 512)
  float overlap = 0.25f;  // diffusers' tile_overlap_factor
};

class Vae {
 public:
  // Binds every tensor from `store` in `layout`, checking shapes against `config`; one error lists every
  // missing or mis-shaped tensor by its key in the file. `dtype` is the compute dtype (f32 on the CPU).
  static Expected<Vae> load(const WeightStore& store, VaeLayout layout, const VaeConfig& config, Device device,
                            DType dtype = DType::F32);
  // A model of `config`'s shape with seeded random weights (benchmarks, tests without checkpoints).
  static Expected<Vae> random(const VaeConfig& config, uint64_t seed, Device device, DType dtype = DType::F32);

  const VaeConfig& config() const { return config_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }

  // z [B, latent, h, w] (unscaled) -> image [B, out, f*h, f*w] (f32)
  Tensor decode(const Tensor& z) const;
  // Same, tile by tile (see VaeTiling); equals decode() when the latent fits in one tile.
  Tensor decode_tiled(const Tensor& z, const VaeTiling& tiling = {}) const;
  // image [B, in, H, W] in [-1, 1] (H, W multiples of f) -> moments [B, latent, H/f, W/f] (f32)
  VaeMoments encode(const Tensor& image) const;

  // Scaled latents as the denoiser sees them [B, latent, h, w] -> image [B, 3, f*h, f*w] in ~[-1, 1]:
  // decode(z / scaling_factor + shift_factor); tiled when `tiling` is given.
  Tensor latents_to_image(const Tensor& latents, const VaeTiling* tiling = nullptr) const;
  // image [B, 3, H, W] in [-1, 1], noise [B, latent, H/f, W/f] (undefined: use the mean, diffusers'
  // sample_mode="argmax") -> (mean + std * noise - shift_factor) * scaling_factor.
  Tensor image_to_latents(const Tensor& image, const Tensor& noise = {}) const;

 private:
  Vae() = default;
  Status bind(VaeParamSource& source);
  // Input checks shared by the entry points; throws Error(invalid_argument).
  Tensor prepare_latents(const Tensor& z) const;
  Tensor decode_prepared(const Tensor& z) const;  // z already checked and in the compute dtype

  VaeConfig config_;
  Device device_;
  DType dtype_ = DType::F32;
  VaeEncoder encoder_;
  VaeDecoder decoder_;
  Conv2d quant_conv_;       // [2L, 2L, 1, 1]; undefined when use_quant_conv is false
  Conv2d post_quant_conv_;  // [L, L, 1, 1]; undefined when use_post_quant_conv is false
};

}  // namespace atelier
