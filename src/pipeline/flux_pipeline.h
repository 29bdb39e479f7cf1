// FLUX.1 txt2img with diffusers' FluxPipeline semantics, img2img with FluxImg2ImgPipeline's (below):
//   prompt -> CLIP-L pooled output [1, 768] and T5 states [1, max_sequence_length, 4096] (txt_ids zeros);
//   noise [B, 16, h, w] (h = 2 * (H / 16)) drawn per image from its seed, packed 2x2 into [B, h/2 * w/2, 64]
//   with img_ids (0, row, col); sigmas np.linspace(1, 1/steps, steps) shifted with mu from the packed
//   sequence length; per step: velocity = transformer(x, t / 1000, guidance) (and, only when asked for with
//   cfg_scale > 1, true CFG against the negative prompt: neg + cfg * (pos - neg)), x += (sigma_next - sigma) * v;
//   then unpack, z / scaling_factor + shift_factor, VAE decode, (image / 2 + 0.5).clamp(0, 1).
// The guidance value is FLUX.1-dev's distilled guidance (an input of the model, no second pass).
// img2img (FluxImg2ImgPipeline's semantics): the init image resized to the request's size (by default the model's, as
// there, not the image's), VAE-encoded with a sample drawn from the image's generator, then noised to the first sigma
// the strength leaves (sigma * noise + (1 - sigma) * latents, the noise drawn after the sample); the last
// int(steps x strength) steps of the same schedule run.
// Inpainting (FluxInpaintPipeline's semantics, for FLUX.1-dev/schnell, not the Fill model): img2img with a mask of the
// image's size (white = repaint; its luma, or its alpha where not all opaque) resized to the request's size (Lanczos),
// binarized at 0.5 and taken to the latent size by nearest neighbour; after every step the kept latents are replaced
// by the image's latents noised to the next step's sigma with the initial noise (at the last step, the latents
// themselves). As there, the decoded image is not composited over the original.
#pragma once
#include <memory>
#include <string>

#include "pipeline/flux_model.h"
#include "pipeline/inpaint.h"
#include "pipeline/sd_pipeline.h"

namespace atelier {

constexpr float kFluxDefaultGuidance = 3.5f;
constexpr int kFluxDefaultMaxSequenceLength = 512;
constexpr int kFluxSizeMultiple = 16;  // VAE factor 8 x 2x2 packing

// The FLUX settings beside GenerateRequest (whose cfg_scale counts only when cfg_explicit is set).
struct FluxOptions {
  float guidance = kFluxDefaultGuidance;
  int max_sequence_length = kFluxDefaultMaxSequenceLength;
  bool cfg_explicit = false;  // the user asked for cfg_scale: true CFG runs when it is > 1

  Status validate() const;
  nlohmann::json to_json() const;
};

struct FluxPrompt {
  Tensor t5;      // [1, S, joint_attention_dim] (or one row per sample: [B, S, ...])
  Tensor pooled;  // [1, pooled_projection_dim] (or [B, ...])
};

// One request of a batch of requests (FluxPipeline::generate_batch): its batch_size images are rows of the batch's
// model calls, with its own prompts, seeds and guidance.
struct FluxBatchItem {
  GenerateRequest request;
  FluxOptions options;
  const Image* init_image = nullptr;  // img2img from an image in memory (the server's); not owned, outlives the call
  const Image* mask = nullptr;        // inpainting (with init_image), likewise
};

// Inpainting's data for one row of a batch: packed [1, L, 64] tensors (pipeline/inpaint.h).
using FluxInpaintRow = FlowInpaintRow;

class FluxPipeline {
 public:
  explicit FluxPipeline(std::shared_ptr<FluxModel> model) : model_(std::move(model)) {}
  const FluxModel& model() const { return *model_; }

