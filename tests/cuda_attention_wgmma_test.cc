// The Hopper flash-attention kernel (cuda_attention_wgmma.cu): CPU parity on the cases it takes, and the cases it
// leaves to the mma.sync kernel. Its figures beside cuDNN's and mma.sync's: bench/cuda_ops_bench.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_attention_lazy.h"
#include "backend/cuda/cuda_attention_wgmma.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"

namespace atelier {
namespace {

using test::cuda0;
using test::cuda_be;
using test::random_tensor;

// The short-key kernels (cuda_attention_short_test.cc) off: they come first and would take the cases over <= 80 keys.
struct WgmmaScope {
  explicit WgmmaScope(bool on) {
    cuda::set_wgmma_attention(on);
    cuda::set_short_kv_attention(false);
  }
  ~WgmmaScope() {
    cuda::set_wgmma_attention(true);
    cuda::set_short_kv_attention(true);
    cuda::set_wgmma_attention_shape({});
    cuda::set_attention_lazy_max(true);
    cuda_be().set_attention_impl(cuda::AttentionImpl::kAuto);
  }
};

struct Case {
  int64_t b, h, hk, sq, sk, d;
};

// One case against the CPU (inputs from `seed`), and that the wgmma kernel took it. `label` names the block shape.
void expect_wgmma_parity(const Case& c, uint32_t seed, const std::string& label) {
  const Tensor q = random_tensor({c.b, c.h, c.sq, c.d}, seed), k = random_tensor({c.b, c.hk, c.sk, c.d}, seed + 1),
               v = random_tensor({c.b, c.hk, c.sk, c.d}, seed + 2);
  const auto fn = [](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], Tensor()); };
  const int64_t before = cuda::wgmma_attention_launches();
  char what[160];
  std::snprintf(what, sizeof(what), "wgmma attention%s b%lld h%lld/%lld q%lld k%lld d%lld", label.c_str(), (long long)c.b,
                (long long)c.h, (long long)c.hk, (long long)c.sq, (long long)c.sk, (long long)c.d);
  EXPECT_PARITY(std::string(what), fn, std::vector<Tensor>({q, k, v}), DType::BF16);
  std::fflush(stdout);  // a kernel that hangs leaves the lines before it
  EXPECT_GT(cuda::wgmma_attention_launches(), before) << what << ": the wgmma kernel did not take the case";
}

TEST(CudaWgmmaAttention, MatchesTheCpu) {
  ATELIER_REQUIRE_HOPPER();
  WgmmaScope scope(true);
  cuda_be().set_attention_impl(cuda::AttentionImpl::kFlash);
  // Whole tiles; ragged queries and keys (the last key tile masked, rows past the end not stored); grouped K/V
  // heads; SD's head dims 40 and 80 (zero-filled to 64 / 128 columns by the tensor maps); many query blocks and key
  // tiles at head dim 40.
  for (const Case& c : {Case{1, 2, 2, 128, 64, 64}, Case{2, 3, 3, 256, 192, 128}, Case{1, 4, 2, 384, 320, 64},
                        Case{1, 2, 2, 128, 1024, 128}, Case{1, 2, 2, 100, 77, 40}, Case{2, 2, 2, 300, 250, 80},
                        Case{1, 4, 2, 200, 130, 128}, Case{1, 3, 3, 512, 512, 40}, Case{1, 1, 1, 7, 300, 64},
                        Case{2, 2, 2, 600, 1500, 40}})
    expect_wgmma_parity(c, 81, "");
}

// The same cases with every tile's exact max (ATELIER_ATTENTION_LAZY_MAX=0): the online softmax the lazy max replaced.
TEST(CudaWgmmaAttention, ExactMaxMatchesTheCpu) {
  ATELIER_REQUIRE_HOPPER();
  WgmmaScope scope(true);
  cuda_be().set_attention_impl(cuda::AttentionImpl::kFlash);
  cuda::set_attention_lazy_max(false);
  for (const Case& c : {Case{1, 2, 2, 128, 1024, 128}, Case{1, 2, 2, 100, 77, 40}, Case{2, 2, 2, 300, 250, 80},
                        Case{1, 4, 2, 384, 320, 64}, Case{2, 2, 2, 600, 1500, 40}})
    expect_wgmma_parity(c, 83, " exact max");
}

