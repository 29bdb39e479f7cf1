// One UNet denoising step (batch 2, as with classifier-free guidance) with random weights built in code:
// the sd15-tiny fixture's architecture on a 16x16 latent, and the full-size SD 1.5 UNet on a 64x64 latent
// (512x512 images). Wall time per step is the figure to compare; process CPU time shows the threads used.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "backend/ops.h"
#include "core/trace.h"
#include "models/sd/unet.h"

namespace atelier {
namespace {

constexpr int64_t kBatch = 2;       // uncond + cond
constexpr int64_t kTokens = 77;     // CLIP context length
constexpr uint64_t kSeed = 1234;

// The sd15-tiny fixture's UNet: SD 1.5's structure with widths (32, 64, 64, 64) and cross dim 32.
UNetConfig tiny_config() {
  UNetConfig c = sd15_unet_config();
  c.block_out_channels = {32, 64, 64, 64};
  c.cross_attention_dim.assign(4, 32);
  c.time_embed_dim = 128;
  c.sample_size = 16;
  return c;
}

Tensor wave(const Shape& shape, float freq) {
  std::vector<float> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(freq * float(i));
  return Tensor::from_vector(v, shape);
}

void run_step(benchmark::State& state, const UNetConfig& config, int64_t latent) {
  auto unet = UNet::random(config, kSeed, Device::cpu());
  if (!unet) {
    state.SkipWithError(unet.status().message().c_str());
    return;
  }
  const Tensor x = wave({kBatch, config.in_channels, latent, latent}, 0.37f);
  const Tensor ctx = wave({kBatch, kTokens, config.cross_attention_dim[0]}, 0.11f);
  const Tensor t = Tensor::from_vector({999.0f, 500.0f}, {kBatch});
  const uint64_t flops0 = trace::thread_flops();
  for (auto _ : state) {
    auto out = unet->forward(x, t, ctx);
    if (!out) {
      state.SkipWithError(out.status().message().c_str());
      return;
    }
    benchmark::DoNotOptimize(out->raw());
  }
  state.counters["latent"] = double(latent);
  // The engine's FLOP count (core/trace.h) as a rate over the iterations' wall time.
  state.counters["FLOP/s"] = benchmark::Counter(double(trace::thread_flops() - flops0), benchmark::Counter::kIsRate);
}

void BM_UnetStepSd15Tiny(benchmark::State& state) { run_step(state, tiny_config(), 16); }
// Arg: latent side (64 = 512x512 images; 32 is a quicker profile of the same network).
void BM_UnetStepSd15(benchmark::State& state) { run_step(state, sd15_unet_config(), state.range(0)); }

// The full SD 1.5 UNet on the device named by $ATELIER_BENCH_DEVICE (e.g. cuda:0) in $ATELIER_BENCH_DTYPE
// (f32, bf16, f16): weights and inputs live on the device, one warm-up call (algorithm choice, plans) is
// outside the timing, and each timed call ends with a device synchronisation. Arg: latent side; batch 2.
void BM_UnetStepSd15Device(benchmark::State& state) {
  const char* dev_env = std::getenv("ATELIER_BENCH_DEVICE");
  const char* dt_env = std::getenv("ATELIER_BENCH_DTYPE");
  auto dev = Device::parse(dev_env ? dev_env : "cpu");
  if (!dev || !backend_available(*dev)) {
    state.SkipWithError("set ATELIER_BENCH_DEVICE to an available device (cpu, cuda:N)");
    return;
  }
  const std::string dts = dt_env ? dt_env : "f32";
  const DType dt = dts == "bf16" ? DType::BF16 : dts == "f16" ? DType::F16 : DType::F32;
  const UNetConfig config = sd15_unet_config();
  const int64_t latent = state.range(0);
  auto unet = UNet::random(config, kSeed, *dev, dt);
  if (!unet) {
    state.SkipWithError(unet.status().message().c_str());
    return;
  }
  const Tensor x = ops::cast(wave({kBatch, config.in_channels, latent, latent}, 0.37f), dt).to(*dev);
  const Tensor ctx = ops::cast(wave({kBatch, kTokens, config.cross_attention_dim[0]}, 0.11f), dt).to(*dev);
  const Tensor t = Tensor::from_vector({999.0f, 500.0f}, {kBatch}).to(*dev);
  Backend& backend = backend_for(*dev);
  auto warm = unet->forward(x, t, ctx);
  if (!warm) {
    state.SkipWithError(warm.status().message().c_str());
    return;
  }
  backend.synchronize();
  for (auto _ : state) {
    auto out = unet->forward(x, t, ctx);
    backend.synchronize();
    benchmark::DoNotOptimize(out.has_value());
  }
  state.counters["latent"] = double(latent);
}

BENCHMARK(BM_UnetStepSd15Device)->Arg(64)->Arg(128)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_UnetStepSd15Tiny)->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();
BENCHMARK(BM_UnetStepSd15)->Arg(64)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime()->Iterations(2);

}  // namespace
}  // namespace atelier

BENCHMARK_MAIN();
