// PNG through libpng's full API (the simplified API cannot write text chunks). libpng reports errors by
// longjmp; so that no C++ destructor is skipped, every function that calls setjmp keeps its mutable state
// in a heap context object created before setjmp, and creates no C++ objects with destructors after it.
#include <png.h>
#include <zlib.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <memory>

#include "io/image.h"
#include "io/image_codecs.h"
#include "io/png_deflate.h"
#include "io/text_encoding.h"

namespace atelier {
namespace {

constexpr size_t kMaxKeywordBytes = 79;  // PNG spec limit for text chunk keywords
constexpr size_t kPngSignatureBytes = 8;
// Text chunks a hostile file can make us inflate: libpng's default cap is 8 MB per chunk; keep it.
constexpr png_alloc_size_t kMaxChunkBytes = png_alloc_size_t(8) << 20;
// The image data's zlib stream goes out in IDAT chunks of at most this many bytes (any size up to 2^31-1 is
// valid; smaller chunks let a streaming reader start sooner).
constexpr size_t kIdatChunkBytes = size_t(256) << 10;
constexpr png_byte kIdat[5] = {'I', 'D', 'A', 'T', '\0'};
constexpr png_byte kIend[5] = {'I', 'E', 'N', 'D', '\0'};

struct PngContext {
  std::string_view in;      // decoding: the file
  size_t pos = 0;
  std::string out;          // encoding: the file
  std::string error;        // first libpng error
  Image image;
  TextChunks text;
  std::vector<png_bytep> rows;
  // Encoding: text chunk storage that must outlive png_set_text.
  std::vector<std::string> keys, values;
  std::vector<png_text> chunks;
  std::vector<bool> is_itxt;
  std::string idat;         // encoding: the image data's zlib stream, made before libpng writes the file
};

void on_error(png_structp png, png_const_charp msg) {
  auto* ctx = static_cast<PngContext*>(png_get_error_ptr(png));
  if (ctx->error.empty()) ctx->error = msg ? msg : "unknown libpng error";
  png_longjmp(png, 1);
}
void on_warning(png_structp, png_const_charp) {}  // ancillary-chunk problems: not fatal, as in browsers

void read_bytes(png_structp png, png_bytep data, png_size_t length) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (length > ctx->in.size() - ctx->pos) png_error(png, "unexpected end of data (truncated file)");
  std::memcpy(data, ctx->in.data() + ctx->pos, length);
  ctx->pos += length;
}

void write_bytes(png_structp png, png_bytep data, png_size_t length) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  bool failed = false;
  try {  // an exception must not unwind through libpng's C frames
    ctx->out.append(reinterpret_cast<const char*>(data), length);
  } catch (...) {
    failed = true;
  }
  if (failed) png_error(png, "out of memory");
}

// Sizes the pixel buffer and row pointers; false when memory runs out (no exception may cross libpng).
bool allocate_pixels(PngContext* ctx, int w, int h, int c) noexcept {
  try {
    ctx->image.width = w;
    ctx->image.height = h;
    ctx->image.channels = c;
    ctx->image.pixels.resize(size_t(w) * size_t(h) * size_t(c));
    ctx->rows.resize(size_t(h));
    for (int y = 0; y < h; ++y) ctx->rows[size_t(y)] = ctx->image.pixels.data() + size_t(y) * size_t(w) * size_t(c);
    return true;
  } catch (...) {
    return false;
  }
}
void flush_nothing(png_structp) {}

// Collects text chunks from `info` (before or after the image data) as UTF-8.
void collect_text(png_structp png, png_infop info, PngContext* ctx) {
  png_textp text = nullptr;
  int n = 0;
  png_get_text(png, info, &text, &n);
  for (int i = 0; i < n; ++i) {
    const std::string key = latin1_to_utf8(text[i].key ? text[i].key : "");
    const bool itxt = text[i].compression == PNG_ITXT_COMPRESSION_NONE || text[i].compression == PNG_ITXT_COMPRESSION_zTXt;
    const size_t len = itxt ? text[i].itxt_length : text[i].text_length;
    const std::string_view raw(text[i].text ? text[i].text : "", text[i].text ? len : 0);
    ctx->text.emplace_back(key, itxt ? std::string(raw) : latin1_to_utf8(raw));
  }
}

// Decodes into ctx->image and ctx->text. False on a libpng error (ctx->error says why).
bool decode_png_guarded(PngContext* ctx) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, ctx, on_error, on_warning);
  if (png == nullptr) { ctx->error = "out of memory"; return false; }
  png_infop info = png_create_info_struct(png);
  png_infop end_info = png_create_info_struct(png);
  if (info == nullptr || end_info == nullptr) {
    png_destroy_read_struct(&png, &info, &end_info);
    ctx->error = "out of memory";
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, &end_info);
    return false;
  }
  png_set_read_fn(png, ctx, read_bytes);
  png_set_user_limits(png, kMaxImageSide, kMaxImageSide);
  png_set_chunk_malloc_max(png, kMaxChunkBytes);
  png_read_info(png, info);
  png_set_expand(png);      // palette -> RGB, gray < 8 bit -> 8 bit, tRNS -> alpha
  png_set_strip_16(png);    // 16-bit -> 8-bit
  png_set_packing(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int w = int(png_get_image_width(png, info)), h = int(png_get_image_height(png, info));
  const int c = int(png_get_channels(png, info));
  if (c < 1 || c > 4 || png_get_rowbytes(png, info) != size_t(w) * size_t(c)) png_error(png, "unsupported pixel layout");
  if (int64_t(w) * h > kMaxImagePixels) png_error(png, "image has too many pixels");
  if (!allocate_pixels(ctx, w, h, c)) png_error(png, "out of memory");
  png_read_image(png, ctx->rows.data());
  png_read_end(png, end_info);
  collect_text(png, info, ctx);
  collect_text(png, end_info, ctx);
  png_destroy_read_struct(&png, &info, &end_info);
  return true;
}

