// CUDA backend, group norms against the CPU backend: NCHW (cuda_norm.cu), channels-last in one kernel per
// (sample, group slice) (cuda_group_norm_slice.cu), in one cooperative kernel over the whole grid
// (cuda_group_norm_grid.cu), and the three-kernel path (cuda_group_norm_nhwc.cu), each pinned by switching the others
// off and checked for which ran. Criteria in cuda_test_util.h; skips with the reason when cuda:0 is not usable.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <iterator>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_group_norm_grid.h"
#include "backend/cuda/cuda_group_norm_slice.h"
#include "backend/graph_runner.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"

namespace atelier {
namespace {

using test::channels_last;
using test::cuda0;
using test::kLowp;
using test::random_tensor;
using test::to_gpu;

// Restores the backend's group-norm switches when a test ends.
struct GnGuard {
  ~GnGuard() {
    if (!backend_available(cuda0())) return;
    test::cuda_be().set_group_norm_apply_merge(false);
    test::cuda_be().set_group_norm_offset_in_kernels(true);
  }
};

// The cooperative whole-grid group norm (cuda_group_norm_grid.cu) switched on or off for a test, then back.
struct GnGridScope {
  bool was = cuda::group_norm_grid_enabled();
  explicit GnGridScope(bool on) { cuda::set_group_norm_grid(on); }
  ~GnGridScope() { cuda::set_group_norm_grid(was); }
};

TEST(CudaOps, GroupNormMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  struct Case { Shape x; int groups; float offset; };
  // The [1, 4, 300, 300] case spreads each group over 44 statistics blocks; offset 100 checks that the
  // variance does not cancel when the mean is large against the spread.
  // Shapes whose groups and planes are multiples of 8 take the vectorised kernels (16-byte loads), the others
  // the scalar ones; [2, 64, 32, 32] with offset 100 checks the vectorised statistics for cancellation.
  const Case cases[] = {{{2, 32, 5, 7}, 8, 0.0f}, {{1, 64, 64, 64}, 32, 0.0f}, {{1, 4, 300, 300}, 2, 0.0f},
                        {{2, 6, 11}, 3, 100.0f}, {{3, 7}, 7, 0.0f}, {{2, 64, 32, 32}, 32, 100.0f}};
  for (const Case& c : cases) {
    const Tensor x = random_tensor(c.x, 41, 1.0f, c.offset), g = random_tensor({c.x[1]}, 42), b = random_tensor({c.x[1]}, 43);
    for (UnaryOp act : {UnaryOp::kIdentity, UnaryOp::kSilu}) {
      const int groups = c.groups;
      const auto fn = [groups, act](const std::vector<Tensor>& in) { return ops::group_norm(in[0], groups, in[1], in[2], 1e-5f, act); };
      const std::string what = "group_norm " + shape_str(c.x) + " groups " + std::to_string(groups) + " act " + std::to_string(int(act));
      EXPECT_PARITY(what, fn, std::vector<Tensor>({x, g, b}), DType::F32);
      for (DType dt : kLowp) EXPECT_PARITY(what, fn, std::vector<Tensor>({x, g, b}), dt);
    }
    const int groups = c.groups;
    EXPECT_PARITY("group_norm no affine", [groups](const std::vector<Tensor>& in) { return ops::group_norm(in[0], groups, Tensor(), Tensor(), 1e-6f); },
                  {x}, DType::F32);
  }
}

// The one-kernel group norm (cuda_group_norm_slice.cu) switched on or off for a test, then back.
struct GnSliceScope {
  bool was = cuda::group_norm_slice_enabled();
  explicit GnSliceScope(bool on) { cuda::set_group_norm_slice(on); }
  ~GnSliceScope() { cuda::set_group_norm_slice(was); }
};

// Clusters for the one-kernel group norm switched on (forced: at any tensor and grid size, aiming at 16 KB of a
// slice per block), on with the default policy, or off, for a test; then back to the defaults.
enum class GnClusters { kOff, kForced, kDefault };
struct GnClusterScope {
  explicit GnClusterScope(GnClusters mode) {
    cuda::set_group_norm_cluster(mode != GnClusters::kOff);
    if (mode == GnClusters::kForced) cuda::set_group_norm_cluster_policy(int64_t(16) << 10, int64_t(1) << 40, true);
  }
  ~GnClusterScope() {
    cuda::set_group_norm_cluster(true);
    cuda::set_group_norm_cluster_policy(0, 0);
  }
};

// Channels-last group norm in one kernel per (sample, group slice) staged in shared memory: SD's 8x8-32x32 shapes
// (slices of 1 group of 40/80 channels, 2 groups of 20 or 60, 4 groups of 10 or 30), a large mean, the resnets'
// offset (a narrow of a stacked tensor, its mean large too), 16 samples, 9 pixels of 2-channel groups (a block of
// fewer threads than a warp's multiple: the reductions' idle threads); every input ramps across its pixels. Then on
// Hopper the same with the slices split over clusters of blocks of about 16 KB (the sums exchanged through
// distributed shared memory), and the slices past one block's 96 KB: SD's 64x64 level, 4087 pixels (rows split
// unevenly), 960 channels with an offset (4 groups of 30 over 16 blocks), 1024²'s 128x128 level (82 KB per block),
// the VAE's 16- and 8-channel slices, a large mean; forced at every size, and by the default policy (tensors up to
// 16 MB of fewer (sample, slice)s than SMs). Each case must have taken the path its sizes call for; SD 1024²'s
// [1, 960, 128, 128] (3.9 MB slices) goes to the three-kernel path. Clusters run in both builds of the kernel (at
// most 64 registers a thread, and uncapped), with the build chosen by the launch, and with clusters halved until the
// device holds them all at once.
TEST(CudaOps, ChannelsLastGroupNormInOneKernelMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  GnSliceScope slice(true);
  const bool hopper = test::cuda_be().cc_major() >= 9;
  constexpr int64_t kDefaultMaxTensor = int64_t(16) << 20;
  // one_block: the 16-bit slice fits one block (96 KB); in_cluster: it fits 16 blocks; over_16k: a cluster splits it.
  struct Case { Shape x; float mean; bool offset; bool one_block, in_cluster, over_16k; };
  const Case cases[] = {
      {{2, 1280, 8, 8}, 0.0f, false, true, true, false},     {{2, 2560, 16, 16}, 100.0f, false, true, true, true},
      {{16, 640, 32, 32}, 0.0f, true, true, true, true},     {{1, 1920, 16, 16}, 0.0f, false, true, true, true},
      {{3, 960, 8, 8}, 30.0f, true, true, true, false},      {{2, 320, 32, 32}, 0.0f, false, true, true, true},
      {{2, 1280, 8, 8}, 0.0f, true, true, true, false},      {{2, 64, 3, 3}, 0.0f, true, true, true, false},
      {{2, 320, 64, 64}, 0.0f, true, false, true, true},     {{2, 320, 61, 67}, 0.0f, false, false, true, true},
      {{1, 960, 64, 64}, 30.0f, true, false, true, true},    {{2, 640, 64, 64}, 100.0f, false, false, true, true},
      {{1, 320, 128, 128}, 0.0f, true, false, true, true},   {{1, 512, 64, 64}, 0.0f, false, false, true, true},
      {{1, 128, 256, 256}, 100.0f, false, false, true, true}, {{1, 960, 128, 128}, 0.0f, false, false, false, true}};
  using Cap = cuda::SliceRegisterCap;
  struct Mode { GnClusters clusters; Cap cap; bool one_wave; };
  for (const auto& [mode, cap, one_wave] : {Mode{GnClusters::kOff, Cap::kNever, false}, Mode{GnClusters::kForced, Cap::kNever, false},
                                            Mode{GnClusters::kDefault, Cap::kNever, false}, Mode{GnClusters::kForced, Cap::kAlways, false},
                                            Mode{GnClusters::kDefault, Cap::kAlways, false}, Mode{GnClusters::kForced, Cap::kNever, true},
                                            Mode{GnClusters::kDefault, Cap::kAlways, true}, Mode{GnClusters::kForced, Cap::kAuto, true},
                                            Mode{GnClusters::kDefault, Cap::kAuto, true}}) {
    GnClusterScope scope(mode);
    cuda::set_group_norm_slice_register_cap(cap);     // the kernel of at most 64 registers, the uncapped, or by the launch
    cuda::set_group_norm_cluster_one_wave(one_wave);  // clusters halved until the device holds them all
    for (const Case& c : cases) {
      const int64_t ch = c.x[1], bytes = c.x[0] * ch * c.x[2] * c.x[3] * 2, cg = ch / 32;
      const int64_t blocks = c.x[0] * 32 / (8 / std::gcd(cg, int64_t(8)));  // (sample, slice)s: whole 16-byte vectors
      const bool few = bytes <= kDefaultMaxTensor && blocks < test::cuda_be().sm_count();
      const bool split = hopper && (mode == GnClusters::kForced || (mode == GnClusters::kDefault && few));
      Tensor x = random_tensor(c.x, 65, 1.0f, c.mean);
      const Tensor g = random_tensor({ch}, 66), b = random_tensor({ch}, 67);
      const Tensor stacked = random_tensor({c.x[0], ch + 64}, 68, 1.0f, 20.0f);
      // A ramp of 3 across the pixels: a cluster's blocks (which hold pixel ranges) see different means, so a block
      // that normalised by its own sums alone would be off by up to 1.5 standard deviations.
      const int64_t hw = c.x[2] * c.x[3];
      float* px = x.data<float>();
      for (int64_t i = 0; i < x.numel(); ++i) px[i] += 3.0f * float(i % hw) / float(hw);
      const bool offset = c.offset;
      const auto fn = [offset, ch](const std::vector<Tensor>& in) {
        const Tensor y = ops::group_norm(channels_last(in[0]), 32, in[1], in[2], 1e-5f, UnaryOp::kSilu,
                                         offset ? in[3].narrow(1, 32, ch) : Tensor());
        if (!in[0].device().is_cpu() && in[0].dtype() != DType::F32) EXPECT_TRUE(y.is_channels_last()) << shape_str(y.strides());
        return y;
      };
      const char* how[] = {" (clusters off)", " (clusters forced)", ""};
      const std::string what = "one-kernel group_norm " + shape_str(c.x) + (offset ? " + offset" : "") + how[int(mode)] +
                               (cap == Cap::kAlways ? " (64 registers)" : cap == Cap::kAuto ? " (registers by residency)" : "") + (one_wave ? " (one wave)" : "");
      const int64_t before = cuda::group_norm_slice_launches(), clustered = cuda::group_norm_slice_cluster_launches();
      for (DType dt : kLowp) EXPECT_PARITY(what, fn, std::vector<Tensor>({x, g, b, stacked}), dt);
      const bool one_kernel = split ? c.in_cluster : c.one_block;
      EXPECT_EQ(cuda::group_norm_slice_launches() - before, one_kernel ? 2 : 0) << what;
      if (!one_wave)  // one wave: how far clusters are halved depends on how many the device holds
        EXPECT_EQ(cuda::group_norm_slice_cluster_launches() - clustered, split && c.in_cluster && c.over_16k ? 2 : 0) << what;
      EXPECT_PARITY(what + " f32", fn, std::vector<Tensor>({x, g, b, stacked}), DType::F32);  // f32 slices: twice the bytes
    }
  }
  cuda::set_group_norm_slice_register_cap(Cap::kAuto);  // the defaults
  cuda::set_group_norm_cluster_one_wave(true);
}

// The one-kernel path with each form of its activation (cuda_norm_act.cuh): identity and SiLU compiled in, anything
// else (GELU here) chosen at run time; one block per slice (the 64-register build at 16 rows) and in clusters (CFG).
TEST(CudaOps, ChannelsLastGroupNormInOneKernelAppliesEachActivation) {
  ATELIER_REQUIRE_CUDA();
  GnSliceScope slice(true);
  for (const Shape& s : {Shape{16, 640, 32, 32}, Shape{2, 320, 32, 32}, Shape{2, 1280, 8, 8}}) {
    const Tensor x = random_tensor(s, 71, 1.0f, 2.0f), g = random_tensor({s[1]}, 72), b = random_tensor({s[1]}, 73);
    for (UnaryOp act : {UnaryOp::kIdentity, UnaryOp::kSilu, UnaryOp::kGelu}) {
      const auto fn = [act](const std::vector<Tensor>& in) {
        return ops::group_norm(channels_last(in[0]), 32, in[1], in[2], 1e-5f, act);
      };
      const std::string what = "one-kernel group_norm " + shape_str(s) + " act " + std::to_string(int(act));
      const int64_t before = cuda::group_norm_slice_launches();
      for (DType dt : kLowp) EXPECT_PARITY(what, fn, std::vector<Tensor>({x, g, b}), dt);
      EXPECT_EQ(cuda::group_norm_slice_launches() - before, 2) << what << ": the one-kernel path did not take it";
    }
  }
}

// The cluster policy on SD's batch-2 norms (512² CFG and 1024²; the VAE's [1, 512, 128, 128]): with the defaults every
// launch takes the one-kernel path in clusters the device holds all at once (session 44's ncu found 16 clusters
// against 14 resident, a second wave paying the whole latency chain again); without the halving, how many do not
// (a figure: it depends on the device's GPCs and the kernel's registers).
TEST(CudaOps, ChannelsLastGroupNormClustersFitInOneWave) {
  ATELIER_REQUIRE_CUDA();
  if (test::cuda_be().cc_major() < 9)
    GTEST_SKIP() << "thread block clusters need Hopper (sm_90); this device is sm_" << test::cuda_be().cc_major() << "x";
  GnSliceScope slice(true);
  const Shape shapes[] = {{2, 320, 64, 64},  {2, 640, 64, 64},  {2, 960, 64, 64}, {2, 1280, 32, 32},
                          {2, 1920, 32, 32}, {2, 2560, 32, 32}, {2, 640, 32, 32}, {1, 512, 128, 128}};
  for (const bool one_wave : {true, false}) {
    cuda::set_group_norm_cluster_one_wave(one_wave);
    int64_t two_waves = 0;
    for (const Shape& shape : shapes) {
      const Tensor x = channels_last(to_gpu(random_tensor(shape, 71), DType::BF16));
      const Tensor g = to_gpu(random_tensor({shape[1]}, 72)), b = to_gpu(random_tensor({shape[1]}, 73));
      const int64_t launches = cuda::group_norm_slice_launches(), clustered = cuda::group_norm_slice_cluster_launches();
      const int64_t waves = cuda::group_norm_slice_two_wave_launches();
      const Tensor y = ops::group_norm(x, 32, g, b, 1e-5f, UnaryOp::kSilu);
      backend_for(y.device()).synchronize();
      EXPECT_EQ(cuda::group_norm_slice_launches() - launches, 1) << shape_str(shape) << ": not the one-kernel path";
      EXPECT_EQ(cuda::group_norm_slice_cluster_launches() - clustered, 1) << shape_str(shape) << ": not in clusters";
      if (one_wave) EXPECT_EQ(cuda::group_norm_slice_two_wave_launches() - waves, 0) << shape_str(shape) << ": two waves";
      two_waves += cuda::group_norm_slice_two_wave_launches() - waves;
    }
    std::printf("[ figures  ] %s: %lld of %zu SD norms in clusters the device cannot hold at once\n",
                one_wave ? "clusters halved (default)" : "clusters not halved", static_cast<long long>(two_waves), std::size(shapes));
  }
  cuda::set_group_norm_cluster_one_wave(true);
}

// The whole-grid group norm (one block per SM, each a run of pixel rows staged in shared memory as far as it fits,
// group sums exchanged through a grid barrier), with the slice kernel off so that every case reaches it: SD 16 rows'
// [16, 320, 64, 64] (42 MB: rows past the shared memories re-read, blocks straddling samples), with the resnets'
// offset and a mean of 30; SD 1024²'s [2, 320, 128, 128] (wholly staged) with a mean of 100 (the sums' reference
// must keep the variance from cancelling); one sample of 960 channels (groups of 30: vectors straddling two groups)
// with an offset; 4087 pixels (blocks of uneven rows across three samples); [8, 960, 64, 64] (63 MB, half of it
// unstaged); no affine parameters with the identity. Every input ramps by 3 across its pixels, so that blocks of
// one sample see different means. VAE-like 4-channel groups are narrower than a 16-bit vector: the kernel declines
// them (the three kernels run). f32 tensors take the NCHW kernels (checked for parity only). Then the same norm twice
// must give the same bits, and recorded in a CUDA graph (a cooperative kernel node) the bits of the eager call.
TEST(CudaOps, ChannelsLastGroupNormOverTheGridMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  GnSliceScope no_slices(false);
  GnGridScope grid(true);
  struct Case { Shape x; float mean; bool offset, affine; UnaryOp act; bool lowp_taken; };
  const Case cases[] = {{{16, 320, 64, 64}, 0.0f, false, true, UnaryOp::kSilu, true},
                        {{16, 320, 64, 64}, 30.0f, true, true, UnaryOp::kSilu, true},
                        {{2, 320, 128, 128}, 100.0f, false, true, UnaryOp::kSilu, true},
                        {{1, 960, 64, 64}, 0.0f, true, true, UnaryOp::kSilu, true},
                        {{3, 640, 61, 67}, 0.0f, false, true, UnaryOp::kSilu, true},
                        {{8, 960, 64, 64}, 0.0f, true, true, UnaryOp::kSilu, true},
                        {{2, 640, 64, 64}, 0.0f, false, false, UnaryOp::kIdentity, true},
                        {{1, 128, 128, 128}, 0.0f, false, true, UnaryOp::kSilu, false}};
  for (const Case& c : cases) {
    const int64_t ch = c.x[1], hw = c.x[2] * c.x[3];
    Tensor x = random_tensor(c.x, 81, 1.0f, c.mean);
    float* px = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) px[i] += 3.0f * float(i % hw) / float(hw);
    const Tensor g = random_tensor({ch}, 82), b = random_tensor({ch}, 83);
    const Tensor stacked = random_tensor({c.x[0], ch + 64}, 84, 1.0f, 20.0f);
    const bool offset = c.offset, affine = c.affine;
    const UnaryOp act = c.act;
    const auto fn = [offset, affine, act, ch](const std::vector<Tensor>& in) {
      const Tensor y = ops::group_norm(channels_last(in[0]), 32, affine ? in[1] : Tensor(), affine ? in[2] : Tensor(), 1e-5f, act,
                                       offset ? in[3].narrow(1, 32, ch) : Tensor());
      if (!in[0].device().is_cpu() && in[0].dtype() != DType::F32) EXPECT_TRUE(y.is_channels_last()) << shape_str(y.strides());
      return y;
    };
    const std::string what = "grid group_norm " + shape_str(c.x) + (offset ? " + offset" : "") + (affine ? "" : " no affine");
    const int64_t before = cuda::group_norm_grid_launches();
    for (DType dt : kLowp) EXPECT_PARITY(what, fn, std::vector<Tensor>({x, g, b, stacked}), dt);
    EXPECT_EQ(cuda::group_norm_grid_launches() - before, c.lowp_taken ? 2 : 0) << what;
    EXPECT_PARITY(what + " f32", fn, std::vector<Tensor>({x, g, b, stacked}), DType::F32);  // the NCHW kernels
  }
  // Repeatable bits, eager and replayed from a CUDA graph.
  const Tensor x = to_gpu(random_tensor({4, 320, 64, 64}, 85, 1.0f, 5.0f), DType::BF16);
  const Tensor g = to_gpu(random_tensor({320}, 86), DType::BF16), b = to_gpu(random_tensor({320}, 87), DType::BF16);
  const auto norm = [&](const std::vector<Tensor>& in) { return ops::group_norm(channels_last(in[0]), 32, g, b, 1e-5f, UnaryOp::kSilu); };
  const std::vector<float> first = norm({x}).to_vector(), second = norm({x}).to_vector();
  ASSERT_EQ(first.size(), second.size());
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0) << "two eager calls differ";
  GraphRunner runner(GraphRunner::Options{});
  const int64_t before = cuda::group_norm_grid_launches();
  for (int call = 0; call < 3; ++call) {
    const std::vector<float> got = runner.run({x}, cuda0(), norm).to_vector();
    EXPECT_EQ(std::memcmp(got.data(), first.data(), first.size() * sizeof(float)), 0) << "graph call " << call;
  }
  const GraphRunner::Stats s = runner.stats();
  EXPECT_EQ(s.captures, 1) << s.last_failure;
  EXPECT_GE(s.replays, 1);
  EXPECT_GE(cuda::group_norm_grid_launches() - before, 2);  // the warm-up and the recording
}

