// Attention over short key sequences (at most 80 keys: the cross-attentions over CLIP's 77 tokens): at head dims up to
// 128 the kernel of cuda_attention_short.cu (unmasked), at 136-160 one key tile of the mma.sync flash kernel
// (cuda_attention.cu, kShortKeys). CPU parity with and without masks, into merged heads, with one or several query
// tiles a warp, and the cases they leave to the other kernels. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_attention_short.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"

namespace atelier {
namespace {

using test::cuda_be;
using test::random_tensor;

struct ShortScope {
  int narrow_before = cuda::set_short_kv_narrow_head_dims(128);  // by default only up to 48 (cuda_attention.cu)
  ShortScope() {
    cuda::set_short_kv_attention(true);
    cuda_be().set_attention_impl(cuda::AttentionImpl::kFlash);  // no cuDNN race: the flash kernels must take it
  }
  ~ShortScope() {
    cuda::set_short_kv_attention(true);
    cuda::set_short_kv_tiles_per_warp(0);
    cuda::set_short_kv_block_warps(0);  // the default
    cuda::set_short_kv_narrow_head_dims(narrow_before);
    cuda_be().set_attention_impl(cuda::AttentionImpl::kAuto);
    cuda_be().set_flash_block_rows(0);
  }
};

struct Case {
  int64_t b, h, hk, sq, sk, d;
};

// [B, 1, 1, Sk] key padding (entry 0's last keys masked) or [Sq, Sk] additive noise.
Tensor mask_for(const char* kind, const Case& c) {
  if (std::string(kind) == "additive") return random_tensor({c.sq, c.sk}, 91, 2.0f);
  if (std::string(kind) != "padding") return Tensor();
  std::vector<float> m(size_t(c.b * c.sk), 0.0f);
  for (int64_t j = c.sk / 2 + 1; j < c.sk; ++j) m[size_t(j)] = -INFINITY;
  return Tensor::from_vector(m, {c.b, 1, 1, c.sk});
}

TEST(CudaShortKvAttention, MatchesTheCpu) {
  ATELIER_REQUIRE_CUDA();
  ShortScope scope;
  // SD's head dim 160 over 77 keys (levels 2 and 3 of the UNet: 256 and 64 queries a head), exactly one tile (80
  // keys), a few keys, grouped K/V heads, ragged queries, one query, head dim 136 (zero-filled to 160 columns).
  const Case cases[] = {{2, 8, 8, 256, 77, 160}, {2, 4, 4, 64, 77, 160}, {1, 2, 2, 65, 80, 160}, {1, 3, 3, 100, 9, 160},
                        {1, 4, 2, 130, 33, 160}, {1, 2, 2, 1, 77, 160},  {1, 2, 2, 70, 77, 136}};
  const auto fn = [](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], in[3]); };
  for (int rows : {64, 128}) {  // a forced height does not change the one-tile kernel's (one m-tile a warp)
    cuda_be().set_flash_block_rows(rows);
    for (const Case& c : cases) {
      const Tensor q = random_tensor({c.b, c.h, c.sq, c.d}, 92), k = random_tensor({c.b, c.hk, c.sk, c.d}, 93),
                   v = random_tensor({c.b, c.hk, c.sk, c.d}, 94);
      for (const char* mask : {"none", "additive", "padding"}) {
        for (DType dt : test::kLowp) {
          char what[160];
          std::snprintf(what, sizeof(what), "short-kv attention rows%d b%lld h%lld/%lld q%lld k%lld d%lld mask %s %s", rows,
                        (long long)c.b, (long long)c.h, (long long)c.hk, (long long)c.sq, (long long)c.sk, (long long)c.d,
                        mask, std::string(dtype_name(dt)).c_str());
          const int64_t before = cuda::short_kv_attention_launches();
          EXPECT_PARITY(std::string(what), fn, std::vector<Tensor>({q, k, v, mask_for(mask, c)}), dt);
          EXPECT_GT(cuda::short_kv_attention_launches(), before) << what << ": the one-tile kernel did not take the case";
        }
      }
    }
  }
}

