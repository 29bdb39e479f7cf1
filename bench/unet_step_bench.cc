// One UNet denoising step (batch 2, as with classifier-free guidance) with random weights built in code:
// the sd15-tiny fixture's architecture on a 16x16 latent, and the full-size SD 1.5 UNet on a 64x64 latent
// (512x512 images). Wall time per step is the figure to compare; process CPU time shows the threads used.
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>

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
  for (auto _ : state) {
    auto out = unet->forward(x, t, ctx);
    if (!out) {
      state.SkipWithError(out.status().message().c_str());
      return;
    }
    benchmark::DoNotOptimize(out->raw());
  }
  state.counters["latent"] = double(latent);
}

void BM_UnetStepSd15Tiny(benchmark::State& state) { run_step(state, tiny_config(), 16); }
// Arg: latent side (64 = 512x512 images; 32 is a quicker profile of the same network).
void BM_UnetStepSd15(benchmark::State& state) { run_step(state, sd15_unet_config(), state.range(0)); }

BENCHMARK(BM_UnetStepSd15Tiny)->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();
BENCHMARK(BM_UnetStepSd15)->Arg(64)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime()->Iterations(2);

}  // namespace
}  // namespace atelier

BENCHMARK_MAIN();
