// cuda_unit_probes.h: MUFU exponential throughput. Each thread runs kChains independent chains x <- 2^x - 1
// (the subtraction keeps x in range and the chain dependent, so nothing is hoisted); with 64 warps per SM the
// MUFU pipe, not latency, sets the rate. Session 21 (H200): 15.9 exponentials per clock per SM for all three
// forms: the packed bf16x2 / f16x2 instructions do not raise the rate, they only halve the instruction count.
#include "cuda_unit_probes.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

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

int device_major() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major;
}

bool exp2_form_runs(Exp2Form form) { return form == Exp2Form::kF32 || device_major() >= 9; }

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

// --- The tensor pipe beside the MUFU (cuda_unit_probes.h: launch_overlap_probe) ---------------------------------
namespace {

constexpr int kProbeTcGroups = 2048;      // commit groups of a 'T' or 'R' warpgroup
constexpr int kProbeMmasPerGroup = 8;     // m64n128k16 products per group
constexpr int kProbeExpIters = 4096;      // steps of each chain of an 'M' warpgroup
constexpr int kProbeExpChains = 16;
constexpr int kProbeFmasPerExp = 4;       // an 'F' warpgroup's FFMAs per exponential of an 'M' one
constexpr int kProbeScores = 64;         // scores per thread of an 'S' warpgroup (a 128-key tile's)
[[maybe_unused]] constexpr int kProbeSoftmaxIters = kProbeExpIters * kProbeExpChains / kProbeScores;  // as many exponentials as 'M'
constexpr int kProbeRoles = 3;            // warpgroups per block
constexpr size_t kProbeSmem = 128 * 1024; // more than half an SM's shared memory: one block per SM
[[maybe_unused]] constexpr uint32_t kProbeABytes = 64 * 128, kProbeBBytes = 128 * 128;  // one 64-row and one 128-row atom column

struct ProbeRoles {
  char r[kProbeRoles];
};

// One 'T' (A from shared memory) or 'R' (A from registers) warpgroup's products; returns a word of the accumulators.
// A function of its own with no branch around a product: a wgmma in a divergent path makes ptxas serialise them all.
template <bool kFromRegisters>
__device__ __forceinline__ uint32_t tensor_role(uint32_t a) {
  uint32_t out = 0;
#if defined(ATELIER_WGMMA)
  const uint32_t b = a + kProbeABytes;
  float d[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = 0.0f;
  const uint32_t frag[4] = {threadIdx.x & 1u, 0u, 0u, 0u};  // bf16 zeros and a denormal: finite
  for (int g = 0; g < kProbeTcGroups; ++g) {
    cuda::wgmma::fence();
#pragma unroll
    for (int k = 0; k < kProbeMmasPerGroup; ++k) {
      const uint32_t step = (k % 4) * 32;
      const uint64_t db = cuda::wgmma::desc_sw128(b + step, 0, cuda::wgmma::kAtomGroupBytes);
      if constexpr (kFromRegisters)
        cuda::wgmma::mma_m64n128k16_rs<0>(d, frag, db, true);
      else
        cuda::wgmma::mma_m64n128k16_ss<0>(d, cuda::wgmma::desc_sw128(a + step, 0, cuda::wgmma::kAtomGroupBytes), db, true);
    }
    cuda::wgmma::commit();
    cuda::wgmma::wait<1>();
  }
  cuda::wgmma::wait<0>();
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    cuda::wgmma::fence_operand(d[i]);
    out ^= __float_as_uint(d[i]);
  }
#endif
  return out;
}

__global__ void __launch_bounds__(128 * kProbeRoles, 1) overlap_probe_kernel(ProbeRoles roles, uint32_t* sink) {
#if defined(ATELIER_WGMMA)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  // Zeros: finite operands, so no NaN path is timed.
  for (uint32_t i = threadIdx.x * 16; i < kProbeABytes + kProbeBBytes; i += blockDim.x * 16)
    *reinterpret_cast<uint4*>(base + i) = make_uint4(0, 0, 0, 0);
  cuda::wgmma::fence_async_smem();
  __syncthreads();
  const char role = roles.r[threadIdx.x / 128];
  uint32_t out = 0;
  if (role == 'T') out = tensor_role<false>(cuda::smem_u32(base));
  else if (role == 'R') out = tensor_role<true>(cuda::smem_u32(base));
  else if (role == 'S') {
    // The d40 attention's softmax per key tile and thread: 64 scores, their max, an FFMA, an exponential and an add
    // per score, and P packed to bf16 (about its 5 instructions per exponential before the loop's overhead).
    float sc[kProbeScores];
#pragma unroll
    for (int i = 0; i < kProbeScores; ++i) sc[i] = 0.01f * float((i * 7 + int(threadIdx.x)) & 63);
    float l = 0.0f;
    for (int it = 0; it < kProbeSoftmaxIters; ++it) {
      float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < kProbeScores; ++i) mx[i % 4] = fmaxf(mx[i % 4], sc[i]);
      const float m = fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3]));
      float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int i = 0; i < kProbeScores; ++i) {
        const float y = cuda::fast_exp2(fmaf(sc[i], cuda::kLog2e, -m));
        sum[i % 4] += y;
        sc[i] = y;
      }
      l += (sum[0] + sum[1]) + (sum[2] + sum[3]);
