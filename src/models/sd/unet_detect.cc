// detect_unet_config: the architecture of a UNet read from its tensor shapes (for files without config.json).
// Two stages: the layout-specific skeleton (how many levels, how many resnets per level), then every other
// field probed through canonical diffusers key names, mapped into the file's layout.
#include <optional>

#include "models/common/weights.h"
#include "models/sd/unet_config.h"
#include "models/sd/unet_keymap_compvis.h"

namespace atelier {
namespace {

constexpr int kSD1Heads = 8;        // SD 1.x: 8 heads at every level
constexpr int kSD2HeadDim = 64;     // SD 2.x: heads of 64 channels
constexpr int kFallbackHeads = 8;   // SD 2 family, width not a multiple of 64
constexpr int kMaxProbe = 1000;     // bound on counted indices (a corrupt file cannot loop forever)

std::string idx(int i) { return std::to_string(i); }

// Resnets per down level, from down_blocks.<i>.resnets.<j>.
std::vector<int> diffusers_skeleton(const WeightStore& store) {
  std::vector<int> layers;
  for (int i = 0; i < kMaxProbe && store.any_with_prefix("down_blocks." + idx(i) + "."); ++i) {
    int j = 0;
    while (j < kMaxProbe && store.any_with_prefix("down_blocks." + idx(i) + ".resnets." + idx(j) + ".")) ++j;
    layers.push_back(j);
  }
  return layers;
}

// Resnets per down level, from the flat input_blocks list: a block holding `.0.op` is a level's downsampler
// and closes the level; the last level has none.
std::vector<int> compvis_skeleton(const WeightStore& store, const std::string& prefix) {
  std::vector<int> layers;
  int count = 0;
  int n = 1;  // input_blocks.0 is conv_in
  for (; n < kMaxProbe && store.any_with_prefix(prefix + "input_blocks." + idx(n) + "."); ++n) {
    if (store.any_with_prefix(prefix + "input_blocks." + idx(n) + ".0.op.")) {
      layers.push_back(count);
      count = 0;
    } else {
      ++count;
    }
  }
  if (n > 1) layers.push_back(count);
  return layers;
}

class Probe {
 public:
  Probe(const WeightStore& store, UNetLayout layout, const UNetConfig& skeleton)
      : store_(store), layout_(layout), skeleton_(skeleton) {
    if (layout == UNetLayout::kCompVis && store.any_with_prefix(kCompVisUNetPrefix)) prefix_ = kCompVisUNetPrefix;
  }
  // Shape of a canonical key in the file, if present.
  std::optional<Shape> shape(const std::string& canonical) const {
    if (layout_ == UNetLayout::kDiffusers) return store_.shape(canonical);
    auto k = compvis_unet_key(skeleton_, canonical);
    if (!k) return std::nullopt;
    return store_.shape(prefix_ + *k);
  }
  // Shape of a key that must be there, or an error naming it.
  Expected<Shape> required(const std::string& canonical, size_t rank) const {
    auto s = shape(canonical);
    if (!s) return not_found("cannot detect the UNet config: tensor '" + canonical + "' (diffusers name) is missing");
    if (s->size() != rank)
      return corrupt("cannot detect the UNet config: tensor '" + canonical + "' has shape " + shape_str(*s) +
                     ", expected rank " + std::to_string(rank));
    return *s;
  }
  bool has(const std::string& canonical) const { return shape(canonical).has_value(); }
  // Number of transformer blocks under an attention module (0 when it does not exist).
  int depth(const std::string& attention) const {
    int d = 0;
    while (d < kMaxProbe && has(attention + ".transformer_blocks." + idx(d) + ".norm1.weight")) ++d;
    return d;
  }

