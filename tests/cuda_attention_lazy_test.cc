// The flash kernels' lazy running max (cuda_attention_lazy.cuh) on scores that jump within a later key tile: its
// exact rescale and its exact recomputation of overflowed rows, in the wgmma kernel (Hopper) and in the mma.sync
// kernel (any GPU; bf16 and f16), each against the CPU's softmax and each rare path counted where it should run.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_attention_lazy.h"
#include "backend/cuda/cuda_attention_wgmma.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"

namespace atelier {
namespace {

using test::cuda_be;
using test::random_tensor;

enum class Kernel { kWgmma, kMmaSync };

// The kernel under test forced (the other flash kernels and cuDNN off), defaults restored after.
struct KernelScope {
  explicit KernelScope(Kernel k) {
    cuda::set_wgmma_attention(k == Kernel::kWgmma);
    cuda::set_short_kv_attention(false);
    cuda_be().set_attention_impl(cuda::AttentionImpl::kFlash);
  }
  ~KernelScope() {
    cuda::set_wgmma_attention(true);
    cuda::set_short_kv_attention(true);
    cuda::set_wgmma_attention_shape({});
    cuda::set_attention_lazy_max(true);
    cuda_be().set_flash_block_rows(0);
    cuda_be().set_attention_impl(cuda::AttentionImpl::kAuto);
  }
};

cuda::LazyMaxCounts counts_of(Kernel k) {
  return k == Kernel::kWgmma ? cuda::wgmma_lazy_max_counts() : cuda::flash_lazy_max_counts();
}

struct Case {
  int64_t b, h, hk, sq, sk, d;
};

// Key `hot` gets the score `jump` (log2 units) over the others: every query's column 0 holds kQ0 and the key's column
// 0 the amplitude that makes it so (the other scores stay within a few units).
struct Jump {
  int64_t hot;
  double jump;
};
constexpr double kQ0 = 16.0;

Tensor with_hot_keys(const Tensor& x, int64_t rows, int64_t d, const std::vector<Jump>& hot) {
  std::vector<float> v = x.to_vector();
  const double sl = std::log2(std::exp(1.0)) / std::sqrt(double(d));  // a score's log2 units per unit of q.k
  for (size_t base = 0; base < v.size(); base += size_t(rows * d))
    for (const Jump& j : hot) v[base + size_t(j.hot * d)] = float(std::round(j.jump / (kQ0 * sl)));
  return Tensor::from_vector(v, x.shape());
}

void expect_jump_parity(Kernel kernel, const Case& c, const std::vector<Jump>& hot, const std::string& label,
                        DType dt) {
  std::vector<float> qv = random_tensor({c.b, c.h, c.sq, c.d}, 61, 0.5f).to_vector();
  for (size_t i = 0; i < qv.size(); i += size_t(c.d)) qv[i] = float(kQ0);
  const Tensor q = Tensor::from_vector(qv, {c.b, c.h, c.sq, c.d});
  const Tensor k = with_hot_keys(random_tensor({c.b, c.hk, c.sk, c.d}, 62, 0.5f), c.sk, c.d, hot);
  const Tensor v = random_tensor({c.b, c.hk, c.sk, c.d}, 63);
  const auto fn = [](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], Tensor()); };
  const int64_t before = cuda::wgmma_attention_launches();
  EXPECT_PARITY(label + " d" + std::to_string(c.d), fn, std::vector<Tensor>({q, k, v}), dt);
  if (kernel == Kernel::kWgmma)
    EXPECT_GT(cuda::wgmma_attention_launches(), before) << label << ": the wgmma kernel did not take the case";
  else
    EXPECT_EQ(cuda::wgmma_attention_launches(), before) << label << ": the wgmma kernel took the case";
}

// A jump past the cap, then keys near it in later tiles: the output mixes the hot keys' values, so the rescale of O
// shows (keys that jump higher still, as in the first case, bury whatever O held before: an O left unrescaled there
// passed, session 55's mutation check).
const std::vector<Jump> kNearJumps = {{300, 80.0}, {310, 82.0}, {450, 79.0}, {590, 81.0}};

