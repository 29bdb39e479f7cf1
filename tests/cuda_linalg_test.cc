// CUDA backend, part 2: GEMM (cuBLASLt epilogues, batching, transposes), convolution (cuDNN and the im2col
// path), layer/RMS norms and attention (the flash kernel and the GEMM path), each against the CPU backend in
// f32 and bf16/f16 (criteria in cuda_test_util.h). Skips with the reason when cuda:0 is not usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_attention_wgmma.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_conv_graph.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_sdpa.h"
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

// Restores the backend's implementation switches when a test ends.
struct ImplGuard {
  cuda::OwnConv own_conv = cuda::own_conv_mode();
  ~ImplGuard() {
    cuda::set_own_conv(own_conv);
    if (!backend_available(cuda0())) return;
    test::cuda_be().set_conv_impl(cuda::ConvImpl::kAuto);
    test::cuda_be().set_attention_impl(cuda::AttentionImpl::kAuto);
    test::cuda_be().set_flash_block_rows(0);
    test::cuda_be().set_flash_key_tile(0);
    test::cuda_be().set_allow_tf32(false);
    test::cuda_be().set_group_norm_apply_merge(false);
    test::cuda_be().set_group_norm_offset_in_kernels(true);
    test::cuda_be().set_conv_gemm(cuda::conv_gemm_default());
    test::cuda_be().set_upsample_phases(cuda::upsample_phases_default());
    cuda::set_wgmma_attention(true);
    cuda::set_short_kv_attention(true);
  }
};

// --- GEMM --------------------------------------------------------------------------------------------------

TEST(CudaOps, LinearWithEpiloguesMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  struct Case { int64_t m, k, n; };
  const Case cases[] = {{1, 1, 1}, {7, 13, 5}, {77, 768, 3072}, {4096, 320, 320}, {33, 40, 1}, {2, 1280, 1280}};
  const UnaryOp acts[] = {UnaryOp::kIdentity, UnaryOp::kSilu, UnaryOp::kGelu, UnaryOp::kGeluTanh, UnaryOp::kRelu, UnaryOp::kQuickGelu};
  for (const Case& c : cases) {
    const Tensor x = random_tensor({c.m, c.k}, 1), w = random_tensor({c.n, c.k}, 2, 1.0f / std::sqrt(float(c.k))),
                 b = random_tensor({c.n}, 3);
    for (UnaryOp act : acts) {
      const auto fn = [act](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2], act); };
      const std::string what = "linear " + std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n) +
                               " act " + std::to_string(int(act));
      EXPECT_PARITY(what, fn, std::vector<Tensor>({x, w, b}), DType::F32);
      for (DType dt : kLowp) EXPECT_PARITY(what, fn, std::vector<Tensor>({x, w, b}), dt);
    }
    const auto no_bias = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1]); };
    EXPECT_PARITY("linear no bias", no_bias, std::vector<Tensor>({x, w}), DType::F32);
    const Tensor r = random_tensor({c.m, c.n}, 4);
    const auto resid = [](const std::vector<Tensor>& in) { return ops::linear_residual(in[0], in[1], in[2], in[3]); };
    EXPECT_PARITY("linear_residual", resid, std::vector<Tensor>({x, w, b, r}), DType::F32);
    EXPECT_PARITY("linear_residual", resid, std::vector<Tensor>({x, w, b, r}), DType::BF16);
  }
  // A narrowed input (rows with a stride larger than the row: read in place) and a 3-D batch.
  const Tensor wide = random_tensor({2, 9, 64}, 5), w = random_tensor({24, 40}, 6), b = random_tensor({24}, 7);
  const auto narrowed = [](const std::vector<Tensor>& in) { return ops::linear(in[0].narrow(2, 8, 40), in[1], in[2]); };
  EXPECT_PARITY("linear on a narrowed view", narrowed, std::vector<Tensor>({wide, w, b}), DType::F32);
  EXPECT_PARITY("linear on a narrowed view", narrowed, std::vector<Tensor>({wide, w, b}), DType::BF16);
}

TEST(CudaOps, MatmulBatchesAndTransposesMatchCpu) {
  ATELIER_REQUIRE_CUDA();
  struct Case { Shape a, b; bool ta, tb; float alpha; };
  const Case cases[] = {
      {{3, 17, 9}, {3, 9, 5}, false, false, 1.0f},   {{3, 9, 17}, {3, 9, 5}, true, false, 0.5f},
      {{3, 17, 9}, {3, 5, 9}, false, true, 2.0f},    {{1, 9, 17}, {4, 5, 9}, true, true, 1.0f},
      {{4, 17, 9}, {1, 9, 5}, false, false, -1.0f},  {{16, 77, 64}, {16, 77, 64}, false, true, 0.125f},
      {{17, 9}, {9, 5}, false, false, 1.0f},         {{2, 1, 40}, {2, 40, 1}, false, false, 1.0f},
      {{8, 128, 256}, {8, 256, 128}, false, false, 1.0f}};
  for (const Case& c : cases) {
    const auto fn = [c](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1], c.ta, c.tb, c.alpha); };
    const std::string what = "matmul " + shape_str(c.a) + (c.ta ? "^T" : "") + " @ " + shape_str(c.b) + (c.tb ? "^T" : "");
    const std::vector<Tensor> in = {random_tensor(c.a, 11), random_tensor(c.b, 12)};
    EXPECT_PARITY(what, fn, in, DType::F32);
    for (DType dt : kLowp) EXPECT_PARITY(what, fn, in, dt);
  }
  // Strided operands (a transposed view is read as the other layout or packed first).
  const auto strided = [](const std::vector<Tensor>& in) { return ops::matmul(in[0].transpose(1, 2), in[1]); };
  EXPECT_PARITY("matmul transposed view", strided, std::vector<Tensor>({random_tensor({2, 9, 17}, 13), random_tensor({2, 9, 5}, 14)}),
                DType::F32);
  // K = 0: an empty sum is zero.
  const Tensor z = ops::matmul(to_gpu(Tensor::zeros({3, 0})), to_gpu(Tensor::zeros({0, 4})));
  EXPECT_EQ(z.to_vector(), std::vector<float>(12, 0.0f));
}

TEST(CudaOps, Tf32IsOptIn) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  const Tensor a = random_tensor({256, 512}, 21), b = random_tensor({512, 256}, 22);
  const auto fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); };
  EXPECT_PARITY("matmul f32 strict", fn, std::vector<Tensor>({a, b}), DType::F32);
  test::cuda_be().set_allow_tf32(true);
  // TF32 keeps 10 mantissa bits: errors near 1e-4 are expected and allowed here only.
  EXPECT_PARITY("matmul f32 with TF32", fn, std::vector<Tensor>({a, b}), DType::F32, 5e-3);
}

