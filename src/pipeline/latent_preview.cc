#include "pipeline/latent_preview.h"

#include <algorithm>
#include <cmath>

namespace atelier {
namespace {

constexpr int kLatentChannels = 4;
// RGB contribution of each latent channel for the SD 1.x/2.x VAE (the widely used "cheap approximation"
// factors); the result is an image in about [-1, 1].
constexpr float kLatentToRgb[kLatentChannels][3] = {
    {0.298f, 0.207f, 0.208f}, {0.187f, 0.286f, 0.173f}, {-0.158f, 0.189f, 0.264f}, {-0.184f, -0.271f, -0.473f}};

uint8_t to_byte(float v) {  // [-1, 1] -> [0, 255]
  if (!std::isfinite(v)) return 0;
  return uint8_t(std::lround(std::clamp((v + 1.0f) * 0.5f, 0.0f, 1.0f) * 255.0f));
}

}  // namespace

Expected<Image> latent_preview(const Tensor& latents) {
  const Shape& s = latents.shape();
  const bool batched = s.size() == 4;
  if (!(batched && s[0] == 1) && s.size() != 3)
    return invalid_argument("latent preview needs [1, 4, h, w] latents, got " + shape_str(s));
  const int64_t c = s[s.size() - 3], h = s[s.size() - 2], w = s[s.size() - 1];
  if (c != kLatentChannels) return unsupported("latent preview supports 4-channel latents, got " + std::to_string(c));
  const std::vector<float> v = latents.to_vector();
  const int k = std::max<int>(1, kPreviewMaxSide / int(std::max(h, w)));
  Image img;
  img.width = int(w) * k;
  img.height = int(h) * k;
  img.channels = 3;
  img.pixels.resize(size_t(img.width) * size_t(img.height) * 3);
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      float rgb[3] = {0, 0, 0};
      for (int ch = 0; ch < kLatentChannels; ++ch) {
        const float l = v[size_t((ch * h + y) * w + x)];
        for (int o = 0; o < 3; ++o) rgb[o] += l * kLatentToRgb[ch][o];
      }
      for (int dy = 0; dy < k; ++dy) {
        for (int dx = 0; dx < k; ++dx) {
          uint8_t* p = &img.pixels[(size_t(y * k + dy) * size_t(img.width) + size_t(x * k + dx)) * 3];
          for (int o = 0; o < 3; ++o) p[o] = to_byte(rgb[o]);
        }
      }
    }
  }
  return img;
}

}  // namespace atelier
