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
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipeline/flux_model.h"
#include "pipeline/sd_model.h"
#include "pipeline/zimage_pipeline.h"

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

// --- diffusion transformers (builtin_dit_models.cc) ---------------------------------------------------
//   flux    FLUX.1-dev: 19 double + 38 single blocks, 24 heads of 128, T5 states [1, 512, 4096] + CLIP pooled
//           [1, 768], distilled guidance 3.5, 28 steps, 1024 px (transformer 11.9 B parameters)
//   zimage  Z-Image-Turbo: dim 3840, 30 layers + 2 noise / 2 context refiner layers, 30 heads, Qwen3 features
//           [N, 2560] (N = 128 tokens here), 8 steps without CFG, 1024 px (transformer 6.15 B parameters)
// Both decode with FLUX's 16-channel KL-f8 VAE. No text encoder is built: the bench feeds seeded conditioning.
struct BuiltinDitConfig {
  std::string name;         // "flux" | "zimage"
  std::string description;  // one line for reports
  std::optional<FluxConfig> flux;      // exactly one of flux / zimage is set
  std::optional<ZImageConfig> zimage;
  VaeConfig vae;
  int default_size = 1024;
  int default_steps = 28;
  float guidance = 3.5f;          // FLUX's distilled guidance (an input of the model); unused by Z-Image
  int64_t text_tokens = 512;      // conditioning rows fed to the transformer
  int64_t text_width = 4096;      // their width (joint_attention_dim / cap_feat_dim)
  int64_t pooled_width = 768;     // FLUX's CLIP pooled width; 0 for Z-Image
  std::optional<Qwen3Config> qwen3;  // Z-Image's text encoder (Qwen3-4B), for benches that build it
};

std::vector<std::string> builtin_dit_config_names();  // {"flux", "zimage"}
bool is_builtin_dit_config(const std::string& name);
// The published configuration called `name`; an error lists the known names.
Expected<BuiltinDitConfig> builtin_dit_config(const std::string& name);
// FLUX's 16-channel VAE (ae.safetensors / the vae/ folder of FLUX.1 and Z-Image): scaling 0.3611, shift 0.1159.
VaeConfig flux_vae_config();

// Parameter counts computed from the configuration (nothing allocated).
int64_t flux_transformer_params(const FluxConfig& config);
int64_t zimage_transformer_params(const ZImageConfig& config);

// Seeded random models of `config` on `device` in default_model_dtype(device) (bf16 on CUDA, f32 on the
// CPU), every transformer tensor made directly on the device (FLUX: 24 GB in bf16, never staged as f32 on the
// host). No text encoders or tokenizers. `params` (optional) receives the transformer's parameter count as
// allocated. An allocation failure (device out of memory) is an error naming what did not fit.
// fp8: the transformer's block projections quantized to FP8 after the random bf16 weights are made.
Expected<std::shared_ptr<FluxModel>> make_random_flux_model(const BuiltinDitConfig& config, Device device, uint64_t seed,
                                                            int64_t* params = nullptr, bool fp8 = false);
// Z-Image's Qwen3 text encoder with seeded random weights on `device` in `dtype` (the layers hidden_states[-2]
// needs); `params` (optional) receives its parameter count.
Expected<Qwen3Encoder> make_random_qwen3_encoder(const Qwen3Config& config, Device device, DType dtype, uint64_t seed,
                                                 int64_t* params = nullptr);
Expected<std::shared_ptr<ZImageModel>> make_random_zimage_model(const BuiltinDitConfig& config, Device device,
                                                                uint64_t seed, int64_t* params = nullptr, bool fp8 = false);

}  // namespace atelier