// --- convolution ---------------------------------------------------------------------------------------------

struct ConvCase {
  Shape x, w;
  Conv2dParams p;
  bool bias;
};

const ConvCase kConvCases[] = {
    {{2, 5, 9, 11}, {7, 5, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true},     // 3x3 same
    {{1, 4, 16, 15}, {8, 4, 3, 3}, {2, 2, 1, 1, 1, 1, 1}, true},    // stride 2 (SD downsampler)
    {{2, 32, 8, 8}, {16, 32, 1, 1}, {1, 1, 0, 0, 1, 1, 1}, true},   // 1x1 (shortcut)
    {{1, 6, 10, 10}, {4, 3, 3, 3}, {1, 1, 1, 1, 1, 1, 2}, false},   // groups
    {{1, 8, 12, 12}, {8, 1, 3, 3}, {1, 1, 2, 2, 2, 2, 8}, true},    // depthwise, dilation 2
    {{1, 3, 7, 13}, {5, 3, 2, 4}, {1, 2, 0, 1, 1, 1, 1}, true},     // rectangular kernel
    {{2, 64, 32, 32}, {64, 64, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true}, // a UNet-sized layer
};

TEST(CudaOps, Conv2dMatchesCpuThroughBothPaths) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  std::printf("[ conv     ] auto path: %s\n", test::cuda_be().conv_impl_name().c_str());
  // auto: cuDNN channels-last for bf16/f16 (transposes around the call; the graph API first, the legacy API
  // for what it declines), legacy NCHW for f32 and groups.
  for (cuda::ConvImpl impl : {cuda::ConvImpl::kAuto, cuda::ConvImpl::kCudnnNchw, cuda::ConvImpl::kIm2col}) {
    test::cuda_be().set_conv_impl(impl);
    const std::string path = impl == cuda::ConvImpl::kIm2col ? "im2col" : impl == cuda::ConvImpl::kCudnnNchw ? "cudnn-nchw" : "auto";
    for (const ConvCase& c : kConvCases) {
      const int64_t fan_in = c.w[1] * c.w[2] * c.w[3];
      const Tensor x = random_tensor(c.x, 31), w = random_tensor(c.w, 32, 1.0f / std::sqrt(float(fan_in)));
      const Tensor b = c.bias ? random_tensor({c.w[0]}, 33) : Tensor();
      const Conv2dParams p = c.p;
      const auto fn = [p](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], in[2], p); };
      const std::string what = "conv2d " + path + " " + shape_str(c.x) + " * " + shape_str(c.w);
      EXPECT_PARITY(what, fn, std::vector<Tensor>({x, w, b}), DType::F32);
      for (DType dt : kLowp) EXPECT_PARITY(what, fn, std::vector<Tensor>({x, w, b}), dt);
    }
  }
}

TEST(CudaOps, Conv2dCudnnWhenItLoads) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  const std::string name = test::cuda_be().conv_impl_name();
  if (name.rfind("cudnn", 0) != 0) GTEST_SKIP() << "cuDNN not used on this machine: " << name;
  test::cuda_be().set_conv_impl(cuda::ConvImpl::kCudnn);  // throws rather than falling back
  for (size_t i = 0; i < std::size(kConvCases); ++i) {
    const ConvCase& c = kConvCases[i];
    const Tensor x = random_tensor(c.x, 34), w = random_tensor(c.w, 35, 0.2f), b = random_tensor({c.w[0]}, 36);
    const Conv2dParams p = c.p;
    const auto fn = [p](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], in[2], p); };
    const std::string what = "conv2d cudnn " + shape_str(c.x) + " * " + shape_str(c.w);
    for (DType dt : {DType::F32, DType::BF16}) {
      try {
        EXPECT_PARITY(what, fn, std::vector<Tensor>({x, w, b}), dt);
      } catch (const Error& e) {
        // SD's own convolutions (the first three cases) must run on cuDNN; for the others cuDNN may
        // decline (the auto path then takes im2col, tested above).
        if (i < 3 || std::string(e.what()).find("no algorithm") == std::string::npos) ADD_FAILURE() << what << ": " << e.what();
        else std::printf("[ conv     ] cuDNN declines %s in %s: %s\n", what.c_str(), std::string(dtype_name(dt)).c_str(), e.what());
      }
    }
  }
}

// Restores the graph-API switch of the convolutions when a test ends.
struct ConvGraphGuard {
  bool was = cuda::conv_graph_enabled();
  ~ConvGraphGuard() { cuda::set_conv_graph_enabled(was); }
};

// Whether bf16/f16 channels-last convolutions go through cuDNN's graph API on this machine (the path name
// says so: "cudnn 9.x.y (graph API, ...)").
bool graph_api_in_use() { return test::cuda_be().conv_impl_name().find("(graph API") != std::string::npos; }

