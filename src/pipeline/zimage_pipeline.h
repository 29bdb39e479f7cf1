// Z-Image (Turbo) text-to-image with diffusers' ZImagePipeline semantics:
//   prompt -> chat template (add_generation_prompt, enable_thinking) -> Qwen tokens (max_sequence_length,
//   right padding) -> Qwen3 hidden_states[-2] with padding removed;
//   latents = noise [1, 16, H/8, W/8] (flow matching starts from pure noise);
//   sigmas = linspace(1, 1/steps, steps) in f32, shifted by the scheduler's static shift (3), Euler steps;
//   per step the transformer sees t = (1000 - timestep) / 1000 and its output v is negated for the
//   scheduler; CFG (guidance > 1: the negative prompt's call too) combines pos + g * (pos - neg);
//   turbo (guidance <= 1, usually 0): one model call per step;
//   VAE (FLUX VAE): decode(latents / scaling + shift), image = clamp(x / 2 + 0.5, 0, 1).
//
// Models: a diffusers folder (model_index.json with _class_name "ZImagePipeline"), or the original
// single-file transformer with the other components (tokenizer, text encoder, VAE, scheduler) taken from a
// Z-Image diffusers folder given as `components_dir`.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <optional>
#include <string>
#include <vector>

#include "models/qwen3/qwen3_encoder.h"
#include "models/vae/vae.h"
#include "models/zimage/zimage_transformer.h"
#include "pipeline/inpaint.h"
#include "pipeline/sd_pipeline.h"
#include "sampling/flow_match.h"
#include "tokenizers/qwen_tokenizer.h"

namespace atelier {

// The Qwen3 text encoder of a model: resident, or (offload) loaded for each request's prompts and dropped
// after, so that its device memory (16 GB in f32 for Qwen3-4B) serves the denoising and the VAE.
class ZImageTextEncoder {
 public:
  using Loader = std::function<Expected<Qwen3Encoder>()>;
  ZImageTextEncoder(Loader load, bool offload) : load_(std::move(load)), offload_(offload) {}
  // Loads the encoder now (so that load errors show at model load).
  Status load();
  // Runs fn(encoder) with the encoder present, loading it first if an offload dropped it and dropping it
  // (returning the device's cached memory) after when offloading. Serialised: one caller at a time.
  Status with_encoder(const std::function<Status(const Qwen3Encoder&)>& fn);
  bool resident() const;

 private:
  Status load_locked();  // mu_ held

  Loader load_;
  bool offload_;
  mutable std::mutex mu_;
  std::optional<Qwen3Encoder> encoder_;
};

struct ZImageModel {
  std::string name;    // folder or file name, for infotext
  std::string path;
  std::string layout;  // "diffusers" | "original"
  QwenTokenizer tokenizer;
  std::shared_ptr<ZImageTextEncoder> text_encoder;
  std::shared_ptr<ZImageTransformer> transformer;
  std::shared_ptr<Vae> vae;
  sampling::FlowMatchConfig scheduler;
  int max_sequence_length = 512;  // the pipeline's default
  bool enable_thinking = true;    // what ZImagePipeline passes to the chat template
};

struct ZImageLoadOptions {
  Device device = Device::cpu();
  // Compute dtype of the transformer and the VAE (f16 keeps the VAE in f32: its activations overflow f16);
  // unset: default_model_dtype(device), f32 on the CPU and bf16 on CUDA. The Qwen3 text encoder runs in f32
  // (once per prompt).
  std::optional<DType> dtype;
  std::string components_dir;  // for a single-file transformer: a Z-Image diffusers folder with the rest
  int max_sequence_length = 512;
  bool offload = false;  // the text encoder leaves the device after each request's prompts (ZImageTextEncoder)
  // The transformer's block projections in FP8 e4m3 with per-row scales (ZImageTransformer::quantize_fp8,
  // `--dtype fp8`); everything else in the compute dtype above.
  bool fp8 = false;
};

// True when `path` is a Z-Image diffusers folder (model_index.json _class_name "ZImagePipeline") or a
// .safetensors file holding a Z-Image transformer (either layout).
bool is_zimage_model(const std::string& path);
Expected<std::shared_ptr<const ZImageModel>> load_zimage_model(const std::string& path, const ZImageLoadOptions& options);

// What a run did, step by step (for tests and tools): the scheduler's plan and the latents after each step.
struct ZImageRunTrace {
  std::vector<float> sigmas, timesteps;
  std::vector<Tensor> latents_per_step;  // each [1, C, h, w]
};

class ZImagePipeline {
 public:
  explicit ZImagePipeline(std::shared_ptr<const ZImageModel> model) : model_(std::move(model)) {}
  const ZImageModel& model() const { return *model_; }

  // prompt -> caption features [L, cap_feat_dim] (the unpadded tokens of the chat-templated prompt)
  Expected<Tensor> encode_prompt(const std::string& prompt) const;
  // The same for several prompts with one use of the text encoder (one load and drop when offloading).
  Expected<std::vector<Tensor>> encode_prompts(const std::vector<std::string>& prompts) const;
  // The scheduler of a `steps`-step run at latent size h x w (what denoise runs).
  Expected<sampling::FlowMatchEuler> make_scheduler(int steps, int64_t h, int64_t w) const;
  // start [1, C, h, w] (noise; for img2img the noised image), cond [L, D], uncond [L', D] (used when guidance > 1)
  // -> final latents [1, C, h, w], running the schedule's steps from `begin_index` (img2img: steps - int(steps x
  // strength)). `progress` (may be empty) is called after every step with call = 1, 2, ... of the steps run.
  // `inpaint` (defined: [1, C, h, w] tensors) blends the kept latents after every step (pipeline/inpaint.h).
  Expected<Tensor> denoise(const Tensor& start, const Tensor& cond, const Tensor& uncond, float guidance, int steps,
                           ZImageRunTrace* trace = nullptr, const ProgressCallback& progress = {},
                           int begin_index = 0, const FlowInpaintRow& inpaint = {}) const;
  // latents [1, C, h, w] -> image [1, 3, 8h, 8w] in [0, 1]
  Expected<Tensor> decode(const Tensor& latents) const;
  // A whole request: seeds, noise from the request's RNG, every image of every batch, infotext and sidecar
  // info. Sampler and schedule settings do not apply (flow-matching Euler only).
  // img2img from `init_image`, else from the request's init_image path when set (ZImageImg2ImgPipeline's semantics:
  // the size is the image's by default, rounded down to multiples of 16; the VAE sample, then the noise, from each
  // image's generator; scale_noise at the first step the strength leaves). Inpainting with `mask` (else the request's
  // mask path) as FLUX's: FluxInpaintPipeline's semantics (pipeline/inpaint.h), there being no Z-Image reference.
  Expected<GenerateResult> generate(const GenerateRequest& request, const ProgressCallback& progress = {},
                                    const Image* init_image = nullptr, const Image* mask = nullptr) const;

 private:
  // One image's start latents [1, C, h, w] (`shape`) from its generator: noise, or for img2img (`init` defined) the
  // init image's VAE sample (drawn first) noised to the sigma of step `begin` of `steps`. `inpaint` (optional) gets
  // the sample and the noise for img2img.
  Expected<Tensor> start_latents(const Tensor& init, NoiseGenerator& gen, const Shape& shape, int steps, int begin,
                                 FlowInpaintRow* inpaint = nullptr) const;
  // The chat-templated prompt's token ids and mask.
  Expected<QwenEncoding> tokenize(const std::string& prompt) const;

  std::shared_ptr<const ZImageModel> model_;
};

}  // namespace atelier