// One head dim's four cases: a jump past the cap takes the rescale (then smaller ones leave P above 1 unrescaled, or
// keys near it follow: kNearJumps), a jump past f32's range recomputes the warps' rows, and the exact max on the same
// scores runs neither. The jump of 10 before the overflow stays under both caps (bf16's 2^64, f16's 2^15): a rescale
// there would move the running max up and leave the 150 finite.
void expect_rare_paths(Kernel kernel, const Case& c, DType dt, const std::string& what) {
  auto counts = counts_of(kernel);
  expect_jump_parity(kernel, c, {{300, 80.0}, {450, 95.0}, {590, 124.0}},
                     what + " lazy max: jumps of 80, then 15 and 29", dt);
  auto now = counts_of(kernel);
  EXPECT_GT(now.rescaled_warp_tiles, counts.rescaled_warp_tiles)
      << what << " d" << c.d << ": the jump of 80 was not rescaled";
  EXPECT_EQ(now.exact_warps, counts.exact_warps) << what << " d" << c.d << ": rows recomputed without an overflow";
  counts = now;
  expect_jump_parity(kernel, c, kNearJumps, what + " lazy max: a jump of 80, then keys near it", dt);
  now = counts_of(kernel);
  EXPECT_GT(now.rescaled_warp_tiles, counts.rescaled_warp_tiles) << what << " d" << c.d << ": the jump was not rescaled";
  counts = now;
  expect_jump_parity(kernel, c, {{140, 10.0}, {400, 150.0}}, what + " lazy max: jumps of 10, then 140 past f32", dt);
  now = counts_of(kernel);
  EXPECT_GT(now.exact_warps, counts.exact_warps) << what << " d" << c.d << ": the overflow did not recompute the rows";
  cuda::set_attention_lazy_max(false);
  counts = now;
  expect_jump_parity(kernel, c, {{140, 10.0}, {400, 150.0}}, what + " exact max: jumps of 10, then 140", dt);
  now = counts_of(kernel);
  EXPECT_EQ(now.exact_warps, counts.exact_warps);
  EXPECT_EQ(now.rescaled_warp_tiles, counts.rescaled_warp_tiles);
  cuda::set_attention_lazy_max(true);
}

// SD's and FLUX's head dims with ragged query rows and grouped K/V heads, and both d40 block shapes.
TEST(CudaAttentionLazyMax, WgmmaKernelRescalesAndRecomputesWhereScoresJump) {
  ATELIER_REQUIRE_HOPPER();
  KernelScope scope(Kernel::kWgmma);
  for (const int64_t d : {40, 64, 80, 128})
    expect_rare_paths(Kernel::kWgmma, Case{1, 4, 2, 200, 600, d}, DType::BF16, "wgmma");
  cuda::set_wgmma_attention_shape({4, 64});  // 64-key tiles: the jumps land in other tiles and threads
  auto counts = cuda::wgmma_lazy_max_counts();
  expect_jump_parity(Kernel::kWgmma, Case{2, 2, 2, 130, 300, 40}, {{70, 80.0}, {200, 215.0}},
                     "wgmma 4x64 lazy max: jumps of 80, then 135 past f32", DType::BF16);
  auto now = cuda::wgmma_lazy_max_counts();
  EXPECT_GT(now.rescaled_warp_tiles, counts.rescaled_warp_tiles);
  EXPECT_GT(now.exact_warps, counts.exact_warps);
  counts = now;
  expect_jump_parity(Kernel::kWgmma, Case{2, 2, 2, 130, 300, 40}, {{70, 80.0}, {100, 81.0}, {250, 79.0}},
                     "wgmma 4x64 lazy max: a jump of 80, then keys near it", DType::BF16);
  EXPECT_GT(cuda::wgmma_lazy_max_counts().rescaled_warp_tiles, counts.rescaled_warp_tiles);
}

// The mma.sync kernel in bf16 and f16 (whose P rescales from 2^15: f16 ends at 65504), one and two m-tiles per warp
// (64- and 128-query blocks; the latter with the wide key tile at head dims 48 and 128).
TEST(CudaAttentionLazyMax, MmaSyncKernelRescalesAndRecomputesWhereScoresJump) {
  ATELIER_REQUIRE_CUDA();
  KernelScope scope(Kernel::kMmaSync);
  for (const int rows : {64, 128}) {
    cuda_be().set_flash_block_rows(rows);
    for (const DType dt : {DType::BF16, DType::F16})
      for (const int64_t d : {40, 64, 128})
        expect_rare_paths(Kernel::kMmaSync, Case{1, 4, 2, 200, 600, d}, dt,
                          "mma.sync " + std::to_string(rows) + "-query blocks " + std::string(dtype_name(dt)));
  }
}

}  // namespace
}  // namespace atelier
