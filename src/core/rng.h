// Random numbers that reproduce PyTorch's generators bit for bit, so that a seed gives the same initial
// noise (and the same ancestral / img2img draws) as diffusers or A1111 do:
//   TorchCpuGenerator  == torch.Generator('cpu').manual_seed(S);  torch.randn(shape, generator=g)
//   TorchCudaGenerator == torch.Generator('cuda').manual_seed(S); torch.randn(shape, generator=g, device='cuda')
// Both are pure CPU code. A draw of n values is a draw of any tensor with numel n (torch fills contiguous
// tensors in row-major order); successive draws continue the generator's stream exactly as torch's do.
// float32 only: that is what the pipelines draw (they cast afterwards when running in half precision).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace atelier {

enum class RngKind { kCpu, kCuda };

// "cpu" | "cuda" (the names of A1111's "RNG source" setting and of torch's generator devices).
Expected<RngKind> parse_rng_kind(std::string_view name);
std::string_view rng_kind_name(RngKind kind);

// What a pipeline draws its noise from. Not thread-safe: one generator per request.
class NoiseGenerator {
 public:
  virtual ~NoiseGenerator() = default;
  virtual RngKind kind() const = 0;
  // Restarts the stream as torch's Generator.manual_seed(seed) does.
  virtual void manual_seed(uint64_t seed) = 0;
  virtual uint64_t initial_seed() const = 0;
  // torch.randn(n, generator=g): n standard normal float32 values; advances the state.
  virtual std::vector<float> randn(int64_t n) = 0;
  // torch.rand(n, generator=g): n float32 values uniform in [0, 1); advances the state.
  virtual std::vector<float> rand(int64_t n) = 0;
};

// torch's CPU generator: a 32-bit Mersenne Twister seeded with the low 32 bits of the seed (as torch's
// at::mt19937 does), plus the cached second Box-Muller value of the scalar normal path.
class TorchCpuGenerator final : public NoiseGenerator {
 public:
  explicit TorchCpuGenerator(uint64_t seed = kDefaultSeed);
  static constexpr uint64_t kDefaultSeed = 67280421310721ull;  // torch's default_rng_seed_val

  RngKind kind() const override { return RngKind::kCpu; }
  void manual_seed(uint64_t seed) override;
  uint64_t initial_seed() const override { return seed_; }
  // n >= 16: torch's vectorised path (float uniforms, Box-Muller over blocks of 16, cephes/avx_mathfun
  // log and sincos as torch's AVX2 kernel computes them); n < 16: the scalar double path.
  std::vector<float> randn(int64_t n) override;
  std::vector<float> rand(int64_t n) override;

  // The raw streams, for tests: next mt19937 output, and torch's 24-/53-bit uniforms built from it.
  uint32_t next_u32() { return uint32_t(engine_()); }
  uint64_t next_u64();  // two outputs, the first one in the high half (torch's random64())
  float next_float_uniform();
  double next_double_uniform();

 private:
  double next_double_normal();  // torch's at::normal_distribution<double>(0, 1)
  void fill_normal_vectorised(float* data, int64_t n);

  uint64_t seed_ = kDefaultSeed;
  std::mt19937 engine_;                       // std::mt19937 is the same engine torch implements
  std::optional<double> next_double_normal_;  // torch's next_double_normal_sample_
};

// The part of the GPU that torch's CUDA random kernels read: their grid is
// min(ceil(numel / 256), multiprocessor_count * (max_threads_per_multiprocessor / 256)) blocks of 256
// threads, and which Philox stream an element comes from depends on that grid. Draws of at most
// 256 * max_resident_blocks() elements (every SD-1.x latent up to 1024x1024 on any GPU of 16+ SMs) are
// the same on every GPU; larger draws reproduce only the GPU they were made on.
struct CudaDeviceProfile {
  int multiprocessor_count = 128;            // default: GeForce RTX 4090 (sm_89)
  int max_threads_per_multiprocessor = 1536;
  int64_t max_resident_blocks() const;
  static CudaDeviceProfile rtx4090() { return {128, 1536}; }
  static CudaDeviceProfile rtx3090() { return {82, 1536}; }
  static CudaDeviceProfile rtx3060() { return {28, 1536}; }
  static CudaDeviceProfile a100() { return {108, 2048}; }
  static CudaDeviceProfile h100_sxm() { return {132, 2048}; }  // also H200
};

// torch's CUDA generator: Philox4x32-10 keyed with the seed; each draw takes a counter offset from the
// generator and each GPU thread of the launch its own Philox subsequence (curand_init(seed, thread, offset)).
// randn is curand_normal4's Box-Muller. Its log is CUDA's logf, reproduced exactly; its sin/cos are the
// GPU's hardware approximations (__sincosf), reproduced to about 1e-7 relative; see rng_cuda.cc.
class TorchCudaGenerator final : public NoiseGenerator {
 public:
  explicit TorchCudaGenerator(uint64_t seed = TorchCpuGenerator::kDefaultSeed, CudaDeviceProfile gpu = {});

  RngKind kind() const override { return RngKind::kCuda; }
  void manual_seed(uint64_t seed) override;
  uint64_t initial_seed() const override { return seed_; }
  std::vector<float> randn(int64_t n) override;
  std::vector<float> rand(int64_t n) override;

  // torch's philox_offset_per_thread (get_state()'s offset): 0 after manual_seed, +4 per round of a draw.
  uint64_t offset() const { return offset_; }
  const CudaDeviceProfile& device_profile() const { return gpu_; }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
  CudaDeviceProfile gpu_;
};

// A generator of `kind` seeded with `seed` (the CUDA one with the default CudaDeviceProfile).
std::unique_ptr<NoiseGenerator> make_generator(RngKind kind, uint64_t seed);

// torch.randn(shape, generator=g) as a host f32 tensor (row-major).
Tensor randn_tensor(NoiseGenerator& gen, const Shape& shape);

}  // namespace atelier
