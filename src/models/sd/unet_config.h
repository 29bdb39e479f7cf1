// UNetConfig: the architecture of a Stable Diffusion 1.x/2.x UNet (diffusers' UNet2DConditionModel in its SD
// variants), resolved to one value per resolution level so that model code never re-derives diffusers' rules.
//
// Two sources: a diffusers config.json (parse_unet_config), or the tensor shapes of a weight file that comes
// without a config, such as a single-file CompVis checkpoint (detect_unet_config). Shapes do not carry the
// number of attention heads, so detection takes the model family (decided by the caller from the text encoder).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace atelier {

class WeightStore;

// How UNet tensors are named in a file: diffusers (`down_blocks.0.resnets.0.conv1.weight`) or the original
// CompVis layout of single-file checkpoints (`model.diffusion_model.input_blocks.1.0.in_layers.2.weight`).
enum class UNetLayout { kDiffusers, kCompVis };

// Which family a UNet belongs to; only used to choose attention heads when detecting a config from shapes.
// SD 1.x: 8 heads at every level. SD 2.x: heads of 64 channels.
enum class UNetFamily { kSD1, kSD2 };

struct UNetConfig {
  static constexpr const char* kCrossAttnDown = "CrossAttnDownBlock2D";
  static constexpr const char* kDown = "DownBlock2D";
  static constexpr const char* kCrossAttnUp = "CrossAttnUpBlock2D";
  static constexpr const char* kUp = "UpBlock2D";
  static constexpr const char* kMidCrossAttn = "UNetMidBlock2DCrossAttn";

  int in_channels = 4;
  int out_channels = 4;
  std::vector<int> block_out_channels;        // per level, top (full resolution) first
  std::vector<std::string> down_block_types;  // per level: kCrossAttnDown or kDown
  std::vector<std::string> up_block_types;    // per up block (lowest resolution first): kCrossAttnUp or kUp
  std::string mid_block_type = kMidCrossAttn; // kMidCrossAttn, or "" for no mid block
  std::vector<int> layers_per_block;          // resnets per down level; the up block of a level has one more
  std::vector<int> transformer_layers_per_block;          // per down level
  std::vector<int> reverse_transformer_layers_per_block;  // per up block, in up order
  std::vector<int> num_attention_heads;       // per down level (resolved from diffusers' naming, see .cc)
  std::vector<int> cross_attention_dim;       // per down level
  std::vector<bool> only_cross_attention;     // per down level: attn1 attends to the context too
  bool use_linear_projection = false;         // proj_in/proj_out: linear (SD 2) or 1x1 conv (SD 1)
  bool upcast_attention = false;              // precision hint: compute attention in f32
  bool center_input_sample = false;
  int norm_num_groups = 32;
  float norm_eps = 1e-5f;
  bool flip_sin_to_cos = true;
  int freq_shift = 0;
  int time_embed_dim = 0;                     // width of the time MLP (diffusers: 4 * block_out_channels[0])
  int conv_in_kernel = 3;
  int conv_out_kernel = 3;
  int downsample_padding = 1;
  float mid_block_scale_factor = 1.0f;
  std::string resnet_time_scale_shift = "default";
  int sample_size = 64;                       // informational: the latent size the model was trained at

  int levels() const { return int(block_out_channels.size()); }
  bool down_has_attention(int level) const { return down_block_types[level] == kCrossAttnDown; }
  bool up_has_attention(int up_index) const { return up_block_types[up_index] == kCrossAttnUp; }
  bool has_mid_block() const { return !mid_block_type.empty(); }
  // The down level whose resolution an up block works at (up blocks run in reverse order).
  int up_level(int up_index) const { return levels() - 1 - up_index; }
  // Channels of a level's attention heads.
  int head_dim(int level) const { return block_out_channels[level] / num_attention_heads[level]; }
  // Product of the downsampling factors (8 for SD): latents whose sides are not multiples of it need the
  // explicit upsample sizes that the forward pass handles.
  int overall_down_factor() const { return 1 << (levels() - 1); }

  // Ok, or what is inconsistent or unsupported (list lengths, channels vs groups and heads, block types).
  Status validate() const;
};

// From a parsed diffusers config.json; rejects features SD 1.x/2.x UNets do not use (class/addition
// embeddings, dual cross-attention, scale-shift resnets, ...) with a message saying what is supported.
Expected<UNetConfig> parse_unet_config(const nlohmann::json& j);
Expected<UNetConfig> load_unet_config(const std::string& config_json_path);

// From tensor shapes: channels, levels, resnets per level, which levels have attention, cross-attention
// width (attn2.to_k), linear vs conv proj_in, transformer depth, kernels and the time MLP width. Heads come
// from `family`: SD1 = 8 per level, SD2 = heads of 64 channels (8 heads when a width is not a multiple of 64).
Expected<UNetConfig> detect_unet_config(const WeightStore& store, UNetLayout layout, UNetFamily family);

// The fields that change the computation and differ between a and b, as "name: a vs b" lines; empty when
// both describe the same network (sample_size and upcast_attention are not compared).
std::vector<std::string> unet_config_differences(const UNetConfig& a, const UNetConfig& b);

// The published Stable Diffusion 1.5 UNet architecture (for benchmarks and tests with random weights).
UNetConfig sd15_unet_config();

}  // namespace atelier