Expected<std::unique_ptr<PngContext>> decode_png(std::string_view bytes, const std::string& label) {
  if (bytes.size() < kPngSignatureBytes || png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, kPngSignatureBytes) != 0)
    return corrupt(label + ": not a PNG file");
  auto ctx = std::make_unique<PngContext>();
  ctx->in = bytes;
  bool ok = false;
  try {
    ok = decode_png_guarded(ctx.get());
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kResourceExhausted, label + ": out of memory decoding PNG");
  }
  if (!ok) return corrupt(label + ": PNG decode failed: " + ctx->error);
  return ctx;
}

// Prepares png_text entries in ctx (Latin-1 -> tEXt, else iTXt UTF-8).
Status prepare_text(const TextChunks& text_chunks, PngContext* ctx) {
  ctx->keys.reserve(text_chunks.size());
  ctx->values.reserve(text_chunks.size());
  for (const auto& [key, value] : text_chunks) {
    auto latin_key = utf8_to_latin1(key);
    if (!latin_key || latin_key->empty() || latin_key->size() > kMaxKeywordBytes || latin_key->front() == ' ' ||
        latin_key->back() == ' ' || latin_key->find('\0') != std::string::npos)
      return invalid_argument("PNG text keyword '" + key + "' is invalid: it must be 1-79 Latin-1 characters without "
                              "leading/trailing spaces");
    auto latin_value = utf8_to_latin1(value);
    const bool use_itxt = !latin_value.has_value();
    if (use_itxt && !decode_utf8(value)) return invalid_argument("PNG text for '" + key + "' is not valid UTF-8");
    ctx->keys.push_back(*latin_key);
    ctx->values.push_back(use_itxt ? value : *latin_value);
    ctx->is_itxt.push_back(use_itxt);
  }
  ctx->chunks.resize(text_chunks.size());
  for (size_t i = 0; i < text_chunks.size(); ++i) {
    png_text& t = ctx->chunks[i];
    std::memset(&t, 0, sizeof t);
    const bool use_itxt = ctx->is_itxt[i];
    t.compression = use_itxt ? PNG_ITXT_COMPRESSION_NONE : PNG_TEXT_COMPRESSION_NONE;
    t.key = ctx->keys[i].data();
    t.text = ctx->values[i].data();
    t.text_length = use_itxt ? 0 : ctx->values[i].size();
    t.itxt_length = use_itxt ? ctx->values[i].size() : 0;
    t.lang = nullptr;
    t.lang_key = nullptr;
  }
  return Status::ok();
}

bool encode_png_guarded(const Image& img, PngContext* ctx) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, ctx, on_error, on_warning);
  if (png == nullptr) { ctx->error = "out of memory"; return false; }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    ctx->error = "out of memory";
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  static constexpr int kColorTypes[] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                                        PNG_COLOR_TYPE_RGB_ALPHA};
  png_set_write_fn(png, ctx, write_bytes, flush_nothing);
  png_set_IHDR(png, info, png_uint_32(img.width), png_uint_32(img.height), 8, kColorTypes[img.channels],
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!ctx->chunks.empty()) png_set_text(png, info, ctx->chunks.data(), int(ctx->chunks.size()));
  png_write_info(png, info);  // text chunks go before the image data, where every reader looks
  // The image data was filtered and compressed on every core (io/png_deflate.h); libpng frames it.
  for (size_t off = 0; off < ctx->idat.size(); off += kIdatChunkBytes)
    png_write_chunk(png, kIdat, reinterpret_cast<png_const_bytep>(ctx->idat.data()) + off,
                    std::min(kIdatChunkBytes, ctx->idat.size() - off));
  png_write_chunk(png, kIend, nullptr, 0);
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace

Expected<Image> decode_png_image(std::string_view bytes, const std::string& label) {
  ATELIER_ASSIGN_OR_RETURN(auto ctx, decode_png(bytes, label));
  return std::move(ctx->image);
}

Expected<TextChunks> read_png_text(std::string_view bytes, const std::string& label) {
  ATELIER_ASSIGN_OR_RETURN(auto ctx, decode_png(bytes, label));
  return std::move(ctx->text);
}

Expected<std::string> encode_png(const Image& img, const TextChunks& text_chunks) {
  ATELIER_RETURN_IF_ERROR(validate_image(img));
  auto ctx = std::make_unique<PngContext>();
  ATELIER_RETURN_IF_ERROR(prepare_text(text_chunks, ctx.get()));
  bool ok = false;
  try {
    const std::string rows = png_filter_rows(img.pixels.data(), img.width, img.height, img.channels);
    ATELIER_ASSIGN_OR_RETURN(ctx->idat, zlib_compress_parallel(rows, kPngDeflateLevel, Z_FILTERED));
    ok = encode_png_guarded(img, ctx.get());
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kResourceExhausted, "out of memory encoding PNG");
  }
  if (!ok) return internal_error("PNG encode failed: " + ctx->error);
  return std::move(ctx->out);
}

Status write_png(const std::string& path, const Image& img, const TextChunks& text_chunks) {
  auto bytes = encode_png(img, text_chunks);
  if (!bytes) return prefixed(bytes.status(), path);
  return write_file(path, *bytes);
}

}  // namespace atelier
