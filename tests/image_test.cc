// Image codecs, metadata (PNG text chunks, EXIF UserComment), tensor conversion and corrupt-input handling.
#include "io/image.h"

#include <gtest/gtest.h>
#include <png.h>
#include <unistd.h>

#include <cmath>
#include <csetjmp>
#include <cstring>
#include <filesystem>
#include <random>

#include "io/image_metadata.h"
#include "io/text_encoding.h"
#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

// A smooth gradient (different per channel), so lossy codecs stay close; alpha ramps left to right.
Image gradient(int w, int h, int c) {
  Image img{w, h, c, std::vector<uint8_t>(size_t(w) * h * c)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k) {
        const int colour = k == 0 ? 20 + x * 180 / (w - 1) + y * 40 / (h - 1)
                         : k == 1 ? 230 - y * 200 / (h - 1)
                                  : 60 + (x + y) * 120 / (w + h - 2);
        img.pixels[(size_t(y) * w + x) * c + k] = uint8_t(k == 3 ? x * 255 / (w - 1) : colour);
      }
  return img;
}

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(int(a[i]) - int(b[i]));
  return s / double(a.size());
}

// Independent reader for the test: raw libpng, returns (key, text, compression) of every text chunk.
struct RawText {
  std::string key, text;
  int compression;
};
struct RawReadState {
  const std::string* data;
  size_t pos;
};
void raw_read(png_structp png, png_bytep out, png_size_t n) {
  auto* st = static_cast<RawReadState*>(png_get_io_ptr(png));
  if (st->pos + n > st->data->size()) png_error(png, "eof");
  std::memcpy(out, st->data->data() + st->pos, n);
  st->pos += n;
}
bool raw_png_text(const std::string& bytes, std::vector<RawText>* out) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  RawReadState* st = new RawReadState{&bytes, 0};
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    delete st;
    return false;
  }
  png_set_read_fn(png, st, raw_read);
  png_read_info(png, info);
  png_textp text = nullptr;
  int n = 0;
  png_get_text(png, info, &text, &n);
  for (int i = 0; i < n; ++i) {
    const bool itxt = text[i].compression >= PNG_ITXT_COMPRESSION_NONE;
    out->push_back({text[i].key, std::string(text[i].text, itxt ? text[i].itxt_length : text[i].text_length),
                    text[i].compression});
  }
  png_destroy_read_struct(&png, &info, nullptr);
  delete st;
  return true;
}

TEST(Image, PngRoundTripEveryChannelCount) {
  for (int c = 1; c <= 4; ++c) {
    const Image img = gradient(37, 23, c);
    auto bytes = encode_png(img);
    ASSERT_TRUE(bytes.has_value()) << bytes.status().message();
    EXPECT_EQ(detect_image_format(*bytes), ImageFormat::kPNG);
    auto back = decode_image(*bytes);
    ASSERT_TRUE(back.has_value()) << back.status().message();
    EXPECT_EQ(back->width, 37);
    EXPECT_EQ(back->height, 23);
    EXPECT_EQ(back->channels, c);
    EXPECT_EQ(back->pixels, img.pixels) << "channels " << c;
  }
}

TEST(Image, PngTextChunksLatin1AsTextAndUnicodeAsITxt) {
  const std::string ascii = "a cat, masterpiece\nNegative prompt: blurry\nSteps: 20, Sampler: Euler a";
  const std::string latin1 = "caf\xc3\xa9 au lait";             // é is Latin-1: tEXt
  const std::string unicode = "\xe7\x8c\xab \xf0\x9f\x90\xb1 cat";  // 猫 🐱: iTXt
  const fs::path path = fs::temp_directory_path() / ("atelier_img_" + std::to_string(::getpid()) + ".png");
  ASSERT_TRUE(write_png(path.string(), gradient(8, 8, 3), {{"parameters", ascii}, {"latin", latin1}, {"uni", unicode}}).is_ok());
  std::string bytes;
  {
    FILE* f = std::fopen(path.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, n);
    std::fclose(f);
  }
  std::vector<RawText> raw;
  ASSERT_TRUE(raw_png_text(bytes, &raw));
  ASSERT_EQ(raw.size(), 3u);
  EXPECT_EQ(raw[0].key, "parameters");
  EXPECT_EQ(raw[0].text, ascii);
  EXPECT_EQ(raw[0].compression, PNG_TEXT_COMPRESSION_NONE);
  EXPECT_EQ(raw[1].text, "caf\xe9 au lait");  // stored as Latin-1 bytes
  EXPECT_EQ(raw[1].compression, PNG_TEXT_COMPRESSION_NONE);
  EXPECT_EQ(raw[2].text, unicode);              // stored as UTF-8
  EXPECT_EQ(raw[2].compression, PNG_ITXT_COMPRESSION_NONE);
  // Our reader decodes both back to UTF-8.
  auto text = read_png_text(bytes);
  ASSERT_TRUE(text.has_value());
  EXPECT_EQ((*text)[1].second, latin1);
  EXPECT_EQ((*text)[2].second, unicode);
  EXPECT_EQ(read_infotext(bytes).value(), ascii);
  auto img = read_image(path.string());
  ASSERT_TRUE(img.has_value());
  EXPECT_EQ(img->pixels, gradient(8, 8, 3).pixels);
  fs::remove(path);
}

