// 8-bit images: decoding PNG/JPEG/WebP (from files or from memory, e.g. the server's base64 uploads),
// encoding them with the generation parameters embedded, and conversion to and from f32 tensors.
//
// Where the infotext ("parameters") goes:
//  - PNG: a text chunk with key "parameters" — tEXt when the text is Latin-1 (as PIL, and so A1111, writes
//    it), iTXt (UTF-8) otherwise.
//  - JPEG and WebP: EXIF UserComment (big-endian TIFF, "UNICODE\0" + UTF-16, as A1111 writes it with piexif).
//    EXIF cannot exceed one 64 KB APP1 segment, so infotext over ~32k UTF-16 units is left out of JPEG/WebP
//    (the image is still written; the encoders say so in `*comment_dropped`).
// Decoders are strict: truncated or corrupt data is an error (libjpeg's "premature end" warnings too),
// and images larger than kMaxImageSide on a side or kMaxImagePixels in all are refused before any pixel memory is allocated.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace atelier {

struct Image {
  int width = 0, height = 0;
  int channels = 0;             // 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA
  std::vector<uint8_t> pixels;  // row-major HWC, width * height * channels bytes
};

using TextChunks = std::vector<std::pair<std::string, std::string>>;  // (keyword, UTF-8 text)

enum class ImageFormat { kUnknown, kPNG, kJPEG, kWebP };

constexpr int kMaxImageSide = 16384;
constexpr int64_t kMaxImagePixels = int64_t(1) << 26;  // 64 Mpx (8192 x 8192): far above any generated image
constexpr int kDefaultJpegQuality = 90;
constexpr int kDefaultWebpQuality = 90;
inline constexpr const char* kInfotextKey = "parameters";

// Format from the leading magic bytes.
ImageFormat detect_image_format(std::string_view bytes);
const char* image_format_name(ImageFormat f);
// Ok when the dimensions, channel count and pixel buffer size agree and are within limits.
Status validate_image(const Image& img);

// Decodes PNG (any bit depth/colour type: palette and <8-bit expand, 16-bit is reduced to 8), JPEG (gray,
// RGB, CMYK -> RGB) or WebP (still images). Channels follow the file: 1/2 for gray(+alpha), 3/4 for
// colour(+alpha); WebP always decodes to 3 or 4 (the format has no gray mode).
Expected<Image> read_image(const std::string& path);
Expected<Image> decode_image(std::string_view bytes, const std::string& label = "<memory>");

// PNG with optional text chunks (keywords: 1-79 Latin-1 characters, no leading/trailing space).
Expected<std::string> encode_png(const Image& img, const TextChunks& text_chunks = {});
Status write_png(const std::string& path, const Image& img, const TextChunks& text_chunks = {});
// Text chunks (tEXt, zTXt, iTXt) of a PNG, decoded to UTF-8, in file order.
Expected<TextChunks> read_png_text(std::string_view bytes, const std::string& label = "<memory>");

// JPEG (alpha is dropped; gray stays gray) and WebP (lossy; alpha kept). `comment` becomes the EXIF
// UserComment when it fits; `comment_dropped` (optional) is set to whether it had to be left out.
Expected<std::string> encode_jpeg(const Image& img, int quality = kDefaultJpegQuality, const std::string& comment = {},
                                  bool* comment_dropped = nullptr);
Expected<std::string> encode_webp(const Image& img, int quality = kDefaultWebpQuality, const std::string& comment = {},
                                  bool* comment_dropped = nullptr);

// The infotext stored in an image file: PNG "parameters" chunk, or EXIF UserComment of a JPEG/WebP.
// Empty string when the file carries none; an error only when the bytes are not a supported image.
Expected<std::string> read_infotext(std::string_view bytes, const std::string& label = "<memory>");

// Writes bytes to `path` atomically (temporary file + rename).
Status write_file(const std::string& path, std::string_view bytes);

// Tensor [N, H, W, C] (NHWC, C in {1,3,4}) or [N, C, H, W] (NCHW), or the same without N, f32 values in
// [0, 1] -> 8-bit image of sample `batch_index`. Values are clamped to [0, 1], multiplied by 255 in f32 and
// rounded half to even, exactly as diffusers' numpy_to_pil does ((x * 255).round().astype("uint8")); NaN
// becomes 0. Layout: NCHW when dim 1 is a channel count and the last dim is not (or both are, since the
// engine's activations are NCHW); NHWC otherwise. Throws atelier::Error on other shapes.
Image image_from_tensor(const Tensor& images, int batch_index = 0);
// 8-bit image -> [1, 3, H, W] f32 in [0, 1] (x / 255 in f32, as diffusers' pil_to_numpy); alpha is
// dropped, gray is replicated to RGB (PIL's convert("RGB")).
Tensor tensor_from_image(const Image& img);

}  // namespace atelier