 private:
  const WeightStore& store_;
  UNetLayout layout_;
  const UNetConfig& skeleton_;
  std::string prefix_;
};

struct LevelAttention {
  bool present = false;
  int depth = 0;
  int64_t cross_dim = 0;
  bool linear_proj = false;
  bool only_cross = false;
};

Expected<LevelAttention> read_attention(const Probe& probe, const std::string& attention, int64_t channels) {
  LevelAttention a;
  auto proj = probe.shape(attention + ".proj_in.weight");
  if (!proj) return a;
  a.present = true;
  a.linear_proj = proj->size() == 2;
  a.depth = probe.depth(attention);
  if (a.depth == 0) return corrupt("cannot detect the UNet config: '" + attention + "' has no transformer blocks");
  const std::string block = attention + ".transformer_blocks.0.";
  ATELIER_ASSIGN_OR_RETURN(Shape k2, probe.required(block + "attn2.to_k.weight", 2));
  ATELIER_ASSIGN_OR_RETURN(Shape k1, probe.required(block + "attn1.to_k.weight", 2));
  a.cross_dim = k2[1];
  a.only_cross = k1[1] != channels;
  return a;
}

int heads_for(UNetFamily family, int channels) {
  if (family == UNetFamily::kSD1) return kSD1Heads;
  return channels % kSD2HeadDim == 0 ? channels / kSD2HeadDim : kFallbackHeads;
}

// Everything but the skeleton, through canonical names.
Status detect_fields(const Probe& probe, UNetFamily family, UNetConfig& c) {
  const int n = c.levels();
  ATELIER_ASSIGN_OR_RETURN(Shape conv_in, probe.required("conv_in.weight", 4));
  ATELIER_ASSIGN_OR_RETURN(Shape conv_out, probe.required("conv_out.weight", 4));
  ATELIER_ASSIGN_OR_RETURN(Shape time1, probe.required("time_embedding.linear_1.weight", 2));
  c.in_channels = int(conv_in[1]);
  c.conv_in_kernel = int(conv_in[2]);
  c.out_channels = int(conv_out[0]);
  c.conv_out_kernel = int(conv_out[2]);
  c.time_embed_dim = int(time1[0]);

  std::optional<LevelAttention> any_attention;
  int mid_depth = 0;
  if (probe.has("mid_block.resnets.0.conv1.weight")) {
    mid_depth = probe.depth("mid_block.attentions.0");
    if (mid_depth == 0) return unsupported("UNet mid block without attention (UNetMidBlock2D) is not supported");
    c.mid_block_type = UNetConfig::kMidCrossAttn;
  } else {
    c.mid_block_type = "";
  }
  for (int i = 0; i < n; ++i) {
    ATELIER_ASSIGN_OR_RETURN(Shape conv1, probe.required("down_blocks." + idx(i) + ".resnets.0.conv1.weight", 4));
    const int ch = int(conv1[0]);
    c.block_out_channels[i] = ch;
    c.num_attention_heads[i] = heads_for(family, ch);
    ATELIER_ASSIGN_OR_RETURN(LevelAttention a, read_attention(probe, "down_blocks." + idx(i) + ".attentions.0", ch));
    c.down_block_types[i] = a.present ? UNetConfig::kCrossAttnDown : UNetConfig::kDown;
    // A level without attention keeps diffusers' per-model value; only the last one matters (the mid
    // block reads transformer_layers_per_block[-1]).
    c.transformer_layers_per_block[i] = a.present ? a.depth : (i == n - 1 && mid_depth ? mid_depth : 1);
    c.only_cross_attention[i] = a.present && a.only_cross;
    if (a.present && any_attention && any_attention->linear_proj != a.linear_proj)
      return unsupported("UNet mixes linear and convolutional proj_in across blocks; not supported");
    if (a.present && !any_attention) any_attention = a;
    if (a.present) c.cross_attention_dim[i] = int(a.cross_dim);
  }
  if (c.has_mid_block()) {
    ATELIER_ASSIGN_OR_RETURN(LevelAttention mid, read_attention(probe, "mid_block.attentions.0", c.block_out_channels[n - 1]));
    if (any_attention && any_attention->linear_proj != mid.linear_proj)
      return unsupported("UNet mixes linear and convolutional proj_in across blocks; not supported");
    if (!any_attention) any_attention = mid;
  }
  if (any_attention) {
    c.use_linear_projection = any_attention->linear_proj;
    for (int i = 0; i < n; ++i)
      if (!c.down_has_attention(i)) c.cross_attention_dim[i] = int(any_attention->cross_dim);
  }
  for (int u = 0; u < n; ++u) {
    const int level = c.up_level(u);
    const std::string up = "up_blocks." + idx(u);
    const int expected = c.layers_per_block[level] + 1;
    if (!probe.has(up + ".resnets." + idx(expected - 1) + ".conv1.weight") || probe.has(up + ".resnets." + idx(expected) + ".conv1.weight"))
      return corrupt("cannot detect the UNet config: " + up + " does not have " + std::to_string(expected) +
                     " resnets (one more than its down level)");
    const int depth = probe.depth(up + ".attentions.0");
    c.up_block_types[u] = depth ? UNetConfig::kCrossAttnUp : UNetConfig::kUp;
    c.reverse_transformer_layers_per_block[u] = depth ? depth : c.transformer_layers_per_block[level];
  }
  return Status::ok();
}

}  // namespace

Expected<UNetConfig> detect_unet_config(const WeightStore& store, UNetLayout layout, UNetFamily family) {
  std::vector<int> layers;
  if (layout == UNetLayout::kDiffusers) {
    layers = diffusers_skeleton(store);
  } else {
    layers = compvis_skeleton(store, store.any_with_prefix(kCompVisUNetPrefix) ? kCompVisUNetPrefix : "");
  }
  if (layers.empty())
    return not_found(std::string("no UNet tensors found to detect a config from (looked for ") +
                     (layout == UNetLayout::kDiffusers ? "'down_blocks.*'" : "'model.diffusion_model.input_blocks.*'") + ")");
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i] == 0) return corrupt("cannot detect the UNet config: down level " + std::to_string(i) + " has no resnets");

  const int n = int(layers.size());
  UNetConfig c;
  c.layers_per_block = layers;
  c.block_out_channels.assign(n, 0);
  c.down_block_types.assign(n, UNetConfig::kCrossAttnDown);
  c.up_block_types.assign(n, UNetConfig::kCrossAttnUp);  // only the upsampler's CompVis slot depends on it
  c.transformer_layers_per_block.assign(n, 1);
  c.reverse_transformer_layers_per_block.assign(n, 1);
  c.num_attention_heads.assign(n, kSD1Heads);
  c.cross_attention_dim.assign(n, 768);
  c.only_cross_attention.assign(n, false);
  // Probe with a copy of the skeleton: detect_fields rewrites c as it goes, the key map must not change.
  const UNetConfig skeleton = c;
  const Probe probe(store, layout, skeleton);
  ATELIER_RETURN_IF_ERROR(detect_fields(probe, family, c));
  ATELIER_RETURN_IF_ERROR(c.validate());
  return c;
}

}  // namespace atelier
