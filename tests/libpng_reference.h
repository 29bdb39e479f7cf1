// The reference PNG encoder of the PNG tests and bench/image_bench.cc: libpng's own, through its simplified API
// (one thread; its default zlib level and adaptive filters), for RGB images.
#pragma once
#include <png.h>

#include <string>

#include "io/image.h"

namespace atelier::test {

// img (3 channels) -> PNG bytes; empty when libpng fails.
inline std::string libpng_encode_rgb(const Image& img) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = png_uint_32(img.width);
  image.height = png_uint_32(img.height);
  image.format = PNG_FORMAT_RGB;
  // Room for the largest file libpng could write, so that it encodes once (asking it for the size first
  // would encode twice).
  png_alloc_size_t size = PNG_IMAGE_PNG_SIZE_MAX(image);
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, img.pixels.data(), 0, nullptr)) return {};
  out.resize(size);
  return out;
}

}  // namespace atelier::test
