// CPU op benchmarks at Stable Diffusion 1.5 shapes (first UNet level at 512 px: 64x64 latents, 320
// channels, 4096 tokens, 8 heads of 40). The benchmark argument is the OpenMP thread count.
//   ./build/bench/ops_bench --benchmark_filter=Conv
#include <benchmark/benchmark.h>
#include <omp.h>

#include <random>

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

void set_threads(benchmark::State& state) { omp_set_num_threads(int(state.range(0))); }

void BM_Conv3x3_64x64x320(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 320, 64, 64}, 1), w = random_tensor({320, 320, 3, 3}, 2, 0.02f), b = random_tensor({320}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::conv2d(x, w, b, {1, 1, 1, 1, 1, 1, 1}));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * 320 * 320 * 9 * 64 * 64, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Conv3x3_64x64x320)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

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
BENCHMARK(BM_Attention_4096x40)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Linear_4096x320x1280_Gelu(benchmark::State& state) {
  set_threads(state);
  Tensor x = random_tensor({1, 4096, 320}, 1), w = random_tensor({1280, 320}, 2, 0.05f), b = random_tensor({1280}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(ops::linear(x, w, b, UnaryOp::kGelu));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * 4096 * 320 * 1280, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Linear_4096x320x1280_Gelu)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

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

}  // namespace
}  // namespace atelier

BENCHMARK_MAIN();