// Channels-last group norm (the NHWC kernels: per-channel chunk sums, a warp per group merging them) at SD's
// channel counts, including the up blocks' concatenations (960, 1920, 2560) and a large mean; a VAE-like shape
// with hundreds of chunks per group and a large mean (the merge's unrolled loop, its common reference); 12
// channels are not whole 16-byte vectors and go through NCHW copies. The output stays channels-last. Each case
// also with the merge inside the apply kernel (set_group_norm_apply_merge: the small cases and the 16-sample one
// take it).
TEST(CudaOps, ChannelsLastGroupNormMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  GnGuard restore;
  GnSliceScope no_slices(false);
  GnGridScope three_kernels(false);
  struct Case { Shape x; int groups; float offset; };
  const Case cases[] = {{{2, 320, 64, 64}, 32, 0.0f}, {{2, 2560, 8, 8}, 32, 0.0f}, {{1, 1920, 16, 16}, 32, 0.0f},
                        {{2, 960, 32, 32}, 32, 100.0f}, {{3, 64, 5, 7}, 4, 0.0f}, {{2, 12, 5, 5}, 4, 0.0f},
                        {{16, 640, 32, 32}, 32, 0.0f}, {{1, 128, 256, 256}, 32, 100.0f}};
  for (const Case& c : cases) {
    const Tensor x = random_tensor(c.x, 61, 1.0f, c.offset), g = random_tensor({c.x[1]}, 62), b = random_tensor({c.x[1]}, 63);
    for (UnaryOp act : {UnaryOp::kIdentity, UnaryOp::kSilu}) {
      const int groups = c.groups;
      const auto fn = [groups, act](const std::vector<Tensor>& in) {
        const Tensor y = ops::group_norm(channels_last(in[0]), groups, in[1], in[2], 1e-5f, act);
        if (!in[0].device().is_cpu() && in[0].dtype() != DType::F32) EXPECT_TRUE(y.is_channels_last()) << shape_str(y.strides());
        return y;
      };
      for (bool merge_in_apply : {false, true}) {
        test::cuda_be().set_group_norm_apply_merge(merge_in_apply);
        const std::string what = "channels-last group_norm " + shape_str(c.x) + " act " + std::to_string(int(act)) +
                                 (merge_in_apply ? " (merged in apply)" : "");
        for (DType dt : kLowp) EXPECT_PARITY(what, fn, std::vector<Tensor>({x, g, b}), dt);
      }
    }
  }
}