// Both block shapes at head dims 40 and 64, forced (cuda_attention_wgmma.h): ragged and whole tiles, grouped heads,
// one key tile and many. Then the default's choice by waves: four consumers for SD's CFG self-attention at d40 (352
// blocks of three on 132 SMs are 2.67 waves), three at 16 rows, three at d64.
TEST(CudaWgmmaAttention, BothBlockShapesMatchTheCpu) {
  ATELIER_REQUIRE_HOPPER();
  WgmmaScope scope(true);
  cuda_be().set_attention_impl(cuda::AttentionImpl::kFlash);
  for (const cuda::WgmmaAttentionShape sh : {cuda::WgmmaAttentionShape{3, 128}, cuda::WgmmaAttentionShape{4, 64}}) {
    ASSERT_TRUE(cuda::wgmma_attention_shape_supported(sh));
    cuda::set_wgmma_attention_shape(sh);
    const std::string label = " " + std::to_string(sh.consumers) + "x" + std::to_string(sh.block_k);
    for (const Case& c : {Case{1, 2, 2, 256, 192, 40}, Case{1, 2, 2, 100, 77, 40}, Case{2, 2, 2, 600, 1500, 40},
                          Case{1, 4, 2, 384, 320, 64}, Case{1, 1, 1, 7, 300, 64}, Case{1, 3, 3, 512, 96, 40},
                          Case{1, 2, 2, 130, 64, 40}, Case{1, 2, 2, 200, 256, 40}})
      expect_wgmma_parity(c, 91, label);
  }
  EXPECT_FALSE(cuda::wgmma_attention_shape_supported({4, 128}));  // S, P and O do not fit four consumers' registers
}

TEST(CudaWgmmaAttention, DefaultShapeIsChosenByWaves) {
  constexpr int kSms = 132;  // H100 / H200 SXM
  EXPECT_EQ(cuda::wgmma_block_shape_for(40, 2, 8, 4096, kSms).consumers, 4);   // SD's CFG step: 2.67 waves of three
  EXPECT_EQ(cuda::wgmma_block_shape_for(40, 16, 8, 4096, kSms).consumers, 3);  // 16 rows: 21.3 waves
  EXPECT_EQ(cuda::wgmma_block_shape_for(40, 2, 8, 16384, kSms).consumers, 3);  // 1024²: 10.4 waves
  EXPECT_EQ(cuda::wgmma_block_shape_for(64, 2, 8, 4096, kSms).consumers, 3);   // d64: not measured, the default
  EXPECT_EQ(cuda::wgmma_block_shape_for(40, 2, 8, 4096, 0).consumers, 3);      // no SM count: the default
  cuda::set_wgmma_attention_shape({3, 128});
  EXPECT_EQ(cuda::wgmma_block_shape_for(40, 2, 8, 4096, kSms).consumers, 3);  // forced
  cuda::set_wgmma_attention_shape({});
}

TEST(CudaWgmmaAttention, LeavesOtherCasesToTheMmaSyncKernel) {
  ATELIER_REQUIRE_HOPPER();
  WgmmaScope scope(true);
  cuda_be().set_attention_impl(cuda::AttentionImpl::kFlash);
  const Tensor q = random_tensor({1, 2, 130, 160}, 84), k = random_tensor({1, 2, 70, 160}, 85),
               v = random_tensor({1, 2, 70, 160}, 86);
  const Tensor q64 = random_tensor({1, 2, 130, 64}, 87), k64 = random_tensor({1, 2, 70, 64}, 88),
               v64 = random_tensor({1, 2, 70, 64}, 89), mask = random_tensor({130, 70}, 90, 2.0f);
  const int64_t before = cuda::wgmma_attention_launches();
  const auto plain = [](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], Tensor()); };
  const auto masked = [](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], in[3]); };
  EXPECT_PARITY("head dim 160 (mma.sync)", plain, std::vector<Tensor>({q, k, v}), DType::BF16);
  EXPECT_PARITY("additive mask (mma.sync)", masked, std::vector<Tensor>({q64, k64, v64, mask}), DType::BF16);
  EXPECT_PARITY("f16 (mma.sync)", plain, std::vector<Tensor>({q64, k64, v64}), DType::F16);
  EXPECT_EQ(cuda::wgmma_attention_launches(), before);
  cuda::set_wgmma_attention(false);  // switched off: the cases it takes go to mma.sync
  EXPECT_PARITY("head dim 64, switched off (mma.sync)", plain, std::vector<Tensor>({q64, k64, v64}), DType::BF16);
  EXPECT_EQ(cuda::wgmma_attention_launches(), before);
}

}  // namespace
}  // namespace atelier
