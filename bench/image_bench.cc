// PNG encoding of generated-image sizes: Atelier's encoder (rows filtered and deflated on every core,
// io/png_deflate.h) against libpng's own one-thread encoder at the same level (the reference: what the encoder
// was before, and what PIL-based servers do). Arguments: the image side, the OpenMP thread count (0: the
// default) and the content (0: photo-like shading, 1: noise, which a random-weight model's images resemble and
// which deflate spends longest on). Counters: MB/s of pixels, and the file size.
//   ./build/bench/image_bench --benchmark_filter=Png
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "io/image.h"
#include "libpng_reference.h"  // tests/

namespace atelier {
namespace {

constexpr int kNoise = 1;

Image bench_image(int side, int content) {
  std::mt19937 rng{uint32_t(side)};
  std::uniform_int_distribution<int> byte(0, 255), grain(-2, 2);
  Image img{side, side, 3, std::vector<uint8_t>(size_t(side) * side * 3)};
  for (int y = 0; y < side; ++y)
    for (int x = 0; x < side; ++x)
      for (int k = 0; k < 3; ++k) {
        const double r = std::hypot(x - side * 0.4, y - side * 0.6) / side;
        const int shade = int(200 * std::exp(-3 * r * r) + 25 * std::cos(0.05 * x * (k + 1))) + grain(rng);
        img.pixels[(size_t(y) * side + x) * 3 + k] = uint8_t(content == kNoise ? byte(rng) : std::clamp(shade, 0, 255));
      }
  return img;
}

void set_threads(int threads) {
  static const int default_threads = omp_get_max_threads();
  omp_set_num_threads(threads > 0 ? threads : default_threads);
}

void report(benchmark::State& state, const Image& img, size_t file_bytes) {
  state.counters["MB/s"] = benchmark::Counter(double(img.pixels.size()), benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
  state.counters["KiB"] = double(file_bytes) / 1024.0;
}

void BM_PngEncode(benchmark::State& state) {
  set_threads(int(state.range(1)));
  const Image img = bench_image(int(state.range(0)), int(state.range(2)));
  size_t bytes = 0;
  for (auto _ : state) {
    auto png = encode_png(img, {{kInfotextKey, "a lighthouse at dusk, Steps: 20"}});
    if (!png) state.SkipWithError(png.status().message().c_str());
    bytes = png ? png->size() : 0;
  }
  report(state, img, bytes);
}
BENCHMARK(BM_PngEncode)
    ->ArgsProduct({{512, 1024}, {1, 0}, {0, kNoise}})
    ->ArgNames({"side", "threads", "noise"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The reference: libpng's simplified API (one thread; level 6 and adaptive filters, its defaults).
void BM_LibpngEncode(benchmark::State& state) {
  const Image img = bench_image(int(state.range(0)), int(state.range(1)));
  size_t bytes = 0;
  for (auto _ : state) {
    const std::string png = test::libpng_encode_rgb(img);
    if (png.empty()) state.SkipWithError("libpng failed");
    bytes = png.size();
  }
  report(state, img, bytes);
}
BENCHMARK(BM_LibpngEncode)
    ->ArgsProduct({{512, 1024}, {0, kNoise}})
    ->ArgNames({"side", "noise"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace atelier

BENCHMARK_MAIN();
