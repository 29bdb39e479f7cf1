// Small device helpers the tensor-core kernels share (the mma.sync flash attention in cuda_attention.cu, the
// wgmma building blocks and the Hopper attention kernel; the one-kernel group norm's staging copies): shared-memory
// addresses for PTX operands, 16-byte asynchronous copies into shared memory, the MUFU exponential, two floats
// packed as one register of two 16-bit values.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace atelier::cuda {

// The 32-bit shared-state-space address of a shared-memory pointer (what ldmatrix, cp.async, wgmma descriptors,
// mbarriers and bulk copies take).
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16-byte global->shared copy that bypasses L1; zero-fills the destination when !valid.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_size) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits until at most N of this thread's newest cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// e^x = 2^(x log2 e): softmaxes fold log2(e) into their scale and run fast_exp2.
constexpr float kLog2e = 1.4426950408889634f;

// 2^x on the MUFU unit (ex2.approx: about 2 ulp; 2^-inf = 0). exp2f would add range fix-ups per element. (On the
// host, for tests of the device formulas: exp2f.)
__host__ __device__ __forceinline__ float fast_exp2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// Two floats as one register of two 16-bit values (rounded to nearest even), the lower column in the low half.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace atelier::cuda