// SD-sized convolutions in bf16/f16 through the auto path (cuDNN's graph API when it plans the shape, the
// legacy API otherwise) and again with the graph API switched off, each against the CPU. Where the graph API
// is in use, SD's own convolutions (channel counts multiples of 8) must run on it: a graph path that silently
// declines everything would only cost speed, and this is where it shows.
TEST(CudaOps, Conv2dGraphApiAtSdShapes) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  ConvGraphGuard restore_graph;
  test::cuda_be().set_conv_gemm(cuda::ConvGemm::kOff);  // cuDNN's paths only (the GEMM path and the own kernel: their own tests)
  cuda::set_own_conv(cuda::OwnConv::kOff);
  struct Case {
    Shape x, w;
    Conv2dParams p;
    bool sd_layer;  // must take the graph path when it is in use
    const char* what;
  };
  const Case cases[] = {
      {{2, 320, 17, 13}, {320, 320, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true, "3x3, odd spatial sizes"},
      {{1, 640, 15, 17}, {640, 640, 3, 3}, {2, 2, 1, 1, 1, 1, 1}, true, "3x3 stride 2 (downsampler), odd input"},
      {{2, 640, 16, 16}, {1280, 640, 1, 1}, {1, 1, 0, 0, 1, 1, 1}, true, "1x1 shortcut"},
      {{1, 1280, 8, 8}, {1280, 1280, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true, "3x3 at 1280 channels"},
      {{1, 64, 20, 18}, {64, 64, 3, 3}, {1, 1, 0, 0, 1, 1, 1}, true, "3x3 padding 0"},
      {{1, 512, 12, 10}, {512, 512, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true, "VAE 3x3 at 512"},
      {{1, 4, 24, 24}, {320, 4, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, false, "UNet conv_in, 4 channels"},
      {{1, 128, 24, 20}, {3, 128, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, false, "VAE conv_out, 3 outputs"},
  };
  const bool graph_api = graph_api_in_use();
  std::printf("[ conv     ] path: %s\n", test::cuda_be().conv_impl_name().c_str());
  for (bool graph_on : {true, false}) {
    cuda::set_conv_graph_enabled(graph_on);
    for (const Case& c : cases) {
      const int64_t fan_in = c.w[1] * c.w[2] * c.w[3];
      const Tensor x = random_tensor(c.x, 41), w = random_tensor(c.w, 42, 1.0f / std::sqrt(float(fan_in)));
      const Tensor b = random_tensor({c.w[0]}, 43);
      const Conv2dParams p = c.p;
      const auto fn = [p](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], in[2], p); };
      const std::string what = std::string("conv2d ") + (graph_on ? "graph-api " : "legacy-api ") + c.what;
      for (DType dt : kLowp) {
        const int64_t runs_before = cuda::conv_graph_stats().runs;
        EXPECT_PARITY(what, fn, std::vector<Tensor>({x, w, b}), dt);
        const int64_t runs = cuda::conv_graph_stats().runs - runs_before;
        if (!graph_on) EXPECT_EQ(runs, 0) << what << ": the graph API ran while switched off";
        else if (graph_api && c.sd_layer) EXPECT_GT(runs, 0) << what << " [" << dtype_name(dt) << "]: graph API declined it";
        else if (graph_on) std::printf("[ conv     ] %s [%s]: %s\n", what.c_str(), std::string(dtype_name(dt)).c_str(),
                                       runs > 0 ? "graph API" : "legacy API");
      }
    }
  }
  const cuda::ConvGraphStats st = cuda::conv_graph_stats();
  std::printf("[ figures  ] graph API: %lld shapes planned (%lld by timing), %lld declined, %lld runs\n", (long long)st.plans,
              (long long)st.autotuned, (long long)st.declined, (long long)st.runs);
}

// Convolutions inside a recorded CUDA graph: with a warm-up call the recording executes the plan planned
// eagerly; without one the shape is new during the recording, which the graph path declines (no timing while
// capturing) so the legacy path records it. Replays must equal the eager result either way.
TEST(CudaOps, Conv2dGraphApiUnderCudaGraphCapture) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  ConvGraphGuard restore_graph;
  cuda::set_conv_graph_enabled(true);
  test::cuda_be().set_conv_gemm(cuda::ConvGemm::kOff);
  cuda::set_own_conv(cuda::OwnConv::kOff);
  const Conv2dParams p{1, 1, 1, 1, 1, 1, 1};
  for (int warmup : {1, 0}) {
    // A channel count of its own per warm-up setting: the second loop must meet a shape never planned.
    const int64_t c = warmup == 1 ? 96 : 104;
    const Tensor w = to_gpu(random_tensor({c, c, 3, 3}, 51, 0.05f), DType::BF16);
    const Tensor b = to_gpu(random_tensor({c}, 52), DType::BF16);
    const auto fn = [&](const std::vector<Tensor>& in) { return ops::conv2d(in[0], w, b, p); };
    GraphRunner::Options options;
    options.warmup = warmup;
    GraphRunner runner(options);
    for (int call = 0; call < 4; ++call) {
      const Tensor x = to_gpu(random_tensor({2, c, 12, 14}, 60 + call), DType::BF16);
      const Tensor got = runner.run({x}, cuda0(), fn);
      const Tensor want = fn({x});  // eager, after the shape is planned
      const double err = test::rel_l2(got.to_vector(), want.to_vector());
      // The recorded path and the eager one may be different kernels only when the recording had to take
      // the legacy path (warm-up 0): then bf16 rounding differences are allowed.
      EXPECT_LE(err, warmup == 1 ? 1e-6 : 1e-2) << "warm-up " << warmup << ", call " << call;
    }
    const GraphRunner::Stats s = runner.stats();
    std::printf("[ figures  ] conv under capture, warm-up %d: %lld captures, %lld replays, %lld failures%s%s\n", warmup,
                (long long)s.captures, (long long)s.replays, (long long)s.capture_failures,
                s.last_failure.empty() ? "" : ": ", s.last_failure.c_str());
    EXPECT_EQ(s.captures, 1) << "warm-up " << warmup << ": " << s.last_failure;
  }
}

// Channels-last convolutions through the GEMM path, forced (cuda_conv_gemm.cu): the NHWC im2col (3x3 with padding,
// stride 2, dilation 2, odd sizes), a 1x1 multiplying x itself, with a bias and a channels-last residual in the GEMM's
// epilogue, at SD's 8x8-level shape (where kAuto takes it on the H200); channel counts that are not whole 16-byte
// vectors (4 like the latents into conv_in, 12) through the padded im2col, a 1x1 among them; every case must have run
// the GEMM path.
TEST(CudaOps, ChannelsLastConvThroughGemmMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  test::cuda_be().set_conv_gemm(cuda::ConvGemm::kForce);
  const auto params = [](int stride, int pad, int dilation) {
    Conv2dParams p;
    p.stride_h = p.stride_w = stride;
    p.pad_h = p.pad_w = pad;
    p.dilation_h = p.dilation_w = dilation;
    return p;
  };
  struct Case { Shape x; int64_t o; int k; Conv2dParams p; bool residual; };
  const Case cases[] = {{{2, 1280, 8, 8}, 1280, 3, params(1, 1, 1), false}, {{2, 640, 16, 16}, 1280, 3, params(1, 1, 1), true},
                        {{2, 64, 9, 7}, 128, 3, params(2, 1, 1), false},    {{3, 32, 5, 5}, 16, 1, params(1, 0, 1), true},
                        {{1, 16, 11, 13}, 24, 3, params(1, 2, 2), false}, {{2, 4, 9, 7}, 320, 3, params(1, 1, 1), false},
                        {{1, 4, 6, 5}, 8, 1, params(1, 0, 1), true},        {{2, 12, 5, 6}, 16, 3, params(2, 1, 1), true}};
  for (const Case& c : cases) {
    const int64_t ho = (c.x[2] + 2 * c.p.pad_h - c.p.dilation_h * (c.k - 1) - 1) / c.p.stride_h + 1;
    const int64_t wo = (c.x[3] + 2 * c.p.pad_w - c.p.dilation_w * (c.k - 1) - 1) / c.p.stride_w + 1;
    const Tensor x = random_tensor(c.x, 81), w = random_tensor({c.o, c.x[1], c.k, c.k}, 82, 0.05f),
                 b = random_tensor({c.o}, 83), r = random_tensor({c.x[0], c.o, ho, wo}, 84);
    const Conv2dParams p = c.p;
    const bool residual = c.residual;
    const auto fn = [p, residual](const std::vector<Tensor>& in) {
      return ops::conv2d(channels_last(in[0]), in[1], in[2], p, residual ? channels_last(in[3]) : Tensor());
    };
    const std::string what = "conv2d through GEMM " + shape_str(c.x) + " -> " + std::to_string(c.o) + " k" + std::to_string(c.k) +
                             " stride " + std::to_string(p.stride_h) + (residual ? " + residual" : "");
    const int64_t before = test::cuda_be().conv_gemm_calls();
    for (DType dt : kLowp) EXPECT_PARITY(what, fn, std::vector<Tensor>({x, w, b, r}), dt);
    EXPECT_EQ(test::cuda_be().conv_gemm_calls() - before, 2) << what << ": the GEMM path did not run";
  }
}

// Channels-last bf16 convolutions through the implicit-GEMM kernel of our own, forced (cuda_gemm_wgmma.cu): every box
// form a tile's 128 output pixels take (two rows of 64 at SD's level 0, eight rows of 16, two whole 8x8 images with a
// third image's tile half past the batch, four rows of 32, 128 pixels of a 256-wide row), padding 0 (the box narrower
// than the input) and 2 with a 5x5 kernel, a 1x1, an output width past the last 128-column tile (200), each with a bias
// and some with a channels-last residual, and outputs of 4 and 6 channels (rows of 8 and 12 bytes: the tile leaves by
// 4-byte stores, not through the staged tensor-map stores); every bf16 case must have run the kernel. f16 and a
// stride-2 case must fall through to the other paths (the kernel takes bf16 and stride 1 only) and still match.
TEST(CudaOps, ChannelsLastConvThroughOwnKernelMatchesCpu) {
  ATELIER_REQUIRE_HOPPER();
  ImplGuard restore;
  cuda::set_own_conv(cuda::OwnConv::kForce);
  struct Case { Shape x; int64_t o; int k, pad, stride; bool residual; bool takes; };
  const Case cases[] = {
      {{2, 320, 64, 64}, 320, 3, 1, 1, false, true},  {{2, 640, 16, 16}, 1280, 3, 1, 1, true, true},
      {{3, 64, 8, 8}, 128, 3, 1, 1, true, true},      {{1, 128, 4, 32}, 64, 3, 1, 1, false, true},
      {{1, 64, 2, 256}, 64, 3, 1, 1, true, true},     {{2, 64, 10, 10}, 64, 3, 0, 1, false, true},
      {{1, 64, 16, 16}, 64, 5, 2, 1, false, true},    {{2, 960, 16, 16}, 320, 1, 0, 1, true, true},
      {{1, 64, 16, 16}, 200, 3, 1, 1, true, true},    {{2, 64, 17, 13}, 64, 3, 1, 1, false, false},
      {{2, 64, 16, 16}, 64, 3, 1, 2, false, false},  {{2, 320, 16, 16}, 4, 3, 1, 1, true, true},
      {{1, 64, 16, 16}, 6, 3, 1, 1, false, true}};
  for (const Case& c : cases) {
    Conv2dParams p;
    p.stride_h = p.stride_w = c.stride;
    p.pad_h = p.pad_w = c.pad;
    const int64_t ho = (c.x[2] + 2 * c.pad - c.k) / c.stride + 1, wo = (c.x[3] + 2 * c.pad - c.k) / c.stride + 1;
    const Tensor x = random_tensor(c.x, 71), w = random_tensor({c.o, c.x[1], c.k, c.k}, 72, 1.0f / std::sqrt(float(c.x[1] * c.k * c.k))),
               b = random_tensor({c.o}, 73), r = random_tensor({c.x[0], c.o, ho, wo}, 74);
    const bool residual = c.residual;
    const auto fn = [p, residual](const std::vector<Tensor>& in) {
    return ops::conv2d(channels_last(in[0]), in[1], in[2], p, residual ? channels_last(in[3]) : Tensor());
    };
    const std::string what = "conv2d through the own kernel " + shape_str(c.x) + " -> " + std::to_string(c.o) + " k" +
                           std::to_string(c.k) + " pad " + std::to_string(c.pad) + " stride " + std::to_string(c.stride) +
                           (residual ? " + residual" : "");
    for (DType dt : kLowp) {
    const int64_t before = cuda::own_conv_launches();
    EXPECT_PARITY(what, fn, std::vector<Tensor>({x, w, b, r}), dt);
    const int64_t ran = cuda::own_conv_launches() - before;
    EXPECT_EQ(ran, dt == DType::BF16 && c.takes ? 1 : 0) << what << " [" << dtype_name(dt) << "]";
    }
  }
}

// Split-K in the own convolution kernel (forced part counts) against the CPU: SD's 8x8 level at CFG and at 16 rows
// (8 and 64 tiles; 4 parts at 64 tiles make 256 units for 132 SMs, so blocks run several and owners wait on other
// blocks), uneven parts (9 k-steps in 2), 128-column tiles, many tiles (units past the grid), SD's conv_out (4
// output channels: 4-byte stores), with and without a residual. Each case must have run split-K, and two runs must
// give the same bytes (the owner adds the parts in order). The part counts the choice times for SD's shapes are
// checked too.
TEST(CudaOps, ChannelsLastConvSplitKMatchesCpu) {
  ATELIER_REQUIRE_HOPPER();
  ImplGuard restore;
  struct SplitGuard {
    int was = cuda::own_conv_split();
    ~SplitGuard() { cuda::set_own_conv_split(was); }
  } split_restore;
  cuda::set_own_conv(cuda::OwnConv::kForce);
  struct Case { Shape x; int64_t o; int split; bool residual; };
  const Case cases[] = {{{2, 1280, 8, 8}, 1280, 2, false},  {{2, 1280, 8, 8}, 1280, 16, true}, {{2, 2560, 8, 8}, 1280, 7, true},
                        {{16, 1280, 8, 8}, 1280, 2, true},  {{16, 1280, 8, 8}, 1280, 4, false}, {{3, 64, 8, 8}, 128, 2, true},
                        {{2, 320, 64, 64}, 320, 2, true},   {{2, 320, 64, 64}, 4, 2, false}};
  for (const Case& c : cases) {
    Conv2dParams p;
    p.pad_h = p.pad_w = 1;
    const Tensor x = random_tensor(c.x, 81), w = random_tensor({c.o, c.x[1], 3, 3}, 82, 1.0f / std::sqrt(float(c.x[1] * 9))),
                 b = random_tensor({c.o}, 83), r = random_tensor({c.x[0], c.o, c.x[2], c.x[3]}, 84);
    const bool residual = c.residual;
    const auto fn = [p, residual](const std::vector<Tensor>& in) {
      return ops::conv2d(channels_last(in[0]), in[1], in[2], p, residual ? channels_last(in[3]) : Tensor());
    };
    const std::string what = "conv2d split-K " + std::to_string(c.split) + " " + shape_str(c.x) + " -> " + std::to_string(c.o) +
                             (residual ? " + residual" : "");
    cuda::set_own_conv_split(c.split);
    const int64_t before = cuda::own_conv_split_launches();
    EXPECT_PARITY(what, fn, std::vector<Tensor>({x, w, b, r}), DType::BF16);
    EXPECT_EQ(cuda::own_conv_split_launches() - before, 1) << what << ": split-K did not run";
    const std::vector<Tensor> gpu = {to_gpu(x, DType::BF16), to_gpu(w, DType::BF16), to_gpu(b, DType::BF16), to_gpu(r, DType::BF16)};
    const Tensor first = fn(gpu).to(Device::cpu()), second = fn(gpu).to(Device::cpu());
    EXPECT_EQ(std::memcmp(first.raw(), second.raw(), first.nbytes()), 0) << what << ": two runs differ";
  }
  // The timed candidates at SD's shapes on 132 SMs: none where the tiles fill half the SMs.
  cuda::OwnConvArgs a;
  a.c = 1280, a.o = 1280, a.h = a.w = a.ho = a.wo = 8, a.kh = a.kw = 3, a.pad_h = a.pad_w = 1;
  a.sm_count = 132;
  a.n = 16;  // 64 tiles of 128 x 160
  EXPECT_EQ(cuda::conv_implicit_splits(a), std::vector<int>({2, 4}));
  a.n = 2;  // 8 tiles
  EXPECT_EQ(cuda::conv_implicit_splits(a), std::vector<int>({16}));
  a.n = 2, a.h = a.w = a.ho = a.wo = 32;  // 128 tiles: slower split (the SMs are busy)
  EXPECT_TRUE(cuda::conv_implicit_splits(a).empty());
  a.n = 16, a.c = a.o = 320, a.h = a.w = a.ho = a.wo = 64;  // 256 tiles
  EXPECT_TRUE(cuda::conv_implicit_splits(a).empty());
}

// The upsamplers (nearest 2x, then a 3x3 convolution) as one 2x2 convolution per output phase (cuda_conv_upsample.cu)
// against the CPU's upsample-then-convolve: SD's 8x8 level, odd sizes, without a bias, and with fewer than 8 input
// channels; each through cuDNN and through the GEMM path. Every case must have taken the phase path (forced: kAuto
// takes it where timed faster).
TEST(CudaOps, Upsample2xConvAsPhaseConvsMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  struct Case { Shape x; int64_t o; bool bias; };
  test::cuda_be().set_upsample_phases(cuda::UpsamplePhases::kForce);
  const Case cases[] = {{{2, 1280, 8, 8}, 1280, true}, {{1, 64, 5, 7}, 32, true}, {{3, 16, 6, 3}, 24, false}, {{2, 4, 4, 5}, 8, true}};
  for (const Case& c : cases) {
    const Tensor x = random_tensor(c.x, 91), w = random_tensor({c.o, c.x[1], 3, 3}, 92, 1.0f / std::sqrt(9.0f * float(c.x[1])));
    const Tensor b = c.bias ? random_tensor({c.o}, 93) : Tensor();
    const auto fn = [](const std::vector<Tensor>& in) {
      const Tensor y = ops::upsample2x_conv2d(channels_last(in[0]), in[1], in.size() > 2 ? in[2] : Tensor(), Conv2dParams{1, 1, 1, 1});
      if (!in[0].device().is_cpu() && in[0].dtype() != DType::F32) EXPECT_TRUE(y.is_channels_last()) << shape_str(y.strides());
      return y;
    };
    const std::vector<Tensor> inputs = c.bias ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x, w};
    for (cuda::ConvGemm gemm : {cuda::ConvGemm::kOff, cuda::ConvGemm::kForce}) {
      test::cuda_be().set_conv_gemm(gemm);
      // The GEMM path takes whole 16-byte channel vectors only; cuDNN takes the rest.
      const std::string what = "upsample2x_conv2d " + shape_str(c.x) + " -> " + std::to_string(c.o) + (c.bias ? " + bias" : "") +
                               (gemm == cuda::ConvGemm::kForce ? " (GEMM path where it applies)" : " (cuDNN)");
      const int64_t before = test::cuda_be().upsample_phase_calls();
      for (DType dt : kLowp) EXPECT_PARITY(what, fn, inputs, dt);
      EXPECT_EQ(test::cuda_be().upsample_phase_calls() - before, 2) << what << ": the phase path did not run";
    }
  }
}

