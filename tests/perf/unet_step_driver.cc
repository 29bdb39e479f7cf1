// The CI performance check's workload: exactly one UNet forward of the sd15-tiny fixture (batch 2 as with
// CFG, 16x16 latent, 77 context tokens), inside atelier_perf_unet_call so that callgrind counts only it
// (valgrind --tool=callgrind --toggle-collect=atelier_perf_unet_call). There is no warm-up call: valgrind
// runs this code ~300x slower than native (its AVX2/FMA emulation), so a second UNet call would double the
// check's time, and the first call's extra work (the allocator's first mallocs) is as repeatable as the rest.
// Run with OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1: thread scheduling makes spin-wait and work-split
// instruction counts vary from run to run; single-threaded they repeat exactly.
//
//   atelier_perf_unet_step MODEL_DIR     (the fixture's diffusers folder, e.g. fixtures/sd15-tiny/model)
// Prints the output's checksum (so the call cannot be optimised away) and exits 0, or a message and 1.
#include <cmath>
#include <cstdio>

#include "models/common/weights.h"
#include "models/sd/unet.h"
#include "models/sd/unet_config.h"

namespace {

constexpr int64_t kBatch = 2;     // uncond + cond
constexpr int64_t kLatent = 16;   // the fixture's sample_size
constexpr int64_t kTokens = 77;

atelier::Tensor wave(const atelier::Shape& shape, float freq) {
  std::vector<float> v(size_t(atelier::numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(freq * float(i));
  return atelier::Tensor::from_vector(v, shape);
}

}  // namespace

using UnetCall = int (*)(const atelier::UNet*, const atelier::Tensor*, const atelier::Tensor*, const atelier::Tensor*,
                         atelier::Tensor*);

// The counted region. C linkage and noinline keep its name stable for --toggle-collect.
extern "C" __attribute__((noinline)) int atelier_perf_unet_call(const atelier::UNet* unet, const atelier::Tensor* x,
                                                                  const atelier::Tensor* t, const atelier::Tensor* ctx,
                                                                  atelier::Tensor* out) {
  auto r = unet->forward(*x, *t, *ctx);
  if (!r) return 1;
  *out = std::move(r).value();
  return 0;
}

int main(int argc, char** argv) {
  using namespace atelier;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FIXTURE_MODEL_DIR (e.g. shared/fixtures/sd15-tiny/model)\n", argv[0]);
    return 1;
  }
  const std::string dir = std::string(argv[1]) + "/unet/";
  auto config = load_unet_config(dir + "config.json");
  auto store = config ? WeightStore::open({dir + "diffusion_pytorch_model.safetensors"}) : Expected<WeightStore>(config.status());
  auto unet = store ? UNet::load(*store, UNetLayout::kDiffusers, *config) : Expected<UNet>(store.status());
  if (!unet) {
    std::fprintf(stderr, "error: %s\n", unet.status().message().c_str());
    return 1;
  }
  const Tensor x = wave({kBatch, config->in_channels, kLatent, kLatent}, 0.37f);
  const Tensor ctx = wave({kBatch, kTokens, config->cross_attention_dim[0]}, 0.11f);
  const Tensor t = Tensor::from_vector({999.0f, 500.0f}, {kBatch});
  // A call through a volatile pointer: the compiler cannot inline the counted function into main.
  volatile UnetCall counted = atelier_perf_unet_call;
  Tensor out;
  if (counted(&*unet, &x, &t, &ctx, &out) != 0) {
    std::fprintf(stderr, "error: the UNet forward failed\n");
    return 1;
  }
  double sum = 0;
  for (float v : out.to_vector()) sum += double(v);
  std::printf("checksum %.6f\n", sum);
  return 0;
}
