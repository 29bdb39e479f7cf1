// Checkpoint layouts of the KL autoencoder and the key maps that translate the canonical (diffusers)
// names the model code uses into each layout's names.
//
//   kDiffusers  diffusers' AutoencoderKL folder (vae/diffusion_pytorch_model.safetensors): canonical names.
//   kCompVis    the original latent-diffusion names under "first_stage_model." in SD 1.x/2.x single files.
//   kOriginal   the same original names without a prefix (FLUX's ae.safetensors, standalone .vae files).
//
// Original names differ in structure, not just spelling: resnets are "block.j", the shortcut conv is
// "nin_shortcut", the mid block is "mid.block_1/attn_1/block_2", attention projections are 1x1 convs
// named q/k/v/proj_out, and the decoder's up blocks are numbered from the lowest resolution upwards
// ("decoder.up.(n-1-i)" is diffusers' "decoder.up_blocks.i").
#pragma once
#include <string>

#include "models/common/weights.h"

namespace atelier {

enum class VaeLayout { kDiffusers, kCompVis, kOriginal };

std::string_view vae_layout_name(VaeLayout layout);

// The prefix every key of `layout` carries in its file ("first_stage_model." for kCompVis, else "").
std::string vae_key_prefix(VaeLayout layout);

// Canonical (diffusers) key, relative to the VAE -> the layout's key, without the prefix.
// `num_levels` (len(block_out_channels)) is needed to reverse the decoder's up-block numbering.
std::string vae_canonical_to_layout(VaeLayout layout, const std::string& canonical, int num_levels);

// The KeyMap for WeightLoader (identity for kDiffusers); use it with prefix vae_key_prefix(layout).
KeyMap vae_key_map(VaeLayout layout, int num_levels);

// The layout's full file key for a canonical key (prefix included).
std::string vae_file_key(VaeLayout layout, const std::string& canonical, int num_levels);

}  // namespace atelier
