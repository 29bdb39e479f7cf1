// The bundled demo model (models/demo: a tiny SD 1.x model trained on coloured shapes, see its README.md):
// where `atelier generate` finds it when no --model is given.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"

namespace atelier {

// The sampler `generate` uses for the demo model when none is given: deterministic samplers follow its
// prompts better than the CLI's general default euler_a, whose ancestral noise moves its small shapes; of
// those, euler measured best on the held-out prompts (92%, dpmpp_2m 90%, ddim 88%; 20 steps, CFG 7:
// models/demo/README.md).
inline constexpr const char* kDemoModelSampler = "euler";

// Folders searched for the demo model, in order: $ATELIER_DEMO_MODEL (when set), <exe_dir>/../share/atelier/
// models/demo (an installed copy; skipped when exe_dir is empty), <source dir>/models/demo (a build tree).
std::vector<std::string> demo_model_candidates(const std::string& exe_dir);

// The first candidate holding a diffusers folder (model_index.json); an error naming every place looked at.
Expected<std::string> find_demo_model(const std::string& exe_dir);

// The folder of the running executable ("" when it cannot be read).
std::string executable_dir();

}  // namespace atelier
