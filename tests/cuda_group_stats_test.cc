// Group-norm statistics written by the own convolution's epilogue (cuda_group_stats.h) and the norm made from them
// (CudaBackend::group_norm_nhwc_from_stats), against the statistics pass of the group norm that runs today and
// against the output's own values. Skips with the reason when cuda:0 is not a Hopper GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_group_stats.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"

namespace atelier {
namespace {

using test::channels_last;
using test::cuda0;
using test::random_tensor;
using test::to_gpu;

constexpr int kGroups = 32;  // SD's group norms
constexpr float kEps = 1e-5f;

// Host f32 values of a CUDA tensor in its logical [N, C, H, W] order.
std::vector<float> host_values(const Tensor& t) {
  return ops::contiguous(ops::cast(ops::to_device(t, Device::cpu()), DType::F32)).to_vector();
}

struct ConvCase {
  Shape x;        // [N, C, H, W]
  int64_t o;      // output channels
  int k;          // square kernel, stride 1, padding k / 2
  bool residual;  // out = conv + bias + residual
  bool offset;    // the norm of out + offset [N, O] (a resnet's time embedding)
  int split;      // split-K parts (1: none)
};

// The convolution through the own kernel into a new channels-last bf16 output, with the statistics into `stats` (or
// none where null); false where the kernel declined.
bool own_conv(const ConvCase& c, const Tensor& x, const Tensor& wn, const Tensor& b, const Tensor& r, Tensor& out, cuda::ChannelStats* stats) {
  cuda::CudaBackend& be = test::cuda_be();
  out = Tensor::empty_channels_last({c.x[0], c.o, c.x[2], c.x[3]}, DType::BF16, cuda0());
  cuda::OwnConvArgs a;
  a.input = x.raw(), a.weight = wn.raw(), a.bias = b.raw(), a.residual = c.residual ? r.raw() : nullptr, a.out = out.raw();
  a.n = c.x[0], a.c = c.x[1], a.h = c.x[2], a.w = c.x[3], a.o = c.o, a.kh = a.kw = c.k, a.ho = c.x[2], a.wo = c.x[3];
  a.pad_h = a.pad_w = c.k / 2;
  a.sm_count = be.sm_count();
  int smem = 0;
  cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
  a.max_smem = size_t(smem);
  Tensor workspace;
  if (c.split > 1) {
    workspace = Tensor::zeros({int64_t(cuda::conv_split_workspace_bytes(a.sm_count) / 4)}, DType::F32, cuda0());
    a.split = c.split, a.split_workspace = workspace.raw();
  }
  a.group_stats = stats;
  const bool ran = cuda::launch_conv_implicit(a, be.cc_major(), be.stream());
  be.synchronize();
  return ran;
}

// SD's shapes: level 0 (160-column tiles, groups of 10 channels), level 1 with a residual, the 8x8 level (64 pixels:
// a tile's two halves in two images) with and without split-K, and 128-column tiles (groups of 4 across tile edges).
TEST(CudaGroupStats, NormFromTheConvolutionsStatisticsMatchesTheStatisticsPass) {
  ATELIER_REQUIRE_HOPPER();
  const ConvCase cases[] = {{{2, 320, 64, 64}, 320, 3, false, true, 1},   {{2, 640, 32, 32}, 640, 3, true, false, 1},
                            {{2, 1280, 8, 8}, 1280, 3, true, true, 1},    {{2, 1280, 8, 8}, 1280, 3, false, true, 2},
                            {{3, 64, 16, 16}, 128, 3, false, true, 1},    {{2, 320, 16, 16}, 640, 1, true, false, 1}};
  for (const ConvCase& c : cases) {
    const std::string what = shape_str(c.x) + " -> " + std::to_string(c.o) + " k" + std::to_string(c.k) +
                             (c.residual ? " + residual" : "") + (c.offset ? ", norm with offset" : "") +
                             (c.split > 1 ? ", split-K " + std::to_string(c.split) : "");
    SCOPED_TRACE(what);
    const int64_t n = c.x[0], hw = c.x[2] * c.x[3];
    const Tensor x = channels_last(to_gpu(random_tensor(c.x, 81), DType::BF16));
    const Tensor w = to_gpu(random_tensor({c.o, c.x[1], c.k, c.k}, 82, 1.0f / std::sqrt(float(c.x[1] * c.k * c.k))), DType::BF16);
    const Tensor wn = ops::contiguous(w.permute({0, 2, 3, 1}));  // [O, kh, kw, C]
    const Tensor b = to_gpu(random_tensor({c.o}, 83, 0.5f, 1.0f), DType::BF16);  // a mean far from 0: the shifts matter
    const Tensor r = channels_last(to_gpu(random_tensor({n, c.o, c.x[2], c.x[3]}, 84), DType::BF16));
    const Tensor gamma = to_gpu(random_tensor({c.o}, 85, 0.5f, 1.0f), DType::BF16);
    const Tensor beta = to_gpu(random_tensor({c.o}, 86), DType::BF16);
    const Tensor offset = c.offset ? to_gpu(random_tensor({n, c.o}, 87, 2.0f), DType::BF16) : Tensor();

    Tensor plain, out;
    ASSERT_TRUE(own_conv(c, x, wn, b, r, plain, nullptr)) << "the own kernel declined the convolution";
    Tensor stats = Tensor::empty({cuda::channel_stats_count(n * hw, c.o) * 3}, DType::F32, cuda0());
    ASSERT_TRUE(own_conv(c, x, wn, b, r, out, static_cast<cuda::ChannelStats*>(stats.raw())));
    const std::vector<float> y = host_values(out);
    EXPECT_EQ(y, host_values(plain)) << "writing the statistics changed the output";

    // Each segment's statistics against the output's values (segment s: rows 64 s.. of [N * H * W]).
    const std::vector<float> st = host_values(stats);
    double worst_dev = 0.0, worst_sq = 0.0;
    int shift_mismatches = 0;
    for (int64_t s = 0; s < n * hw / cuda::kStatsSegmentRows; ++s) {
      for (int64_t ch = 0; ch < c.o; ++ch) {
        const int64_t row0 = s * cuda::kStatsSegmentRows, img = row0 / hw;
        const auto at = [&](int64_t row) { return double(y[size_t((img * c.o + ch) * hw + row % hw)]); };
        const double shift = at(row0);
        double dev = 0.0, sq = 0.0;
        for (int64_t row = row0; row < row0 + cuda::kStatsSegmentRows; ++row) {
          dev += at(row) - shift;
          sq += (at(row) - shift) * (at(row) - shift);
        }
        const float* got = &st[size_t((s * c.o + ch) * 3)];
        shift_mismatches += double(got[0]) != shift;
        worst_dev = std::max(worst_dev, std::abs(got[1] - dev) / (1.0 + std::sqrt(sq)));
        worst_sq = std::max(worst_sq, std::abs(got[2] - sq) / (1e-3 + sq));
      }
    }
    EXPECT_EQ(shift_mismatches, 0);
    EXPECT_LT(worst_dev, 1e-4);
    EXPECT_LT(worst_sq, 1e-4);

    // The norm from them against the norm with its own statistics pass, on the same output.
    const Tensor want = ops::group_norm(out, kGroups, gamma, beta, kEps, UnaryOp::kSilu, offset);
    Tensor got = Tensor::empty_channels_last(out.shape(), DType::BF16, cuda0());
    ASSERT_TRUE(test::cuda_be().group_norm_nhwc_from_stats(got, out, offset, gamma, beta, kGroups, kEps, UnaryOp::kSilu,
                                                          static_cast<const cuda::ChannelStats*>(stats.raw())));
    const std::vector<float> g = host_values(got), ref = host_values(want);
    double worst = 0.0, sum = 0.0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double d = std::abs(double(g[i]) - double(ref[i])) / (1.0 + std::abs(double(ref[i])));
      worst = std::max(worst, d);
      sum += d;
    }
    EXPECT_LE(worst, 2 * test::output_ulp(DType::BF16)) << "one bf16 ulp apart at most";
    EXPECT_LT(sum / double(g.size()), 1e-3);
  }
}

// Where the statistics cannot be written (rows not whole segments) the kernel declines instead of writing part of
// them, and the norm declines sizes whose images are not whole segments.
TEST(CudaGroupStats, DeclinedWhereSegmentsAreNotWhole) {
  ATELIER_REQUIRE_HOPPER();
  const ConvCase c{{3, 64, 2, 16}, 64, 3, false, false, 1};  // 96 rows: the kernel takes them (4 images a tile)
  const Tensor x = channels_last(to_gpu(random_tensor(c.x, 91), DType::BF16));
  const Tensor wn = ops::contiguous(to_gpu(random_tensor({c.o, c.x[1], 3, 3}, 92, 0.05f), DType::BF16).permute({0, 2, 3, 1}));
  const Tensor b = to_gpu(random_tensor({c.o}, 93), DType::BF16);
  Tensor stats = Tensor::empty({1024}, DType::F32, cuda0()), out;
  EXPECT_TRUE(own_conv(c, x, wn, b, Tensor(), out, nullptr));
  EXPECT_FALSE(own_conv(c, x, wn, b, Tensor(), out, static_cast<cuda::ChannelStats*>(stats.raw())));
  Tensor y = Tensor::empty_channels_last(out.shape(), DType::BF16, cuda0());
  EXPECT_FALSE(test::cuda_be().group_norm_nhwc_from_stats(y, out, Tensor(), Tensor(), Tensor(), kGroups, kEps, UnaryOp::kIdentity,
                                                          static_cast<const cuda::ChannelStats*>(stats.raw())));
}

}  // namespace
}  // namespace atelier
