// FluxTransformer2DModel's configuration and the two checkpoint layouts of its weights.
//
//   kDiffusers  diffusers' transformer/ folder: the canonical names the model code uses.
//   kBfl        Black Forest Labs' original names (flux1-dev.safetensors; ComfyUI checkpoints carry them
//               under "model.diffusion_model."): img_in/txt_in, time_in/guidance_in/vector_in,
//               double_blocks.N.{img,txt}_{mod,attn,mlp}, single_blocks.N.{linear1,linear2,modulation,norm},
//               final_layer.{linear,adaLN_modulation.1}. Structural differences handled at load (flux_transformer.cc):
//               fused qkv (double blocks) and fused qkv+mlp linear1 (single blocks) are split into views, and the
//               final adaLN modulation's (shift, scale) halves are swapped into diffusers' (scale, shift).
#pragma once
#include <array>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "models/common/weights.h"

namespace atelier {

enum class FluxLayout { kDiffusers, kBfl };

struct FluxConfig {
  int64_t in_channels = 64;           // packed latent channels (16 latent channels x 2 x 2)
  int64_t out_channels = 64;
  int num_layers = 19;                // double-stream blocks
  int num_single_layers = 38;
  int num_heads = 24;
  int64_t head_dim = 128;
  int64_t joint_attention_dim = 4096; // T5 width
  int64_t pooled_projection_dim = 768;  // CLIP pooled width
  bool guidance_embeds = true;        // FLUX.1-dev (distilled guidance); false for schnell
  std::array<int, 3> axes_dims_rope{16, 56, 56};
  double rope_theta = 10000.0;
  int64_t mlp_ratio = 4;

  int64_t inner_dim() const { return int64_t(num_heads) * head_dim; }
  int64_t mlp_dim() const { return inner_dim() * mlp_ratio; }

  // diffusers' transformer/config.json.
  static Expected<FluxConfig> from_json(const nlohmann::json& j);
  static Expected<FluxConfig> from_file(const std::string& path);
  // From the weights of `layout` under `prefix`. axes_dims_rope cannot be read from weights: FLUX's
  // (16, 56, 56) for head_dim 128; otherwise head_dim/4 for the index axis and the rest split evenly between
  // the two spatial axes (all even), which is what the reduced test models use.
  static Expected<FluxConfig> detect(const WeightStore& store, FluxLayout layout, const std::string& prefix = "");
};

// The prefix of a BFL transformer inside `store`: "" or "model.diffusion_model."; nullopt when neither holds
// double_blocks.0.
std::optional<std::string> flux_bfl_prefix(const WeightStore& store);

// Canonical (diffusers) key -> BFL key (no prefix) for the tensors that are plain renames; keys with no
// single BFL counterpart (to_q/to_k/to_v, add_*_proj, proj_mlp of single blocks) are returned unchanged.
std::string flux_bfl_key(const std::string& canonical);

}  // namespace atelier
