// A generation request: every setting a user can give, validated once at the boundary (CLI, HTTP) with
// messages that say what is supported. Defaults follow A1111/diffusers.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace atelier {

constexpr int kLatentFactor = 8;          // SD/FLUX VAEs downsample by 8
constexpr int kMaxGenerateSide = 4096;
constexpr int kMaxSteps = 1000;
constexpr int kMaxBatch = 64;
constexpr int kMaxMaskBlur = 64;          // A1111's UI allows 0-64 pixels
constexpr int kMaxInpaintPadding = 256;   // A1111's UI allows 0-256 pixels

struct GenerateRequest {
  std::string prompt;
  std::string negative_prompt;
  int width = 0;    // 0 = the model's default size
  int height = 0;
  int steps = 20;
  float cfg_scale = 7.0f;
  std::string sampler = "euler_a";
  std::string schedule = "default";    // default | karras | exponential
  int64_t seed = -1;                    // -1 = random
  std::string rng = "cuda";             // "cpu" | "cuda"; A1111's default: torch's CUDA generator (Philox), reproduced on any device
  int clip_skip = 1;                    // A1111 numbering: 1 = last layer
  std::string prediction;               // "" = detected, or "epsilon" / "v"
  std::string init_image;               // path (CLI) — img2img when set
  float strength = 0.75f;
  std::string resize_mode = "resize";   // init image of another aspect ratio: resize | crop | fill (A1111 resize_mode 0-2)
  // Inpainting (SD models; pipeline/inpaint.h). Defaults: A1111's web UI's.
  std::string mask;                     // path (CLI) — inpaints the init image where the mask is white
  int mask_blur_x = 4, mask_blur_y = 4; // Gaussian blur of the mask, in pixels
  std::string inpaint_fill = "original";  // fill | original | latent_noise | latent_nothing (A1111 inpainting_fill 0-3)
  bool inpaint_only_masked = false;     // A1111 inpaint_full_res: generate the masked area's box at full size
  int inpaint_padding = 32;             // pixels around the mask's box in that mode
  bool mask_invert = false;             // inpaint where the mask is black
  bool mask_round = true;               // a mask from an alpha channel: thresholded (A1111 mask_round)
  int batch_size = 1;
  int batch_count = 1;
  bool emphasis = false;                // A1111 (word:1.2) syntax; off = brackets are literal, as diffusers
  std::string device = "cpu";

  // Checks every field; `model_default_size` fills width/height when 0.
  Status validate() const;
  nlohmann::json to_json() const;
  // The inpainting fields above into `j` (to_json does when `mask` is a path; the server's masks are uploads).
  void add_inpaint_settings(nlohmann::json& j) const;
};

}  // namespace atelier
