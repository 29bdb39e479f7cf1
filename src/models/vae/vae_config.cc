#include "models/vae/vae_config.h"

#include "io/json_util.h"
#include "models/common/weights.h"

namespace atelier {

namespace {

constexpr float kSdScalingFactor = 0.18215f;   // SD 1.x/2.x; the only factor a single file implies
constexpr int kDefaultNormGroups = 32;         // every published KL VAE
constexpr int kMaxLevels = 8;                  // sanity bound while probing keys

template <typename T>
void read_field(const nlohmann::json& j, const char* key, T& out) {
  read_config_field(j, key, out, "vae config");
}

Status check_block_types(const nlohmann::json& j, const char* key, const char* expected, size_t levels) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_array() || it->size() != levels)
    return invalid_argument(std::string("vae config: ") + key + " must list one block per entry of block_out_channels");
  for (const auto& t : *it) {
    const auto name = ConfigValue<std::string>::read(t, std::string("vae config: ") + key);
    if (name != expected)
      return unsupported(std::string("vae config: ") + key + " entry '" + name + "' is not supported (only " + expected +
                         ", as in AutoencoderKL)");
  }
  return Status::ok();
}

Status parse_into(const nlohmann::json& j, VaeConfig& c) {
  if (!j.is_object()) return invalid_argument("vae config: expected a JSON object");
  std::string class_name = "AutoencoderKL", act_fn = "silu";
  read_field(j, "_class_name", class_name);
  read_field(j, "act_fn", act_fn);
  if (class_name != "AutoencoderKL")
    return unsupported("vae config: _class_name '" + class_name + "' is not supported (only AutoencoderKL)");
  if (act_fn != "silu") return unsupported("vae config: act_fn '" + act_fn + "' is not supported (only silu)");
  for (const char* k : {"latents_mean", "latents_std"})
    if (auto it = j.find(k); it != j.end() && !it->is_null())
      return unsupported(std::string("vae config: per-channel ") + k + " is not supported (only scaling_factor/shift_factor)");
  read_field(j, "in_channels", c.in_channels);
  read_field(j, "out_channels", c.out_channels);
  read_field(j, "latent_channels", c.latent_channels);
  read_field(j, "block_out_channels", c.block_out_channels);
  read_field(j, "layers_per_block", c.layers_per_block);
  read_field(j, "norm_num_groups", c.norm_num_groups);
  read_field(j, "scaling_factor", c.scaling_factor);
  read_field(j, "shift_factor", c.shift_factor);
  read_field(j, "use_quant_conv", c.use_quant_conv);
  read_field(j, "use_post_quant_conv", c.use_post_quant_conv);
  read_field(j, "mid_block_add_attention", c.mid_block_add_attention);
  read_field(j, "force_upcast", c.force_upcast);
  read_field(j, "sample_size", c.sample_size);
  ATELIER_RETURN_IF_ERROR(check_block_types(j, "down_block_types", "DownEncoderBlock2D", c.block_out_channels.size()));
  ATELIER_RETURN_IF_ERROR(check_block_types(j, "up_block_types", "UpDecoderBlock2D", c.block_out_channels.size()));
  return c.validate();
}

}  // namespace

Status VaeConfig::validate() const {
  if (block_out_channels.empty() || int(block_out_channels.size()) > kMaxLevels)
    return invalid_argument("vae config: block_out_channels must have 1.." + std::to_string(kMaxLevels) + " entries");
  if (in_channels <= 0 || out_channels <= 0 || latent_channels <= 0 || layers_per_block <= 0 || norm_num_groups <= 0)
    return invalid_argument("vae config: channel counts, layers_per_block and norm_num_groups must be positive");
  if (layers_per_block > kMaxLayerCount)
    return invalid_argument("vae config: layers_per_block " + std::to_string(layers_per_block) + " is more than " +
                            std::to_string(kMaxLayerCount));
  for (int ch : block_out_channels)
    if (ch <= 0 || ch % norm_num_groups != 0)
      return invalid_argument("vae config: block_out_channels entry " + std::to_string(ch) + " is not a multiple of norm_num_groups " +
                              std::to_string(norm_num_groups));
  if (!(scaling_factor > 0.0f)) return invalid_argument("vae config: scaling_factor must be positive");
  return Status::ok();
}

