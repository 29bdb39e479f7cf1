// torch-compatible generators: bit-exact against the fixtures' torch.randn goldens (CPU and CUDA generators),
// plus the stream semantics torch has (state carried across draws, the redrawn tail block, the scalar path's
// cached Box-Muller value, the CUDA offset and launch geometry). Where no fixture covers a case, the expected
// bits were measured once with torch 2.11.0 (x86-64 CPU, whose float randn runs the AVX2 kernel; NVIDIA H200:
// 132 SMs x 2048 threads) and are written out below.
#include "core/rng.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstring>

#include "test_util.h"

namespace atelier {
namespace {

std::vector<float> golden_values(const std::string& key) { return test::golden("sd15-tiny", key).to_vector(); }

// Count of elements whose bits differ (so -0 vs +0 and NaNs count too).
size_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t bad = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) bad += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
  return bad;
}

std::vector<float> concat(std::initializer_list<std::vector<float>> parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

#define EXPECT_BITS(value, bits) EXPECT_EQ(std::bit_cast<uint32_t>(float(value)), uint32_t(bits)) << (value)

constexpr int64_t kLatent16 = 1 * 4 * 16 * 16;
constexpr int64_t kLatent64 = 1 * 4 * 64 * 64;
const CudaDeviceProfile kH200{132, 2048};   // the GPU the measured CUDA values come from
constexpr int64_t kH200Stride = 132 * 8 * 256;  // threads in torch's capped grid there

// --- CPU generator --------------------------------------------------------------------------------------

TEST(RngCpu, MatchesTorchGoldenSeed1234) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const auto want = golden_values("noise.cpu.seed1234");
  TorchCpuGenerator gen(1234);
  EXPECT_EQ(bit_mismatches(gen.randn(kLatent16), want), 0u);
}

TEST(RngCpu, MatchesTorchGoldenSeed42Latent64) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const auto want = golden_values("noise.cpu.seed42.64x64");
  TorchCpuGenerator gen(42);
  EXPECT_EQ(bit_mismatches(gen.randn(kLatent64), want), 0u);
}

TEST(RngCpu, DrawsOfWholeBlocksContinueTheStream) {
  // n % 16 == 0: each draw uses exactly n uniforms, so two draws of 512 are one draw of 1024.
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const auto want = golden_values("noise.cpu.seed1234");
  TorchCpuGenerator gen(1234);
  const auto a = gen.randn(kLatent16 / 2);
  const auto b = gen.randn(kLatent16 / 2);
  EXPECT_EQ(bit_mismatches(concat({a, b}), want), 0u);
}

TEST(RngCpu, PartialLastBlockIsRedrawnFromFreshUniforms) {
  // randn(1000): 62 full blocks from uniforms 0..991 (as in randn(1024)), then the last 16 elements
  // [984, 1000) redrawn from uniforms 1000..1015 -- so only [0, 984) agrees with the 1024 draw.
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const auto full = golden_values("noise.cpu.seed1234");
  TorchCpuGenerator gen(1234);
  const auto v = gen.randn(1000);
  using Vec = std::vector<float>;
  EXPECT_EQ(bit_mismatches(Vec(v.begin(), v.begin() + 984), Vec(full.begin(), full.begin() + 984)), 0u);
  EXPECT_EQ(bit_mismatches(Vec(v.begin() + 984, v.end()), Vec(full.begin() + 984, full.begin() + 1000)), 16u);
  // torch 2.11: torch.randn(1000, generator=torch.Generator().manual_seed(1234))[983, 984, 999]
  EXPECT_BITS(v[983], 0xbf05c245);
  EXPECT_BITS(v[984], 0x3e524b7b);
  EXPECT_BITS(v[999], 0x3fa47522);
  // The same at the smallest size: randn(17) keeps element 0 of the first block, redraws [1, 17).
  TorchCpuGenerator g17(1234);
  const auto w = g17.randn(17);
  EXPECT_EQ(w[0], full[0]);
  EXPECT_BITS(w[0], 0xbde4ccb4);  // torch 2.11: torch.randn(17, generator=...manual_seed(1234))[0, 1, 16]
  EXPECT_BITS(w[1], 0xbdbd013f);
  EXPECT_BITS(w[16], 0xc021bfdc);
}

