// `atelier bench --config flux|zimage`: one FLUX.1-dev or Z-Image-Turbo generation at full size with seeded
// random weights (pipeline/builtin_models.h), timed and reported as the SD bench reports (sd_bench.h: the
// same BenchReport, trace ranges and summary; the "unet_*" fields hold the transformer's figures and
// model_call says so). The denoise loops are the pipelines' own (FluxPipeline::denoise,
// ZImagePipeline::denoise); a model call is one transformer evaluation plus the Euler update (two
// evaluations with CFG). No text encoder is built: seeded conditioning of the encoders' output shapes is fed
// (FLUX: T5 states [1, 512, 4096] + CLIP pooled [1, 768]; Z-Image: Qwen3 features [128, 2560]).
#pragma once
#include <string>

#include "core/status.h"
#include "pipeline/builtin_models.h"
#include "pipeline/sd_bench.h"

namespace atelier {

// Whether `options` asks for a diffusion-transformer configuration (flux, zimage).
bool is_dit_bench(const BenchOptions& options);
// `options` with the configuration's defaults where the caller gave nothing: its step count (FLUX 28,
// Z-Image 8) and no CFG. `steps_given` / `cfg_given` say which the caller set.
BenchOptions with_dit_defaults(BenchOptions options, bool steps_given, bool cfg_given);

// Runs the bench of the built-in configuration options.config (1024² unless width/height say otherwise).
Expected<BenchReport> run_dit_bench(const BenchOptions& options);
// The same with an explicit configuration (tests pass reduced dimensions).
Expected<BenchReport> run_dit_bench(const BenchOptions& options, const BuiltinDitConfig& config);

// run_dit_bench for flux/zimage, run_sd_bench otherwise.
Expected<BenchReport> run_bench(const BenchOptions& options);

}  // namespace atelier