Expected<VaeConfig> VaeConfig::from_json(const nlohmann::json& j) {
  VaeConfig c;
  Status st = catch_status([&]() -> Status {
    try {
      return parse_into(j, c);
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument(std::string("vae config: a field has the wrong type: ") + e.what());
    }
  });
  if (!st) return st;
  return c;
}

Expected<VaeConfig> VaeConfig::from_file(const std::string& path) {
  ATELIER_ASSIGN_OR_RETURN(const nlohmann::json j, read_json_file(path));
  auto c = from_json(j);
  if (!c) return prefixed(c.status(), path);
  return c;
}

Expected<VaeLayout> detect_vae_layout(const WeightStore& store) {
  if (store.contains("first_stage_model.decoder.conv_in.weight")) return VaeLayout::kCompVis;
  if (store.contains("decoder.mid_block.resnets.0.conv1.weight")) return VaeLayout::kDiffusers;
  if (store.contains("decoder.mid.block_1.conv1.weight")) return VaeLayout::kOriginal;
  return not_found("no VAE found in the weights (looked for decoder.conv_in / first_stage_model.* / decoder.mid.block_1)");
}

Expected<VaeConfig> detect_vae_config(const WeightStore& store, VaeLayout layout) {
  // Encoder keys do not depend on the level count (only the decoder's numbering is reversed), so they can
  // be probed before the count is known.
  auto key = [&](const std::string& canonical, int levels) { return vae_file_key(layout, canonical, levels); };
  auto shape = [&](const std::string& canonical, int levels = 1) { return store.shape(key(canonical, levels)); };
  auto conv_in = shape("encoder.conv_in.weight");
  auto dec_in = shape("decoder.conv_in.weight");
  if (!conv_in || !dec_in || conv_in->size() != 4 || dec_in->size() != 4)
    return not_found(std::string("no ") + std::string(vae_layout_name(layout)) + " VAE in the weights: '" +
                     key("encoder.conv_in.weight", 1) + "' or '" + key("decoder.conv_in.weight", 1) + "' is missing");
  VaeConfig c;
  c.in_channels = int((*conv_in)[1]);
  c.latent_channels = int((*dec_in)[1]);
  c.block_out_channels.clear();
  for (int i = 0; i < kMaxLevels; ++i) {
    const std::string name = "encoder.down_blocks." + std::to_string(i) + ".resnets.0.conv1.weight";
    auto s = shape(name);
    if (!s) break;
    if (s->size() != 4 || (*s)[0] < 1) return corrupt("VAE weights: '" + key(name, 1) + "' is not a convolution weight [O, C, kh, kw]");
    c.block_out_channels.push_back(int((*s)[0]));
  }
  if (c.block_out_channels.empty()) return not_found("VAE weights have no encoder level ('" + key("encoder.down_blocks.0.resnets.0.conv1.weight", 1) + "')");
  const int n = c.num_levels();
  c.layers_per_block = 0;
  while (shape("encoder.down_blocks.0.resnets." + std::to_string(c.layers_per_block) + ".conv1.weight")) ++c.layers_per_block;
  auto out = shape("decoder.conv_out.weight", n);
  if (!out) return not_found("VAE weights lack '" + key("decoder.conv_out.weight", n) + "'");
  if (out->size() != 4) return corrupt("VAE weights: '" + key("decoder.conv_out.weight", n) + "' is not a convolution weight [O, C, kh, kw]");
  c.out_channels = int((*out)[0]);
  c.norm_num_groups = kDefaultNormGroups;
  c.scaling_factor = kSdScalingFactor;
  c.shift_factor = 0.0f;
  c.use_quant_conv = store.contains(key("quant_conv.weight", n));
  c.use_post_quant_conv = store.contains(key("post_quant_conv.weight", n));
  c.mid_block_add_attention = store.contains(key("encoder.mid_block.attentions.0.to_q.weight", n));
  ATELIER_RETURN_IF_ERROR(c.validate());
  return c;
}

}  // namespace atelier
