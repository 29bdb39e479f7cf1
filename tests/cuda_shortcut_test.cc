// A resnet's conv2 and its 1x1 shortcut as one implicit GEMM on cuda:0 (ops::conv2d_with_shortcut,
// CudaBackend::conv2d_shortcut): the shortcut's k-steps after conv2's taps, from one input or from a skip
// concatenation's two parts. Forced, it ran folded (one own-kernel launch, split-K where asked) and matches the CPU
// within the parity criteria, and the separate path (shortcut, then conv2 with it as the addend) to bf16 rounding;
// as kAuto's timed choice it matches the CPU too. Skips with the reason without a Hopper GPU.
#include <gtest/gtest.h>

#include <algorithm>
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
using Fold = cuda::CudaBackend::FoldShortcut;

// Restores the switches the tests turn.
struct FoldScope : test::OwnConvScope {
  ~FoldScope() {
    test::cuda_be().set_fold_shortcut(cuda::CudaBackend::fold_shortcut_default());
  }
};

struct Case {
  Shape h;        // conv2's input [N, O, H, W] (O in, O out)
  int64_t c1, c2;  // the shortcut's input channels: one tensor (c2 0) or two parts
  int split;
};

// in: h, x1, x2 (or undefined), w, b, ws, bs -> conv2(h) + shortcut([x1, x2]) through the op, channels-last.
Tensor run(const std::vector<Tensor>& in) {
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  const Tensor h = channels_last(in[0]);
  if (!in[2].defined()) return ops::conv2d_with_shortcut(h, in[3], in[4], p, channels_last(in[1]), in[5], in[6]);
  return ops::conv2d_with_shortcut(h, in[3], in[4], p, ops::ChannelConcat(channels_last(in[1]), channels_last(in[2])), in[5], in[6]);
}

// SD 1.5's shapes: an up block's resnet at 64x64 over the skip concatenation (CFG batch), a down block's at 32x32
// over one input, the 8x8 level at 16 rows in split-K; and small ones: two images a 128-pixel tile, parts of one
// 64-channel k-step, and four split-K parts of 27 k-steps (18 taps, then 1 + 8 of the shortcut's), the last starting
// inside the shortcut's second part.
TEST(CudaShortcut, FoldedIntoConv2MatchesTheCpuAndTheSeparatePath) {
  ATELIER_REQUIRE_HOPPER();
  FoldScope restore;
  const Case cases[] = {{{2, 320, 64, 64}, 640, 320, 1}, {{2, 640, 32, 32}, 320, 0, 1}, {{16, 1280, 8, 8}, 1280, 1280, 2},
                        {{2, 128, 8, 8}, 64, 64, 1},     {{2, 128, 8, 16}, 64, 512, 4}, {{1, 256, 8, 16}, 64, 0, 3}};
  for (const Case& c : cases) {
    const int64_t n = c.h[0], o = c.h[1], hh = c.h[2], ww = c.h[3], cs = c.c1 + c.c2;
    const std::string what = "conv2 " + shape_str(c.h) + " + shortcut of " + std::to_string(c.c1) +
                             (c.c2 ? " + " + std::to_string(c.c2) : std::string()) + " channels, split " + std::to_string(c.split);
    const std::vector<Tensor> in{random_tensor(c.h, 81),
                                 random_tensor({n, c.c1, hh, ww}, 82),
                                 c.c2 ? random_tensor({n, c.c2, hh, ww}, 83) : Tensor(),
                                 random_tensor({o, o, 3, 3}, 84, 1.0f / std::sqrt(float(o * 9))),
                                 random_tensor({o}, 85),
                                 random_tensor({o, cs, 1, 1}, 86, 1.0f / std::sqrt(float(cs))),
                                 random_tensor({o}, 87)};
    std::vector<Tensor> gin;
    for (const Tensor& t : in) gin.push_back(t.defined() ? to_gpu(t, DType::BF16) : t);

    cuda::set_own_conv(cuda::OwnConv::kForce);
    cuda::set_own_conv_split(c.split);
    test::cuda_be().set_fold_shortcut(Fold::kForce);
    const int64_t folds = test::cuda_be().folded_shortcuts(), own = cuda::own_conv_launches(), split = cuda::own_conv_split_launches();
    const Tensor folded = ops::cast(ops::contiguous(run(gin)), DType::F32).to(Device::cpu());
    EXPECT_EQ(test::cuda_be().folded_shortcuts() - folds, 1) << what << ": not folded";
    EXPECT_EQ(cuda::own_conv_launches() - own, 1) << what << ": not one own-kernel launch";
    EXPECT_EQ(cuda::own_conv_split_launches() - split, c.split > 1 ? 1 : 0) << what;
    EXPECT_PARITY(what, run, in, DType::BF16);

    // The separate path: the shortcut's output rounded to bf16 once more, the biases added in another order.
    test::cuda_be().set_fold_shortcut(Fold::kOff);
    const int64_t before = test::cuda_be().folded_shortcuts();
    const Tensor separate = ops::cast(ops::contiguous(run(gin)), DType::F32).to(Device::cpu());
    EXPECT_EQ(test::cuda_be().folded_shortcuts(), before) << what << ": folded with the switch off";
    ASSERT_EQ(folded.shape(), separate.shape()) << what;
    const std::vector<float> a = folded.to_vector(), b = separate.to_vector();
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i]))), scale = std::max(scale, double(std::fabs(b[i])));
    // Two bf16 roundings of values up to `scale` (the shortcut's and the output's) differ by at most ~2^-7 of it.
    EXPECT_LE(worst, scale / 128.0) << what << ": folded and separate differ by " << worst << " (largest value " << scale << ")";
    EXPECT_GT(worst, 0.0) << what << ": the same bytes: was the fold really off?";

    cuda::set_own_conv(cuda::OwnConv::kAuto);
    cuda::set_own_conv_split(0);
    test::cuda_be().set_fold_shortcut(Fold::kAuto);
    EXPECT_PARITY(what + ", timed choice", run, in, DType::BF16);
  }
}

}  // namespace
}  // namespace atelier
