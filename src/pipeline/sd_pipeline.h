// Stable Diffusion txt2img / img2img with diffusers' semantics:
//   tokens -> CLIP -> (uncond, cond) rows; latents = noise * init_noise_sigma (txt2img) or the VAE-encoded
//   init image noised to the first planned timestep (img2img); per model call: scale, UNet on the CFG batch,
//   uncond + g * (cond - uncond), sampler update; VAE decode; pixels = round(255 * clamp(x / 2 + 0.5)).
// Every sample has its own sampler (and RNG stream), so the stages below also serve a batcher that mixes
// samples at different steps.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "core/trace.h"
#include "pipeline/stage_names.h"
#include "io/image.h"
#include "pipeline/inpaint.h"
#include "pipeline/request.h"
#include "pipeline/sd_batch.h"
#include "pipeline/sd_model.h"
#include "sampling/sampler.h"

namespace atelier {

struct StepProgress {
  int batch_index = 0;    // which batch of the request (0 .. batch_count-1)
  int call = 0;           // model calls done in this batch
  int total_calls = 0;
  const Tensor* latents = nullptr;   // the samples after this call [B, C, h, w]
  const Tensor* denoised = nullptr;  // current x0 estimate [B, C, h, w] (for previews), may be null
};
// Called after every model call; returning false cancels the request.
using ProgressCallback = std::function<bool(const StepProgress&)>;

// Wall times of a request, read from the trace events of its ranges (never measured separately).
struct StageTimes {
  double text_encode_s = 0, denoise_s = 0, vae_s = 0, image_encode_s = 0, total_s = 0;
  std::vector<double> call_ms;  // wall time of each model call (UNet batch + sampler update)
  nlohmann::json to_json() const;
  // Sums the pipeline ranges (stage:: names) of `events`: vae_s is VAE decode + encode.
  static StageTimes from_events(const std::vector<trace::Event>& events);
};

// Runs `body` (one request's work, on this thread) inside its own trace recorder and kGenerate range and returns
// the StageTimes of the ranges it recorded; an error, or an exception (catch_status), from `body` is returned instead.
Expected<StageTimes> timed_stages(const std::function<Status()>& body);

struct GeneratedImage {
  Image image;
  int64_t seed = 0;
  std::string infotext;  // A1111 "parameters"
  nlohmann::json info;   // everything about this image (sidecar JSON)
};

struct GenerateResult {
  std::vector<GeneratedImage> images;
  StageTimes times;
  // Sets `times` and writes them into each image's info["timings"].
  void set_times(const StageTimes& t);
};

// A validated request with everything resolved (size, seed, sampler, init image), ready to run.
struct GenerationPlan {
  GenerateRequest request;          // width/height and seed resolved
  sampling::SamplerSpec spec;
  std::string sampler_name;         // canonical (ours): "euler_a", ...
  std::string schedule_name;        // "default" | "karras" | "exponential"
  RngKind rng = RngKind::kCuda;
  Tensor init_image;                // [1, 3, H, W] in [0, 1] for img2img; undefined for txt2img
  std::shared_ptr<const InpaintPlan> inpaint;  // img2img with a mask; null otherwise

  int image_count() const { return request.batch_size * request.batch_count; }
  // A1111: consecutive seeds, one per image across all batches.
  int64_t seed_of(int image_index) const { return request.seed + image_index; }
  bool guided() const { return request.cfg_scale > 1.0f; }
};

// One image of a plan, ready to denoise: its sampler (noise bound to its own generator) and its initial latents.
struct PreparedSample {
  std::unique_ptr<sampling::Sampler> sampler;
  std::shared_ptr<NoiseGenerator> generator;
  Tensor latents;  // [1, C, h, w]
  int64_t seed = 0;
  KeptRegion kept;  // inpainting: the mask and init latents its denoising holds to; undefined otherwise
};

class SdPipeline {
 public:
  explicit SdPipeline(std::shared_ptr<SdModel> model) : model_(std::move(model)) {}
  const SdModel& model() const { return *model_; }

  // Validates `request` (sizes, sampler, steps, ...) and runs it; errors are values.
  Expected<GenerateResult> generate(const GenerateRequest& request, const ProgressCallback& progress = {}) const;

  // --- stages -------------------------------------------------------------------------------------
  // Validates `request` and resolves it for this model. img2img takes `init_image` when given (the server's
  // decoded upload), else reads request.init_image (a path); the image is resized to the request's size.
  // Inpainting likewise takes `mask` or request.mask (pipeline/inpaint.h).
  Expected<GenerationPlan> plan(const GenerateRequest& request, const Image* init_image = nullptr,
                                const Image* mask = nullptr) const;
  // Image `index` of `plan` (0 .. image_count-1): sampler + generator seeded with seed_of(index), initial
  // latents drawn from it (img2img: the VAE sample noise first, then the add_noise draw, as diffusers; inpainting:
  // the masked latents filled as asked before the noise is added).
  Expected<PreparedSample> prepare_sample(const GenerationPlan& plan, int index) const;
  // images01 [B, 3, H, W] in [0, 1] (decode()), row `row` -> the image with its infotext and info (inpainting:
  // composited over the original, InpaintPlan::composite).
  GeneratedImage finish_image(const GenerationPlan& plan, const Tensor& images01, int row, int64_t seed) const;
  // text -> [1, 77, D] conditioning (clip_skip in A1111 numbering; emphasis = A1111 (word:1.2) weights).
  Expected<Tensor> encode_prompt(const std::string& text, int clip_skip, bool emphasis) const;
  // Several texts in one text-encoder call (rows of equal token count share it): one [1, 77, D] per text, in
  // order, as encode_prompt gives them. What a server admitting a burst of requests wants: one call's
  // launches instead of one per prompt.
  Expected<std::vector<Tensor>> encode_prompts(const std::vector<std::string>& texts, int clip_skip, bool emphasis) const;
  // Runs every sampler to the end. x [B, C, h, w] initial latents (row b belongs to samplers[b]);
  // cond/uncond [B, 77, D]; cfg_scale <= 1 skips the unconditional rows (diffusers' rule). `kept`: empty, or one
  // KeptRegion per row (inpainting; undefined ones for rows without), whose final latents are returned blended.
  // Opens the trace ranges model_call / unet / sampler_step per call; `times` (optional) gets call_ms.
  Expected<Tensor> denoise(const std::vector<sampling::Sampler*>& samplers, Tensor x, const Tensor& cond,
                           const Tensor& uncond, float cfg_scale, int batch_index,
                           const ProgressCallback& progress, StageTimes* times,
                           const std::vector<KeptRegion>& kept = {}) const;
  // latents [B, C, h, w] (scaled, as the denoiser sees them) -> images [B, 3, H, W] in [0, 1]
  Tensor decode(const Tensor& latents) const;
  // image [1, 3, H, W] in [0, 1] + a generator (draws the VAE sample noise) -> scaled latents [1, C, h, w]
  Tensor encode_image(const Tensor& image01, NoiseGenerator& gen) const;

 private:
  std::shared_ptr<SdModel> model_;
};

// A1111 names for infotext: "Euler a", "DPM++ 2M", ...; schedule "Karras" / "Exponential" / "Automatic".
std::string a1111_sampler_name(const std::string& sampler);
std::string a1111_schedule_name(const std::string& schedule);

}  // namespace atelier
