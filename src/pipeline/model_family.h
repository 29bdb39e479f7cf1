// Which pipeline a model path takes: SD 1.x/2.x, FLUX.1 or Z-Image. One detection for `atelier generate`,
// `atelier info` and the server's model registry.
#pragma once
#include <string>

namespace atelier {

enum class ModelFamily { kSd, kFlux, kZImage };
const char* model_family_name(ModelFamily f);  // "sd", "flux", "zimage"

// The family of the model at `path`: FLUX and Z-Image diffusers folders or transformer files (is_flux_model,
// is_zimage_model), anything else (SD folders and files, the built-in `builtin:` configurations) SD. Never fails:
// unreadable paths are SD's, whose loader then says what is wrong.
ModelFamily detect_model_family(const std::string& path);

}  // namespace atelier