// Restores the convolutions' fused-epilogue mode when a test ends.
struct FusedEpilogueGuard {
  cuda::ConvFusedEpilogue was = cuda::conv_fused_epilogue();
  ~FusedEpilogueGuard() { cuda::set_conv_fused_epilogue(was); }
};

// Convolutions reading and writing channels-last with the addend in their output pass: a per-sample bias (the
// resnets' time embedding) and a residual, channels-last or not, with and without a bias, at channel counts with
// and without whole 16-byte vectors, and with fewer than 8 channels in or out. Each 16-bit case twice: with the
// bias and addend inside cuDNN's plan wherever it offers one that passes the result check
// (ConvFusedEpilogue::kForce) and as the separate pass. Where the graph API is in use, a bias alone at SD's
// channel counts must be fused (precompiled engines take it): otherwise the fusion silently never runs.
TEST(CudaOps, ChannelsLastConvWithAddendMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  FusedEpilogueGuard restore_fusion;
  test::cuda_be().set_conv_gemm(cuda::ConvGemm::kOff);  // cuDNN's fused epilogues (the GEMM path and the own kernel: their own tests)
  cuda::set_own_conv(cuda::OwnConv::kOff);
  const bool graph_api = graph_api_in_use();
  struct Case { Shape x; int64_t o; int k; };
  // The last three have fewer than 8 channels in or out (the UNet's conv_in and conv_out, the VAE's conv_out:
  // no whole 16-byte channel vectors, cuDNN's generic engines).
  const Case cases[] = {{{2, 320, 32, 32}, 320, 3}, {{2, 64, 9, 7}, 128, 3}, {{2, 640, 16, 16}, 320, 1}, {{1, 32, 8, 8}, 4, 3},
                        {{2, 4, 16, 16}, 320, 3}, {{2, 320, 12, 10}, 4, 3}, {{1, 128, 16, 16}, 3, 3}};
  for (const Case& c : cases) {
    const int64_t fan_in = c.x[1] * c.k * c.k;
    const Tensor x = random_tensor(c.x, 71), w = random_tensor({c.o, c.x[1], c.k, c.k}, 72, 1.0f / std::sqrt(float(fan_in)));
    const Tensor b = random_tensor({c.o}, 73), temb = random_tensor({c.x[0], c.o, 1, 1}, 74);
    const Tensor res = random_tensor({c.x[0], c.o, c.x[2], c.x[3]}, 75);
    const Conv2dParams p{1, 1, c.k / 2, c.k / 2};
    const auto per_sample = [p](const std::vector<Tensor>& in) { return ops::conv2d(channels_last(in[0]), in[1], in[2], p, in[3]); };
    const auto residual_cl = [p](const std::vector<Tensor>& in) { return ops::conv2d(channels_last(in[0]), in[1], in[2], p, channels_last(in[3])); };
    const auto residual_nchw_no_bias = [p](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1], Tensor(), p, in[2]); };
    const auto bias_only = [p](const std::vector<Tensor>& in) { return ops::conv2d(channels_last(in[0]), in[1], in[2], p); };
    const std::string what = "conv2d " + shape_str(c.x) + " -> " + std::to_string(c.o);
    const bool sd_channels = c.x[1] % 8 == 0 && c.o % 8 == 0;
    for (cuda::ConvFusedEpilogue mode : {cuda::ConvFusedEpilogue::kForce, cuda::ConvFusedEpilogue::kOff}) {
      cuda::set_conv_fused_epilogue(mode);
      const bool force = mode == cuda::ConvFusedEpilogue::kForce;
      const std::string how = force ? " (fused where offered)" : " (separate pass)";
      for (DType dt : kLowp) {
        const std::string tag = what + " [" + std::string(dtype_name(dt)) + "]";
        int64_t before = cuda::conv_graph_stats().fused_runs;
        EXPECT_PARITY(what + " + bias" + how, bias_only, std::vector<Tensor>({x, w, b}), dt);
        const int64_t bias_fused = cuda::conv_graph_stats().fused_runs - before;
        before = cuda::conv_graph_stats().fused_runs;
        EXPECT_PARITY(what + " + per-sample addend" + how, per_sample, std::vector<Tensor>({x, w, b, temb}), dt);
        EXPECT_PARITY(what + " + channels-last residual" + how, residual_cl, std::vector<Tensor>({x, w, b, res}), dt);
        EXPECT_PARITY(what + " + NCHW residual, no bias" + how, residual_nchw_no_bias, std::vector<Tensor>({x, w, res}), dt);
        const int64_t addend_fused = cuda::conv_graph_stats().fused_runs - before;
        if (!force) {
          EXPECT_EQ(bias_fused + addend_fused, 0) << tag << ": fused while switched off";
          continue;
        }
        if (graph_api && sd_channels) EXPECT_EQ(bias_fused, 1) << tag << ": no fused plan for the bias";
        std::printf("[ conv     ] %s: bias %s, %lld of 3 with an addend fused\n", tag.c_str(), bias_fused ? "fused" : "separate",
                    (long long)addend_fused);
      }
    }
    cuda::set_conv_fused_epilogue(cuda::ConvFusedEpilogue::kAuto);
    EXPECT_PARITY(what + " f32 + per-sample addend", per_sample, std::vector<Tensor>({x, w, b, temb}), DType::F32);
    test::cuda_be().set_conv_impl(cuda::ConvImpl::kIm2col);  // channels-last operands through the NCHW path's copies
    EXPECT_PARITY(what + " im2col + channels-last residual", residual_cl, std::vector<Tensor>({x, w, b, res}), DType::BF16);
    test::cuda_be().set_conv_impl(cuda::ConvImpl::kAuto);
  }
}

