// Low-cost previews of latents in the middle of denoising: a fixed linear map from the 4 latent channels of
// the SD 1.x/2.x VAE to RGB (a least-squares fit of what the VAE decoder makes of each latent pixel), one
// image pixel per latent pixel, optionally enlarged by pixel repetition. Costs a few multiply-adds per latent
// pixel instead of a VAE decode, so a server can send one per step.
#pragma once
#include "core/tensor.h"
#include "io/image.h"

namespace atelier {

constexpr int kPreviewMaxSide = 128;  // previews are enlarged (nearest) up to this side, never shrunk

// latents [1, 4, h, w] or [4, h, w] (scaled, as the denoiser sees them, any device) -> RGB image of
// h*k x w*k pixels, k the largest integer with max(h, w) * k <= kPreviewMaxSide (at least 1).
// Latents with other channel counts give an error.
Expected<Image> latent_preview(const Tensor& latents);

}  // namespace atelier
