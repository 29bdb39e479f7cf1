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

// torch's formula of each unary op, in double: the reference for the f32 results of both backends.
inline double ref_unary(double x, UnaryOp op) {
  switch (op) {
    case UnaryOp::kIdentity: return x;
    case UnaryOp::kSilu: return x / (1.0 + std::exp(-x));
    case UnaryOp::kGelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case UnaryOp::kGeluTanh: return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case UnaryOp::kQuickGelu: return x / (1.0 + std::exp(-1.702 * x));
    case UnaryOp::kRelu: return x > 0 ? x : 0.0;
    case UnaryOp::kSigmoid: return 1.0 / (1.0 + std::exp(-x));
    case UnaryOp::kTanh: return std::tanh(x);
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kSqrt: return std::sqrt(x);
    case UnaryOp::kRsqrt: return 1.0 / std::sqrt(x);
    case UnaryOp::kSquare: return x * x;
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kSin: return std::sin(x);
    case UnaryOp::kCos: return std::cos(x);
  }
  return x;
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