// Channel concatenation and nearest upsampling of channels-last tensors keep the layout and copy whole 16-byte
// channel runs where they can (channel counts of whole vectors); 12 channels take the element-wise copy.
TEST(CudaOps, ChannelsLastConcatAndUpsampleMatchCpu) {
  ATELIER_REQUIRE_CUDA();
  const Shape shapes[][2] = {{{2, 320, 16, 16}, {2, 640, 16, 16}}, {{1, 12, 5, 7}, {1, 24, 5, 7}}, {{2, 256, 9, 11}, {2, 256, 9, 11}}};
  for (const auto& sh : shapes) {
    const Tensor a = random_tensor(sh[0], 81), b = random_tensor(sh[1], 82);
    const auto cat = [](const std::vector<Tensor>& in) {
      const Tensor y = ops::concat({channels_last(in[0]), channels_last(in[1])}, 1);
      if (!in[0].device().is_cpu() && in[0].dtype() != DType::F32) EXPECT_TRUE(y.is_channels_last()) << shape_str(y.strides());
      return y;
    };
    const auto up = [](const std::vector<Tensor>& in) {
      const Tensor y = ops::upsample_nearest2d(channels_last(in[0]), 2);
      if (!in[0].device().is_cpu() && in[0].dtype() != DType::F32) EXPECT_TRUE(y.is_channels_last()) << shape_str(y.strides());
      return y;
    };
    for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
      EXPECT_PARITY("channels-last concat " + shape_str(sh[0]) + " + " + shape_str(sh[1]), cat, std::vector<Tensor>({a, b}), dt);
      EXPECT_PARITY("channels-last upsample " + shape_str(sh[0]), up, std::vector<Tensor>({a}), dt);
    }
  }
}

