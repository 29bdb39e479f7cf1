// The few-channel convolution kernels on cuda:0 (cuda_conv_narrow.cu: SD's conv_out and conv_in, the VAE's) against
// the CPU in bf16 and f16: few outputs (4, 3 and 8 channels; odd image sizes; 1x1 without a bias) and few inputs (the
// latents' 4 channels into 320 and 512, 6 channels over three k16 chunks, a 5x5 kernel), forced, then as one candidate
// of conv2d's timed choice. Skips with the reason without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_conv_narrow.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"

namespace atelier {
namespace {

using test::channels_last;
using test::random_tensor;

struct NarrowScope {
  ~NarrowScope() {
    if (backend_available(test::cuda0())) test::cuda_be().set_narrow_conv(cuda::narrow_conv_default());
  }
};

TEST(CudaConvNarrow, FewOutputAndFewInputChannelsMatchTheCpu) {
  ATELIER_REQUIRE_CUDA();
  NarrowScope restore;
  struct Case { Shape x; int64_t o; int k; bool bias; };
  const Case cases[] = {{{2, 320, 64, 64}, 4, 3, true}, {{1, 128, 17, 9}, 3, 3, true}, {{3, 64, 5, 7}, 8, 1, false},
                        {{2, 4, 64, 64}, 320, 3, true}, {{1, 4, 9, 13}, 512, 3, true}, {{2, 6, 5, 5}, 16, 3, false},
                        {{1, 2, 7, 7}, 8, 5, true}};
  for (const Case& c : cases) {
    Conv2dParams p;
    p.pad_h = p.pad_w = c.k / 2;
    const int64_t k = c.x[1] * c.k * c.k;
    const Tensor x = random_tensor(c.x, 51), w = random_tensor({c.o, c.x[1], c.k, c.k}, 52, 1.0f / std::sqrt(float(k)));
    const Tensor b = c.bias ? random_tensor({c.o}, 53) : Tensor();
    const auto fn = [p](const std::vector<Tensor>& in) {
      return ops::conv2d(channels_last(in[0]), in[1], in.size() > 2 ? in[2] : Tensor(), p);
    };
    const std::vector<Tensor> inputs = c.bias ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x, w};
    const std::string what = "conv2d " + shape_str(c.x) + " -> " + std::to_string(c.o) + " " + std::to_string(c.k) + "x" +
                             std::to_string(c.k) + (c.bias ? " + bias" : "");
    for (DType dt : test::kLowp) {
      test::cuda_be().set_narrow_conv(cuda::NarrowConv::kForce);
      const int64_t before = cuda::conv_narrow_launches();
      EXPECT_PARITY(what, fn, inputs, dt);
      EXPECT_EQ(cuda::conv_narrow_launches() - before, 1) << what << ": the narrow kernel did not run";
      test::cuda_be().set_narrow_conv(cuda::NarrowConv::kAuto);
      EXPECT_PARITY(what + ", timed choice", fn, inputs, dt);
    }
  }
}

// Cases the kernels leave to the other paths: 16 outputs over 320 channels (neither narrow side), 4 outputs over 48
// channels (not whole 32-channel vectors), a stride of 2.
TEST(CudaConvNarrow, DeclinesWideAndStridedConvolutions) {
  cuda::NarrowConvArgs a;
  a.n = 1, a.c = 320, a.h = a.w_in = a.ho = a.wo = 8, a.o = 16, a.kh = a.kw = 3, a.pad_h = a.pad_w = 1;
  alignas(16) static const uint16_t buffer[8] = {};
  a.x = a.w = buffer;
  static uint32_t out[4];
  a.out = out;
  EXPECT_FALSE(cuda::conv_narrow_takes(a));
  a.o = 4;
  EXPECT_TRUE(cuda::conv_narrow_takes(a));
  a.c = 48;
  EXPECT_FALSE(cuda::conv_narrow_takes(a));
  a.c = 4, a.o = 320;
  EXPECT_TRUE(cuda::conv_narrow_takes(a));
  a.ho = a.wo = 4;  // a stride-2 output size
  EXPECT_FALSE(cuda::conv_narrow_takes(a));
}

}  // namespace
}  // namespace atelier
