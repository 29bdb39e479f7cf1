#include "pipeline/image_resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace atelier {
namespace {

constexpr double kLanczosLobes = 3.0;
constexpr double kPi = 3.14159265358979323846;

double sinc(double x) { return x == 0.0 ? 1.0 : std::sin(kPi * x) / (kPi * x); }
double lanczos(double x) { return std::abs(x) < kLanczosLobes ? sinc(x) * sinc(x / kLanczosLobes) : 0.0; }

struct Taps {
  int first = 0;
  std::vector<double> w;
};

// For each output coordinate: the input range and normalised weights (support widened when shrinking).
std::vector<Taps> make_taps(int in, int out) {
  const double scale = double(in) / out;
  const double support = kLanczosLobes * std::max(1.0, scale);
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
      const double w = lanczos((i + 0.5 - center) / filter_scale);
      t.w.push_back(w);
      sum += w;
    }
    for (double& w : t.w) w /= sum == 0 ? 1.0 : sum;
  }
  return taps;
}

}  // namespace

Image resize_image(const Image& src, int width, int height) {
  if (src.width == width && src.height == height) return src;
  const int c = src.channels;
  const auto tx = make_taps(src.width, width), ty = make_taps(src.height, height);
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

}  // namespace atelier
