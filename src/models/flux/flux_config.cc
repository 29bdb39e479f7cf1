#include "models/flux/flux_config.h"

#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/json_util.h"

namespace atelier {

namespace {

constexpr int64_t kFluxHeadDim = 128;
constexpr std::array<int, 3> kFluxAxes{16, 56, 56};
constexpr const char* kComfyPrefix = "model.diffusion_model.";

using Renames = std::vector<std::pair<std::string, std::string>>;

// Replaces the first matching prefix of `rest`; returns false when none matches.
bool rename_prefix(const Renames& table, std::string& rest) {
  for (const auto& [from, to] : table) {
    if (rest.compare(0, from.size(), from) == 0) {
      rest = to + rest.substr(from.size());
      return true;
    }
  }
  return false;
}

// "transformer_blocks.12.attn.to_out.0.weight" with block prefix "transformer_blocks." -> ("12.", "attn...").
bool split_block(const std::string& key, const std::string& prefix, std::string& index, std::string& rest) {
  if (key.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos) return false;
  index = key.substr(prefix.size(), dot + 1 - prefix.size());
  rest = key.substr(dot + 1);
  return true;
}

int count_blocks(const WeightStore& store, const std::string& prefix, const std::string& probe) {
  int n = 0;
  while (store.contains(prefix + std::to_string(n) + probe)) ++n;
  return n;
}

}  // namespace

std::string flux_bfl_key(const std::string& k) {
  static const Renames kTop = {
      {"x_embedder.", "img_in."},
      {"context_embedder.", "txt_in."},
      {"time_text_embed.timestep_embedder.linear_1.", "time_in.in_layer."},
      {"time_text_embed.timestep_embedder.linear_2.", "time_in.out_layer."},
      {"time_text_embed.guidance_embedder.linear_1.", "guidance_in.in_layer."},
      {"time_text_embed.guidance_embedder.linear_2.", "guidance_in.out_layer."},
      {"time_text_embed.text_embedder.linear_1.", "vector_in.in_layer."},
      {"time_text_embed.text_embedder.linear_2.", "vector_in.out_layer."},
      {"norm_out.linear.", "final_layer.adaLN_modulation.1."},
      {"proj_out.", "final_layer.linear."},
  };
  static const Renames kDouble = {
      {"norm1.linear.", "img_mod.lin."},
      {"norm1_context.linear.", "txt_mod.lin."},
      {"attn.norm_q.weight", "img_attn.norm.query_norm.scale"},
      {"attn.norm_k.weight", "img_attn.norm.key_norm.scale"},
      {"attn.norm_added_q.weight", "txt_attn.norm.query_norm.scale"},
      {"attn.norm_added_k.weight", "txt_attn.norm.key_norm.scale"},
      {"attn.to_out.0.", "img_attn.proj."},
      {"attn.to_add_out.", "txt_attn.proj."},
      {"ff.net.0.proj.", "img_mlp.0."},
      {"ff.net.2.", "img_mlp.2."},
      {"ff_context.net.0.proj.", "txt_mlp.0."},
      {"ff_context.net.2.", "txt_mlp.2."},
  };
  static const Renames kSingle = {
      {"norm.linear.", "modulation.lin."},
      {"attn.norm_q.weight", "norm.query_norm.scale"},
      {"attn.norm_k.weight", "norm.key_norm.scale"},
      {"proj_out.", "linear2."},
  };
  std::string index, rest;
  if (split_block(k, "transformer_blocks.", index, rest)) {
    return rename_prefix(kDouble, rest) ? "double_blocks." + index + rest : k;
  }
  if (split_block(k, "single_transformer_blocks.", index, rest)) {
    return rename_prefix(kSingle, rest) ? "single_blocks." + index + rest : k;
  }
  rest = k;
  return rename_prefix(kTop, rest) ? rest : k;
}

std::optional<std::string> flux_bfl_prefix(const WeightStore& store) {
  for (const std::string p : {"", kComfyPrefix}) {
    if (store.contains(p + "double_blocks.0.img_attn.qkv.weight")) return p;
  }
  return std::nullopt;
}

Expected<FluxConfig> FluxConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return invalid_argument("FLUX transformer config: expected a JSON object");
  FluxConfig c;
  int64_t patch_size = 1;
  Status st = catch_status([&]() -> Status {
    constexpr const char* kContext = "FLUX transformer config";
    read_config_field(j, "in_channels", c.in_channels, kContext);
    c.out_channels = c.in_channels;
    read_config_field(j, "out_channels", c.out_channels, kContext);
    read_config_field(j, "num_layers", c.num_layers, kContext);
    read_config_field(j, "num_single_layers", c.num_single_layers, kContext);
    read_config_field(j, "num_attention_heads", c.num_heads, kContext);
    read_config_field(j, "attention_head_dim", c.head_dim, kContext);
    read_config_field(j, "joint_attention_dim", c.joint_attention_dim, kContext);
    read_config_field(j, "pooled_projection_dim", c.pooled_projection_dim, kContext);
    read_config_field(j, "guidance_embeds", c.guidance_embeds, kContext);
    read_config_field(j, "patch_size", patch_size, kContext);
    if (j.contains("axes_dims_rope")) {
      std::vector<int> axes;
      read_config_field(j, "axes_dims_rope", axes, kContext);
      if (axes.size() != 3) return unsupported("FLUX axes_dims_rope must list 3 axes");
      for (size_t i = 0; i < 3; ++i) c.axes_dims_rope[i] = axes[i];
    }
    return Status::ok();
  });
  if (!st) return st;
  if (patch_size != 1) return unsupported("FLUX transformer: only patch_size 1 is supported");
  if (c.num_layers < 0 || c.num_single_layers < 0 || c.num_layers + c.num_single_layers > kMaxLayerCount)
    return invalid_argument("FLUX transformer config: num_layers + num_single_layers must be 0.." + std::to_string(kMaxLayerCount));
  if (c.num_heads < 1 || c.head_dim < 1) return invalid_argument("FLUX transformer config: num_attention_heads and attention_head_dim must be positive");
  if (c.axes_dims_rope[0] + c.axes_dims_rope[1] + c.axes_dims_rope[2] != c.head_dim) {
    return invalid_argument("FLUX config: axes_dims_rope must sum to attention_head_dim");
  }
  return c;
}