TEST(Image, PngRejectsBadKeywordsAndText) {
  const Image img = gradient(4, 4, 3);
  EXPECT_FALSE(encode_png(img, {{"", "x"}}).has_value());
  EXPECT_FALSE(encode_png(img, {{std::string(80, 'k'), "x"}}).has_value());
  EXPECT_FALSE(encode_png(img, {{" lead", "x"}}).has_value());
  EXPECT_FALSE(encode_png(img, {{"\xe7\x8c\xab", "x"}}).has_value());  // keyword not Latin-1
  EXPECT_FALSE(encode_png(img, {{"k", "\xff\xfe"}}).has_value());      // not UTF-8
  Image bad = img;
  bad.pixels.pop_back();
  EXPECT_FALSE(encode_png(bad).has_value());
  bad = img;
  bad.channels = 5;
  EXPECT_FALSE(encode_png(bad).has_value());
}

TEST(Image, JpegEncodeDecode) {
  const Image rgb = gradient(64, 48, 3);
  auto bytes = encode_jpeg(rgb, 95);
  ASSERT_TRUE(bytes.has_value()) << bytes.status().message();
  EXPECT_EQ(detect_image_format(*bytes), ImageFormat::kJPEG);
  auto back = decode_image(*bytes);
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->width, 64);
  EXPECT_EQ(back->height, 48);
  EXPECT_EQ(back->channels, 3);
  EXPECT_LT(mean_abs_diff(back->pixels, rgb.pixels), 4.0);
  // Lower quality: smaller file, larger error.
  auto small = encode_jpeg(rgb, 20);
  ASSERT_TRUE(small.has_value());
  EXPECT_LT(small->size(), bytes->size());
  // Gray stays gray; alpha is dropped.
  auto gray = decode_image(encode_jpeg(gradient(16, 16, 1)).value());
  ASSERT_TRUE(gray.has_value());
  EXPECT_EQ(gray->channels, 1);
  auto rgba = decode_image(encode_jpeg(gradient(16, 16, 4)).value());
  ASSERT_TRUE(rgba.has_value());
  EXPECT_EQ(rgba->channels, 3);
  EXPECT_FALSE(encode_jpeg(rgb, 0).has_value());
  EXPECT_FALSE(encode_jpeg(rgb, 101).has_value());
}

TEST(Image, JpegAndWebpCarryInfotextInExif) {
  const std::string info = "a \xe7\x8c\xab, (masterpiece:1.2)\nNegative prompt: \xf0\x9f\x90\xb1\nSteps: 20, Seed: 1";
  const Image rgb = gradient(32, 32, 3);
  bool dropped = true;
  auto jpeg = encode_jpeg(rgb, 90, info, &dropped);
  ASSERT_TRUE(jpeg.has_value());
  EXPECT_FALSE(dropped);
  EXPECT_EQ(read_infotext(*jpeg).value(), info);
  ASSERT_TRUE(decode_image(*jpeg).has_value());
  for (int c : {3, 4}) {
    dropped = true;
    auto webp = encode_webp(gradient(32, 32, c), 90, info, &dropped);
    ASSERT_TRUE(webp.has_value());
    EXPECT_FALSE(dropped);
    EXPECT_EQ(read_infotext(*webp).value(), info);
    auto back = decode_image(*webp);
    ASSERT_TRUE(back.has_value()) << back.status().message();
    EXPECT_EQ(back->channels, c);
  }
  // Too long for one APP1 segment: the image is written without it.
  const std::string huge(40000, 'x');
  auto big = encode_jpeg(rgb, 90, huge, &dropped);
  ASSERT_TRUE(big.has_value());
  EXPECT_TRUE(dropped);
  EXPECT_EQ(read_infotext(*big).value(), "");
  EXPECT_TRUE(decode_image(*big).has_value());
  EXPECT_EQ(read_infotext(encode_png(rgb).value()).value(), "");
}

