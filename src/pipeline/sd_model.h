// A loaded Stable Diffusion 1.x/2.x model: tokenizer, text encoder, UNet, VAE and the scheduler config,
// from a diffusers folder (model_index.json + component folders) or one single-file checkpoint in the
// original CompVis layout (SD 1: HF CLIP text encoder; SD 2: OpenCLIP, run up to its penultimate layer).
// Configuration comes from the component config.json files when present and is otherwise detected from
// tensor shapes.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "models/clip/clip_text_model.h"
#include "models/common/weights.h"
#include "models/sd/unet.h"
#include "models/vae/vae.h"
#include "tokenizers/clip_tokenizer.h"

namespace atelier {

enum class SdFamily { kSD1, kSD2 };
enum class Prediction { kEpsilon, kV };

const char* sd_family_name(SdFamily f);
const char* prediction_name(Prediction p);  // "epsilon" | "v"
Expected<Prediction> parse_prediction(const std::string& s);  // "epsilon" | "v" | "v_prediction"

// f32 on the CPU (its backend computes in f32), bf16 on CUDA (f32 accumulation; diffusers users run fp16/bf16).
DType default_model_dtype(Device device);

// A `--dtype` name as model load options: "auto" (unset: default_model_dtype), "f32", "bf16", "f16", or "fp8" (FLUX and
// Z-Image block projections in FP8 e4m3, the rest in the device's default dtype; SD has no FP8 path).
struct ModelDtype {
  std::optional<DType> dtype;
  bool fp8 = false;
};
inline constexpr const char* kModelDtypeNames[] = {"auto", "f32", "bf16", "f16", "fp8"};
Expected<ModelDtype> parse_model_dtype(const std::string& name);

struct SdLoadOptions {
  std::string tokenizer_dir;   // where vocab.json + merges.txt are, when the model carries no tokenizer
  std::string prediction;      // "" = detect; "epsilon" | "v" overrides
  Device device = Device::cpu();
  // Compute dtype of the models; unset: default_model_dtype(device). The VAE runs in the same dtype except
  // f16, where it runs in f32: SD's VAE overflows f16's range (diffusers' force_upcast); bf16 has f32's.
  std::optional<DType> dtype;
  bool require_tokenizer = true;  // `atelier info` describes single files without one
  bool compute_hash = true;    // SHA-256 of the weights (A1111 "Model hash"); reads the whole file once
};

struct SdModel {
  std::string path;
  std::string name;           // folder or file name without extension
  std::string layout;         // "diffusers" | "single-file (CompVis)"
  std::string hash;           // first 10 hex digits of the SHA-256 of the UNet weights file (or the single file)
  SdFamily family = SdFamily::kSD1;
  Prediction prediction = Prediction::kEpsilon;
  bool prediction_detected = true;
  int default_size = 512;     // image side the model was trained at

  std::optional<ClipTokenizer> tokenizer;
  std::optional<ClipTextModel> text_encoder;
  std::optional<UNet> unet;
  std::optional<Vae> vae;
  nlohmann::json scheduler_config;  // the model's scheduler_config.json (or SD defaults for single files)

  int64_t text_encoder_params = 0, unet_params = 0, vae_params = 0;
};

// Loads `path` (a diffusers folder or a .safetensors file). Errors name the file and what is wrong.
Expected<std::shared_ptr<SdModel>> load_sd_model(const std::string& path, const SdLoadOptions& options = {});

// Human-readable description (family, layout, configuration, parameter counts) for `atelier info`.
nlohmann::json describe_sd_model(const SdModel& model);

}  // namespace atelier
