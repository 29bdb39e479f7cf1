// The upsamplers (nearest 2x, then a 3x3 convolution) as the own implicit-GEMM kernel's one product over the four
// output phases (OwnConvArgs::upsample_phases, cuda_conv_upsample.cu): each phase's tiles read the input from the
// phase's tap offset and store their pixels at (2i + a, 2j + b) through a 5-D tensor map. Forced, it ran as one
// own-kernel launch (split-K where asked) and matches the CPU's upsample-then-convolve within the parity criteria;
// as kAuto's timed choice among it, the packed phases and the plain path it matches too. Skips with the reason
// without a Hopper GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::channels_last;
using test::random_tensor;
using test::to_gpu;

// Restores the switches the tests turn.
struct PhasesScope : test::OwnConvScope {
  ~PhasesScope() {
    test::cuda_be().set_upsample_phases(cuda::upsample_phases_default());
    test::cuda_be().set_own_phases(cuda::CudaBackend::own_phases_default());
  }
};

struct Case {
  Shape x;    // [N, C, H, W]
  int64_t o;  // output channels
  bool bias;
  int split;
};

// in: x, w [O, C, 3, 3], b (or absent) -> conv3x3(upsample2x(x)) through the op, channels-last.
Tensor run(const std::vector<Tensor>& in) {
  return ops::upsample2x_conv2d(channels_last(in[0]), in[1], in.size() > 2 ? in[2] : Tensor(), Conv2dParams{1, 1, 1, 1});
}

// SD 1.5's three UNet upsamplers (8x8 at CFG batch with 160-column tiles, 16x16 at 640 channels, 32x32 at 320 without a
// bias), the 8x8 level in split-K (64 rows: half a tile), the VAE's 512 channels (128-column tiles), and rows 128
// wide (64-pixel parts of a row per output box).
TEST(CudaUpsamplePhases, OwnKernelProductMatchesTheCpu) {
  ATELIER_REQUIRE_HOPPER();
  PhasesScope restore;
  test::cuda_be().set_own_phases(true);
  const Case cases[] = {{{2, 1280, 8, 8}, 1280, true, 1}, {{1, 640, 16, 16}, 640, true, 1}, {{1, 320, 32, 32}, 320, false, 1},
                        {{1, 1280, 8, 8}, 1280, true, 4}, {{1, 512, 16, 16}, 512, true, 1},  {{1, 64, 4, 128}, 128, true, 1}};
  for (const Case& c : cases) {
    const std::string what = "upsample2x_conv2d " + shape_str(c.x) + " -> " + std::to_string(c.o) + (c.bias ? " + bias" : "") +
                             ", split " + std::to_string(c.split);
    std::vector<Tensor> in{random_tensor(c.x, 71), random_tensor({c.o, c.x[1], 3, 3}, 72, 1.0f / std::sqrt(9.0f * float(c.x[1])))};
    if (c.bias) in.push_back(random_tensor({c.o}, 73));
    std::vector<Tensor> gin;
    for (const Tensor& t : in) gin.push_back(to_gpu(t, DType::BF16));

    cuda::set_own_conv(cuda::OwnConv::kForce);
    cuda::set_own_conv_split(c.split);
    test::cuda_be().set_upsample_phases(cuda::UpsamplePhases::kForce);
    const int64_t calls = test::cuda_be().upsample_phase_calls(), own = cuda::own_conv_launches();
    const int64_t split = cuda::own_conv_split_launches();
    const Tensor y = run(gin);
    EXPECT_EQ(y.shape(), (Shape{c.x[0], c.o, 2 * c.x[2], 2 * c.x[3]})) << what;
    EXPECT_EQ(test::cuda_be().upsample_phase_calls() - calls, 1) << what << ": the phase path did not run";
    EXPECT_EQ(cuda::own_conv_launches() - own, 1) << what << ": not one own-kernel launch";
    EXPECT_EQ(cuda::own_conv_split_launches() - split, c.split > 1 ? 1 : 0) << what;
    EXPECT_PARITY(what, run, in, DType::BF16);

    cuda::set_own_conv(cuda::OwnConv::kAuto);
    cuda::set_own_conv_split(0);
    test::cuda_be().set_upsample_phases(cuda::UpsamplePhases::kAuto);
    EXPECT_PARITY(what + ", timed choice", run, in, DType::BF16);
  }
}

// What the kernel declines: a width whose 128-pixel tiles are no box (48), output channels whose phase does not fill
// whole tiles (200: 800 columns take 160-column tiles, 200 is no multiple of them), an output size not the input's.
// Host logic only: runs without a GPU.
TEST(CudaUpsamplePhases, OwnKernelDeclinesWhatItCannotPlace) {
  cuda::OwnConvArgs a;
  a.upsample_phases = true;
  a.n = 1, a.c = 64, a.kh = a.kw = 2, a.pad_h = a.pad_w = 1, a.sm_count = 132, a.max_smem = 232448;
  a.h = a.ho = 8, a.w = a.wo = 48, a.o = 4 * 128;
  alignas(16) static char buffer[16];
  a.input = a.weight = a.out = buffer;
  EXPECT_FALSE(cuda::conv_implicit_takes(a, 9)) << "width 48";
  a.w = a.wo = 32;
  EXPECT_TRUE(cuda::conv_implicit_takes(a, 9)) << "width 32, 128 channels";
  a.o = 4 * 200;
  EXPECT_FALSE(cuda::conv_implicit_takes(a, 9)) << "200 channels a phase";
  a.o = 4 * 128, a.ho = 9;
  EXPECT_FALSE(cuda::conv_implicit_takes(a, 9)) << "an output size other than the input's";
}

}  // namespace
}  // namespace atelier
