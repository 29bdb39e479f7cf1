// Format detection, file I/O, infotext lookup and tensor <-> image conversion; the codecs live in
// image_png.cc, image_jpeg.cc and image_webp.cc.
#include "io/image.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "io/file.h"
#include "io/image_codecs.h"
#include "io/image_metadata.h"

namespace atelier {
namespace {

constexpr std::string_view kPngMagic("\x89PNG\r\n\x1a\n", 8);
constexpr uint64_t kMaxImageFileBytes = uint64_t(512) << 20;

bool is_channel_count(int64_t c) { return c == 1 || c == 3 || c == 4; }

}  // namespace

ImageFormat detect_image_format(std::string_view b) {
  if (b.substr(0, kPngMagic.size()) == kPngMagic) return ImageFormat::kPNG;
  if (b.size() >= 3 && static_cast<unsigned char>(b[0]) == 0xFF && static_cast<unsigned char>(b[1]) == 0xD8 &&
      static_cast<unsigned char>(b[2]) == 0xFF)
    return ImageFormat::kJPEG;
  if (b.size() >= 12 && b.substr(0, 4) == "RIFF" && b.substr(8, 4) == "WEBP") return ImageFormat::kWebP;
  return ImageFormat::kUnknown;
}

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::kPNG: return "png";
    case ImageFormat::kJPEG: return "jpeg";
    case ImageFormat::kWebP: return "webp";
    case ImageFormat::kUnknown: break;
  }
  return "unknown";
}

Status validate_image(const Image& img) {
  if (img.width < 1 || img.height < 1 || img.width > kMaxImageSide || img.height > kMaxImageSide)
    return invalid_argument("image size " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                            " is outside 1.." + std::to_string(kMaxImageSide));
  if (img.channels < 1 || img.channels > 4)
    return invalid_argument("image has " + std::to_string(img.channels) + " channels (supported: 1, 2, 3, 4)");
  const size_t want = size_t(img.width) * size_t(img.height) * size_t(img.channels);
  if (img.pixels.size() != want)
    return invalid_argument("image pixel buffer holds " + std::to_string(img.pixels.size()) + " bytes, expected " +
                            std::to_string(want));
  return Status::ok();
}

Expected<Image> decode_image(std::string_view bytes, const std::string& label) {
  try {
    switch (detect_image_format(bytes)) {
      case ImageFormat::kPNG: return decode_png_image(bytes, label);
      case ImageFormat::kJPEG: return decode_jpeg_image(bytes, label);
      case ImageFormat::kWebP: return decode_webp_image(bytes, label);
      case ImageFormat::kUnknown: break;
    }
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kResourceExhausted, label + ": out of memory decoding the image");
  }
  return unsupported(label + ": not a PNG, JPEG or WebP image (unrecognised leading bytes)");
}

Expected<Image> read_image(const std::string& path) {
  ATELIER_ASSIGN_OR_RETURN(std::string bytes, read_file(path, "image file", kMaxImageFileBytes));
  return decode_image(bytes, path);
}

Expected<std::string> read_infotext(std::string_view bytes, const std::string& label) {
  switch (detect_image_format(bytes)) {
    case ImageFormat::kPNG: {
      ATELIER_ASSIGN_OR_RETURN(TextChunks chunks, read_png_text(bytes, label));
      for (const auto& [k, v] : chunks)
        if (k == kInfotextKey) return v;
      return std::string();
    }
    case ImageFormat::kJPEG: {
      auto tiff = find_jpeg_exif(bytes);
      auto text = tiff ? parse_exif_user_comment(*tiff) : std::nullopt;
      return text ? *text : std::string();
    }
    case ImageFormat::kWebP: {
      auto tiff = find_webp_exif(bytes);
      auto text = tiff ? parse_exif_user_comment(*tiff) : std::nullopt;
      return text ? *text : std::string();
    }
    case ImageFormat::kUnknown: break;
  }
  return unsupported(label + ": not a PNG, JPEG or WebP image");
}

Status write_file(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return invalid_argument(path + ": cannot create the file");
  bool ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return Status(ErrorCode::kResourceExhausted, path + ": write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    return invalid_argument(path + ": cannot move the finished file into place: " + ec.message());
  }
  return Status::ok();
}

// images: [N, H, W, C] / [N, C, H, W] / [H, W, C] / [C, H, W] f32 in [0, 1].
Image image_from_tensor(const Tensor& images, int batch_index) {
  Tensor t = images;
  if (t.dim() == 3) t = t.unsqueeze(0);
  ATELIER_CHECK(t.dim() == 4, "image_from_tensor: expected a 3-D or 4-D tensor, got " + shape_str(images.shape()));
  ATELIER_CHECK(batch_index >= 0 && batch_index < t.size(0), "image_from_tensor: batch index out of range");
  const bool nchw = is_channel_count(t.size(1));  // NCHW wins ties: the engine's activations are NCHW
  ATELIER_CHECK(nchw || is_channel_count(t.size(3)),
                "image_from_tensor: no channel dimension of size 1, 3 or 4 in " + shape_str(images.shape()));
  Tensor hwc = t.select(0, batch_index);  // [C, H, W] or [H, W, C]
  if (nchw) hwc = hwc.permute({1, 2, 0});
  const std::vector<float> v = hwc.to_vector();  // logical order: row-major HWC
  Image img;
  img.height = int(hwc.size(0));
  img.width = int(hwc.size(1));
  img.channels = int(hwc.size(2));
  img.pixels.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    float x = v[i];
    if (!(x >= 0.0f)) x = 0.0f;  // also NaN
    if (x > 1.0f) x = 1.0f;
    const float scaled = x * 255.0f;                         // f32 product, as numpy does on a float32 array
    img.pixels[i] = uint8_t(std::nearbyint(scaled));         // round half to even (default rounding mode)
  }
  return img;
}

// -> [1, 3, H, W] f32.
Tensor tensor_from_image(const Image& img) {
  const Status st = validate_image(img);
  ATELIER_CHECK(st.is_ok(), "tensor_from_image: " + st.message());
  const int64_t h = img.height, w = img.width, c = img.channels;
  Tensor t = Tensor::empty({1, 3, h, w}, DType::F32, Device::cpu());
  float* out = t.data<float>();
  const int64_t plane = h * w;
  for (int64_t i = 0; i < plane; ++i) {
    const uint8_t* p = img.pixels.data() + i * c;
    for (int64_t ch = 0; ch < 3; ++ch) {
      const uint8_t v = c >= 3 ? p[ch] : p[0];  // gray (+alpha) replicates; alpha is dropped
      out[ch * plane + i] = float(v) / 255.0f;
    }
  }
  return t;
}

}  // namespace atelier
