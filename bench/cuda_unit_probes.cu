// cuda_unit_probes.h: MUFU exponential throughput. Each thread runs kChains independent chains x <- 2^x - 1
// (the subtraction keeps x in range and the chain dependent, so nothing is hoisted); with 64 warps per SM the
// MUFU pipe, not latency, sets the rate. Session 21 (H200): 15.9 exponentials per clock per SM for all three
// forms: the packed bf16x2 / f16x2 instructions do not raise the rate, they only halve the instruction count.
#include "cuda_unit_probes.h"

#include <cstdint>

namespace atelier::bench {
namespace {

constexpr int kIters = 4096;  // chain steps per thread
constexpr int kChains = 8;
constexpr int kThreads = 256, kBlocksPerSm = 8;

template <Exp2Form F>
__global__ void exp2_chains_kernel(uint32_t* sink, uint32_t seed) {
  uint32_t x[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) x[c] = seed + threadIdx.x + c;
#if defined(__CUDA_ARCH__)
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (F == Exp2Form::kF32) {
        float y;
        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(__uint_as_float(x[c])));
        x[c] = __float_as_uint(y - 1.0f);
      } else {
#if __CUDA_ARCH__ >= 900
        uint32_t y;
        if constexpr (F == Exp2Form::kBf16x2) {
          asm volatile("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(y) : "r"(x[c]));
          asm volatile("sub.rn.bf16x2 %0, %1, %2;" : "=r"(x[c]) : "r"(y), "r"(0x3F803F80u));
        } else {
          asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x[c]));
          asm volatile("sub.rn.f16x2 %0, %1, %2;" : "=r"(x[c]) : "r"(y), "r"(0x3C003C00u));
        }
#endif
      }
    }
#endif
  uint32_t s = 0;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s ^= x[c];
  if (s == 0x9E3779B9u) *sink = s;  // keeps the chains alive; practically never taken
}

template <Exp2Form F>
void launch(int sms, uint32_t* sink, cudaStream_t stream) {
  // Inputs near -0.5 (f32 bits / packed halves): every step's 2^x - 1 stays in (-1, 0).
  const uint32_t seed = F == Exp2Form::kF32 ? 0xBF000000u : F == Exp2Form::kBf16x2 ? 0xBF00BF00u : 0xB800B800u;
  exp2_chains_kernel<F><<<unsigned(sms * kBlocksPerSm), kThreads, 0, stream>>>(sink, seed);
}

}  // namespace

bool exp2_form_runs(Exp2Form form) {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return form == Exp2Form::kF32 || major >= 9;
}

void launch_exp2_chains(Exp2Form form, int sms, uint32_t* sink, cudaStream_t stream) {
  switch (form) {
    case Exp2Form::kF32: return launch<Exp2Form::kF32>(sms, sink, stream);
    case Exp2Form::kBf16x2: return launch<Exp2Form::kBf16x2>(sms, sink, stream);
    case Exp2Form::kF16x2: return launch<Exp2Form::kF16x2>(sms, sink, stream);
  }
}

double exp2_per_launch(Exp2Form form, int sms) {
  return double(sms) * kBlocksPerSm * kThreads * kIters * kChains * (form == Exp2Form::kF32 ? 1 : 2);
}

}  // namespace atelier::bench
