// Host-side helpers shared by the CUDA backend's files: error checks that throw atelier::Error (ops never
// abort), the current-device guard, and the size limits of the kernels' index structs.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "core/status.h"

namespace atelier::cuda {

// Whether environment variable `name` is set to exactly `value` (the ATELIER_* switches of the backend).
inline bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

// The number environment variable `name` holds (atof: 0 for text that is not one), or nullopt where it is unset
// (the backend's numeric ATELIER_* settings; each caller applies its own bounds and units).
inline std::optional<double> env_number(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::atof(v);
}

// Whether p lies on a `bytes` boundary (the vector paths' 16-byte loads and stores, 8-byte table reads).
inline bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
inline bool aligned16(const void* p) { return aligned_to(p, 16); }

// Launches kernel<<<blocks, threads, smem, stream>>>(args...) cooperatively: all blocks resident at once (kernels
// whose blocks wait on each other), or no launch and cudaErrorCooperativeLaunchTooLarge. Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t launch_cooperative(void (*kernel)(Params...), unsigned blocks, unsigned threads, size_t smem, cudaStream_t stream,
                               Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute coop{};
  coop.id = cudaLaunchAttributeCooperative;
  coop.val.cooperative = 1;
  cfg.attrs = &coop;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// n / d for 32-bit n < 2^31 by a divisor fixed on the host: one high product, an add and a shift (the
// round-up method of Granlund and Montgomery: l = ceil(log2 d), m = floor(2^32 (2^l - d) / d) + 1, then
// n / d = (umulhi(n, m) + n) >> l, the sum below 2^32 for n < 2^31). A division by a runtime divisor compiled
// to a reciprocal estimate and ~25 instructions per thread (SASS of the normalising rope, session 16).
struct FastDivU32 {
  uint32_t d = 1, m = 1, l = 0;
  __host__ __device__ static FastDivU32 of(uint32_t divisor) {
    FastDivU32 f;
    f.d = divisor;
    while ((uint64_t(1) << f.l) < divisor) ++f.l;
    f.m = uint32_t((uint64_t(1) << 32) * ((uint64_t(1) << f.l) - divisor) / divisor + 1);
    return f;
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t t = __umulhi(n, m);
#else
    const uint32_t t = uint32_t((uint64_t(n) * m) >> 32);
#endif
    return (t + n) >> l;
  }
};

// Throws atelier::Error naming the failed call and CUDA's message.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

}  // namespace atelier::cuda

// Checks a cudaError_t; on failure throws atelier::Error (kInternal, or kResourceExhausted for OOM).
#define ATELIER_CUDA_OK(expr)                                                             \
  do {                                                                                    \
    const cudaError_t _err = (expr);                                                      \
    if (_err != cudaSuccess) ::atelier::cuda::throw_cuda_error(_err, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: reports launch-configuration errors (no synchronisation).
#define ATELIER_CUDA_LAUNCHED() ATELIER_CUDA_OK(cudaGetLastError())

namespace atelier::cuda {

// Makes `index` the calling thread's current device for the guard's lifetime (restores the previous one).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    cudaGetDevice(&previous_);
    if (previous_ != index) ATELIER_CUDA_OK(cudaSetDevice(index));
    else previous_ = -1;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace atelier::cuda