TEST(Image, WebpEncodeDecode) {
  const Image rgb = gradient(64, 48, 3);
  auto bytes = encode_webp(rgb, 95);
  ASSERT_TRUE(bytes.has_value()) << bytes.status().message();
  EXPECT_EQ(detect_image_format(*bytes), ImageFormat::kWebP);
  auto back = decode_image(*bytes);
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->width, 64);
  EXPECT_EQ(back->height, 48);
  EXPECT_EQ(back->channels, 3);
  EXPECT_LT(mean_abs_diff(back->pixels, rgb.pixels), 4.0);
  // Alpha survives (libwebp compresses alpha losslessly by default).
  const Image rgba = gradient(64, 48, 4);
  auto a = decode_image(encode_webp(rgba, 90).value());
  ASSERT_TRUE(a.has_value());
  ASSERT_EQ(a->channels, 4);
  for (size_t i = 3; i < rgba.pixels.size(); i += 4) ASSERT_EQ(a->pixels[i], rgba.pixels[i]) << i;
  auto gray = decode_image(encode_webp(gradient(16, 16, 1), 90).value());
  ASSERT_TRUE(gray.has_value());
  EXPECT_EQ(gray->channels, 3);
}

TEST(Image, UnknownAndMissingInputs) {
  auto none = decode_image("", "empty");
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(none.status().message().find("empty"), std::string::npos);
  EXPECT_EQ(decode_image("GIF89a....").status().code(), ErrorCode::kUnsupported);
  EXPECT_EQ(read_image("/nonexistent/x.png").status().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(read_infotext("nope").has_value());
}

// Every truncation of a valid file must fail (never crash); flips must fail or give a valid image.
void fuzz_codec(const std::string& name, const std::string& valid, int w, int h, int* inputs) {
  for (size_t n = 0; n < valid.size(); n += std::max<size_t>(1, valid.size() / 150)) {
    auto r = decode_image(valid.substr(0, n), name);
    EXPECT_FALSE(r.has_value()) << name << " truncated to " << n;
    if (!r.has_value()) EXPECT_NE(r.status().message().find(name), std::string::npos) << r.status().message();
    (void)read_infotext(valid.substr(0, n), name);
    ++*inputs;
  }
  std::mt19937 rng(4242);
  for (int k = 0; k < 150; ++k) {
    std::string s = valid;
    const int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) s[rng() % s.size()] = char(rng() % 256);
    auto r = decode_image(s, name);
    if (r.has_value()) EXPECT_TRUE(validate_image(*r).is_ok()) << name << " flip " << k;
    (void)read_infotext(s, name);
    ++*inputs;
  }
}

TEST(Image, FuzzCorruptAndTruncatedData) {
  const Image img = gradient(24, 16, 3);
  const std::string info = "prompt\nSteps: 20";
  int inputs = 0;
  fuzz_codec("x.png", encode_png(img, {{"parameters", info}}).value(), 24, 16, &inputs);
  fuzz_codec("x.jpg", encode_jpeg(img, 90, info).value(), 24, 16, &inputs);
  fuzz_codec("x.webp", encode_webp(img, 90, info).value(), 24, 16, &inputs);
  fuzz_codec("a.webp", encode_webp(gradient(24, 16, 4), 90, info).value(), 24, 16, &inputs);
  EXPECT_GT(inputs, 600);
}

// ---- tensor conversion --------------------------------------------------------------------------------

