// Helpers for the op tests: random tensors, double-precision reference data, strided views.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "test_util.h"

namespace atelier::test {

// The op tests' tolerance against double references (f32 results, f32 rounding only).
constexpr double kOpsTol = 1e-5;

inline Tensor random_tensor(const Shape& shape, uint32_t seed, float scale = 1.0f, float offset = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(size_t(numel_of(shape)));
  for (float& x : v) x = offset + scale * dist(rng);
  return Tensor::from_vector(v, shape);
}

inline std::vector<double> to_double(const Tensor& t) {
  const std::vector<float> f = t.to_vector();
  return std::vector<double>(f.begin(), f.end());
}

inline std::vector<float> to_float(const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); }

// rel L2 of a tensor against a double reference.
inline double rel_err(const Tensor& actual, const std::vector<double>& expected) {
  return rel_l2(actual.to_vector(), to_float(expected));
}

// A non-contiguous tensor with the same logical values as `x`: stored transposed (last two dims swapped)
// and viewed back, so strides differ but values agree.
inline Tensor strided_copy(const Tensor& x) {
  const int r = int(x.dim());
  Tensor stored = ops::contiguous(x.transpose(r - 2, r - 1));  // [..., W, H] packed
  return stored.transpose(r - 2, r - 1);                        // [..., H, W] strided view
}

}  // namespace atelier::test

// Streams like EXPECT_LE: EXPECT_OPS_CLOSE(out, ref) << "context"; prints the rel L2 on failure.
#define EXPECT_OPS_CLOSE(actual, expected) \
  EXPECT_LE(::atelier::test::rel_err((actual), (expected)), ::atelier::test::kOpsTol)
