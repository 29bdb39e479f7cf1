// The wgmma building blocks (cuda_wgmma.cuh) on the GPU: one warpgroup's C[64 x 64] = A[64 x K] x B against a
// double-precision product of the same bf16 values, for A from shared memory or registers, B K-major or
// MN-major, K of one or two atom columns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "backend/cuda/cuda_wgmma_check.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace atelier {
namespace {

TEST(CudaWgmma, ProductsMatchADoubleReference) {
  ATELIER_REQUIRE_CUDA();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int k : {64, 128})
    for (bool regs : {false, true})
      for (bool mn : {false, true}) {
        std::vector<uint16_t> a(size_t(64) * k), b(size_t(64) * k);
        for (auto& x : a) x = float_to_bf16(normal(rng));
        for (auto& x : b) x = float_to_bf16(normal(rng));
        std::string why;
        const std::vector<float> c = cuda::wgmma_check({k, regs, mn}, a, b, &why);
        if (c.empty()) GTEST_SKIP() << why;
        double worst = 0, scale = 0;
        for (int i = 0; i < 64; ++i)
          for (int j = 0; j < 64; ++j) {
            double want = 0;
            for (int kk = 0; kk < k; ++kk) {
              const float bv = mn ? bf16_to_float(b[size_t(kk) * 64 + j]) : bf16_to_float(b[size_t(j) * k + kk]);
              want += double(bf16_to_float(a[size_t(i) * k + kk])) * bv;
            }
            worst = std::max(worst, std::abs(double(c[size_t(i) * 64 + j]) - want));
            scale = std::max(scale, std::abs(want));
          }
        std::printf("[ figures  ] wgmma k %d, A from %s, B %s: max |error| %.3g (largest |C| %.3g)\n", k,
                    regs ? "registers" : "shared memory", mn ? "MN-major" : "K-major", worst, scale);
        EXPECT_LT(worst, 1e-4 * scale) << "k " << k << (regs ? " A regs" : " A smem") << (mn ? " B MN-major" : " B K-major");
      }
}

}  // namespace
}  // namespace atelier
