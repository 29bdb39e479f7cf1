// The original CompVis (LDM) names of UNet tensors, as found in single-file SD 1.x/2.x checkpoints.
//
// The CompVis UNet is one flat list of input blocks, a middle block and a list of output blocks:
//   input_blocks.0.0            = conv_in
//   input_blocks.N.0 / .N.1     = a down level's resnet / its attention, N = 1 + sum over earlier levels of
//                                 (layers + 1) + j; the level's downsampler follows as input_blocks.N.0.op
//   middle_block.0 / .1 / .2    = mid resnet 0 / attention / resnet 1
//   output_blocks.N.0 / .N.1    = an up block's resnet / attention, N = sum over earlier up blocks of their
//                                 resnets + j; the upsampler is output_blocks.<last>.2 after an attention,
//                                 .1 without one
//   time_embed.0 / .2           = time_embedding.linear_1 / linear_2; out.0 / out.2 = conv_norm_out / conv_out
// Inside a resnet: in_layers.0 = norm1, in_layers.2 = conv1, emb_layers.1 = time_emb_proj, out_layers.0 =
// norm2, out_layers.3 = conv2, skip_connection = conv_shortcut. Attention blocks keep diffusers' inner names.
#pragma once
#include <optional>
#include <string>

#include "models/common/weights.h"
#include "models/sd/unet_config.h"

namespace atelier {

// Prefix of the UNet's tensors in a single-file checkpoint.
inline constexpr const char* kCompVisUNetPrefix = "model.diffusion_model.";

// Canonical (diffusers) UNet key -> CompVis key without the prefix; nullopt when `canonical` is not a key of
// a UNet with this config. Only layers_per_block and the up block types of `config` are used.
std::optional<std::string> compvis_unet_key(const UNetConfig& config, const std::string& canonical);

// The same as a KeyMap for WeightLoader; a key without a CompVis name maps to a name that reports itself
// in the loader's "missing tensor" error.
KeyMap compvis_unet_key_map(const UNetConfig& config);

}  // namespace atelier
