#include "models/sd/unet_config.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "io/json_util.h"
#include "models/common/weights.h"

namespace atelier {
namespace {

constexpr int kDefaultHeads = 8;  // diffusers' default attention_head_dim (which really counts heads)

bool is_null_or_absent(const nlohmann::json& j, const char* key) { return !j.contains(key) || j[key].is_null(); }

template <typename T>
T value_or(const nlohmann::json& j, const char* key, T fallback) {
  read_config_field(j, key, fallback, "UNet config");
  return fallback;
}

// diffusers accepts an int (same for every level) or a list with one entry per level.
Expected<std::vector<int>> per_level_ints(const nlohmann::json& j, const char* key, int fallback, int levels) {
  if (is_null_or_absent(j, key)) return std::vector<int>(levels, fallback);
  const auto& v = j[key];
  const std::string where = std::string("UNet config: ") + key;
  if (v.is_number()) return std::vector<int>(levels, config_integer<int>(v, where));
  if (!v.is_array() || int(v.size()) != levels)
    return invalid_argument(std::string("UNet config: '") + key + "' must be an int or a list of " +
                            std::to_string(levels) + " ints (one per level)");
  std::vector<int> out;
  for (const auto& e : v) {
    if (!e.is_number_integer())
      return unsupported(std::string("UNet config: '") + key +
                         "' with per-layer lists (SDXL-refiner style) is not supported; use one int per level");
    out.push_back(config_integer<int>(e, where));
  }
  return out;
}

Expected<std::vector<std::string>> string_list(const nlohmann::json& j, const char* key) {
  if (is_null_or_absent(j, key) || !j[key].is_array())
    return invalid_argument(std::string("UNet config: '") + key + "' must be a list of block type names");
  return ConfigValue<std::vector<std::string>>::read(j[key], std::string("UNet config: ") + key);
}

// Features of UNet2DConditionModel that SD 1.x/2.x never use: each must be absent/null (or its default).
Status reject_unused_features(const nlohmann::json& j) {
  for (const char* key : {"class_embed_type", "addition_embed_type", "num_class_embeds", "encoder_hid_dim",
                          "encoder_hid_dim_type", "time_embedding_act_fn", "timestep_post_act",
                          "time_cond_proj_dim", "cross_attention_norm"}) {
    if (!is_null_or_absent(j, key))
      return unsupported(std::string("UNet config: '") + key +
                         "' is set; only Stable Diffusion 1.x/2.x UNets (without it) are supported");
  }
  for (const char* key : {"dual_cross_attention", "resnet_skip_time_act", "class_embeddings_concat"}) {
    if (value_or<bool>(j, key, false))
      return unsupported(std::string("UNet config: '") + key + "' = true is not supported (SD 1.x/2.x use false)");
  }
  const auto check_string = [&](const char* key, const char* expected) -> Status {
    const std::string v = value_or<std::string>(j, key, expected);
    if (v != expected)
      return unsupported(std::string("UNet config: '") + key + "' = '" + v + "' is not supported; only '" +
                         expected + "' is");
    return Status::ok();
  };
  ATELIER_RETURN_IF_ERROR(check_string("act_fn", "silu"));
  ATELIER_RETURN_IF_ERROR(check_string("time_embedding_type", "positional"));
  ATELIER_RETURN_IF_ERROR(check_string("attention_type", "default"));
  ATELIER_RETURN_IF_ERROR(check_string("resnet_time_scale_shift", "default"));
  if (value_or<double>(j, "resnet_out_scale_factor", 1.0) != 1.0)
    return unsupported("UNet config: 'resnet_out_scale_factor' other than 1.0 is not supported");
  return Status::ok();
}

// diffusers' naming quirk: for UNet2DConditionModel, `attention_head_dim` is the number of heads (SD 1.x: 8
// heads; SD 2.x: [5, 10, 20, 20] heads of 64 channels). `num_attention_heads`, when set, means the same.
Expected<std::vector<int>> resolve_heads(const nlohmann::json& j, int levels) {
  const char* key = is_null_or_absent(j, "num_attention_heads") ? "attention_head_dim" : "num_attention_heads";
  return per_level_ints(j, key, kDefaultHeads, levels);
}

Status parse_lists(const nlohmann::json& j, UNetConfig& c) {
  if (is_null_or_absent(j, "block_out_channels"))
    return invalid_argument("UNet config: 'block_out_channels' (a list of ints) is required");
  if (!j["block_out_channels"].is_array())
    return invalid_argument("UNet config: 'block_out_channels' must be a list of ints, got " + json_excerpt(j["block_out_channels"]));
  c.block_out_channels = ConfigValue<std::vector<int>>::read(j["block_out_channels"], "UNet config: block_out_channels");
  const int n = c.levels();
  ATELIER_ASSIGN_OR_RETURN(c.down_block_types, string_list(j, "down_block_types"));
  ATELIER_ASSIGN_OR_RETURN(c.up_block_types, string_list(j, "up_block_types"));
  ATELIER_ASSIGN_OR_RETURN(c.layers_per_block, per_level_ints(j, "layers_per_block", 2, n));
  ATELIER_ASSIGN_OR_RETURN(c.transformer_layers_per_block, per_level_ints(j, "transformer_layers_per_block", 1, n));
  ATELIER_ASSIGN_OR_RETURN(c.cross_attention_dim, per_level_ints(j, "cross_attention_dim", 1280, n));
  ATELIER_ASSIGN_OR_RETURN(c.num_attention_heads, resolve_heads(j, n));
  if (is_null_or_absent(j, "reverse_transformer_layers_per_block")) {
    c.reverse_transformer_layers_per_block.assign(c.transformer_layers_per_block.rbegin(),
                                                  c.transformer_layers_per_block.rend());
  } else {
    ATELIER_ASSIGN_OR_RETURN(c.reverse_transformer_layers_per_block,
                             per_level_ints(j, "reverse_transformer_layers_per_block", 1, n));
  }
  c.only_cross_attention.assign(n, false);
  if (!is_null_or_absent(j, "only_cross_attention")) {
    const auto& v = j["only_cross_attention"];
    if (v.is_boolean()) {
      c.only_cross_attention.assign(n, v.get<bool>());
    } else if (v.is_array() && int(v.size()) == n) {
      for (int i = 0; i < n; ++i) c.only_cross_attention[i] = ConfigValue<bool>::read(v[i], "UNet config: only_cross_attention");
    } else {
      return invalid_argument("UNet config: 'only_cross_attention' must be a bool or one bool per level");
    }
  }
  return Status::ok();
}

Status parse_scalars(const nlohmann::json& j, UNetConfig& c) {
  c.in_channels = value_or<int>(j, "in_channels", 4);
  c.out_channels = value_or<int>(j, "out_channels", 4);
  c.mid_block_type = value_or<std::string>(j, "mid_block_type", "");
  if (!j.contains("mid_block_type")) c.mid_block_type = UNetConfig::kMidCrossAttn;  // diffusers' default
  c.use_linear_projection = value_or<bool>(j, "use_linear_projection", false);
  c.upcast_attention = value_or<bool>(j, "upcast_attention", false);
  c.center_input_sample = value_or<bool>(j, "center_input_sample", false);
  c.norm_num_groups = value_or<int>(j, "norm_num_groups", 32);
  if (j.contains("norm_num_groups") && j["norm_num_groups"].is_null())
    return unsupported("UNet config: 'norm_num_groups' = null (no output norm) is not supported");
  c.norm_eps = float(value_or<double>(j, "norm_eps", 1e-5));
  c.flip_sin_to_cos = value_or<bool>(j, "flip_sin_to_cos", true);
  c.freq_shift = value_or<int>(j, "freq_shift", 0);
  c.time_embed_dim = value_or<int>(j, "time_embedding_dim", c.block_out_channels.empty() ? 0 : 4 * c.block_out_channels[0]);
  c.conv_in_kernel = value_or<int>(j, "conv_in_kernel", 3);
  c.conv_out_kernel = value_or<int>(j, "conv_out_kernel", 3);
  c.downsample_padding = value_or<int>(j, "downsample_padding", 1);
  c.mid_block_scale_factor = float(value_or<double>(j, "mid_block_scale_factor", 1.0));
  c.resnet_time_scale_shift = value_or<std::string>(j, "resnet_time_scale_shift", "default");
  const auto& ss = is_null_or_absent(j, "sample_size") ? nlohmann::json(64) : j["sample_size"];
  if (ss.is_array() && ss.empty()) return invalid_argument("UNet config: sample_size is an empty list (expected an integer or [H, W])");
  c.sample_size = config_integer<int>(ss.is_array() ? ss[0] : ss, "UNet config: sample_size");
  if (c.sample_size < 1) return invalid_argument("UNet config: sample_size must be positive, got " + std::to_string(c.sample_size));
  return Status::ok();
}

template <typename T>
std::string text(const T& v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

template <typename T>
std::string text(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + text(v[i]);
  return s + "]";
}

}  // namespace

Status UNetConfig::validate() const {
  const int n = levels();
  if (n < 1) return invalid_argument("UNet config: 'block_out_channels' is empty");
  const auto check_len = [&](size_t size, const char* name) -> Status {
    if (int(size) != n)
      return invalid_argument(std::string("UNet config: '") + name + "' has " + std::to_string(size) +
                              " entries, block_out_channels has " + std::to_string(n));
    return Status::ok();
  };
  ATELIER_RETURN_IF_ERROR(check_len(down_block_types.size(), "down_block_types"));
  ATELIER_RETURN_IF_ERROR(check_len(up_block_types.size(), "up_block_types"));
  ATELIER_RETURN_IF_ERROR(check_len(layers_per_block.size(), "layers_per_block"));
  ATELIER_RETURN_IF_ERROR(check_len(transformer_layers_per_block.size(), "transformer_layers_per_block"));
  ATELIER_RETURN_IF_ERROR(check_len(reverse_transformer_layers_per_block.size(), "reverse_transformer_layers_per_block"));
  ATELIER_RETURN_IF_ERROR(check_len(num_attention_heads.size(), "num_attention_heads"));
  ATELIER_RETURN_IF_ERROR(check_len(cross_attention_dim.size(), "cross_attention_dim"));
  ATELIER_RETURN_IF_ERROR(check_len(only_cross_attention.size(), "only_cross_attention"));
  for (const auto& t : down_block_types)
    if (t != kCrossAttnDown && t != kDown)
      return unsupported("UNet down block type '" + t + "' is not supported (CrossAttnDownBlock2D, DownBlock2D are)");
  for (const auto& t : up_block_types)
    if (t != kCrossAttnUp && t != kUp)
      return unsupported("UNet up block type '" + t + "' is not supported (CrossAttnUpBlock2D, UpBlock2D are)");
  if (has_mid_block() && mid_block_type != kMidCrossAttn)
    return unsupported("UNet mid block type '" + mid_block_type + "' is not supported (UNetMidBlock2DCrossAttn is)");
  if (resnet_time_scale_shift != "default")
    return unsupported("UNet resnet_time_scale_shift '" + resnet_time_scale_shift + "' is not supported ('default' is)");
  if (norm_num_groups < 1) return invalid_argument("UNet config: norm_num_groups must be positive");
  for (int i = 0; i < n; ++i) {
    const int ch = block_out_channels[i];
    if (ch < 1 || ch % norm_num_groups != 0)
      return invalid_argument("UNet config: block_out_channels[" + std::to_string(i) + "] = " + std::to_string(ch) +
                              " is not a positive multiple of norm_num_groups " + std::to_string(norm_num_groups));
    if (num_attention_heads[i] < 1 || ch % num_attention_heads[i] != 0)
      return invalid_argument("UNet config: level " + std::to_string(i) + " has " + std::to_string(ch) +
                              " channels, not divisible into " + std::to_string(num_attention_heads[i]) + " heads");
    if (layers_per_block[i] < 1 || transformer_layers_per_block[i] < 1 || reverse_transformer_layers_per_block[i] < 1 ||
        cross_attention_dim[i] < 1)
      return invalid_argument("UNet config: layer counts and cross_attention_dim must be positive");
    if (std::max({layers_per_block[i], transformer_layers_per_block[i], reverse_transformer_layers_per_block[i]}) > kMaxLayerCount)
      return invalid_argument("UNet config: level " + std::to_string(i) + " asks for more than " + std::to_string(kMaxLayerCount) +
                              " layers (layers_per_block, transformer_layers_per_block)");
  }
  if (in_channels < 1 || out_channels < 1 || time_embed_dim < 1)
    return invalid_argument("UNet config: in/out channels and the time embedding width must be positive");
  if (conv_in_kernel % 2 == 0 || conv_out_kernel % 2 == 0)
    return unsupported("UNet config: conv_in_kernel/conv_out_kernel must be odd");
  if (downsample_padding != 0 && downsample_padding != 1)
    return unsupported("UNet config: downsample_padding must be 0 or 1");
  return Status::ok();
}

Expected<UNetConfig> parse_unet_config(const nlohmann::json& j) {
  if (!j.is_object()) return invalid_argument("UNet config must be a JSON object");
  const auto cls_field = j.find("_class_name");
  const std::string cls = cls_field == j.end() || cls_field->is_null() ? "UNet2DConditionModel"
                          : cls_field->is_string()                     ? cls_field->get<std::string>()
                                                                       : json_excerpt(*cls_field);
  if (cls != "UNet2DConditionModel")
    return unsupported("UNet config: class '" + cls + "' is not supported (UNet2DConditionModel is)");
  UNetConfig c;
  Status st = catch_status([&]() -> Status {
    ATELIER_RETURN_IF_ERROR(reject_unused_features(j));
    ATELIER_RETURN_IF_ERROR(parse_lists(j, c));
    return parse_scalars(j, c);
  });
  if (!st) {
    // nlohmann throws on type mismatches; say which file content was wrong rather than "internal".
    if (st.code() == ErrorCode::kInternal) return invalid_argument("UNet config: " + st.message());
    return st;
  }
  ATELIER_RETURN_IF_ERROR(c.validate());
  return c;
}

Expected<UNetConfig> load_unet_config(const std::string& path) {
  ATELIER_ASSIGN_OR_RETURN(const nlohmann::json j, read_json_file(path));
  auto c = parse_unet_config(j);
  if (!c) return prefixed(c.status(), path);
  return c;
}

std::vector<std::string> unet_config_differences(const UNetConfig& a, const UNetConfig& b) {
  std::vector<std::string> out;
  const auto cmp = [&](const char* name, const auto& x, const auto& y) {
    if (x != y) out.push_back(std::string(name) + ": " + text(x) + " vs " + text(y));
  };
  cmp("in_channels", a.in_channels, b.in_channels);
  cmp("out_channels", a.out_channels, b.out_channels);
  cmp("block_out_channels", a.block_out_channels, b.block_out_channels);
  cmp("down_block_types", a.down_block_types, b.down_block_types);
  cmp("up_block_types", a.up_block_types, b.up_block_types);
  cmp("mid_block_type", a.mid_block_type, b.mid_block_type);
  cmp("layers_per_block", a.layers_per_block, b.layers_per_block);
  cmp("transformer_layers_per_block", a.transformer_layers_per_block, b.transformer_layers_per_block);
  cmp("reverse_transformer_layers_per_block", a.reverse_transformer_layers_per_block, b.reverse_transformer_layers_per_block);
  cmp("num_attention_heads", a.num_attention_heads, b.num_attention_heads);
  cmp("cross_attention_dim", a.cross_attention_dim, b.cross_attention_dim);
  cmp("only_cross_attention", std::vector<int>(a.only_cross_attention.begin(), a.only_cross_attention.end()),
      std::vector<int>(b.only_cross_attention.begin(), b.only_cross_attention.end()));
  cmp("use_linear_projection", a.use_linear_projection, b.use_linear_projection);
  cmp("center_input_sample", a.center_input_sample, b.center_input_sample);
  cmp("norm_num_groups", a.norm_num_groups, b.norm_num_groups);
  cmp("norm_eps", a.norm_eps, b.norm_eps);
  cmp("flip_sin_to_cos", a.flip_sin_to_cos, b.flip_sin_to_cos);
  cmp("freq_shift", a.freq_shift, b.freq_shift);
  cmp("time_embed_dim", a.time_embed_dim, b.time_embed_dim);
  cmp("conv_in_kernel", a.conv_in_kernel, b.conv_in_kernel);
  cmp("conv_out_kernel", a.conv_out_kernel, b.conv_out_kernel);
  cmp("downsample_padding", a.downsample_padding, b.downsample_padding);
  cmp("mid_block_scale_factor", a.mid_block_scale_factor, b.mid_block_scale_factor);
  cmp("resnet_time_scale_shift", a.resnet_time_scale_shift, b.resnet_time_scale_shift);
  return out;
}

UNetConfig sd15_unet_config() {
  UNetConfig c;
  c.block_out_channels = {320, 640, 1280, 1280};
  c.down_block_types = {UNetConfig::kCrossAttnDown, UNetConfig::kCrossAttnDown, UNetConfig::kCrossAttnDown, UNetConfig::kDown};
  c.up_block_types = {UNetConfig::kUp, UNetConfig::kCrossAttnUp, UNetConfig::kCrossAttnUp, UNetConfig::kCrossAttnUp};
  c.layers_per_block = {2, 2, 2, 2};
  c.transformer_layers_per_block = {1, 1, 1, 1};
  c.reverse_transformer_layers_per_block = {1, 1, 1, 1};
  c.num_attention_heads = {8, 8, 8, 8};
  c.cross_attention_dim = {768, 768, 768, 768};
  c.only_cross_attention = {false, false, false, false};
  c.time_embed_dim = 4 * 320;
  c.sample_size = 64;
  return c;
}

}  // namespace atelier
