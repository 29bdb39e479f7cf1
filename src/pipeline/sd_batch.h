// One denoising model call over a batch of samples that may belong to different requests, be at different
// steps of different samplers and use different guidance scales: the unit of step-level (continuous)
// batching. SdPipeline::denoise runs a whole request through it, and the server's device worker runs its
// mixed batches through it, so there is one implementation of the denoising step.
//
// A step, for samples s = 0..S-1 (latents x_s [1, C, h, w], all on the UNet's device, same h and w):
//   in_s   = x_s * c_in(s)                                  (scale_model_input, per sampler)
//   UNet over the rows [in_0 .. in_{S-1}, in_g for every guided sample g] with the timestep of each
//   sample's next call and the context rows [cond_0 .. cond_{S-1}, uncond_g ...]
//   eps_s  = u_s + g_s * (c_s - u_s) for guided samples (diffusers' order of operations), c_s otherwise
//   eps_s  = for an inpainted sample (KeptRegion), where it is kept: the prediction whose x0 estimate is the init latents
//   x_s    = the sampler's update of x_s with eps_s         (sampling::apply_step, one fused op per output)
// A sample is "guided" when its cfg_scale > 1 (diffusers: do_classifier_free_guidance = guidance_scale > 1).
// On the device, the work before the UNet call (scaled rows, timesteps, contexts) and after it (combine, update)
// launches as one batch each (Backend::run_batched), and the UNet's output is borrowed, not copied out.
#pragma once
#include <span>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "models/sd/unet.h"
#include "sampling/sampler.h"

namespace atelier {

// Inpainting's kept region of a sample (A1111's mask and init_latent; pipeline/inpaint.h): where `keep` is 1, the
// sample's x0 estimate is held to the init image's latents at every model call (A1111's CFGDenoiser blends its
// denoised output so), and its final latents take them (final_latents).
struct KeptRegion {
  Tensor keep;       // [1, C, h, w] 1 = kept, 0 = inpainted (A1111's mask)
  Tensor inpainted;  // [1, C, h, w] 1 - keep (A1111's nmask)
  Tensor latents;    // [1, C, h, w] the init image's latents (scaled, as the UNet sees them)
  bool defined() const { return keep.defined(); }
};

// One sample being denoised. The batch step reads and replaces `x` (and `denoised` when asked for).
struct DenoiseSample {
  sampling::Sampler* sampler = nullptr;  // not owned; its noise source must be set when it draws noise
  Tensor x;                              // [1, C, h, w] current latents (scaled, as the UNet sees them)
  Tensor cond;                           // [1, T, D] prompt conditioning
  Tensor uncond;                         // [1, T, D] negative-prompt conditioning; may be undefined unless guided
  float cfg_scale = 1.0f;
  Tensor denoised;                       // [1, C, h, w] x0 estimate after the last step (when requested)
  KeptRegion kept;                       // inpainting; undefined otherwise

  bool guided() const { return cfg_scale > 1.0f; }
  bool done() const { return sampler->done(); }
};

struct BatchStepOutput {
  Tensor x;         // [S, C, h, w] the samples after this call (row s = samples[s]; each sample's x is a view)
  Tensor denoised;  // [S, C, h, w] x0 estimates, defined when requested
};

// The latents to decode once `sample` is done: x, or for inpainting x where it was inpainted and the init image's
// latents where it was kept (A1111: samples * nmask + init_latent * mask). [1, C, h, w]
Tensor final_latents(const DenoiseSample& sample);

// Samples that may share one model call: same latent shape, same conditioning shape.
bool batch_compatible(const DenoiseSample& a, const DenoiseSample& b);

// One model call over `samples` (none done, all batch_compatible). Updates every sample's x (and denoised
// when `want_denoised`) and advances its sampler. Errors (bad shapes) are values; a failing device throws
// atelier::Error as the backend does, which the caller may treat as a device failure.
Expected<BatchStepOutput> denoise_batch_step(const UNet& unet, std::span<DenoiseSample* const> samples,
                                             bool want_denoised);

// Callers of denoise_batch_step keep one call in flight: call n + 1 is enqueued before the host waits for call n, so
// the device starts n + 1 right after n (SdPipeline::denoise, the server's workers). ATELIER_SYNC_EACH_CALL=1 in the
// environment makes them wait after each call instead (an A/B switch: before session 39 they all did).
bool sync_each_call();

}  // namespace atelier
