#include "models/clip/clip_keymaps.h"

#include <array>
#include <utility>

namespace atelier {

namespace {

constexpr const char* kHfTower = "text_model.";
constexpr const char* kCompVisRoot = "cond_stage_model.transformer.";
constexpr const char* kCompVisTower = "cond_stage_model.transformer.text_model.";
constexpr const char* kOpenClipTower = "cond_stage_model.model.";
constexpr const char* kHfTokenEmbedding = "embeddings.token_embedding.weight";

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Replaces the first occurrence of `from` in `s` by `to`; returns whether it did.
bool replace_once(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  if (at == std::string::npos) return false;
  s.replace(at, from.size(), to);
  return true;
}

// transformers' names inside one encoder layer -> OpenCLIP's names inside one residual block.
std::string openclip_layer_key(std::string rest) {
  static const std::array<std::pair<const char*, const char*>, 6> kRenames = {{
      {"layer_norm1.", "ln_1."},
      {"layer_norm2.", "ln_2."},
      {"self_attn.out_proj.", "attn.out_proj."},
      {"self_attn.in_proj_", "attn.in_proj_"},  // fused q/k/v; not a transformers key, see clip_keymaps.h
      {"mlp.fc1.", "mlp.c_fc."},
      {"mlp.fc2.", "mlp.c_proj."},
  }};
  for (const auto& [from, to] : kRenames)
    if (replace_once(rest, from, to)) break;
  return rest;
}

std::string openclip_key(const std::string& key) {
  static const std::string kLayers = "encoder.layers.";
  if (starts_with(key, kLayers)) return "transformer.resblocks." + openclip_layer_key(key.substr(kLayers.size()));
  if (key == kHfTokenEmbedding) return "token_embedding.weight";
  if (key == "embeddings.position_embedding.weight") return "positional_embedding";
  static const std::string kFinalNorm = "final_layer_norm.";
  if (starts_with(key, kFinalNorm)) return "ln_final." + key.substr(kFinalNorm.size());
  return key;
}

}  // namespace

const char* clip_layout_name(ClipLayout layout) {
  switch (layout) {
    case ClipLayout::kTransformers: return "transformers";
    case ClipLayout::kCompVis: return "CompVis SD 1.x single file";
    case ClipLayout::kOpenClip: return "OpenCLIP SD 2.x single file";
  }
  return "?";
}

std::optional<ClipLayout> detect_clip_layout(const WeightStore& store) {
  if (store.any_with_prefix(kCompVisRoot)) return ClipLayout::kCompVis;
  if (store.contains(std::string(kOpenClipTower) + "token_embedding.weight") ||
      store.any_with_prefix(std::string(kOpenClipTower) + "transformer.resblocks."))
    return ClipLayout::kOpenClip;
  if (store.contains(std::string(kHfTower) + kHfTokenEmbedding) || store.contains(kHfTokenEmbedding))
    return ClipLayout::kTransformers;
  return std::nullopt;
}

std::string clip_tower_prefix(const WeightStore& store, ClipLayout layout) {
  switch (layout) {
    case ClipLayout::kTransformers:
      // Published repos (transformers 4) keep "text_model."; transformers 5 saves the tower without it.
      return store.any_with_prefix(kHfTower) ? kHfTower : "";
    case ClipLayout::kCompVis:
      // Some early SD 1.x files were saved by a transformers version without the "text_model." level.
      return store.any_with_prefix(kCompVisTower) ? kCompVisTower : kCompVisRoot;
    case ClipLayout::kOpenClip:
      return kOpenClipTower;
  }
  return "";
}

KeyMap clip_key_map(ClipLayout layout) {
  if (layout == ClipLayout::kOpenClip) return openclip_key;
  return {};
}

std::string clip_projection_key(ClipLayout layout) {
  switch (layout) {
    case ClipLayout::kTransformers: return "text_projection.weight";
    case ClipLayout::kCompVis: return "";
    case ClipLayout::kOpenClip: return std::string(kOpenClipTower) + "text_projection";
  }
  return "";
}

}  // namespace atelier