// --- normalisation (group norms: cuda_group_norm_test.cc) ------------------------------------------------------

TEST(CudaOps, LayerNormAndRmsNormMatchCpu) {
  ATELIER_REQUIRE_CUDA();
  // RMS: rows of 8, 16 or 32 whole 16-byte vectors take the vector kernel, several rows per warp (a head dim of
  // 128: FLUX and Z-Image q/k norms, 27 rows: a last block only partly filled; 64: 33 rows), other rows up to
  // 1024 the warp-per-row kernel, longer rows the block-per-row kernel. Layer norm: rows of whole 16-byte
  // vectors up to 1536 bf16 / 768 f32 elements take its warp-per-row kernel (SD's 320/640/1280 channels; 1280
  // in f32 and the odd widths take the block kernel); 16-bit rows of 320 and 640 with 16-bit parameters, when
  // there are many (16389: 96 per SM up to 170 SMs), at 8 and 16 lanes per row (a last warp whose later rows are past
  // the end), and few of them (45, 37) at 32.
  for (const Shape& s : {Shape{7, 13}, Shape{3, 77, 768}, Shape{2, 5000}, Shape{4096, 320}, Shape{1, 1}, Shape{3, 9, 128},
                         Shape{5, 1280}, Shape{11, 1536}, Shape{33, 64}, Shape{45, 320}, Shape{37, 640}, Shape{16389, 320},
                         Shape{16389, 640}}) {
    const int64_t d = s.back();
    for (float offset : {0.0f, 50.0f}) {
      const Tensor x = random_tensor(s, 51, 1.0f, offset), g = random_tensor({d}, 52), b = random_tensor({d}, 53);
      const auto ln = [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], in[1], in[2], 1e-5f); };
      const auto rms = [](const std::vector<Tensor>& in) { return ops::rms_norm(in[0], in[1], 1e-6f); };
      const std::string sfx = shape_str(s) + " offset " + std::to_string(int(offset));
      EXPECT_PARITY("layer_norm " + sfx, ln, std::vector<Tensor>({x, g, b}), DType::F32);
      EXPECT_PARITY("rms_norm " + sfx, rms, std::vector<Tensor>({x, g}), DType::F32);
      // Parameters kept in f32 beside 16-bit rows: the kernels' element loads instead of their packed ones.
      const auto ln_f32_params = [](const std::vector<Tensor>& in) {
        return ops::layer_norm(in[0], ops::cast(in[1], DType::F32), ops::cast(in[2], DType::F32), 1e-5f);
      };
      for (DType dt : kLowp) {
        EXPECT_PARITY("layer_norm " + sfx, ln, std::vector<Tensor>({x, g, b}), dt);
        EXPECT_PARITY("layer_norm f32 parameters " + sfx, ln_f32_params, std::vector<Tensor>({x, g, b}), dt);
        EXPECT_PARITY("rms_norm " + sfx, rms, std::vector<Tensor>({x, g}), dt);
      }
    }
    EXPECT_PARITY("layer_norm no affine " + shape_str(s), [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], Tensor(), Tensor(), 1e-5f); },
                  {random_tensor(s, 54)}, DType::F32);
  }
}

