// Channels-last concatenation on cuda:0 in one pass (CudaBackend::concat_channels_last, a UNet's skip
// concatenations): the same bits as the CPU's part-by-part copies, and the part-by-part path where the kernel
// does not take the case (channel runs that are not whole 16-byte chunks, more than four parts, the switch off).
// And the concatenation's readers reading its two parts where they lie (ops::ChannelConcat: group_norm_concat,
// conv2d_concat): the same bytes as over the concatenation, within the parity criteria of the CPU, and no
// concatenation written. Skips with the reason without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_group_norm_grid.h"
#include "backend/cuda/cuda_group_norm_slice.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::channels_last;
using test::cuda0;
using test::random_tensor;
using test::to_gpu;

struct OnePassScope {
  ~OnePassScope() { cuda::set_concat_one_pass(true); }
};

// Concatenates `shapes` (channels-last, `dt`) on the GPU and checks every value against the CPU's result and
// whether the one-pass kernel ran.
void check(const std::vector<Shape>& shapes, DType dt, bool one_pass) {
  std::vector<Tensor> cpu, gpu;
  uint64_t seed = 40;
  for (const Shape& s : shapes) {
    Tensor x = ops::cast(random_tensor(s, seed++), dt);
    cpu.push_back(x);
    gpu.push_back(channels_last(to_gpu(x)));
    ASSERT_TRUE(gpu.back().is_channels_last());
  }
  const int64_t before = cuda::concat_one_pass_launches();
  const Tensor got = ops::concat(gpu, 1);
  EXPECT_EQ(cuda::concat_one_pass_launches() - before, one_pass ? 1 : 0) << shape_str(shapes[0]) << " x " << shapes.size();
  EXPECT_TRUE(got.is_channels_last());
  const std::vector<float> want = ops::cast(ops::concat(cpu, 1), DType::F32).to_vector();
  const std::vector<float> have = ops::cast(ops::contiguous(got), DType::F32).to_vector();
  ASSERT_EQ(have.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(have[i], want[i]) << "element " << i << " of " << shape_str(got.shape());
}

TEST(CudaConcat, ChannelsLastPartsInOnePassMatchTheCpu) {
  ATELIER_REQUIRE_CUDA();
  OnePassScope restore;
  check({{2, 640, 16, 16}, {2, 320, 16, 16}}, DType::BF16, true);       // SD's up path at 512², CFG
  check({{3, 8, 5, 7}, {3, 16, 5, 7}, {3, 8, 5, 7}}, DType::BF16, true);  // three parts, odd pixel counts
  check({{1, 8, 9, 9}, {1, 24, 9, 9}}, DType::F16, true);                // 16 and 48 bytes per pixel, f16
  check({{1, 3, 5, 7}, {1, 5, 5, 7}}, DType::BF16, false);               // 6 and 10 bytes: part by part
  check({{1, 8, 4, 4}, {1, 8, 4, 4}, {1, 8, 4, 4}, {1, 8, 4, 4}, {1, 8, 4, 4}}, DType::BF16, false);  // five parts
  cuda::set_concat_one_pass(false);
  check({{2, 640, 16, 16}, {2, 320, 16, 16}}, DType::BF16, false);
}

// Restores the switches the in-place tests turn.
struct InPlaceScope : test::OwnConvScope {
  ~InPlaceScope() {
    if (backend_available(cuda0())) test::cuda_be().set_concat_in_place(true);
  }
};

// fn(a, b) on cuda:0 (bf16, channels-last parts) with the parts read in place and over their concatenation: the
// same bytes; no concatenation written by the first. Returns the in-place result.
Tensor same_bytes_either_way(const std::string& what, const Tensor& a, const Tensor& b,
                             const std::function<Tensor(const ops::ChannelConcat&)>& fn) {
  const Tensor ga = channels_last(to_gpu(a, DType::BF16)), gb = channels_last(to_gpu(b, DType::BF16));
  test::cuda_be().set_concat_in_place(true);
  const int64_t concats = cuda::concat_one_pass_launches();
  const Tensor in_place = ops::contiguous(fn(ops::ChannelConcat(ga, gb))).to(Device::cpu());
  EXPECT_EQ(cuda::concat_one_pass_launches(), concats) << what << ": the parts were concatenated";
  test::cuda_be().set_concat_in_place(false);
  const Tensor joined = ops::contiguous(fn(ops::ChannelConcat(ga, gb))).to(Device::cpu());
  EXPECT_EQ(cuda::concat_one_pass_launches() - concats, 1) << what << ": the reference path did not concatenate";
  test::cuda_be().set_concat_in_place(true);
  EXPECT_EQ(in_place.shape(), joined.shape()) << what;
  if (in_place.shape() == joined.shape())
    EXPECT_EQ(std::memcmp(in_place.raw(), joined.raw(), in_place.nbytes()), 0) << what << ": not the bytes of the concatenation's path";
  return in_place;
}

// SD's skip concatenations' norms (one-block slices, clusters, the grid kernel at 64x64 and 16 rows) and parts of odd
// sizes: each norm ran one kernel (slice or grid) on the two parts, and matches the CPU.
TEST(CudaConcat, GroupNormReadsThePartsWhereTheyLie) {
  ATELIER_REQUIRE_CUDA();
  InPlaceScope restore;
  struct Case { Shape a, b; int groups; };
  const Case cases[] = {{{2, 640, 16, 16}, {2, 320, 16, 16}, 32},   {{16, 1280, 8, 8}, {16, 1280, 8, 8}, 32},
                        {{16, 640, 64, 64}, {16, 320, 64, 64}, 32}, {{2, 320, 64, 64}, {2, 320, 64, 64}, 32},
                        {{1, 40, 5, 7}, {1, 24, 5, 7}, 8},          {{3, 16, 9, 9}, {3, 48, 9, 9}, 4}};
  for (const Case& c : cases) {
    const int64_t ch = c.a[1] + c.b[1];
    const Tensor a = random_tensor(c.a, 61), b = random_tensor(c.b, 62), gamma = random_tensor({ch}, 63), beta = random_tensor({ch}, 64);
    const int groups = c.groups;
    const auto norm = [&](const ops::ChannelConcat& x) {
      return ops::group_norm(x, groups, to_gpu(gamma, DType::BF16), to_gpu(beta, DType::BF16), 1e-5f, UnaryOp::kSilu);
    };
    const std::string what = "group_norm of " + shape_str(c.a) + " + " + shape_str(c.b);
    const int64_t kernels = cuda::group_norm_slice_launches() + cuda::group_norm_grid_launches();
    same_bytes_either_way(what, a, b, norm);
    EXPECT_EQ(cuda::group_norm_slice_launches() + cuda::group_norm_grid_launches() - kernels, 2) << what << ": not one kernel a norm";
    const auto fn = [groups](const std::vector<Tensor>& in) {
      return ops::group_norm(ops::ChannelConcat(channels_last(in[0]), channels_last(in[1])), groups, in[2], in[3], 1e-5f, UnaryOp::kSilu);
    };
    EXPECT_PARITY(what, fn, std::vector<Tensor>({a, b, gamma, beta}), DType::BF16);
  }
}

// The own implicit-GEMM convolution over the two parts (two tensor maps): SD's 1x1 shortcuts (up levels 0 and 3 of
// the CFG batch; the 8x8 level at 16 rows in split-K), a 3x3 convolution with a residual, parts of one 64-channel
// k-step; forced, then as kAuto's timed choice. The same bytes as the forced kernel over the concatenation.
TEST(CudaConcat, ConvolutionReadsThePartsWhereTheyLie) {
  ATELIER_REQUIRE_HOPPER();
  InPlaceScope restore;
  struct Case { Shape a, b; int64_t o; int k, split; bool residual; };
  const Case cases[] = {{{2, 640, 64, 64}, {2, 320, 64, 64}, 320, 1, 1, false}, {{2, 1280, 16, 16}, {2, 640, 16, 16}, 1280, 1, 1, false},
                        {{16, 1280, 8, 8}, {16, 1280, 8, 8}, 1280, 1, 2, false}, {{2, 128, 8, 8}, {2, 64, 8, 8}, 128, 3, 1, true},
                        {{3, 64, 8, 16}, {3, 64, 8, 16}, 160, 3, 2, true}};
  for (const Case& c : cases) {
    const int64_t ch = c.a[1] + c.b[1];
    Conv2dParams p;
    p.pad_h = p.pad_w = c.k / 2;
    const Tensor a = random_tensor(c.a, 71), b = random_tensor(c.b, 72), w = random_tensor({c.o, ch, c.k, c.k}, 73, 1.0f / std::sqrt(float(ch * c.k * c.k)));
    const Tensor bias = random_tensor({c.o}, 74), r = random_tensor({c.a[0], c.o, c.a[2], c.a[3]}, 75);
    const bool residual = c.residual;
    const std::string what = "conv2d of " + shape_str(c.a) + " + " + shape_str(c.b) + " -> " + std::to_string(c.o) + " " +
                             std::to_string(c.k) + "x" + std::to_string(c.k) + ", split " + std::to_string(c.split);
    cuda::set_own_conv(cuda::OwnConv::kForce);
    cuda::set_own_conv_split(c.split);
    const Tensor gw = to_gpu(w, DType::BF16), gbias = to_gpu(bias, DType::BF16), gr = residual ? channels_last(to_gpu(r, DType::BF16)) : Tensor();
    const int64_t own = cuda::own_conv_launches(), split = cuda::own_conv_split_launches();
    same_bytes_either_way(what, a, b, [&](const ops::ChannelConcat& x) { return ops::conv2d(x, gw, gbias, p, gr); });
    EXPECT_EQ(cuda::own_conv_launches() - own, 2) << what << ": the own kernel did not take both";
    EXPECT_EQ(cuda::own_conv_split_launches() - split, c.split > 1 ? 2 : 0) << what;
    const auto fn = [p, residual](const std::vector<Tensor>& in) {
      return ops::conv2d(ops::ChannelConcat(channels_last(in[0]), channels_last(in[1])), in[2], in[3], p,
                         residual ? channels_last(in[4]) : Tensor());
    };
    EXPECT_PARITY(what, fn, std::vector<Tensor>({a, b, w, bias, r}), DType::BF16);
    cuda::set_own_conv(cuda::OwnConv::kAuto);
    cuda::set_own_conv_split(0);
    EXPECT_PARITY(what + ", timed choice", fn, std::vector<Tensor>({a, b, w, bias, r}), DType::BF16);
  }
}

}  // namespace
}  // namespace atelier
