#include "pipeline/request.h"

#include <cmath>

#include "pipeline/image_resize.h"
#include "pipeline/inpaint.h"
#include "sampling/sampler.h"

namespace atelier {

Status GenerateRequest::validate() const {
  auto side = [](const char* name, int v) -> Status {
    if (v == 0) return Status::ok();
    if (v < kLatentFactor || v > kMaxGenerateSide || v % kLatentFactor != 0)
      return invalid_argument(std::string(name) + " " + std::to_string(v) + " is not supported: it must be a multiple of " +
                              std::to_string(kLatentFactor) + " between " + std::to_string(kLatentFactor) + " and " +
                              std::to_string(kMaxGenerateSide));
    return Status::ok();
  };
  ATELIER_RETURN_IF_ERROR(side("width", width));
  ATELIER_RETURN_IF_ERROR(side("height", height));
  if (steps < 1 || steps > kMaxSteps)
    return invalid_argument("steps " + std::to_string(steps) + " is not supported: use 1 to " + std::to_string(kMaxSteps));
  if (!std::isfinite(cfg_scale) || cfg_scale < 0 || cfg_scale > 100)
    return invalid_argument("cfg scale must be a number from 0 to 100");
  if (schedule != "default" && schedule != "karras" && schedule != "exponential")
    return invalid_argument("unknown schedule '" + schedule + "': supported are default, karras, exponential");
  if (seed < -1 || seed > int64_t(0xffffffffffffLL))
    return invalid_argument("seed must be -1 (random) or from 0 to 2^48-1");
  if (rng != "cpu" && rng != "cuda")
    return invalid_argument("unknown rng '" + rng + "': supported are cpu (torch CPU generator, mt19937) and cuda (torch CUDA generator, Philox)");
  if (clip_skip < 1 || clip_skip > 12) return invalid_argument("clip skip must be from 1 to 12");
  if (!prediction.empty() && prediction != "epsilon" && prediction != "v")
    return invalid_argument("unknown prediction '" + prediction + "': supported are epsilon and v");
  if (!init_image.empty() && (!(strength > 0) || strength > 1))
    return invalid_argument("strength must be in (0, 1] for img2img");
  if (!init_image.empty() && steps >= 1 && sampling::img2img_steps(steps, strength) < 1)
    return invalid_argument("strength " + std::to_string(strength) + " with " + std::to_string(steps) +
                            " steps leaves no step to run (img2img runs the last int(steps x strength)); raise either");
  if (batch_size < 1 || batch_size > kMaxBatch)
    return invalid_argument("batch size must be from 1 to " + std::to_string(kMaxBatch));
  if (batch_count < 1 || batch_count > 1000) return invalid_argument("batch count must be from 1 to 1000");
  ATELIER_RETURN_IF_ERROR(parse_resize_mode(resize_mode).status());
  ATELIER_RETURN_IF_ERROR(parse_inpaint_fill(inpaint_fill).status());
  if (mask_blur_x < 0 || mask_blur_x > kMaxMaskBlur || mask_blur_y < 0 || mask_blur_y > kMaxMaskBlur)
    return invalid_argument("mask blur must be from 0 to " + std::to_string(kMaxMaskBlur) + " pixels");
  if (inpaint_padding < 0 || inpaint_padding > kMaxInpaintPadding)
    return invalid_argument("inpaint padding must be from 0 to " + std::to_string(kMaxInpaintPadding) + " pixels");
  return Status::ok();
}

nlohmann::json GenerateRequest::to_json() const {
  nlohmann::json j = {{"prompt", prompt}, {"negative_prompt", negative_prompt}, {"width", width}, {"height", height},
                      {"steps", steps}, {"cfg_scale", cfg_scale}, {"sampler", sampler}, {"schedule", schedule},
                      {"seed", seed}, {"rng", rng}, {"clip_skip", clip_skip},
                      {"batch_size", batch_size}, {"batch_count", batch_count}, {"emphasis", emphasis},
                      {"device", device}};
  if (!prediction.empty()) j["prediction"] = prediction;
  if (!init_image.empty()) {
    j["init_image"] = init_image;
    j["strength"] = strength;
    j["resize_mode"] = resize_mode;
  }
  if (!mask.empty()) {
    j["mask"] = mask;
    add_inpaint_settings(j);
  }
  return j;
}

void GenerateRequest::add_inpaint_settings(nlohmann::json& j) const {
  j["mask_blur_x"] = mask_blur_x;
  j["mask_blur_y"] = mask_blur_y;
  j["inpaint_fill"] = inpaint_fill;
  j["inpaint_only_masked"] = inpaint_only_masked;
  j["inpaint_padding"] = inpaint_padding;
  j["mask_invert"] = mask_invert;
  j["mask_round"] = mask_round;
}

}  // namespace atelier