// --- attention ------------------------------------------------------------------------------------------------

struct AttnCase {
  int64_t b, h, hk, sq, sk, d, dv;
};

// SD's head dims (40, 64, 80, 160), CLIP's 77 tokens, GQA/MQA, odd lengths, the widest flash head (256).
const AttnCase kFlashCases[] = {{2, 8, 8, 77, 77, 64, 64},    {1, 2, 2, 33, 47, 40, 40},  {2, 4, 2, 129, 65, 80, 80},
                                {1, 2, 1, 64, 64, 160, 160},  {1, 1, 1, 5, 300, 8, 8},    {1, 1, 1, 70, 70, 256, 256},
                                {1, 3, 3, 200, 9, 48, 48},    {1, 2, 2, 1024, 1024, 40, 40}, {1, 2, 2, 1, 4096, 128, 128}};

Tensor attn_mask(const std::string& kind, const AttnCase& c) {
  if (kind == "none") return Tensor();
  if (kind == "additive") return random_tensor({c.sq, c.sk}, 61, 2.0f);  // broadcast over batch and heads
  if (kind == "causal") {
    // Bottom-right aligned when there are more keys than queries; key 0 always visible (no fully masked row).
    const int64_t shift = std::max<int64_t>(0, c.sk - c.sq);
    std::vector<float> m(size_t(c.sq * c.sk));
    for (int64_t i = 0; i < c.sq; ++i)
      for (int64_t j = 0; j < c.sk; ++j) m[size_t(i * c.sk + j)] = j <= i + shift ? 0.0f : -INFINITY;
    return Tensor::from_vector(m, {1, 1, c.sq, c.sk});
  }
  // Key padding per batch entry: [B, 1, 1, Sk], the last keys of entry 0 masked.
  std::vector<float> m(size_t(c.b * c.sk), 0.0f);
  for (int64_t j = c.sk / 2 + 1; j < c.sk; ++j) m[size_t(j)] = -INFINITY;
  return Tensor::from_vector(m, {c.b, 1, 1, c.sk});
}

void check_attention(const AttnCase& c, const std::string& mask_kind, DType dt, const std::string& path) {
  const Tensor q = random_tensor({c.b, c.h, c.sq, c.d}, 71), k = random_tensor({c.b, c.hk, c.sk, c.d}, 72),
               v = random_tensor({c.b, c.hk, c.sk, c.dv}, 73);
  const Tensor mask = attn_mask(mask_kind, c);
  const auto fn = [](const std::vector<Tensor>& in) { return ops::attention(in[0], in[1], in[2], in[3]); };
  char what[160];
  std::snprintf(what, sizeof(what), "attention %s b%lld h%lld/%lld q%lld k%lld d%lld/%lld mask %s", path.c_str(), (long long)c.b,
                (long long)c.h, (long long)c.hk, (long long)c.sq, (long long)c.sk, (long long)c.d, (long long)c.dv, mask_kind.c_str());
  EXPECT_PARITY(std::string(what), fn, std::vector<Tensor>({q, k, v, mask}), dt);
}

