// Checkpoint layouts of the CLIP text encoder and the key maps that read them. Model code names every tensor
// as transformers does inside `text_model.` ("embeddings.token_embedding.weight",
// "encoder.layers.N.self_attn.q_proj.weight", "final_layer_norm.weight"); each layout adds a prefix and, for
// OpenCLIP, renames.
#pragma once
#include <optional>
#include <string>

#include "models/common/weights.h"

namespace atelier {

enum class ClipLayout {
  kTransformers,  // HF CLIPTextModel folder: "text_model.*", or no prefix (as transformers 5 saves it)
  kCompVis,       // SD 1.x single file: "cond_stage_model.transformer.text_model.*" (same names under it)
  kOpenClip,      // SD 2.x single file: "cond_stage_model.model.*" (OpenCLIP names, fused q/k/v)
};

const char* clip_layout_name(ClipLayout layout);

// Which layout the store holds a CLIP text encoder in; nullopt when it holds none.
std::optional<ClipLayout> detect_clip_layout(const WeightStore& store);

// Prefix of the text tower's keys in `store` for `layout` (detects "text_model." vs none for transformers, and
// the old SD 1.x files whose keys lack "text_model." under "cond_stage_model.transformer.").
std::string clip_tower_prefix(const WeightStore& store, ClipLayout layout);

// Canonical (transformers) key -> key in the file, relative to the tower prefix. Identity for kTransformers
// and kCompVis. For kOpenClip it also maps "encoder.layers.N.self_attn.in_proj_{weight,bias}" (the fused
// q/k/v that the model splits itself) and leaves keys it does not know unchanged.
KeyMap clip_key_map(ClipLayout layout);

// File key of the text projection for `layout` (full key, not relative to the tower prefix): transformers'
// CLIPTextModelWithProjection keeps "text_projection.weight" [proj, D] beside "text_model."; OpenCLIP stores
// "text_projection" [D, proj] (transposed) inside the tower. Empty when the layout has none (SD 1.x).
std::string clip_projection_key(ClipLayout layout);

}  // namespace atelier