TEST(RngCpu, ScalarPathBelowSixteenMatchesTorch) {
  // torch 2.11: torch.randn(5, generator=torch.Generator().manual_seed(1234))
  TorchCpuGenerator gen(1234);
  const auto v = gen.randn(5);
  const uint32_t want[5] = {0x3d3cf34c, 0x3ece07be, 0xbf8179c9, 0x3e5df0a1, 0xbf1cbdee};
  for (int i = 0; i < 5; ++i) EXPECT_BITS(v[i], want[i]) << " at " << i;
}

TEST(RngCpu, ScalarPathCachesTheSecondValueAcrossDraws) {
  // torch keeps r*sin(theta) in the generator; a vectorised draw in between neither uses nor clears it.
  // torch 2.11, one generator seeded 5: randn(3), randn(20), randn(1) -> the randn(1) is the cached value.
  TorchCpuGenerator gen(5);
  const auto a = gen.randn(3);
  gen.randn(20);
  const auto c = gen.randn(1);
  EXPECT_BITS(a[0], 0xbef93b54);
  EXPECT_BITS(a[2], 0xbf0edf65);
  EXPECT_BITS(c[0], 0x3f2ae2df);
  TorchCpuGenerator fresh(5);
  EXPECT_EQ(fresh.randn(4)[3], c[0]);  // the sin half of the second pair
  // manual_seed drops the cache: the same draw again.
  gen.manual_seed(5);
  EXPECT_EQ(bit_mismatches(gen.randn(3), a), 0u);
}

TEST(RngCpu, OnlyTheLow32SeedBitsMatter) {
  // at::mt19937 seeds with seed & 0xffffffff (checked against torch for 2^32 + 1234 and 2^64 - 1).
  TorchCpuGenerator a(1234), b((uint64_t(1) << 32) + 1234);
  EXPECT_EQ(bit_mismatches(a.randn(40), b.randn(40)), 0u);
  EXPECT_EQ(b.initial_seed(), (uint64_t(1) << 32) + 1234);
}

TEST(RngCpu, RandMatchesTorch) {
  // torch 2.11: torch.rand(100, generator=torch.Generator().manual_seed(9))[0, 1, 99]
  TorchCpuGenerator gen(9);
  const auto v = gen.rand(100);
  EXPECT_BITS(v[0], 0x3f27e17e);
  EXPECT_BITS(v[1], 0x3e9aa2b8);
  EXPECT_BITS(v[99], 0x3f251c2e);
  for (float x : v) EXPECT_TRUE(x >= 0.0f && x < 1.0f);
}

// --- CUDA generator ---------------------------------------------------------------------------------------

TEST(RngCuda, MatchesTorchGoldenSeed1234) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const auto want = golden_values("noise.cuda.seed1234");
  TorchCudaGenerator gen(1234);
  EXPECT_EQ(bit_mismatches(gen.randn(kLatent16), want), 0u);
}

TEST(RngCuda, MatchesTorchGoldenSeed42Latent64) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const auto want = golden_values("noise.cuda.seed42.64x64");
  TorchCudaGenerator gen(42);
  EXPECT_EQ(bit_mismatches(gen.randn(kLatent64), want), 0u);
}

TEST(RngCuda, EveryGpuGivesTheSameSmallDraws) {
  // Up to 256 * max_resident_blocks elements each element comes from its own thread's first value.
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const auto want = golden_values("noise.cuda.seed42.64x64");
  for (CudaDeviceProfile gpu : {CudaDeviceProfile::rtx3060(), CudaDeviceProfile::a100(), kH200}) {
    TorchCudaGenerator gen(42, gpu);
    EXPECT_EQ(bit_mismatches(gen.randn(kLatent64), want), 0u) << gpu.multiprocessor_count << " SMs";
  }
}

TEST(RngCuda, LargeDrawsFollowTheLaunchGeometry) {
  // torch 2.11 on an H200 (grid capped at 1056 blocks = 270336 threads): element t + stride*(4r + i) is
  // component i of thread t's r-th curand_normal4 -- components 1..3 and a second round appear here.
  TorchCudaGenerator a(1234, kH200);
  const auto v = a.randn(kH200Stride + 1);
  EXPECT_BITS(v[0], 0xbfcee929);
  EXPECT_BITS(v[1], 0x3f118647);
  EXPECT_BITS(v[kH200Stride], 0x3f9d54f1);  // thread 0, component 1 (s * cos)
  TorchCudaGenerator b(1234, kH200);
  const auto w = b.randn(3 * kH200Stride + 7);
  EXPECT_BITS(w[2 * kH200Stride + 5], 0xbf8d15bb);  // thread 5, component 2
  EXPECT_BITS(w[3 * kH200Stride + 6], 0x3f36fd9d);  // thread 6, component 3
  TorchCudaGenerator c(1234, kH200);
  const auto x = c.randn(4 * kH200Stride + 9);
  EXPECT_BITS(x[4 * kH200Stride + 8], 0x3ef332ec);  // thread 8, second round
  EXPECT_EQ(c.offset(), 8u);
  // A GPU with fewer resident threads lays the same draw out differently.
  TorchCudaGenerator small(1234, CudaDeviceProfile::rtx3060());
  EXPECT_NE(bit_mismatches(small.randn(kH200Stride + 1), v), 0u);
}

