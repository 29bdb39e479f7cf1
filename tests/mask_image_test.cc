// The 8-bit image operations of inpainting (pipeline/mask_image.h) and A1111's resize modes (pipeline/image_resize.h),
// against values worked out by hand from A1111's / PIL's / OpenCV's definitions.
#include <gtest/gtest.h>

#include <cmath>

#include "pipeline/image_resize.h"
#include "pipeline/mask_image.h"

namespace atelier {
namespace {

Image solid(int w, int h, int channels, std::initializer_list<uint8_t> value) {
  Image img;
  img.width = w;
  img.height = h;
  img.channels = channels;
  for (int i = 0; i < w * h; ++i) img.pixels.insert(img.pixels.end(), value.begin(), value.end());
  return img;
}

uint8_t& px(Image& img, int x, int y, int c = 0) { return img.pixels[(size_t(y) * img.width + x) * img.channels + c]; }
uint8_t at(const Image& img, int x, int y, int c = 0) { return img.pixels[(size_t(y) * img.width + x) * img.channels + c]; }

TEST(MaskImage, UploadGivesLumaUnlessItsAlphaIsAMask) {
  Image rgb = solid(2, 1, 3, {255, 0, 0});
  px(rgb, 1, 0, 1) = 255;  // (255, 255, 0)
  const Image luma = mask_from_upload(rgb, true);
  ASSERT_EQ(luma.channels, 1);
  EXPECT_EQ(at(luma, 0, 0), 76);   // (19595 * 255 + 2^15) >> 16
  EXPECT_EQ(at(luma, 1, 0), 226);  // ((19595 + 38470) * 255 + 2^15) >> 16
  // RGBA with every alpha opaque: still the luma. With a transparent pixel: the alpha, thresholded at > 128.
  Image rgba = solid(3, 1, 4, {255, 255, 255, 255});
  EXPECT_EQ(at(mask_from_upload(rgba, true), 0, 0), 255);
  px(rgba, 0, 0, 3) = 0;
  px(rgba, 1, 0, 3) = 128;
  px(rgba, 2, 0, 3) = 129;
  const Image alpha = mask_from_upload(rgba, true);
  EXPECT_EQ(at(alpha, 0, 0), 0);
  EXPECT_EQ(at(alpha, 1, 0), 0);
  EXPECT_EQ(at(alpha, 2, 0), 255);
  EXPECT_EQ(at(mask_from_upload(rgba, false), 1, 0), 128);  // mask_round off: the alpha as it is
  EXPECT_EQ(at(invert_mask(alpha), 2, 0), 0);
}

TEST(MaskImage, BlurIsOpenCvsGaussianWithReflectedBorders) {
  // One white pixel in the middle of a 41-pixel line, sigma 2: k = 2 * int(5.5) + 1 = 11 taps of exp(-d^2 / 8).
  Image line = solid(41, 1, 1, {0});
  px(line, 20, 0) = 255;
  const Image b = blur_mask(line, 2, 0);
  double sum = 0;
  for (int d = -5; d <= 5; ++d) sum += std::exp(-d * d / 8.0);
  for (int d = -5; d <= 5; ++d) EXPECT_EQ(at(b, 20 + d, 0), std::lround(255 * std::exp(-d * d / 8.0) / sum)) << d;
  EXPECT_EQ(at(b, 14, 0), 0);  // beyond the kernel
  EXPECT_EQ(blur_mask(line, 0, 3).pixels, line.pixels);  // a one-row image: the vertical pass reflects onto itself
  // At the border the kernel reflects (101: gfedcb|abcdefgh): pixel 0 reads pixel 1 on both sides.
  Image edge = solid(20, 1, 1, {0});
  px(edge, 1, 0) = 100;
  EXPECT_EQ(at(blur_mask(edge, 2, 0), 0, 0), std::lround(100 * 2 * std::exp(-1 / 8.0) / sum));
  // ... and pixel 1 reads itself, and again two to the left (index -1 reflects to 1).
  EXPECT_EQ(at(blur_mask(edge, 2, 0), 1, 0), std::lround(100 * (1 + std::exp(-4 / 8.0)) / sum));
}

TEST(MaskImage, CropRegionIsTheMaskBoxPaddedThenGrownToTheRatio) {
  Image m = solid(100, 80, 1, {0});
  EXPECT_EQ(mask_bounds(m, 8).width(), 0);  // nothing masked
  for (int y = 30; y < 40; ++y)
    for (int x = 40; x < 60; ++x) px(m, x, y) = 200;
  EXPECT_EQ(mask_bounds(m, 0), (PixelBox{40, 30, 60, 40}));
  EXPECT_EQ(mask_bounds(m, 35), (PixelBox{5, 0, 95, 75}));  // clipped at the top
  // 20x10 to a square: 10 rows more, 5 above and 5 below.
  EXPECT_EQ(expand_to_ratio({40, 30, 60, 40}, 64, 64, 100, 80), (PixelBox{40, 25, 60, 45}));
  // 20x10 to 1:2 (width 32, height 64): the height wants 40, 30 more: 15 up, 15 down.
  EXPECT_EQ(expand_to_ratio({40, 30, 60, 40}, 32, 64, 100, 80), (PixelBox{40, 15, 60, 55}));
  // Near the bottom edge it slides up: rows 70-80 grown to 20 rows -> 60-80.
  EXPECT_EQ(expand_to_ratio({40, 70, 60, 80}, 64, 64, 100, 80), (PixelBox{40, 60, 60, 80}));
  // 10x20 to 2:1: the width wants 40, 30 more columns; at the left edge it slides right.
  EXPECT_EQ(expand_to_ratio({0, 30, 10, 50}, 64, 32, 100, 80), (PixelBox{0, 30, 40, 50}));
  const Image c = crop_image(m, {38, 29, 42, 31});
  ASSERT_EQ(c.width, 4);
  EXPECT_EQ(at(c, 1, 0), 0);
  EXPECT_EQ(at(c, 2, 1), 200);
}

TEST(MaskImage, ResizeModesCropOrFillTheOtherAspectRatio) {
  // A 4x2 image whose columns are 10, 20, 30, 40, into 2x2.
  Image wide = solid(4, 2, 1, {0});
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 4; ++x) px(wide, x, y) = uint8_t(10 * (x + 1));
  const Image cropped = resize_image(wide, 2, 2, ResizeMode::kCropAndResize);  // the middle two columns
  EXPECT_EQ(at(cropped, 0, 0), 20);
  EXPECT_EQ(at(cropped, 1, 1), 30);
  // Fill: scaled to 2x1 (fits the width) in the middle row... of a 2x4 target: rows 0 and 3 repeat the edge rows.
  const Image filled = resize_image(wide, 2, 4, ResizeMode::kResizeAndFill);
  ASSERT_EQ(filled.height, 4);
  for (int x = 0; x < 2; ++x) {
    EXPECT_EQ(at(filled, x, 0), at(filled, x, 1)) << "top band repeats the first row";
    EXPECT_EQ(at(filled, x, 3), at(filled, x, 2)) << "bottom band repeats the last row";
  }
  EXPECT_LT(at(filled, 0, 1), at(filled, 1, 1));  // still the image's left-to-right ramp
  EXPECT_EQ(resize_image(wide, 2, 2, ResizeMode::kResize).width, 2);
  EXPECT_TRUE(parse_resize_mode("crop").has_value());
  EXPECT_FALSE(parse_resize_mode("latent").has_value());
}

TEST(MaskImage, FillPaintsTheMaskedAreaWithTheColoursAroundIt) {
  Image rgb = solid(32, 32, 3, {200, 100, 50});
  Image mask = solid(32, 32, 1, {0});
  for (int y = 10; y < 20; ++y)
    for (int x = 10; x < 20; ++x) {
      px(mask, x, y) = 255;
      for (int c = 0; c < 3; ++c) px(rgb, x, y, c) = 0;  // black under the mask: the fill must not show it
    }
  const Image filled = fill_masked_area(rgb, mask);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(at(filled, 15, 15, c), at(rgb, 0, 0, c), 1) << c;
    EXPECT_EQ(at(filled, 2, 2, c), at(rgb, 2, 2, c)) << "unmasked pixels keep their colour";
  }
}

TEST(MaskImage, CompositeTakesTheTopWhereTheAlphaIsFull) {
  const Image bottom = solid(3, 1, 3, {0, 0, 0}), top = solid(3, 1, 3, {200, 100, 255});
  Image alpha = solid(3, 1, 1, {0});
  px(alpha, 1, 0) = 255;
  px(alpha, 2, 0) = 128;
  const Image out = composite(bottom, top, alpha);
  EXPECT_EQ(at(out, 0, 0, 0), 0);
  EXPECT_EQ(at(out, 1, 0, 0), 200);
  EXPECT_EQ(at(out, 2, 0, 0), std::lround(200 * 128 / 255.0));
  EXPECT_EQ(at(out, 2, 0, 2), 128);
}

}  // namespace
}  // namespace atelier
