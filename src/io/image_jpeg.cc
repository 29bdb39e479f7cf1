// JPEG through libjpeg(-turbo). libjpeg reports errors by longjmp from error_exit; as in image_png.cc, all
// mutable state lives in a heap context created before setjmp, and no C++ object with a destructor is
// created between setjmp and the end of the libjpeg calls.
// Corrupt-data warnings (e.g. "premature end of JPEG file", which libjpeg papers over with grey) are
// treated as errors: a truncated upload should be reported, not silently half-grey.
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>

#include <csetjmp>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "io/image.h"
#include "io/image_codecs.h"
#include "io/image_metadata.h"

namespace atelier {
namespace {

constexpr int kApp1 = JPEG_APP0 + 1;
constexpr std::string_view kExifHeader("Exif\0\0", 6);

struct JpegError {
  jpeg_error_mgr mgr;  // first member: libjpeg hands us a pointer to it
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_jpeg_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_jpeg_error(cinfo);  // level -1: corrupt-data warning -> fatal (see the file comment)
}

struct JpegDecodeContext {
  jpeg_decompress_struct cinfo;
  JpegError err;
  Image image;
  std::vector<uint8_t> row;  // one CMYK scanline
  bool created = false;
};

// PIL's CMYK -> RGB: channel = (255 - c) * (255 - k) / 255 rounded; Adobe files store c and k inverted.
inline uint8_t mul_div_255(int a, int b) {
  const int t = a * b + 128;
  return uint8_t((t + (t >> 8)) >> 8);
}

void cmyk_row_to_rgb(const uint8_t* cmyk, uint8_t* rgb, int width, bool inverted) {
  for (int x = 0; x < width; ++x) {
    int c[4];
    for (int i = 0; i < 4; ++i) c[i] = inverted ? cmyk[4 * x + i] : 255 - cmyk[4 * x + i];
    for (int i = 0; i < 3; ++i) rgb[3 * x + i] = mul_div_255(c[i], c[3]);
  }
}

bool allocate(JpegDecodeContext* ctx, int w, int h, int c, bool cmyk) noexcept {
  try {
    ctx->image.width = w;
    ctx->image.height = h;
    ctx->image.channels = c;
    ctx->image.pixels.resize(size_t(w) * size_t(h) * size_t(c));
    if (cmyk) ctx->row.resize(size_t(w) * 4);
    return true;
  } catch (...) {
    return false;
  }
}

bool decode_jpeg_guarded(JpegDecodeContext* ctx, std::string_view bytes) {
  jpeg_decompress_struct& cinfo = ctx->cinfo;
  cinfo.err = jpeg_std_error(&ctx->err.mgr);
  ctx->err.mgr.error_exit = on_jpeg_error;
  ctx->err.mgr.emit_message = on_jpeg_message;
  if (setjmp(ctx->err.jump)) {
    if (ctx->created) jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  ctx->created = true;
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.image_width > unsigned(kMaxImageSide) || cinfo.image_height > unsigned(kMaxImageSide) ||
      int64_t(cinfo.image_width) * cinfo.image_height > kMaxImagePixels) {
    std::snprintf(ctx->err.message, sizeof ctx->err.message, "image %ux%u exceeds the size limit",
                  cinfo.image_width, cinfo.image_height);
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  const bool gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = cmyk ? JCS_CMYK : gray ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const int w = int(cinfo.output_width), h = int(cinfo.output_height), c = gray ? 1 : 3;
  if (!allocate(ctx, w, h, c, cmyk)) {
    std::snprintf(ctx->err.message, sizeof ctx->err.message, "out of memory");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    uint8_t* dst = ctx->image.pixels.data() + size_t(cinfo.output_scanline) * size_t(w) * size_t(c);
    JSAMPROW row = cmyk ? ctx->row.data() : dst;
    jpeg_read_scanlines(&cinfo, &row, 1);
    if (cmyk) cmyk_row_to_rgb(ctx->row.data(), dst, w, cinfo.saw_Adobe_marker);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

struct JpegEncodeContext {
  jpeg_compress_struct cinfo;
  JpegError err;
  unsigned char* buf = nullptr;  // malloc'd by jpeg_mem_dest, ours to free
  unsigned long size = 0;
  std::vector<uint8_t> row;      // input row with alpha dropped
  std::string app1;              // "Exif\0\0" + TIFF, empty for none
  bool created = false;
};

bool encode_jpeg_guarded(JpegEncodeContext* ctx, const Image& img, int quality) {
  jpeg_compress_struct& cinfo = ctx->cinfo;
  cinfo.err = jpeg_std_error(&ctx->err.mgr);
  ctx->err.mgr.error_exit = on_jpeg_error;
  ctx->err.mgr.emit_message = on_jpeg_message;
  if (setjmp(ctx->err.jump)) {
    if (ctx->created) jpeg_destroy_compress(&cinfo);
    return false;
  }
  jpeg_create_compress(&cinfo);
  ctx->created = true;
  jpeg_mem_dest(&cinfo, &ctx->buf, &ctx->size);
  const bool gray = img.channels <= 2;
  const int out_c = gray ? 1 : 3;
  cinfo.image_width = JDIMENSION(img.width);
  cinfo.image_height = JDIMENSION(img.height);
  cinfo.input_components = out_c;
  cinfo.in_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  if (!ctx->app1.empty())
    jpeg_write_marker(&cinfo, kApp1, reinterpret_cast<const JOCTET*>(ctx->app1.data()), unsigned(ctx->app1.size()));
  const size_t stride = size_t(img.width) * size_t(img.channels);
  while (cinfo.next_scanline < cinfo.image_height) {
    const uint8_t* src = img.pixels.data() + size_t(cinfo.next_scanline) * stride;
    JSAMPROW row = const_cast<JSAMPROW>(src);
    if (img.channels != out_c) {  // drop alpha into the scratch row
      for (int x = 0; x < img.width; ++x)
        for (int i = 0; i < out_c; ++i) ctx->row[size_t(x) * out_c + i] = src[size_t(x) * img.channels + i];
      row = ctx->row.data();
    }
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}

}  // namespace

Expected<Image> decode_jpeg_image(std::string_view bytes, const std::string& label) {
  auto ctx = std::make_unique<JpegDecodeContext>();
  if (!decode_jpeg_guarded(ctx.get(), bytes)) return corrupt(label + ": JPEG decode failed: " + ctx->err.message);
  return std::move(ctx->image);
}

Expected<std::string> encode_jpeg(const Image& img, int quality, const std::string& comment, bool* comment_dropped) {
  ATELIER_RETURN_IF_ERROR(validate_image(img));
  if (quality < 1 || quality > 100) return invalid_argument("JPEG quality " + std::to_string(quality) + " is outside 1..100");
  auto ctx = std::make_unique<JpegEncodeContext>();
  bool dropped = false;
  if (!comment.empty()) {
    auto tiff = build_exif_user_comment(comment);
    if (tiff) ctx->app1 = std::string(kExifHeader) + *tiff;
    else dropped = true;
  }
  if (comment_dropped != nullptr) *comment_dropped = dropped;
  ctx->row.resize(size_t(img.width) * 3);
  const bool ok = encode_jpeg_guarded(ctx.get(), img, quality);
  const std::unique_ptr<unsigned char, void (*)(void*)> owned(ctx->buf, std::free);
  std::string out;
  if (ok && ctx->buf != nullptr) out.assign(reinterpret_cast<const char*>(ctx->buf), ctx->size);
  if (!ok) return internal_error(std::string("JPEG encode failed: ") + ctx->err.message);
  return out;
}

}  // namespace atelier
