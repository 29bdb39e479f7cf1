// Resizing of 8-bit images for img2img inputs whose size differs from the requested one.
#pragma once
#include "io/image.h"

namespace atelier {

// Lanczos-3 resampling (separable, antialiased when shrinking), as PIL's Image.LANCZOS that A1111 uses.
Image resize_image(const Image& src, int width, int height);

}  // namespace atelier