TEST(Image, FromTensorRoundsHalfToEvenAfterClamping) {
  // Find f32 inputs whose f32 product with 255 is exactly k + 0.5, to pin down the tie rule.
  std::vector<float> xs;
  std::vector<uint8_t> expect;
  for (int k = 0; k < 255; ++k) {
    float x = (float(k) + 0.5f) / 255.0f;
    for (int step = 0; step < 8 && x * 255.0f != float(k) + 0.5f; ++step)
      x = std::nextafter(x, x * 255.0f < float(k) + 0.5f ? 2.0f : -1.0f);
    if (x * 255.0f != float(k) + 0.5f) continue;
    xs.push_back(x);
    expect.push_back(uint8_t(k % 2 == 0 ? k : k + 1));
  }
  ASSERT_GT(xs.size(), 100u);
  for (float x : {-0.25f, 1.75f, std::nanf(""), 1.0f, 0.0f, 0.2f}) xs.push_back(x);
  for (int v : {0, 255, 0, 255, 0, 51}) expect.push_back(uint8_t(v));
  const int64_t n = int64_t(xs.size());
  Image img = image_from_tensor(Tensor::from_vector(xs, {1, 1, 1, n}));  // NCHW, 1 channel
  EXPECT_EQ(img.width, n);
  EXPECT_EQ(img.height, 1);
  EXPECT_EQ(img.channels, 1);
  EXPECT_EQ(img.pixels, expect);
}

TEST(Image, FromTensorNchwAndNhwcAgree) {
  std::vector<float> v(2 * 3 * 6 * 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 97) / 96.0f;
  Tensor nchw = Tensor::from_vector(v, {2, 3, 6, 5});
  const Image a = image_from_tensor(nchw, 1);
  const Image b = image_from_tensor(nchw.permute({0, 2, 3, 1}), 1);  // NHWC view of the same values
  EXPECT_EQ(a.width, 5);
  EXPECT_EQ(a.height, 6);
  EXPECT_EQ(a.channels, 3);
  EXPECT_EQ(a.pixels, b.pixels);
  // Pixel (y=2, x=3) channel 1 of sample 1 is v[1*90 + 1*30 + 2*5 + 3].
  EXPECT_EQ(a.pixels[(2 * 5 + 3) * 3 + 1], uint8_t(std::nearbyint(v[90 + 30 + 13] * 255.0f)));
  EXPECT_THROW(image_from_tensor(Tensor::from_vector(std::vector<float>(10), {2, 5})), Error);
  EXPECT_THROW(image_from_tensor(nchw, 2), Error);
}

TEST(Image, FromTensorMatchesNumpyOnGoldenImage) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  // Reference: numpy (clip(x, 0, 1) * 255).round().astype(uint8) over the same golden, summarised as the
  // byte sum and the FNV-1a 64 hash of the bytes in HWC order.
  struct Ref { const char* key; uint64_t sum, fnv; };
  for (const Ref& ref : {Ref{"run.euler.image", 7475774, 0x84e15d99d9cc3421ull},
                         Ref{"img2img.image", 7479964, 0xd537a89a3d2fe8f1ull}}) {
    const Image img = image_from_tensor(test::golden("sd15-tiny", ref.key));
    EXPECT_EQ(img.width, 128);
    EXPECT_EQ(img.height, 128);
    EXPECT_EQ(img.channels, 3);
    uint64_t sum = 0, fnv = 0xcbf29ce484222325ull;
    for (uint8_t p : img.pixels) {
      sum += p;
      fnv = (fnv ^ p) * 0x100000001b3ull;
    }
    EXPECT_EQ(sum, ref.sum) << ref.key;
    EXPECT_EQ(fnv, ref.fnv) << ref.key;
  }
}

TEST(Image, TensorFromImage) {
  Image rgba{2, 1, 4, {0, 128, 255, 7, 10, 20, 30, 40}};
  Tensor t = tensor_from_image(rgba);
  EXPECT_EQ(t.shape(), (Shape{1, 3, 1, 2}));
  const std::vector<float> v = t.to_vector();
  EXPECT_EQ(v, (std::vector<float>{0.0f, 10 / 255.0f, 128 / 255.0f, 20 / 255.0f, 1.0f, 30 / 255.0f}));
  Image gray{2, 1, 2, {51, 9, 102, 9}};
  EXPECT_EQ(tensor_from_image(gray).to_vector(),
            (std::vector<float>{51 / 255.0f, 102 / 255.0f, 51 / 255.0f, 102 / 255.0f, 51 / 255.0f, 102 / 255.0f}));
  // Round trip image -> tensor -> image is the identity on 8-bit values.
  const Image g = gradient(9, 7, 3);
  EXPECT_EQ(image_from_tensor(tensor_from_image(g)).pixels, g.pixels);
}

