// Names of the trace ranges (core/trace.h) the Stable Diffusion pipeline opens; StageTimes, `atelier bench`
// and tests read them. A header of its own so the batcher (sd_batch.cc) and the pipeline share it.
#pragma once

namespace atelier {

namespace stage {
inline constexpr const char* kGenerate = "generate";          // a whole request (category stage)
inline constexpr const char* kTextEncode = "text_encode";     // one prompt through tokenizer + CLIP (stage)
inline constexpr const char* kDenoise = "denoise";            // one batch's sampling loop (stage)
inline constexpr const char* kModelCall = "model_call";       // UNet + CFG combine + sampler update (call)
inline constexpr const char* kUnet = "unet";                  // one UNet forward (call; UNet::forward opens it)
inline constexpr const char* kSamplerStep = "sampler_step";   // CFG combine + sampler update (call)
inline constexpr const char* kVaeDecode = "vae_decode";       // latents -> pixels, one batch (stage)
inline constexpr const char* kVaeEncode = "vae_encode";       // img2img init image -> latents (stage)
inline constexpr const char* kImageEncode = "image_encode";   // tensors -> images + infotext (stage)
}  // namespace stage

}  // namespace atelier
