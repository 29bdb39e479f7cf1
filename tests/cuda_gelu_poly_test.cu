// The device GELU's formula (gelu_erfc_poly, cuda_device.cuh) evaluated on the host against the exact GELU: its
// polynomial, clamp and select, in every CI run (the GPU tests compare the kernels with the CPU backend only on a GPU).
// On the device the exp2 is the MUFU's ex2.approx (about 2 ulp more), so the bounds below leave it room.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cuda/cuda_device.cuh"

namespace atelier {
namespace {

double exact_gelu(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }

// scripts/fit_gelu_erfc.py measures 6.7e-7 absolute and 6.4e-6 relative (|x| <= 5.5) for this form in float32.
TEST(CudaGeluPoly, MatchesTheExactGeluOnTheHost) {
  constexpr double kMaxAbs = 1e-6, kMaxRel = 1e-5, kRelRange = 5.5;
  constexpr int kPoints = 160001;  // [-8, 8] in steps of 1e-4
  double worst_abs = 0, worst_rel = 0;
  for (int i = 0; i < kPoints; ++i) {
    const float x = float(-8.0 + 16.0 * i / (kPoints - 1));
    const double got = cuda::gelu_erfc_poly(x), want = exact_gelu(x);
    worst_abs = std::max(worst_abs, std::abs(got - want));
    if (std::abs(x) <= kRelRange && want != 0) worst_rel = std::max(worst_rel, std::abs(got - want) / std::abs(want));
  }
  EXPECT_LE(worst_abs, kMaxAbs);
  EXPECT_LE(worst_rel, kMaxRel);
  EXPECT_EQ(cuda::gelu_erfc_poly(0.0f), 0.0f);
}

// As torch's GELU: +inf stays +inf, NaN stays NaN; large values are themselves (positive) or zero-ish (negative).
TEST(CudaGeluPoly, KeepsInfinityAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cuda::gelu_erfc_poly(inf), inf);
  EXPECT_TRUE(std::isnan(cuda::gelu_erfc_poly(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(cuda::gelu_erfc_poly(1e30f), 1e30f);
  EXPECT_LE(std::abs(cuda::gelu_erfc_poly(-1e3f)), 1e-4f);
}

}  // namespace
}  // namespace atelier
