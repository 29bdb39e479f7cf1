// The generator-independent part of core/rng.h: choosing a generator and shaping its draws.
#include "core/rng.h"

namespace atelier {

Expected<RngKind> parse_rng_kind(std::string_view name) {
  if (name == "cpu") return RngKind::kCpu;
  if (name == "cuda" || name == "gpu") return RngKind::kCuda;
  return invalid_argument("unknown RNG source '" + std::string(name) +
                          "': supported are 'cpu' (torch.Generator('cpu'), diffusers' usual choice) and "
                          "'cuda' (torch.Generator('cuda'), A1111's default; computed on the CPU)");
}

std::string_view rng_kind_name(RngKind kind) { return kind == RngKind::kCpu ? "cpu" : "cuda"; }

std::unique_ptr<NoiseGenerator> make_generator(RngKind kind, uint64_t seed) {
  if (kind == RngKind::kCuda) return std::make_unique<TorchCudaGenerator>(seed);
  return std::make_unique<TorchCpuGenerator>(seed);
}

// shape: any -> host f32 tensor of that shape, values in row-major order as torch fills them.
Tensor randn_tensor(NoiseGenerator& gen, const Shape& shape) {
  return Tensor::from_vector(gen.randn(numel_of(shape)), shape);
}

}  // namespace atelier