  // Runs the request (batch_size images per batch, seeds seed, seed+1, ...): txt2img, or img2img from `init_image`
  // or else the request's init_image path. StepProgress.latents points at the packed latents [B, L, 64] after each
  // step.
  // `mask` (or else the request's mask path) inpaints the init image.
  Expected<GenerateResult> generate(const GenerateRequest& request, const FluxOptions& options,
                                    const ProgressCallback& progress = {}, const Image* init_image = nullptr,
                                    const Image* mask = nullptr) const;
  // Requests denoised together in one batch of model calls (the server's batching of concurrent FLUX requests):
  // each item's images are what generate() gives for it alone; results in the items' order, each with the whole
  // batch's stage times. Items must be batch_compatible (a batch_count of 1 each). StepProgress.latents: every
  // row [sum of batch sizes, L, 64], the items' rows in order.
  Expected<std::vector<GenerateResult>> generate_batch(const std::vector<FluxBatchItem>& items,
                                                       const ProgressCallback& progress = {}) const;
  // Whether b's images can be rows of a's model calls: one batch each (batch_count 1), the same size (after this
  // model's default), steps, T5 length, CFG (off, or on at one scale) and img2img strength (or txt2img for both).
  bool batch_compatible(const FluxBatchItem& a, const FluxBatchItem& b) const;

  // --- stages -------------------------------------------------------------------------------------
  Expected<FluxPrompt> encode_prompt(const std::string& text, int max_sequence_length) const;
  // The scheduler for `steps` steps at latent size h x w (unpacked latent rows and columns).
  Expected<sampling::FlowMatchEuler> make_scheduler(int steps, int64_t h, int64_t w) const;
  // x [B, L, 64] packed initial latents; cond (and uncond when cfg_scale > 1), one row or B -> final packed latents.
  // guidance: one value, or one per row. `inpaint`: empty, or one FluxInpaintRow per row (inpainting's blend after
  // every step).
  Expected<Tensor> denoise(sampling::FlowMatchEuler& scheduler, Tensor x, const FluxPrompt& cond,
                           const FluxPrompt* uncond, const std::vector<float>& guidance, float cfg_scale, int64_t h,
                           int64_t w, int batch_index, const ProgressCallback& progress,
                           const std::vector<FluxInpaintRow>& inpaint = {}) const;
  // packed [B, L, 64] -> images [B, 3, 8h, 8w] in [0, 1].
  Tensor decode(const Tensor& packed, int64_t h, int64_t w) const;

 private:
  struct EncodedItem;
  // Each item's prompt (and negative prompt when it runs CFG; a text met twice is encoded once), loading the text
  // encoders first when an offload dropped them and dropping them after when the model offloads
  // (FluxLoadOptions::offload).
  Status encode_items(std::vector<EncodedItem>& items) const;
  // The request validated, with this model's defaults (size, a random seed) filled in, its CFG decided and its init
  // image (`init_image`, else the request's path) read and resized; prompts not yet encoded.
  Expected<EncodedItem> prepare(const GenerateRequest& request, const FluxOptions& options,
                                const Image* init_image, const Image* mask) const;
  // One batch of model calls over the items' rows: noise from each item's seeds, denoise, decode, finished images
  // (images[i]: item i's).
  Status run_rows(const std::vector<EncodedItem>& items, int batch_index, const ProgressCallback& progress,
                  std::vector<std::vector<GeneratedImage>>& images) const;
  std::shared_ptr<FluxModel> model_;
};

// latents [B, C, h, w] -> [B, (h/2)*(w/2), 4C] (2x2 patches, channel-major within a patch).
Tensor flux_pack_latents(const Tensor& latents);
// [B, (h/2)*(w/2), 4C] -> [B, C, h, w]
Tensor flux_unpack_latents(const Tensor& packed, int64_t h, int64_t w);
// Position ids of the packed latents: [(h/2)*(w/2), 3] f32 rows (0, row, col), host.
Tensor flux_image_ids(int64_t h, int64_t w);

}  // namespace atelier
