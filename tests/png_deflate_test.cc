// The PNG encoder's parallel image data (io/png_deflate.h): the zlib stream inflates to its input at every size,
// does not depend on the thread count, compresses as well as one stream, and the files it makes decode (by
// libpng) to the pixels that went in and are no larger than libpng's own.
#include "io/png_deflate.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "io/image.h"
#include "libpng_reference.h"

namespace atelier {
namespace {

// zlib's own one-thread inflate: checks the header and the Adler-32 trailer too.
std::string inflate_all(const std::string& stream, size_t expected_size) {
  std::string out(expected_size + 1, '\0');  // one spare byte: a longer result shows as a size mismatch
  uLongf n = uLongf(out.size());
  const int rc = uncompress(reinterpret_cast<Bytef*>(out.data()), &n, reinterpret_cast<const Bytef*>(stream.data()),
                            uLong(stream.size()));
  EXPECT_EQ(rc, Z_OK) << "zlib uncompress";
  out.resize(n);
  return out;
}

// data -> one zlib stream on one thread (the size to match).
size_t one_stream_size(const std::string& data, int level, int strategy) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, level, Z_DEFLATED, 15, 8, strategy), Z_OK);
  std::string out(deflateBound(&zs, uLong(data.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = uInt(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  const size_t n = out.size() - zs.avail_out;
  deflateEnd(&zs);
  return n;
}

// Bytes that compress like image rows: a slow wave plus a little noise.
std::string wavy_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(-3, 3);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char(128 + int(90 * std::sin(double(i) * 0.003)) + noise(rng));
  return s;
}

// A photo-like RGB image: smooth shading, an edge, texture and sensor noise.
Image photo_like(int w, int h, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0.0, 2.0);
  Image img{w, h, 3, std::vector<uint8_t>(size_t(w) * h * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < 3; ++k) {
        const double shade = 60 + 100.0 * x / w + 40 * std::sin(y * 0.02 + k);
        const double edge = x > w / 3 + y / 4 ? 30 : 0;
        const double texture = 12 * std::sin(x * 0.3) * std::cos(y * 0.25 + k);
        const double v = shade + edge + texture + noise(rng);
        img.pixels[(size_t(y) * w + x) * 3 + k] = uint8_t(std::clamp(v, 0.0, 255.0));
      }
  return img;
}

TEST(PngDeflate, StreamInflatesToItsInputAtEverySize) {
  const size_t strip = kDeflateStripBytes;
  for (size_t n : {size_t(0), size_t(1), size_t(1000), strip - 1, strip, strip + 1, 3 * strip + 12345}) {
    const std::string data = wavy_bytes(n, uint32_t(n));
    for (int level : {0, 1, kPngDeflateLevel, 9}) {
      auto z = zlib_compress_parallel(data, level, Z_FILTERED);
      ASSERT_TRUE(z.has_value()) << z.status().message();
      EXPECT_EQ(inflate_all(*z, n), data) << n << " bytes at level " << level;
    }
  }
}

TEST(PngDeflate, RefusesLevelsZlibDoesNotHave) {
  EXPECT_FALSE(zlib_compress_parallel("abc", 10, Z_DEFAULT_STRATEGY).has_value());
  EXPECT_FALSE(zlib_compress_parallel("abc", -2, Z_DEFAULT_STRATEGY).has_value());
}

TEST(PngDeflate, BytesDoNotDependOnTheThreadCount) {
  const std::string data = wavy_bytes(5 * kDeflateStripBytes + 777, 7);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto one = zlib_compress_parallel(data, kPngDeflateLevel, Z_FILTERED);
  omp_set_num_threads(4);
  auto four = zlib_compress_parallel(data, kPngDeflateLevel, Z_FILTERED);
  omp_set_num_threads(saved);
  ASSERT_TRUE(one.has_value() && four.has_value());
  EXPECT_EQ(*one, *four);
}

// Each strip is primed with the 32 KiB before it: data that repeats a block shorter than the window compresses
// as well split as whole. Unprimed strips would each spell the block out again (8 KiB per strip here).
TEST(PngDeflate, StripsSeeTheWindowBeforeThem) {
  constexpr size_t kBlock = 8 << 10;
  const std::string block = wavy_bytes(kBlock, 3) + std::string("seed-dependent tail");
  std::string data;
  while (data.size() < 8 * kDeflateStripBytes) data += block;
  auto z = zlib_compress_parallel(data, kPngDeflateLevel, Z_DEFAULT_STRATEGY);
  ASSERT_TRUE(z.has_value());
  const size_t whole = one_stream_size(data, kPngDeflateLevel, Z_DEFAULT_STRATEGY);
  EXPECT_LE(z->size(), whole + 8 * 64) << "one stream: " << whole << " bytes";
  EXPECT_EQ(inflate_all(*z, data.size()), data);
}

TEST(PngDeflate, CompressesImageRowsAsWellAsOneStream) {
  const Image img = photo_like(640, 480, 11);
  const std::string rows = png_filter_rows(img.pixels.data(), img.width, img.height, img.channels);
  auto z = zlib_compress_parallel(rows, kPngDeflateLevel, Z_FILTERED);
  ASSERT_TRUE(z.has_value());
  const size_t whole = one_stream_size(rows, kPngDeflateLevel, Z_FILTERED);
  EXPECT_LE(double(z->size()), 1.002 * double(whole)) << "one stream: " << whole << " bytes";
}

// Columns of constant colour: below the first row, Up predicts every byte exactly (so does Paeth, which the
// specification's order puts after Up), so every such row must be filtered with Up.
TEST(PngFilter, RowsTakeTheFilterWithTheSmallestSignedSum) {
  constexpr int kW = 50, kH = 6, kC = 3;
  std::mt19937 rng(5);
  std::vector<uint8_t> column(kW * kC);
  for (auto& v : column) v = uint8_t(rng());
  std::vector<uint8_t> pixels;
  for (int y = 0; y < kH; ++y) pixels.insert(pixels.end(), column.begin(), column.end());
  const std::string rows = png_filter_rows(pixels.data(), kW, kH, kC);
  ASSERT_EQ(rows.size(), size_t(kH) * (1 + kW * kC));
  for (int y = 1; y < kH; ++y) {
    const size_t at = size_t(y) * (1 + kW * kC);
    EXPECT_EQ(int(rows[at]), 2) << "row " << y;
    EXPECT_EQ(rows.substr(at + 1, kW * kC), std::string(kW * kC, '\0')) << "row " << y;
  }
}

TEST(PngDeflate, FilesDecodeToTheirPixelsAndAreNoLargerThanLibpngs) {
  for (int c = 1; c <= 4; ++c) {
    Image img = photo_like(701, 301, uint32_t(c));  // 5 strips of image data as RGB
    if (c != 3) {
      Image other{img.width, img.height, c, std::vector<uint8_t>(size_t(img.width) * img.height * c)};
      for (size_t p = 0; p < size_t(img.width) * img.height; ++p)
        for (int k = 0; k < c; ++k) other.pixels[p * c + k] = img.pixels[p * 3 + k % 3];
      img = std::move(other);
    }
    auto bytes = encode_png(img, {{kInfotextKey, "a photo, Steps: 20"}});
    ASSERT_TRUE(bytes.has_value()) << bytes.status().message();
    auto back = decode_image(*bytes);
    ASSERT_TRUE(back.has_value()) << back.status().message();
    EXPECT_EQ(back->channels, c);
    EXPECT_EQ(back->pixels, img.pixels) << "channels " << c;
    if (c != 3) continue;
    const std::string reference = test::libpng_encode_rgb(img);
    ASSERT_FALSE(reference.empty());
    EXPECT_LE(double(bytes->size()), 1.01 * double(reference.size()));
  }
}

}  // namespace
}  // namespace atelier
