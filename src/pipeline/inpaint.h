// Inpainting with an ordinary (4-channel) Stable Diffusion model, as A1111's img2img with a mask does it
// (modules/processing.py StableDiffusionProcessingImg2Img, sd_samplers_cfg_denoiser.py):
//   mask    the upload's luma (or its alpha), inverted if asked, Gaussian-blurred by mask_blur pixels;
//   area    "whole picture": image and mask resized to the request's size by the resize mode; "only masked"
//           (inpaint_full_res): the box around the mask plus padding, grown to the request's aspect ratio, cut out
//           and scaled to the request's size, the result scaled back into the box of the full-size image;
//   content "original" encodes the image as it is; "fill" paints the masked area with the colours around it first;
//           "latent noise" / "latent nothing" replace the masked latents with the seed's noise / zeros;
//   latents the mask at the latent size (bicubic, rounded to 0/1): at every model call the x0 estimate is held to the
//           image's latents where the mask is 0 (pipeline/sd_batch.h KeptRegion), and so are the final latents;
//   pixels  the decoded image composited over the original with the blurred mask (doubled and clipped when the whole
//           picture was generated), so the unmasked pixels come back unchanged.
// Not here: inpainting models (9 input channels), A1111's soft inpainting, resize mode 3 (latent upscale).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/image.h"
#include "pipeline/mask_image.h"
#include "pipeline/request.h"
#include "sampling/flow_match.h"

namespace atelier {

// A1111's inpainting_fill 0-3: what the masked area starts from.
enum class InpaintFill { kFill, kOriginal, kLatentNoise, kLatentNothing };
// "fill" | "original" | "latent_noise" | "latent_nothing".
Expected<InpaintFill> parse_inpaint_fill(const std::string& name);
const char* inpaint_fill_name(InpaintFill fill);
// A1111's infotext names: "fill", "original", "latent noise", "latent nothing".
const char* a1111_inpaint_fill_name(InpaintFill fill);

// Everything an inpainting request needs beyond img2img's, worked out once per request.
struct InpaintPlan {
  InpaintFill fill = InpaintFill::kOriginal;
  Image model_image;                 // width x height RGB: what the VAE encodes
  Image base;                        // RGB: the picture the result is composited into (its size is the output's)
  Image overlay_mask;                // one channel, base's size: 255 = generated pixel, 0 = base's pixel
  std::optional<PixelBox> paste_to;  // "only masked": the box of base the generated image is scaled into
  int latent_w = 0, latent_h = 0;
  std::vector<float> latent_mask;    // latent_h x latent_w: 1 = inpainted (A1111's nmask), 0 = kept

  // [1, channels, latent_h, latent_w] f32 on `device`: 1 where the image is kept (1 - latent_mask).
  Tensor keep_mask(int channels, Device device) const;
  // The decoded width x height RGB image -> the output image (base's size).
  Image composite(const Image& generated) const;
};

// The plan for inpainting `image` under `mask` (an upload of the image's size) with the request's inpainting
// settings. A width or height of 0 in `r` becomes the image's, rounded down to a multiple of `multiple`;
// `latent_factor` is the VAE's downscale. An all-black mask (nothing to inpaint) is an error.
Expected<InpaintPlan> plan_inpaint(const Image& image, const Image& mask, GenerateRequest& r, int multiple,
                                   int latent_factor);

// The request's mask: `given` (an upload) or else the file at r.mask, read into `loaded`; null without either. A mask
// without a start image (`has_init_image`) is an error.
Expected<const Image*> request_mask(const GenerateRequest& r, const Image* given, bool has_init_image, Image& loaded);
// Ok when the mask has the image's size, else an error naming both sizes.
Status check_mask_size(const Image& mask, const Image& image);
// a * mask + b * not_mask, with not_mask = 1 - mask: exactly a where the mask is 1 and b where it is 0. Shapes equal.
Tensor masked_blend(const Tensor& a, const Tensor& mask, const Tensor& b, const Tensor& not_mask);

// The inpainting of a request, or null without a mask: `given_image` / `given_mask` (the server's uploads) or else
// the files at r.init_image / r.mask. A mask without a start image is an error.
Expected<std::shared_ptr<const InpaintPlan>> request_inpaint(GenerateRequest& r, const Image* given_image,
                                                             const Image* given_mask, int multiple, int latent_factor);

// latents [1, C, h, w]: the masked latents replaced as the fill asks ("latent noise": the first draw of a generator
// of `kind` seeded with `seed`, A1111's create_random_tensors; "latent nothing": zeros); unchanged for the others.
// keep / inpainted: InpaintPlan::keep_mask in the latents' dtype and 1 - it.
Tensor fill_masked_latents(InpaintFill fill, const Tensor& latents, const Tensor& keep, const Tensor& inpainted,
                           RngKind kind, int64_t seed);

// --- Flow-matching models (FLUX, Z-Image): diffusers' FluxInpaintPipeline's semantics --------------------------
// A mask upload -> the latent mask [1, channels, h, w] (host, 0/1, every channel alike): resized to width x height
// (Lanczos), binarized at 0.5 (VaeImageProcessor's do_binarize), nearest neighbour to the latent size h x w (torch's
// interpolate).
Tensor binarized_latent_mask(const Image& upload, int width, int height, int64_t h, int64_t w, int64_t channels);

// One sample's inpainting data, all of the sample's latent shape (FLUX's packed one, or [1, C, h, w]); undefined
// tensors for a sample without a mask.
struct FlowInpaintRow {
  Tensor mask;           // 1 = repainted, 0 = kept
  Tensor image_latents;  // the init image's VAE latents
  Tensor noise;          // the sample's initial noise
  bool defined() const { return mask.defined(); }
};

// x [B, ...] after a step of `s`, rows: empty or one per sample -> each inpainted sample's kept latents replaced by the
// image's latents noised to the scheduler's current sigma with the initial noise, or by the latents themselves once
// the last step is done: (1 - mask) * init_latents_proper + mask * latents. The other rows as they are.
Tensor blend_flow_inpaint(const Tensor& x, const std::vector<FlowInpaintRow>& rows, const sampling::FlowMatchEuler& s);

}  // namespace atelier
