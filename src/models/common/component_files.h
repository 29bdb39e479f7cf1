// The weight files of one component folder of a diffusers-layout model (unet/, vae/, text_encoder/, ...):
// shared by the SD, FLUX and Z-Image loaders.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "core/status.h"

namespace atelier {

// In order: `stem`.safetensors; the shards named by `stem`.safetensors.index.json (each once, in index
// order); the `stem`.fp16 / .bf16 variants; any other *.safetensors in the folder (sorted). Errors: the
// folder is missing, the index is malformed, or there are no safetensors weights at all (.bin/.ckpt files
// are not read: they can run code).
Expected<std::vector<std::string>> component_weight_files(const std::filesystem::path& dir, const std::string& stem);

}  // namespace atelier