// The norm of x + offset (the resnets' time embedding joining norm2): offset a narrow of a stacked [N, K] tensor, its
// mean large against x's spread (the statistics' shift must include it), at SD's channel counts through the
// channels-last kernels (the merge in its own kernel and inside the apply kernel) and with the offset in a pass of its
// own (the default path, which 12 channels and an NCHW tensor always take).
TEST(CudaOps, GroupNormWithOffsetMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  GnGuard restore;
  GnSliceScope no_slices(false);
  GnGridScope three_kernels(false);
  struct Case { Shape x; int groups; bool nhwc; };
  const Case cases[] = {{{2, 320, 64, 64}, 32, true}, {{2, 1280, 8, 8}, 32, true}, {{16, 640, 32, 32}, 32, true},
                        {{2, 12, 5, 5}, 4, true}, {{2, 64, 9, 7}, 8, false}};
  for (const Case& c : cases) {
    const int64_t ch = c.x[1];
    const Tensor x = random_tensor(c.x, 71, 1.0f), g = random_tensor({ch}, 72), b = random_tensor({ch}, 73);
    const Tensor stacked = random_tensor({c.x[0], ch + 64}, 74, 1.0f, 20.0f);
    const int groups = c.groups;
    const bool nhwc = c.nhwc;
    const auto fn = [groups, nhwc, ch](const std::vector<Tensor>& in) {
      const Tensor y = ops::group_norm(nhwc ? channels_last(in[0]) : in[0], groups, in[1], in[2], 1e-5f, UnaryOp::kSilu,
                                       in[3].narrow(1, 32, ch));
      if (nhwc && !in[0].device().is_cpu()) EXPECT_TRUE(y.is_channels_last()) << shape_str(y.strides());
      return y;
    };
    for (int variant = 0; variant < 3; ++variant) {  // in the kernels (merge kernel, merge in apply); a pass of its own
      test::cuda_be().set_group_norm_apply_merge(variant == 1);
      test::cuda_be().set_group_norm_offset_in_kernels(variant != 2);
      const char* how[] = {"", " (merged in apply)", " (offset in its own pass)"};
      const std::string what = std::string(nhwc ? "channels-last" : "NCHW") + " group_norm with offset " + shape_str(c.x) + how[variant];
      for (DType dt : kLowp) EXPECT_PARITY(what, fn, std::vector<Tensor>({x, g, b, stacked}), dt);
    }
  }
}

}  // namespace
}  // namespace atelier
