// Built-in full-size model configurations with seeded random weights: benchmarks of the published
// architectures without downloading a checkpoint. The figures depend only on shapes, not on weight values.
//   sd15  Stable Diffusion 1.5: UNet 320/640/1280/1280, 8 heads, CLIP-L context (77 x 768), 512 px, epsilon
//   sd21  Stable Diffusion 2.1 768-v: heads of 64 channels (5/10/20/20), OpenCLIP-H context (77 x 1024),
//         linear proj_in/proj_out, 768 px, v-prediction
// The VAE is the same KL-f8 autoencoder in both. There is no random text encoder: callers feed a context
// tensor of the right shape instead (text encoding is ~0.3% of an SD generation's FLOPs).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipeline/sd_model.h"

namespace atelier {

struct BuiltinSdConfig {
  std::string name;         // "sd15" | "sd21"
  std::string description;  // one line for reports
  SdFamily family = SdFamily::kSD1;
  Prediction prediction = Prediction::kEpsilon;
  int default_size = 512;   // image side
  UNetConfig unet;
  VaeConfig vae;
  int64_t context_tokens = 77;  // CLIP's sequence length
  ClipTextConfig text_encoder;  // CLIP ViT-L/14 (sd15) or OpenCLIP ViT-H/14 up to its penultimate layer (sd21)
};

std::vector<std::string> builtin_sd_config_names();  // {"sd15", "sd21"}
// The configuration called `name`; an error lists the known names.
Expected<BuiltinSdConfig> builtin_sd_config(const std::string& name);

// The published SD 2.1 (768-v) UNet (diffusers' stabilityai/stable-diffusion-2-1 unet/config.json).
UNetConfig sd21_unet_config();

// An SdModel of `config` with random UNet and VAE weights (seeded) on `device` in default_model_dtype(device),
// SD's default scheduler config, and — when `tokenizer_dir` names a CLIP tokenizer folder (vocab.json +
// merges.txt; the vocabulary is the published one) — a random text encoder of the real size, so that the
// model serves prompts (`atelier serve --model sd15=builtin:sd15 --tokenizer DIR`). Without a tokenizer it has
// no text encoder (the bench feeds seeded conditioning). Allocates the full weights (SD 1.5: 1.7 GB in bf16).
Expected<std::shared_ptr<SdModel>> make_random_sd_model(const BuiltinSdConfig& config, Device device, uint64_t seed,
                                                        const std::string& tokenizer_dir = "");
// "builtin:sd15" -> "sd15"; "" when `path` does not name a built-in configuration.
std::string builtin_name_of(const std::string& path);

}  // namespace atelier