TEST(CudaShortKvAttention, NarrowHeadDimsMatchTheCpu) {
  ATELIER_REQUIRE_CUDA();
  ShortScope scope;
  // SD 1.x's level-0 and level-1 cross-attentions (head dims 40 and 80 over 77 keys), SD 2.x's 64, every head-dim
  // bucket (8 runs with 32 columns, 96 with 128), exactly 80 keys, one key, grouped K/V heads, ragged and single queries.
  const Case cases[] = {{2, 8, 8, 4096, 77, 40}, {2, 8, 8, 1024, 77, 80}, {1, 5, 5, 300, 77, 64},
                        {1, 2, 2, 50, 20, 8},    {1, 3, 3, 100, 80, 32},  {1, 4, 2, 130, 33, 48},
                        {1, 2, 2, 70, 1, 96},    {1, 2, 2, 33, 77, 128},  {1, 2, 2, 1, 77, 40}};
  const auto fn = [](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], Tensor()); };
  // Blocks of 4, 8 and 16 warps (16 falls back to 8 at head dims above 80); the one-wave grid, one tile a warp, three
  // (each warp's two Q buffers reused).
  const struct {
    int warps, tiles;
  } shapes[] = {{4, 0}, {4, 1}, {4, 3}, {8, 0}, {16, 0}, {16, 3}};
  for (const auto& shape : shapes) {
    cuda::set_short_kv_block_warps(shape.warps);
    cuda::set_short_kv_tiles_per_warp(shape.tiles);
    for (const Case& c : cases) {
      const Tensor q = random_tensor({c.b, c.h, c.sq, c.d}, 110), k = random_tensor({c.b, c.hk, c.sk, c.d}, 111),
                   v = random_tensor({c.b, c.hk, c.sk, c.d}, 112);
      for (DType dt : test::kLowp) {
        char what[160];
        std::snprintf(what, sizeof(what), "short-kv attention warps%d tiles%d b%lld h%lld/%lld q%lld k%lld d%lld %s",
                      shape.warps, shape.tiles, (long long)c.b, (long long)c.h, (long long)c.hk, (long long)c.sq,
                      (long long)c.sk, (long long)c.d, std::string(dtype_name(dt)).c_str());
        const int64_t before = cuda::short_kv_attention_launches();
        EXPECT_PARITY(std::string(what), fn, std::vector<Tensor>({q, k, v}), dt);
        EXPECT_GT(cuda::short_kv_attention_launches(), before) << what << ": the short-key kernel did not take the case";
      }
    }
  }
}

TEST(CudaShortKvAttention, WritesMergedHeads) {
  ATELIER_REQUIRE_CUDA();
  ShortScope scope;
  const auto fn = [](const std::vector<Tensor>& in) { return ops::attention_merged(in[0], in[1], in[2]); };
  for (int64_t d : {160, 40}) {  // the one-tile flash kernel; the narrow heads' kernel
    const Tensor q = random_tensor({2, 8, 256, d}, 95), k = random_tensor({2, 8, 77, d}, 96), v = random_tensor({2, 8, 77, d}, 97);
    const int64_t before = cuda::short_kv_attention_launches();
    for (DType dt : test::kLowp)
      EXPECT_PARITY("short-kv attention_merged d" + std::to_string(d), fn, std::vector<Tensor>({q, k, v}), dt);
    EXPECT_GT(cuda::short_kv_attention_launches(), before);
  }
}

TEST(CudaShortKvAttention, LongerSequencesOtherHeadDimsAndTheSwitchGoElsewhere) {
  ATELIER_REQUIRE_CUDA();
  ShortScope scope;
  const auto fn = [](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], Tensor()); };
  const Tensor q = random_tensor({1, 2, 100, 160}, 98), k81 = random_tensor({1, 2, 81, 160}, 99), v81 = random_tensor({1, 2, 81, 160}, 100);
  const Tensor k77 = random_tensor({1, 2, 77, 160}, 104), v77 = random_tensor({1, 2, 77, 160}, 105);
  const Tensor q40 = random_tensor({1, 2, 100, 40}, 101), k40 = random_tensor({1, 2, 81, 40}, 102), v40 = random_tensor({1, 2, 81, 40}, 103);
  const Tensor k40s = random_tensor({1, 2, 77, 40}, 106), v40s = random_tensor({1, 2, 77, 40}, 107);
  const auto masked = [](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], in[3]); };
  const int64_t before = cuda::short_kv_attention_launches();
  EXPECT_PARITY("81 keys (tiled)", fn, std::vector<Tensor>({q, k81, v81}), DType::BF16);
  EXPECT_PARITY("head dim 40 over 81 keys (wgmma or tiled)", fn, std::vector<Tensor>({q40, k40, v40}), DType::BF16);
  EXPECT_PARITY("head dim 40 over 77 keys, masked (tiled)", masked,
                std::vector<Tensor>({q40, k40s, v40s, random_tensor({100, 77}, 108, 2.0f)}), DType::BF16);
  // By default the narrow kernel stops at head dim 48: SD's d80 cross-attention goes to the wgmma (or tiled) kernel.
  cuda::set_short_kv_narrow_head_dims(cuda::short_kv_narrow_head_dims_default());
  const Tensor q80 = random_tensor({1, 2, 100, 80}, 113), k80 = random_tensor({1, 2, 77, 80}, 114), v80 = random_tensor({1, 2, 77, 80}, 115);
  EXPECT_PARITY("head dim 80 over 77 keys by default (wgmma or tiled)", fn, std::vector<Tensor>({q80, k80, v80}), DType::BF16);
  EXPECT_EQ(cuda::short_kv_attention_launches(), before);
  EXPECT_PARITY("head dim 40 over 77 keys by default (the narrow kernel)", fn, std::vector<Tensor>({q40, k40s, v40s}), DType::BF16);
  EXPECT_GT(cuda::short_kv_attention_launches(), before);
  const int64_t taken = cuda::short_kv_attention_launches();
  cuda::set_short_kv_attention(false);
  EXPECT_PARITY("77 keys, switched off (tiled)", fn, std::vector<Tensor>({q, k77, v77}), DType::BF16);
  EXPECT_PARITY("head dim 40, switched off", fn, std::vector<Tensor>({q40, k40s, v40s}), DType::BF16);
  EXPECT_EQ(cuda::short_kv_attention_launches(), taken);
}

}  // namespace
}  // namespace atelier
