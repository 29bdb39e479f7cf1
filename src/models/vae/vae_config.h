// Configuration of the KL autoencoder (diffusers' AutoencoderKL): SD 1.x/2.x (4 latent channels, quant
// convs, scaling 0.18215) and FLUX / Z-Image (16 latent channels, no quant convs, scaling 0.3611 and
// shift 0.1159) are the same model with different settings.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "models/common/weights.h"
#include "models/vae/vae_keymaps.h"

namespace atelier {

struct VaeConfig {
  int in_channels = 3;
  int out_channels = 3;
  int latent_channels = 4;
  std::vector<int> block_out_channels = {128, 256, 512, 512};
  int layers_per_block = 2;  // resnets per encoder level; the decoder has one more per level
  int norm_num_groups = 32;
  float scaling_factor = 0.18215f;
  float shift_factor = 0.0f;  // null in SD configs
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  bool force_upcast = true;  // the reference runs this VAE in float32 even in half-precision pipelines
  int sample_size = 512;     // image size the model was trained at: the default tile size for tiled decode

  int num_levels() const { return int(block_out_channels.size()); }
  // Image pixels per latent pixel along each axis: 2^(levels-1) (8 for every published model).
  int downscale_factor() const { return 1 << (num_levels() - 1); }

  // From a diffusers vae/config.json (AutoencoderKL). Rejects block types, activations and options this
  // implementation does not have, naming the field.
  static Expected<VaeConfig> from_json(const nlohmann::json& j);
  static Expected<VaeConfig> from_file(const std::string& path);
  // Ok, or what is inconsistent (channel counts versus groups, empty levels, ...).
  Status validate() const;
};

// Reads the architecture from tensor shapes (single-file checkpoints have no config). Scaling and shift
// cannot be read from weights: SD's 0.18215 / 0 is assumed; the FLUX / Z-Image loaders set their own.
// norm_num_groups is 32 in every published model and is not visible in shapes either.
Expected<VaeConfig> detect_vae_config(const WeightStore& store, VaeLayout layout);

// Which layout a store holds the VAE in, from its keys; NotFound when it holds no VAE.
Expected<VaeLayout> detect_vae_layout(const WeightStore& store);

}  // namespace atelier