#pragma unroll
      for (int i = 0; i < kProbeScores; i += 2) {
        __nv_bfloat162 h = __floats2bfloat162_rn(sc[i], sc[i + 1]);
        out ^= *reinterpret_cast<uint32_t*>(&h);
      }
    }
    out ^= __float_as_uint(l);
  } else if (role == 'F') {
    // FFMA chains: 4 FMAs per exponential of 'M' (the rate a polynomial exponential on the FMA pipes would need).
    float x[kProbeExpChains];
#pragma unroll
    for (int c = 0; c < kProbeExpChains; ++c) x[c] = 0.5f + 0.001f * float(c + (threadIdx.x & 7));
    for (int i = 0; i < kProbeExpIters * kProbeFmasPerExp; ++i)
#pragma unroll
      for (int c = 0; c < kProbeExpChains; ++c) x[c] = fmaf(x[c], 0.999f, 0.0005f);
#pragma unroll
    for (int c = 0; c < kProbeExpChains; ++c) out ^= __float_as_uint(x[c]);
  } else if (role == 'M') {
    float x[kProbeExpChains];
#pragma unroll
    for (int c = 0; c < kProbeExpChains; ++c) x[c] = -0.5f - 0.001f * float(c + (threadIdx.x & 7));
    for (int i = 0; i < kProbeExpIters; ++i)
#pragma unroll
      for (int c = 0; c < kProbeExpChains; ++c) x[c] = cuda::fast_exp2(x[c]) - 1.0f;
#pragma unroll
    for (int c = 0; c < kProbeExpChains; ++c) out ^= __float_as_uint(x[c]);
  }
  if (out == 0x9E3779B9u) *sink = out;  // keeps the work alive; practically never taken
#else
  __trap();
#endif
}

}  // namespace

bool overlap_probe_runs() { return device_major() == 9; }

void launch_overlap_probe(const char* roles, int sms, uint32_t* sink, cudaStream_t stream) {
  ProbeRoles r{};
  for (int i = 0; i < kProbeRoles; ++i) r.r[i] = '.';
  for (int i = 0; i < kProbeRoles && roles[i] != '\0'; ++i) r.r[i] = roles[i];
  static bool attribute_set = false;
  if (!attribute_set) {
    cudaFuncSetAttribute(overlap_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kProbeSmem));
    attribute_set = true;
  }
  overlap_probe_kernel<<<unsigned(sms), 128 * kProbeRoles, kProbeSmem, stream>>>(r, sink);
}

double overlap_probe_tensor_flops_per_role() { return 2.0 * 64 * 128 * 16 * kProbeMmasPerGroup * double(kProbeTcGroups); }
double overlap_probe_exp2_per_role() { return 128.0 * kProbeExpIters * kProbeExpChains; }
double overlap_probe_fma_flops_per_role() { return 2.0 * kProbeFmasPerExp * overlap_probe_exp2_per_role(); }

}  // namespace atelier::bench