TEST(RngCuda, OffsetAdvancesPerDrawAsTorchDoes) {
  // torch 2.11, one generator seeded 7 on an H200: randn(1000), randn(270337), rand(5000), randn(3),
  // rand(4*270336+1), randn(1024) -> get_offset() after each: 4 8 12 16 24 28.
  TorchCudaGenerator gen(7, kH200);
  const uint64_t want[] = {4, 8, 12, 16, 24, 28};
  const auto a = gen.randn(1000);
  EXPECT_EQ(gen.offset(), want[0]);
  const auto b = gen.randn(kH200Stride + 1);
  EXPECT_EQ(gen.offset(), want[1]);
  const auto c = gen.rand(5000);
  EXPECT_EQ(gen.offset(), want[2]);
  gen.randn(3);
  EXPECT_EQ(gen.offset(), want[3]);
  gen.rand(4 * kH200Stride + 1);
  EXPECT_EQ(gen.offset(), want[4]);
  gen.randn(1024);
  EXPECT_EQ(gen.offset(), want[5]);
  EXPECT_BITS(a[0], 0xbe9c14e8);
  EXPECT_BITS(b[0], 0xbfa4bccc);
  EXPECT_BITS(c[0], 0x3bc711e0);
  gen.manual_seed(7);
  EXPECT_EQ(gen.offset(), 0u);
  EXPECT_EQ(bit_mismatches(gen.randn(1000), a), 0u);
}

TEST(RngCuda, SeedUsesAll64Bits) {
  // The Philox key is the whole seed (unlike the CPU generator).
  TorchCudaGenerator a(1234), b((uint64_t(1) << 32) + 1234);
  EXPECT_EQ(bit_mismatches(a.randn(64), b.randn(64)), 64u);
}

TEST(RngCuda, RandMatchesTorch) {
  // torch 2.11: torch.rand(1024, generator=torch.Generator('cuda').manual_seed(3), device='cuda')[:3]
  TorchCudaGenerator gen(3);
  const auto v = gen.rand(1024);
  EXPECT_BITS(v[0], 0x3f51104d);
  EXPECT_BITS(v[1], 0x3e518e5f);
  EXPECT_BITS(v[2], 0x3e1db3b4);
  for (float x : v) EXPECT_TRUE(x >= 0.0f && x < 1.0f);
}

// --- interface ----------------------------------------------------------------------------------------------

TEST(Rng, ParsesKindNames) {
  EXPECT_EQ(*parse_rng_kind("cpu"), RngKind::kCpu);
  EXPECT_EQ(*parse_rng_kind("cuda"), RngKind::kCuda);
  const auto bad = parse_rng_kind("nv");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'cpu'"), std::string::npos);
  EXPECT_EQ(rng_kind_name(RngKind::kCuda), "cuda");
}

TEST(Rng, MakeGeneratorAndRandnTensor) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  for (RngKind kind : {RngKind::kCpu, RngKind::kCuda}) {
    auto gen = make_generator(kind, 1234);
    EXPECT_EQ(gen->kind(), kind);
    EXPECT_EQ(gen->initial_seed(), 1234u);
    const Tensor t = randn_tensor(*gen, {1, 4, 16, 16});
    EXPECT_EQ(t.shape(), (Shape{1, 4, 16, 16}));
    EXPECT_EQ(t.dtype(), DType::F32);
    const char* key = kind == RngKind::kCpu ? "noise.cpu.seed1234" : "noise.cuda.seed1234";
    EXPECT_EQ(bit_mismatches(t.to_vector(), golden_values(key)), 0u);
  }
  auto gen = make_generator(RngKind::kCpu, 1);
  EXPECT_EQ(randn_tensor(*gen, {0, 4}).numel(), 0);
}

}  // namespace
}  // namespace atelier