Expected<FluxConfig> FluxConfig::from_file(const std::string& path) {
  ATELIER_ASSIGN_OR_RETURN(auto j, read_json_file(path));
  auto c = from_json(j);
  if (!c) return prefixed(c.status(), path);
  return c;
}

Expected<FluxConfig> FluxConfig::detect(const WeightStore& store, FluxLayout layout, const std::string& prefix) {
  auto key = [&](const std::string& canonical) {
    return prefix + (layout == FluxLayout::kBfl ? flux_bfl_key(canonical) : canonical);
  };
  const auto x_in = store.shape(key("x_embedder.weight"));
  const auto ctx = store.shape(key("context_embedder.weight"));
  const auto pooled = store.shape(key("time_text_embed.text_embedder.linear_1.weight"));
  const auto qnorm = store.shape(key("transformer_blocks.0.attn.norm_q.weight"));
  const auto out = store.shape(key("proj_out.weight"));
  if (!x_in || !ctx || !pooled || !qnorm || !out) {
    return not_found("no FLUX transformer weights found (expected " + key("x_embedder.weight") + ")");
  }
  if (!shape_is(x_in, 2) || !shape_is(ctx, 2) || !shape_is(pooled, 2) || !shape_is(qnorm, 1) || !shape_is(out, 2) ||
      (*x_in)[0] % (*qnorm)[0] != 0)
    return corrupt("FLUX transformer weights: " + key("x_embedder.weight") + ", " + key("context_embedder.weight") + ", " +
                   key("proj_out.weight") + " and the text embedder must be matrices of positive sizes, and " +
                   key("transformer_blocks.0.attn.norm_q.weight") + " a vector (the head dim) that divides the width");
  FluxConfig c;
  c.in_channels = (*x_in)[1];
  c.out_channels = (*out)[0];
  c.joint_attention_dim = (*ctx)[1];
  c.pooled_projection_dim = (*pooled)[1];
  c.head_dim = (*qnorm)[0];
  c.num_heads = int((*x_in)[0] / c.head_dim);
  c.guidance_embeds = store.contains(key("time_text_embed.guidance_embedder.linear_1.weight"));
  const bool bfl = layout == FluxLayout::kBfl;
  c.num_layers = count_blocks(store, prefix + (bfl ? "double_blocks." : "transformer_blocks."),
                              bfl ? ".img_mod.lin.weight" : ".norm1.linear.weight");
  c.num_single_layers = count_blocks(store, prefix + (bfl ? "single_blocks." : "single_transformer_blocks."),
                                     bfl ? ".modulation.lin.weight" : ".norm.linear.weight");
  if (c.head_dim == kFluxHeadDim) {
    c.axes_dims_rope = kFluxAxes;
  } else {
    const int index_axis = int(c.head_dim / 4) & ~1;
    const int spatial = (int(c.head_dim) - index_axis) / 2;
    if (spatial % 2 != 0 || index_axis + 2 * spatial != c.head_dim) {
      return unsupported("FLUX transformer: cannot infer axes_dims_rope for head_dim " + std::to_string(c.head_dim) +
                         "; load it from a diffusers config");
    }
    c.axes_dims_rope = {index_axis, spatial, spatial};
  }
  return c;
}

}  // namespace atelier
