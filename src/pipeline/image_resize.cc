#include "pipeline/image_resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace atelier {
namespace {

constexpr double kLanczosLobes = 3.0;
constexpr double kBicubicSupport = 2.0;
constexpr double kBicubicA = -0.5;  // PIL's (Keys' cubic with a = -0.5)
constexpr double kPi = 3.14159265358979323846;

double sinc(double x) { return x == 0.0 ? 1.0 : std::sin(kPi * x) / (kPi * x); }
double lanczos(double x) { return std::abs(x) < kLanczosLobes ? sinc(x) * sinc(x / kLanczosLobes) : 0.0; }
double bicubic(double x) {
  x = std::abs(x);
  if (x < 1.0) return ((kBicubicA + 2.0) * x - (kBicubicA + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * kBicubicA;
  return 0.0;
}

struct Taps {
  int first = 0;
  std::vector<double> w;
};

// For each output coordinate: the input range and normalised weights (support widened when shrinking).
std::vector<Taps> make_taps(int in, int out, ResizeFilter filter) {
  const bool cubic = filter == ResizeFilter::kBicubic;
  const double scale = double(in) / out;
  const double support = (cubic ? kBicubicSupport : kLanczosLobes) * std::max(1.0, scale);
  const double filter_scale = std::max(1.0, scale);
  std::vector<Taps> taps{size_t(out)};
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    const int lo = std::max(0, int(std::floor(center - support)));
    const int hi = std::min(in, int(std::ceil(center + support)));
    Taps& t = taps[size_t(o)];
    t.first = lo;
    double sum = 0;
    for (int i = lo; i < hi; ++i) {
      const double u = (i + 0.5 - center) / filter_scale;
      const double w = cubic ? bicubic(u) : lanczos(u);
      t.w.push_back(w);
      sum += w;
    }
    for (double& w : t.w) w /= sum == 0 ? 1.0 : sum;
  }
  return taps;
}

}  // namespace

Image resize_image(const Image& src, int width, int height, ResizeFilter filter) {
  if (src.width == width && src.height == height) return src;
  const int c = src.channels;
  const auto tx = make_taps(src.width, width, filter), ty = make_taps(src.height, height, filter);
  std::vector<double> tmp(size_t(src.height) * width * c);  // horizontal pass
  for (int y = 0; y < src.height; ++y)
    for (int x = 0; x < width; ++x)
      for (int ch = 0; ch < c; ++ch) {
        double acc = 0;
        const Taps& t = tx[size_t(x)];
        for (size_t k = 0; k < t.w.size(); ++k)
          acc += t.w[k] * src.pixels[(size_t(y) * src.width + t.first + k) * c + ch];
        tmp[(size_t(y) * width + x) * c + ch] = acc;
      }
  Image out;
  out.width = width;
  out.height = height;
  out.channels = c;
  out.pixels.resize(size_t(width) * height * c);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int ch = 0; ch < c; ++ch) {
        double acc = 0;
        const Taps& t = ty[size_t(y)];
        for (size_t k = 0; k < t.w.size(); ++k) acc += t.w[k] * tmp[(size_t(t.first + k) * width + x) * c + ch];
        out.pixels[(size_t(y) * width + x) * c + ch] = uint8_t(std::clamp(std::lround(acc), 0L, 255L));
      }
  return out;
}

Expected<ResizeMode> parse_resize_mode(const std::string& name) {
  for (ResizeMode m : {ResizeMode::kResize, ResizeMode::kCropAndResize, ResizeMode::kResizeAndFill})
    if (name == resize_mode_name(m)) return m;
  return invalid_argument("unknown resize mode '" + name +
                          "': supported are resize (stretch to the size), crop (cover it, cut the overflow) and "
                          "fill (fit inside it, fill the bands with the edges)");
}

const char* resize_mode_name(ResizeMode mode) {
  switch (mode) {
    case ResizeMode::kCropAndResize: return "crop";
    case ResizeMode::kResizeAndFill: return "fill";
    case ResizeMode::kResize: break;
  }
  return "resize";
}

namespace {

// Copies `src` into `dst` with its top-left corner at (x0, y0); what falls outside `dst` is cut off.
void paste(const Image& src, Image& dst, int x0, int y0) {
  const int c = dst.channels;
  for (int y = std::max(0, y0); y < std::min(dst.height, y0 + src.height); ++y)
    for (int x = std::max(0, x0); x < std::min(dst.width, x0 + src.width); ++x)
      for (int ch = 0; ch < c; ++ch)
        dst.pixels[(size_t(y) * dst.width + x) * c + ch] = src.pixels[(size_t(y - y0) * src.width + (x - x0)) * c + ch];
}

// Rows [y_begin, y_end) of `img` become copies of row `from` (columns likewise when `columns`).
void replicate_edge(Image& img, bool columns, int begin, int end, int from) {
  const int c = img.channels;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) {
      const int along = columns ? x : y;
      if (along < begin || along >= end) continue;
      const int sx = columns ? from : x, sy = columns ? y : from;
      for (int ch = 0; ch < c; ++ch)
        img.pixels[(size_t(y) * img.width + x) * c + ch] = img.pixels[(size_t(sy) * img.width + sx) * c + ch];
    }
}

}  // namespace

Image resize_image(const Image& src, int width, int height, ResizeMode mode) {
  if (mode == ResizeMode::kResize) return resize_image(src, width, height);
  // A1111's images.resize_image: the scaled size in integers (floor), centred with floor offsets.
  const double ratio = double(width) / height, src_ratio = double(src.width) / src.height;
  const bool cover = mode == ResizeMode::kCropAndResize;
  const bool by_width = cover ? ratio > src_ratio : ratio < src_ratio;  // the width matches; the height follows
  const int w = by_width ? width : std::max(1, int(int64_t(src.width) * height / src.height));
  const int h = by_width ? std::max(1, int(int64_t(src.height) * width / src.width)) : height;
  Image out;
  out.width = width;
  out.height = height;
  out.channels = src.channels;
  out.pixels.assign(size_t(width) * height * src.channels, 0);
  const int x0 = width / 2 - w / 2, y0 = height / 2 - h / 2;
  paste(resize_image(src, w, h), out, x0, y0);
  if (cover || ratio == src_ratio) return out;
  // The empty bands repeat the image's first and last rows (columns): PIL's resize of a zero-height box.
  if (by_width && y0 > 0) {
    replicate_edge(out, false, 0, y0, y0);
    replicate_edge(out, false, y0 + h, height, y0 + h - 1);
  } else if (!by_width && x0 > 0) {
    replicate_edge(out, true, 0, x0, x0);
    replicate_edge(out, true, x0 + w, width, x0 + w - 1);
  }
  return out;
}

}  // namespace atelier
