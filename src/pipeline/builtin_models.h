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
};

std::vector<std::string> builtin_sd_config_names();  // {"sd15", "sd21"}
// The configuration called `name`; an error lists the known names.
Expected<BuiltinSdConfig> builtin_sd_config(const std::string& name);

// The published SD 2.1 (768-v) UNet (diffusers' stabilityai/stable-diffusion-2-1 unet/config.json).
UNetConfig sd21_unet_config();

// An SdModel of `config` with random UNet and VAE weights (seeded) on `device`, SD's default scheduler
// config and no tokenizer / text encoder. Allocates the full weights (SD 1.5: 3.4 GB in f32).
Expected<std::shared_ptr<SdModel>> make_random_sd_model(const BuiltinSdConfig& config, Device device, uint64_t seed);

}  // namespace atelier
