// WebP through libwebp's simple API (no longjmp); EXIF is added by rewriting the RIFF container
// (image_metadata.cc), since libwebpmux is not a dependency.
#include <webp/decode.h>
#include <webp/encode.h>

#include <memory>

#include "io/image.h"
#include "io/image_codecs.h"
#include "io/image_metadata.h"

namespace atelier {

constexpr int kMaxWebpSide = 16383;  // the format's limit

Expected<Image> decode_webp_image(std::string_view bytes, const std::string& label) {
  WebPBitstreamFeatures features;
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  if (WebPGetFeatures(data, bytes.size(), &features) != VP8_STATUS_OK)
    return corrupt(label + ": WebP header is invalid or truncated");
  if (features.has_animation) return unsupported(label + ": animated WebP is not supported");
  const int w = features.width, h = features.height;
  if (w <= 0 || h <= 0 || w > kMaxImageSide || h > kMaxImageSide || int64_t(w) * h > kMaxImagePixels)
    return corrupt(label + ": WebP size " + std::to_string(w) + "x" + std::to_string(h) + " is outside the limits");
  Image img;
  img.width = w;
  img.height = h;
  img.channels = features.has_alpha ? 4 : 3;
  img.pixels.resize(size_t(w) * size_t(h) * size_t(img.channels));
  const int stride = w * img.channels;
  const uint8_t* ok = features.has_alpha
                          ? WebPDecodeRGBAInto(data, bytes.size(), img.pixels.data(), img.pixels.size(), stride)
                          : WebPDecodeRGBInto(data, bytes.size(), img.pixels.data(), img.pixels.size(), stride);
  if (ok == nullptr) return corrupt(label + ": WebP decode failed (corrupt or truncated data)");
  return img;
}

Expected<std::string> encode_webp(const Image& img, int quality, const std::string& comment, bool* comment_dropped) {
  ATELIER_RETURN_IF_ERROR(validate_image(img));
  if (quality < 1 || quality > 100) return invalid_argument("WebP quality " + std::to_string(quality) + " is outside 1..100");
  if (img.width > kMaxWebpSide || img.height > kMaxWebpSide)
    return invalid_argument("WebP cannot hold " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                            " (limit " + std::to_string(kMaxWebpSide) + " per side)");
  // libwebp takes RGB or RGBA: expand gray(+alpha).
  const bool alpha = img.channels == 2 || img.channels == 4;
  const int c = alpha ? 4 : 3;
  const uint8_t* src = img.pixels.data();
  std::vector<uint8_t> expanded;
  if (img.channels <= 2) {
    const size_t n = size_t(img.width) * size_t(img.height);
    expanded.resize(n * size_t(c));
    for (size_t i = 0; i < n; ++i) {
      const uint8_t g = img.pixels[i * img.channels];
      expanded[i * c] = expanded[i * c + 1] = expanded[i * c + 2] = g;
      if (alpha) expanded[i * c + 3] = img.pixels[i * img.channels + 1];
    }
    src = expanded.data();
  }
  uint8_t* out = nullptr;
  const size_t size = alpha ? WebPEncodeRGBA(src, img.width, img.height, img.width * c, float(quality), &out)
                            : WebPEncodeRGB(src, img.width, img.height, img.width * c, float(quality), &out);
  const std::unique_ptr<uint8_t, void (*)(void*)> owned(out, WebPFree);
  if (size == 0 || out == nullptr) return internal_error("WebP encode failed");
  std::string bytes(reinterpret_cast<const char*>(out), size);
  bool dropped = false;
  if (!comment.empty()) {
    auto tiff = build_exif_user_comment(comment);
    std::optional<std::string> with_exif;
    if (tiff) with_exif = add_webp_exif(bytes, *tiff, img.width, img.height, alpha);
    if (with_exif) bytes = std::move(*with_exif);
    else dropped = true;
  }
  if (comment_dropped != nullptr) *comment_dropped = dropped;
  return bytes;
}

}  // namespace atelier
