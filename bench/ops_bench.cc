// CPU op benchmarks at Stable Diffusion 1.5 shapes (first UNet level at 512 px: 64x64 latents, 320
// channels, 4096 tokens, 8 heads of 40) and a few others (other UNet levels, VAE, wider heads). The
// benchmark argument is the OpenMP thread count (0: the default). *_Im2col / *_GemmPath variants run the
// portable paths that the Winograd convolution and the fused attention replace.
//   ./build/bench/ops_bench --benchmark_filter='Conv3x3|Attention_4096x40'
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <random>

#include "backend/cpu/cpu_kernels.h"
#include "backend/ops.h"

namespace atelier {
namespace {

Tensor random_tensor(const Shape& shape, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(size_t(numel_of(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape);
}

// Argument 0 keeps the OpenMP default (OMP_NUM_THREADS, else every core): for scaling runs on big machines.
void set_threads(benchmark::State& state) {
  static const int default_threads = omp_get_max_threads();
  omp_set_num_threads(state.range(0) > 0 ? int(state.range(0)) : default_threads);
}

void BM_Conv3x3_64x64x320(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 320, 64, 64}, 1), w = random_tensor({320, 320, 3, 3}, 2, 0.02f), b = random_tensor({320}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::conv2d(x, w, b, {1, 1, 1, 1, 1, 1, 1}));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * 320 * 320 * 9 * 64 * 64, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Conv3x3_64x64x320)->Arg(1)->Arg(2)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Conv3x3_64x64x320_Im2col(benchmark::State& state) {
  cpu::set_winograd_conv(false);
  BM_Conv3x3_64x64x320(state);
  cpu::set_winograd_conv(true);
}
BENCHMARK(BM_Conv3x3_64x64x320_Im2col)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// The other SD 1.5 UNet levels (batch 2 for classifier-free guidance): Winograd against im2col.
void ConvLevel(benchmark::State& state, int64_t size, int64_t channels, bool winograd) {
  set_threads(state);
  cpu::set_winograd_conv(winograd);
  Tensor x = random_tensor({2, channels, size, size}, 1), w = random_tensor({channels, channels, 3, 3}, 2, 0.02f);
  for (auto _ : state) benchmark::DoNotOptimize(ops::conv2d(x, w, Tensor(), {1, 1, 1, 1, 1, 1, 1}));
  cpu::set_winograd_conv(true);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * 2 * channels * channels * 9 * size * size, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK_CAPTURE(ConvLevel, w32x32x640, 32, 640, true)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(ConvLevel, i32x32x640, 32, 640, false)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(ConvLevel, w16x16x1280, 16, 1280, true)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(ConvLevel, i16x16x1280, 16, 1280, false)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(ConvLevel, w8x8x1280, 8, 1280, true)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(ConvLevel, i8x8x1280, 8, 1280, false)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(ConvLevel, w12x12x640, 12, 640, true)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(ConvLevel, i12x12x640, 12, 640, false)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(ConvLevel, w64x64x320b2, 64, 320, true)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(ConvLevel, i64x64x320b2, 64, 320, false)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Conv1x1_64x64x320(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 320, 64, 64}, 1), w = random_tensor({320, 320, 1, 1}, 2, 0.02f), b = random_tensor({320}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::conv2d(x, w, b, {}));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * 320 * 320 * 64 * 64, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Conv1x1_64x64x320)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Attention_4096x40(benchmark::State& state) {
  set_threads(state);
  const int64_t heads = 8, s = 4096, d = 40;
  Tensor q = random_tensor({1, heads, s, d}, 1), k = random_tensor({1, heads, s, d}, 2), v = random_tensor({1, heads, s, d}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::attention(q, k, v));
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * heads * s * s * d, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Attention_4096x40)->Arg(1)->Arg(2)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

// The portable GEMM path that CPUs without AVX-512 take.
void BM_Attention_4096x40_GemmPath(benchmark::State& state) {
  cpu::set_fused_attention(false);
  BM_Attention_4096x40(state);
  cpu::set_fused_attention(true);
}
BENCHMARK(BM_Attention_4096x40_GemmPath)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// Cross-attention shape: 4096 queries over 77 text tokens.
void BM_CrossAttention_4096x77(benchmark::State& state) {
  set_threads(state);
  Tensor q = random_tensor({2, 8, 4096, 40}, 1), k = random_tensor({2, 8, 77, 40}, 2), v = random_tensor({2, 8, 77, 40}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::attention(q, k, v));
}
BENCHMARK(BM_CrossAttention_4096x77)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// SD 2.x / FLUX-like head width.
void BM_Attention_1024x64(benchmark::State& state) {
  set_threads(state);
  Tensor q = random_tensor({1, 10, 1024, 64}, 1), k = random_tensor({1, 10, 1024, 64}, 2), v = random_tensor({1, 10, 1024, 64}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::attention(q, k, v));
}
BENCHMARK(BM_Attention_1024x64)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Linear_4096x320x1280_Gelu(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 4096, 320}, 1), w = random_tensor({1280, 320}, 2, 0.05f), b = random_tensor({1280}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::linear(x, w, b, UnaryOp::kGelu));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * 4096 * 320 * 1280, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Linear_4096x320x1280_Gelu)->Arg(1)->Arg(2)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_GroupNormSilu_64x64x320(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 320, 64, 64}, 1), g = random_tensor({320}, 2), b = random_tensor({320}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::group_norm(x, 32, g, b, 1e-5f, UnaryOp::kSilu));
}
BENCHMARK(BM_GroupNormSilu_64x64x320)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Geglu_4096x2560(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 4096, 2560}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ops::glu(x, UnaryOp::kGelu));
}
BENCHMARK(BM_Geglu_4096x2560)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LayerNorm_4096x320(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 4096, 320}, 1), g = random_tensor({320}, 2), b = random_tensor({320}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::layer_norm(x, g, b, 1e-5f));
}
BENCHMARK(BM_LayerNorm_4096x320)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AddBroadcast_64x64x320(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 320, 64, 64}, 1), b = random_tensor({1, 320, 1, 1}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(ops::add(x, b));
}
BENCHMARK(BM_AddBroadcast_64x64x320)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Upsample2x_64x64x320(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 320, 64, 64}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ops::upsample_nearest2d(x, 2));
}
BENCHMARK(BM_Upsample2x_64x64x320)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ConcatChannels_64x64x640(benchmark::State& state) {
  set_threads(state);
  Tensor a = random_tensor({1, 320, 64, 64}, 1), b = random_tensor({1, 320, 64, 64}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(ops::concat({a, b}, 1));
}
BENCHMARK(BM_ConcatChannels_64x64x640)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_TransposeToTokens_64x64x320(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 320, 4096}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ops::contiguous(x.transpose(1, 2)));
}
BENCHMARK(BM_TransposeToTokens_64x64x320)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Pad2d_64x64x320(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 320, 64, 64}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ops::pad2d(x, 0, 1, 0, 1));
}
BENCHMARK(BM_Pad2d_64x64x320)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// FLUX-like head width 128 (2 heads of 4096 tokens), both paths, and the 64-wide shape on the GEMM path.
void BM_Attention_4096x128(benchmark::State& state) {
  set_threads(state);
  Tensor q = random_tensor({1, 2, 4096, 128}, 1), k = random_tensor({1, 2, 4096, 128}, 2), v = random_tensor({1, 2, 4096, 128}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::attention(q, k, v));
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * 2 * 4096 * 4096 * 128, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Attention_4096x128)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Attention_4096x128_GemmPath(benchmark::State& state) {
  cpu::set_fused_attention(false);
  BM_Attention_4096x128(state);
  cpu::set_fused_attention(true);
}
BENCHMARK(BM_Attention_4096x128_GemmPath)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Attention_1024x64_GemmPath(benchmark::State& state) {
  cpu::set_fused_attention(false);
  BM_Attention_1024x64(state);
  cpu::set_fused_attention(true);
}
BENCHMARK(BM_Attention_1024x64_GemmPath)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// VAE decoder shapes at 512 px: the last level's conv3x3 (128 channels at 512x512) and the mid-block's
// single-head attention over 64x64 = 4096 tokens of 512 channels.
void BM_VaeConv3x3_512x512x128(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 128, 512, 512}, 1), w = random_tensor({128, 128, 3, 3}, 2, 0.02f), b = random_tensor({128}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::conv2d(x, w, b, {1, 1, 1, 1, 1, 1, 1}));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * 128 * 128 * 9 * 512 * 512, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_VaeConv3x3_512x512x128)->Arg(1)->Arg(2)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_VaeConv3x3_512x512x128_Im2col(benchmark::State& state) {
  cpu::set_winograd_conv(false);
  BM_VaeConv3x3_512x512x128(state);
  cpu::set_winograd_conv(true);
}
BENCHMARK(BM_VaeConv3x3_512x512x128_Im2col)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_VaeAttention_4096x512(benchmark::State& state) {
  set_threads(state);
  Tensor q = random_tensor({1, 1, 4096, 512}, 1), k = random_tensor({1, 1, 4096, 512}, 2), v = random_tensor({1, 1, 4096, 512}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::attention(q, k, v));
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * 4096 * 4096 * 512, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_VaeAttention_4096x512)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_VaeAttention_4096x512_GemmPath(benchmark::State& state) {
  cpu::set_fused_attention(false);
  BM_VaeAttention_4096x512(state);
  cpu::set_fused_attention(true);
}
BENCHMARK(BM_VaeAttention_4096x512_GemmPath)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// The UNet transformer's residual: tokens [B, HW, C] viewed back as NCHW plus the NCHW input.
void BM_AddPermuted_64x64x320(benchmark::State& state) {
  set_threads(state);
  Tensor seq = random_tensor({1, 64, 64, 320}, 1), x = random_tensor({1, 320, 64, 64}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(ops::add(seq.permute({0, 3, 1, 2}), x));
}
BENCHMARK(BM_AddPermuted_64x64x320)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// The threading-policy comparison behind cpu_gemm.cc: a conv-sized product followed by an OpenMP
// normalisation, (a) as the backend runs it (single-threaded OpenBLAS tiles inside one OpenMP team) and
// (b) with OpenBLAS threading the product itself through its own pthreads pool.
void BM_GemmThenNorm_OpenMpTiles(benchmark::State& state) {
  set_threads(state);
  Tensor a = random_tensor({320, 2880}, 1), b = random_tensor({2880, 4096}, 2);
  for (auto _ : state) {
    Tensor c = ops::matmul(a, b);
    benchmark::DoNotOptimize(ops::group_norm(c.reshape({1, 320, 4096}), 32, Tensor(), Tensor(), 1e-5f, UnaryOp::kSilu));
  }
}
BENCHMARK(BM_GemmThenNorm_OpenMpTiles)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_GemmThenNorm_OpenBlasThreads(benchmark::State& state) {
  set_threads(state);
  Tensor a = random_tensor({320, 2880}, 1), b = random_tensor({2880, 4096}, 2);
  Tensor c = Tensor::empty({320, 4096});
  ops::matmul(a, b);  // backend set-up first (core selection), then hand OpenBLAS the threads
  openblas_set_num_threads(int(state.range(0)));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 320, 4096, 2880, 1.0f, a.data<float>(), 2880, b.data<float>(), 4096,
                0.0f, c.data<float>(), 4096);
    benchmark::DoNotOptimize(ops::group_norm(c.reshape({1, 320, 4096}), 32, Tensor(), Tensor(), 1e-5f, UnaryOp::kSilu));
  }
  openblas_set_num_threads(1);
}
BENCHMARK(BM_GemmThenNorm_OpenBlasThreads)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace atelier

BENCHMARK_MAIN();
