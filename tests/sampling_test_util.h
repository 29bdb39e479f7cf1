// Helpers shared by the sampling tests.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "sampling/sampler.h"

namespace atelier::sampling {

using nlohmann::json;

inline std::unique_ptr<Sampler> make(const json& cfg, std::string_view name, int steps, const json& overrides = json::object()) {
  auto s = make_sampler(cfg, name, steps, overrides);
  EXPECT_TRUE(s.has_value()) << name << ": " << s.status().message();
  return s ? std::move(s).value() : nullptr;
}

// Deterministic standard-normal noise per sample.
inline NoiseSource gaussian_source(uint32_t seed) {
  auto gen = std::make_shared<std::mt19937>(seed);
  return [gen](const Shape& shape) {
    std::normal_distribution<float> nd;
    std::vector<float> v(size_t(numel_of(shape)));
    for (float& x : v) x = nd(*gen);
    return Tensor::from_vector(v, shape);
  };
}

// The (alpha, sigma) with model input = alpha * x0 + sigma * eps for the sampler's next call.
inline std::pair<double, double> model_noise_level(const Sampler& s) {
  const ModelCall call = s.next_call();
  if (s.kind() == SamplerKind::kDDIM || s.kind() == SamplerKind::kLCM) {
    const double a = s.train_schedule().alphas_cumprod[size_t(call.timestep)];
    return {std::sqrt(a), std::sqrt(1 - a)};
  }
  const double sig = s.sigmas()[size_t(call.index)];
  return {1 / std::sqrt(sig * sig + 1), sig / std::sqrt(sig * sig + 1)};
}

}  // namespace atelier::sampling