TEST(CudaOps, FlashAttentionMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  test::cuda_be().set_attention_impl(cuda::AttentionImpl::kFlash);  // fails instead of falling back
  // The mma.sync kernel on every case (on sm_90 the wgmma kernel would take the unmasked bf16 ones first: its
  // own tests are in cuda_attention_wgmma_test.cc), tiled over the keys (the one-tile variant for short key
  // sequences would take most of these cases: cuda_attention_short_test.cc).
  cuda::set_wgmma_attention(false);
  cuda::set_short_kv_attention(false);
  // Both block heights (one or two m-tiles per warp) on every case, and the wide key tile of the 128-query
  // kernels (head dims 48/64/128; elsewhere it falls back to the default tile).
  const struct {
    int rows, key_tile;
    const char* name;
  } variants[] = {{64, 0, "flash64"},
                  {128, cuda::CudaBackend::kFlashNarrowKeys, "flash128"},
                  {128, cuda::CudaBackend::kFlashWideKeys, "flash128 wide keys"}};
  for (const auto& var : variants) {
    test::cuda_be().set_flash_block_rows(var.rows);
    test::cuda_be().set_flash_key_tile(var.key_tile);
    for (const AttnCase& c : kFlashCases)
      for (const char* mask : {"none", "additive", "causal", "padding"})
        for (DType dt : kLowp) check_attention(c, mask, dt, var.name);
  }
}

TEST(CudaOps, CudnnSdpaMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  std::string why;
  if (!test::cuda_be().cudnn_sdpa_available(&why)) GTEST_SKIP() << "cuDNN's SDPA node is not available here: " << why;
  test::cuda_be().set_attention_impl(cuda::AttentionImpl::kCudnnSdpa);  // throws where cuDNN declines
  for (const AttnCase& c : kFlashCases) {
    // The head dims the models run must be taken; others (8, 48, 160, 256) may be declined by a release.
    const bool must = c.d == 40 || c.d == 64 || c.d == 80 || c.d == 128;
    for (DType dt : kLowp) {
      try {
        check_attention(c, "none", dt, "cudnn sdpa");
      } catch (const Error& e) {
        if (must) ADD_FAILURE() << e.what();
        else std::printf("cuDNN declined (allowed for this head dim): %s\n", e.what());
      }
    }
  }
  const cuda::SdpaStats st = cuda::sdpa_stats();
  std::printf("cuDNN SDPA: %lld shapes planned, %lld declined, %lld runs\n", (long long)st.cudnn_shapes,
              (long long)st.declined, (long long)st.runs);
  EXPECT_GT(st.runs, 0);
}

TEST(CudaOps, GemmAttentionMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  test::cuda_be().set_attention_impl(cuda::AttentionImpl::kGemm);
  const AttnCase odd[] = {{1, 2, 2, 9, 11, 12, 12}, {2, 2, 1, 17, 5, 64, 32}, {1, 4, 2, 31, 31, 7, 3}};
  for (const char* mask : {"none", "additive", "causal", "padding"}) {
    for (const AttnCase& c : kFlashCases) check_attention(c, mask, DType::F32, "gemm");
    for (const AttnCase& c : odd) {
      check_attention(c, mask, DType::F32, "gemm");
      check_attention(c, mask, DType::BF16, "gemm");
    }
    check_attention(kFlashCases[2], mask, DType::BF16, "gemm");
  }
}

TEST(CudaOps, AttentionWritesMergedHeadsOnEveryPath) {
  ATELIER_REQUIRE_CUDA();
  ImplGuard restore;
  // attention_merged: the backend writes [B, Sq, H, Dv] through a permuted output view (flash kernel and
  // cuDNN directly; the GEMM path through a temporary).
  const Tensor q = random_tensor({2, 3, 70, 64}, 111), k = random_tensor({2, 3, 50, 64}, 112), v = random_tensor({2, 3, 50, 64}, 113);
  const auto fn = [](const std::vector<Tensor>& in) { return ops::attention_merged(in[0], in[1], in[2]); };
  std::string why;
  const bool cudnn = test::cuda_be().cudnn_sdpa_available(&why);
  for (cuda::AttentionImpl impl : {cuda::AttentionImpl::kFlash, cuda::AttentionImpl::kGemm, cuda::AttentionImpl::kCudnnSdpa,
                                   cuda::AttentionImpl::kAuto}) {
    if (impl == cuda::AttentionImpl::kCudnnSdpa && !cudnn) continue;
    test::cuda_be().set_attention_impl(impl);
    for (DType dt : kLowp) EXPECT_PARITY("attention_merged impl " + std::to_string(int(impl)), fn, std::vector<Tensor>({q, k, v}), dt);
  }
  test::cuda_be().set_attention_impl(cuda::AttentionImpl::kGemm);
  EXPECT_PARITY("attention_merged f32 (gemm)", fn, std::vector<Tensor>({q, k, v}), DType::F32);
}

TEST(CudaOps, AttentionAutoPathAndStridedHeads) {
  ATELIER_REQUIRE_CUDA();
  // multi_head_attention splits heads out of [B, S, H*D] rows as strided views (no copy), also from one
  // fused QKV projection.
  const Tensor qkv = random_tensor({2, 77, 3 * 320}, 81);
  const auto fn = [](const std::vector<Tensor>& in) {
    const std::vector<Tensor> parts = ops::chunk(in[0], 3, 2);
    return ops::multi_head_attention(parts[0], parts[1], parts[2], 8);
  };
  EXPECT_PARITY("multi_head_attention fused qkv (auto)", fn, {qkv}, DType::F32);
  for (DType dt : kLowp) EXPECT_PARITY("multi_head_attention fused qkv (auto)", fn, {qkv}, dt);
  const Tensor x = random_tensor({2, 256, 320}, 82), ctx = random_tensor({2, 77, 768}, 83), wk = random_tensor({320, 768}, 84, 0.03f);
  const auto cross = [](const std::vector<Tensor>& in) {
    const Tensor k = ops::linear(in[1], in[2]);
    return ops::multi_head_attention(in[0], k, k, 5);  // head dim 64, 5 heads
  };
  EXPECT_PARITY("cross attention (auto)", cross, std::vector<Tensor>({x, ctx, wk}), DType::F32);
  EXPECT_PARITY("cross attention (auto)", cross, std::vector<Tensor>({x, ctx, wk}), DType::BF16);
  // A fully masked row gives NaN on every path, as torch does.
  const Tensor q = to_gpu(random_tensor({1, 1, 2, 8}, 85), DType::BF16), kv = to_gpu(random_tensor({1, 1, 3, 8}, 86), DType::BF16);
  const Tensor m = to_gpu(Tensor::from_vector({0, 0, 0, -INFINITY, -INFINITY, -INFINITY}, {1, 1, 2, 3}));
  const std::vector<float> out = ops::attention(q, kv, kv, m).to_vector();
  EXPECT_FALSE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[8]));
}

}  // namespace
}  // namespace atelier
