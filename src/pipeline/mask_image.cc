#include "pipeline/mask_image.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

namespace atelier {
namespace {

constexpr int kOpaque = 255;
constexpr int kAlphaThreshold = 128;     // create_binary_mask: alpha > 128 is masked
constexpr double kBlurKernelSigmas = 2.5;  // A1111's kernel size: 2 * int(2.5 * sigma + 0.5) + 1
constexpr int kBoxBlurPasses = 3;        // PIL's GaussianBlur: an extended box blur, three passes
// masking.fill: (Gaussian radius, times composited), from the widest to the unblurred pixels.
constexpr std::array<std::pair<double, int>, 6> kFillLayers = {{{256, 1}, {64, 1}, {16, 2}, {4, 4}, {2, 2}, {0, 1}}};

uint8_t to_u8(double v) { return uint8_t(std::clamp(std::lround(v), 0L, 255L)); }

Image gray_image(int width, int height) {
  Image g;
  g.width = width;
  g.height = height;
  g.channels = 1;
  g.pixels.assign(size_t(width) * height, 0);
  return g;
}

// Index i of a line of n values with BORDER_REFLECT_101 (gfedcb|abcdefgh|gfedcba), reflected as often as needed.
int reflect101(int i, int n) {
  if (n == 1) return 0;
  while (i < 0 || i >= n) i = i < 0 ? -i : 2 * n - 2 - i;
  return i;
}

// One pass of a normalised Gaussian (sigma, k taps) along x (horizontal) or y of a one-channel image.
Image gaussian_pass(const Image& src, double sigma, bool horizontal) {
  const int k = 2 * int(kBlurKernelSigmas * sigma + 0.5) + 1, half = k / 2;
  std::vector<double> w(static_cast<size_t>(k));
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += w[size_t(i)] = std::exp(-double((i - half) * (i - half)) / (2 * sigma * sigma));
  for (double& v : w) v /= sum;
  Image out = gray_image(src.width, src.height);
#pragma omp parallel for schedule(static)
  for (int y = 0; y < src.height; ++y)
    for (int x = 0; x < src.width; ++x) {
      double acc = 0;
      for (int i = 0; i < k; ++i) {
        const int sx = horizontal ? reflect101(x + i - half, src.width) : x;
        const int sy = horizontal ? y : reflect101(y + i - half, src.height);
        acc += w[size_t(i)] * src.pixels[size_t(sy) * src.width + sx];
      }
      out.pixels[size_t(y) * src.width + x] = to_u8(acc);
    }
  return out;
}

// A float image of C channels (row-major HWC), for the fill's premultiplied layers.
struct FloatImage {
  int width = 0, height = 0, channels = 0;
  std::vector<double> v;
  double& at(int x, int y, int c) { return v[(size_t(y) * width + x) * channels + c]; }
};

// One extended box blur pass of radius r = l + a along one axis: the 2l + 1 values around each one plus a times the
// next one on each side, over 2r + 1; the edge values repeat beyond the edges.
void box_pass(FloatImage& img, double r, bool horizontal) {
  const int l = int(std::floor(r));
  const double a = r - l, norm = 1.0 / (2.0 * r + 1.0);
  const int n = horizontal ? img.width : img.height, lines = horizontal ? img.height : img.width;
#pragma omp parallel for schedule(static)
  for (int li = 0; li < lines; ++li) {
    std::vector<double> line(static_cast<size_t>(n)), prefix(static_cast<size_t>(n) + 1);
    for (int c = 0; c < img.channels; ++c) {
      for (int i = 0; i < n; ++i) line[size_t(i)] = horizontal ? img.at(i, li, c) : img.at(li, i, c);
      prefix[0] = 0;
      for (int i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + line[size_t(i)];
      // Sum of line[clamp(j)] for j in [lo, hi]: the in-range part from the prefix sums, the rest as edge copies.
      const auto span_sum = [&](int lo, int hi) {
        double s = 0;
        if (lo < 0) s += double(std::min(hi, -1) - lo + 1) * line.front();
        if (hi >= n) s += double(hi - std::max(lo, n)+ 1) * line.back();
        const int a0 = std::max(lo, 0), a1 = std::min(hi, n - 1);
        if (a1 >= a0) s += prefix[size_t(a1) + 1] - prefix[size_t(a0)];
        return s;
      };
      const auto value = [&](int j) { return line[size_t(std::clamp(j, 0, n - 1))]; };
      for (int i = 0; i < n; ++i) {
        const double s = span_sum(i - l, i + l) + a * (value(i - l - 1) + value(i + l + 1));
        if (horizontal) img.at(i, li, c) = s * norm;
        else img.at(li, i, c) = s * norm;
      }
    }
  }
}

// PIL's GaussianBlur(radius): three extended box blurs whose variance sums to radius^2.
void gaussian_blur(FloatImage& img, double radius) {
  if (radius <= 0) return;
  const double sigma2 = radius * radius / kBoxBlurPasses;
  const double big_l = std::sqrt(12.0 * sigma2 + 1.0);
  const double l = std::floor((big_l - 1.0) / 2.0);
  const double a = (2 * l + 1) * (l * (l + 1) - 3 * sigma2) / (6 * (sigma2 - (l + 1) * (l + 1)));
  for (int p = 0; p < kBoxBlurPasses; ++p) box_pass(img, l + a, true);
  for (int p = 0; p < kBoxBlurPasses; ++p) box_pass(img, l + a, false);
}

}  // namespace

Image mask_from_upload(const Image& upload, bool round_alpha) {
  Image g = gray_image(upload.width, upload.height);
  const int c = upload.channels;
  const size_t n = size_t(upload.width) * upload.height;
  bool alpha_mask = false;
  if (c == 4)
    for (size_t i = 0; i < n && !alpha_mask; ++i) alpha_mask = upload.pixels[i * 4 + 3] != kOpaque;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &upload.pixels[i * size_t(c)];
    if (alpha_mask) g.pixels[i] = round_alpha ? (p[3] > kAlphaThreshold ? 255 : 0) : p[3];
    else if (c >= 3) g.pixels[i] = uint8_t((19595u * p[0] + 38470u * p[1] + 7471u * p[2] + 0x8000u) >> 16);
    else g.pixels[i] = p[0];
  }
  return g;
}

Image invert_mask(const Image& mask) {
  Image out = mask;
  for (uint8_t& v : out.pixels) v = uint8_t(255 - v);
  return out;
}

Image blur_mask(const Image& mask, int sigma_x, int sigma_y) {
  Image out = mask;
  if (sigma_x > 0) out = gaussian_pass(out, sigma_x, true);
  if (sigma_y > 0) out = gaussian_pass(out, sigma_y, false);
  return out;
}

PixelBox mask_bounds(const Image& mask, int padding) {
  PixelBox b{mask.width, mask.height, 0, 0};
  for (int y = 0; y < mask.height; ++y)
    for (int x = 0; x < mask.width; ++x)
      if (mask.pixels[size_t(y) * mask.width + x] != 0) {
        b = {std::min(b.x1, x), std::min(b.y1, y), std::max(b.x2, x + 1), std::max(b.y2, y + 1)};
      }
  if (b.x2 == 0) return {};
  return {std::max(b.x1 - padding, 0), std::max(b.y1 - padding, 0), std::min(b.x2 + padding, mask.width),
          std::min(b.y2 + padding, mask.height)};
}

PixelBox expand_to_ratio(PixelBox box, int width, int height, int image_w, int image_h) {
  const double ratio = double(width) / height;
  const bool taller = double(box.width()) / box.height() > ratio;  // too wide: grow the height
  int& lo = taller ? box.y1 : box.x1;
  int& hi = taller ? box.y2 : box.x2;
  const int limit = taller ? image_h : image_w;
  const double desired = taller ? box.width() / ratio : box.height() * ratio;
  const int diff = int(desired - (hi - lo));
  lo -= diff / 2;
  hi += diff - diff / 2;
  if (hi >= limit) {  // slide back inside, then clip what still does not fit
    lo -= hi - limit;
    hi = limit;
  }
  if (lo < 0) {
    hi -= lo;
    lo = 0;
  }
  hi = std::min(hi, limit);
  return box;
}

Image crop_image(const Image& img, const PixelBox& box) {
  Image out;
  out.width = box.width();
  out.height = box.height();
  out.channels = img.channels;
  out.pixels.resize(size_t(out.width) * out.height * img.channels);
  const size_t row = size_t(out.width) * img.channels;
  for (int y = 0; y < out.height; ++y)
    std::copy_n(&img.pixels[(size_t(box.y1 + y) * img.width + box.x1) * img.channels], row, &out.pixels[size_t(y) * row]);
  return out;
}

Image fill_masked_area(const Image& rgb, const Image& mask) {
  const int w = rgb.width, h = rgb.height;
  // The unmasked pixels, premultiplied by their opacity 255 - mask (PIL "RGBa").
  FloatImage kept{w, h, 4, std::vector<double>(size_t(w) * h * 4)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const double alpha = 255 - mask.pixels[size_t(y) * w + x];
      for (int c = 0; c < 3; ++c) kept.at(x, y, c) = rgb.pixels[(size_t(y) * w + x) * 3 + c] * alpha / 255.0;
      kept.at(x, y, 3) = alpha;
    }
  FloatImage acc{w, h, 4, std::vector<double>(size_t(w) * h * 4, 0.0)};  // straight RGBA, transparent at first
  for (const auto& [radius, repeats] : kFillLayers) {
    FloatImage layer = kept;
    gaussian_blur(layer, radius);
#pragma omp parallel for schedule(static)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const double sa = layer.at(x, y, 3) / 255.0;
        for (int rep = 0; rep < repeats; ++rep) {
          const double da = acc.at(x, y, 3) / 255.0, oa = sa + da * (1 - sa);
          for (int c = 0; c < 3 && oa > 0; ++c) {
            const double src = sa > 0 ? layer.at(x, y, c) / sa : 0.0;  // un-premultiplied
            acc.at(x, y, c) = (src * sa + acc.at(x, y, c) * da * (1 - sa)) / oa;
          }
          acc.at(x, y, 3) = oa * 255.0;
        }
      }
  }
  Image out = rgb;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) out.pixels[(size_t(y) * w + x) * 3 + c] = to_u8(acc.at(x, y, c));
  return out;
}

Image composite(const Image& bottom, const Image& top, const Image& alpha) {
  Image out = bottom;
  const size_t n = size_t(bottom.width) * bottom.height;
  for (size_t i = 0; i < n; ++i) {
    const int a = alpha.pixels[i];
    for (int c = 0; c < 3; ++c)
      out.pixels[i * 3 + c] = to_u8((double(top.pixels[i * 3 + c]) * a + double(bottom.pixels[i * 3 + c]) * (255 - a)) / 255.0);
  }
  return out;
}

}  // namespace atelier
