// img2img's init image, shared by the SD and FLUX pipelines: the request's size taken from the image where the
// request leaves it open, the image resized to it, and its VAE encoding with the sample drawn from the image's
// generator (diffusers' retrieve_latents with sample_mode "sample": the draw comes before the starting noise's).
#pragma once
#include <string>

#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/image.h"
#include "models/vae/vae.h"
#include "pipeline/request.h"

namespace atelier {

// A width or height of 0 in `r` becomes the image's, rounded down to a multiple of `multiple` (the model's size
// step); an image smaller than one step is an error naming `label`.
Status size_from_image(const Image& image, GenerateRequest& r, int multiple, const std::string& label);

// `image` as the pipeline's input [1, 3, H, W] in [0, 1], resized (Lanczos) to the request's size by its resize
// mode, the request sized by size_from_image first.
Expected<Tensor> init_image_tensor(const Image& image, GenerateRequest& r, int multiple, const std::string& label);

// The strength must be in (0, 1] and leave at least one of the steps to run.
Status check_img2img_strength(const GenerateRequest& r);

// The start image of a request: `given` (an image in memory, the server's) or else the one at the request's init_image
// path, through init_image_tensor; an undefined tensor for txt2img (neither). The strength must be in (0, 1] and leave
// at least one of the steps to run (img2img runs the last int(steps x strength)). (The mask, if any, is
// read apart: pipeline/inpaint.h request_mask.)
Expected<Tensor> request_init_image(GenerateRequest& r, const Image* given, int multiple);

// image01 [B, 3, H, W] in [0, 1] (any device) -> scaled latents [B, latent, H/f, W/f] on `device`:
// (mean + std * noise - shift) * scale with the noise drawn from `gen` first.
Tensor vae_encode_sample(const Vae& vae, const Tensor& image01, NoiseGenerator& gen, Device device);

}  // namespace atelier