// ---- metadata helpers ---------------------------------------------------------------------------------

TEST(ImageMetadata, ExifUserCommentRoundTripAndByteOrders) {
  const std::string text = "Steps: 20, \xc3\xa9\xe7\x8c\xab\xf0\x9f\x90\xb1";
  auto tiff = build_exif_user_comment(text);
  ASSERT_TRUE(tiff.has_value());
  EXPECT_EQ(tiff->substr(0, 4), std::string("MM\0*", 4));
  EXPECT_EQ(parse_exif_user_comment(*tiff).value(), text);
  EXPECT_EQ(parse_exif_user_comment(std::string("Exif\0\0", 6) + *tiff).value(), text);
  // Little-endian TIFF with an ASCII comment directly in IFD0 (seen in some writers).
  std::string le("II*\0\x08\0\0\0", 8);
  le += std::string("\x01\0", 2);                                  // 1 entry
  le += std::string("\x86\x92\x07\0\x0d\0\0\0\x1a\0\0\0", 12);     // 0x9286 UNDEFINED count 13 at 26
  le += std::string("\0\0\0\0", 4);
  le += std::string("ASCII\0\0\0hello", 13);
  EXPECT_EQ(parse_exif_user_comment(le).value(), "hello");
  EXPECT_FALSE(build_exif_user_comment("\xff").has_value());
  EXPECT_FALSE(build_exif_user_comment(std::string(40000, 'a')).has_value());
}

TEST(ImageMetadata, FuzzExifParserNeverReadsOutOfBounds) {
  const std::string tiff = build_exif_user_comment("hello \xe7\x8c\xab").value();
  int parsed = 0;
  for (size_t n = 0; n <= tiff.size(); ++n) {
    // Copy into an exact-size heap buffer so that AddressSanitizer sees any over-read.
    std::unique_ptr<char[]> buf(new char[n + 1]);
    std::memcpy(buf.get(), tiff.data(), n);
    parsed += parse_exif_user_comment(std::string_view(buf.get(), n)).has_value();
  }
  EXPECT_EQ(parsed, 1);  // only the whole blob: every shorter one cuts the comment's declared bytes
  std::mt19937 rng(99);
  for (int k = 0; k < 400; ++k) {
    std::string s = tiff;
    for (int f = 0; f < 1 + int(rng() % 3); ++f) s[rng() % s.size()] = char(rng() % 256);
    std::unique_ptr<char[]> buf(new char[s.size()]);
    std::memcpy(buf.get(), s.data(), s.size());
    (void)parse_exif_user_comment(std::string_view(buf.get(), s.size()));
    (void)find_jpeg_exif(std::string_view(buf.get(), s.size()));
    (void)find_webp_exif(std::string_view(buf.get(), s.size()));
  }
}

TEST(TextEncoding, Utf8Validation) {
  EXPECT_TRUE(decode_utf8("plain ascii").has_value());
  EXPECT_EQ(decode_utf8("\xe2\x82\xac").value(), std::u32string(1, U'\u20ac'));
  EXPECT_EQ(decode_utf8("\xf0\x9f\x90\xb1").value(), std::u32string(1, U'\U0001F431'));
  for (const char* bad : {"\xc0\x80", "\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\x80", "\xff"})
    EXPECT_FALSE(decode_utf8(bad).has_value()) << bad;
  EXPECT_EQ(utf8_to_latin1("caf\xc3\xa9").value(), "caf\xe9");
  EXPECT_FALSE(utf8_to_latin1("\xe2\x82\xac").has_value());
  EXPECT_EQ(latin1_to_utf8("caf\xe9"), "caf\xc3\xa9");
  const auto u16 = utf8_to_utf16("a\xf0\x9f\x90\xb1").value();
  EXPECT_EQ(u16, (std::u16string{u'a', char16_t(0xD83D), char16_t(0xDC31)}));
  EXPECT_EQ(utf16_to_utf8(u16), "a\xf0\x9f\x90\xb1");
  EXPECT_EQ(utf16_to_utf8(std::u16string{char16_t(0xD800)}), "\xef\xbf\xbd");  // lone surrogate -> U+FFFD
}

}  // namespace
}  // namespace atelier
