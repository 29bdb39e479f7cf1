// Resizing of 8-bit images for img2img inputs whose size differs from the requested one, and A1111's resize modes.
#pragma once
#include <string>

#include "core/status.h"
#include "io/image.h"

namespace atelier {

// PIL's resampling filters (separable, antialiased when shrinking: the support widens with the scale).
enum class ResizeFilter {
  kLanczos,  // Image.LANCZOS (3 lobes): what A1111 resizes init images with
  kBicubic,  // Image.BICUBIC (a = -0.5): PIL's default, what A1111 resizes masks to the latent size with
};

Image resize_image(const Image& src, int width, int height, ResizeFilter filter = ResizeFilter::kLanczos);

// A1111's img2img resize modes (resize_mode 0-2) for an image of another aspect ratio than the request's.
enum class ResizeMode {
  kResize,         // 0 "Just resize": stretched to the size
  kCropAndResize,  // 1 "Crop and resize": scaled to cover the size, centred, the overflow cut off
  kResizeAndFill,  // 2 "Resize and fill": scaled to fit inside, centred, the bands filled with its edge rows/columns
};
// "resize" | "crop" | "fill" -> the mode; anything else is an error that lists them.
Expected<ResizeMode> parse_resize_mode(const std::string& name);
const char* resize_mode_name(ResizeMode mode);
Image resize_image(const Image& src, int width, int height, ResizeMode mode);

}  // namespace atelier
