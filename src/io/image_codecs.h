// Per-format decoders behind decode_image() (internal to src/io; callers use io/image.h).
#pragma once
#include <string>
#include <string_view>

#include "io/image.h"

namespace atelier {

Expected<Image> decode_png_image(std::string_view bytes, const std::string& label);
Expected<Image> decode_jpeg_image(std::string_view bytes, const std::string& label);
Expected<Image> decode_webp_image(std::string_view bytes, const std::string& label);

}  // namespace atelier
