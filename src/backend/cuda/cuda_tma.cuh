// Hopper's asynchronous pipeline pieces for kernels of our own: mbarriers, the bulk tensor copy engine (TMA),
// named barriers and register reallocation between warpgroups (used by cuda_attention_wgmma.cu).
//
// An mbarrier counts arrivals and, for TMA loads, bytes: the producer arms it with arrive_expect_tx(bytes) and
// each copy completes its bytes on it; waiters pass once the phase with the parity they name has completed
// (a fresh barrier is in phase 0, and the phase "before" it, parity 1, counts as completed: a producer waiting
// on an empty-buffer barrier with parity 1 passes at once the first time round).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_wgmma.cuh"

namespace atelier::cuda::tma {

// cuTensorMapEncodeTiled from the driver, fetched once (the runtime links no driver library); null where the
// driver lacks it.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return EncodeTiled(nullptr);
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

#ifdef ATELIER_WGMMA
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes the initialisations visible to the copy engine and the other threads (then a block barrier).
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// A box of a 4-D tensor map (coordinates innermost first, in elements) into shared memory at dst, its bytes
// completing on bar. The map must be a __grid_constant__ kernel parameter (its address is in parameter space).
__device__ __forceinline__ void load_4d(void* dst, const void* tensor_map, int c0, int c1, int c2, int c3,
                                        uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
}

// A box of a 2-D tensor map (coordinates innermost first, in elements) into shared memory at dst, its bytes
// completing on bar (a row-major matrix: c0 the column, c1 the row).
__device__ __forceinline__ void load_2d(void* dst, const void* tensor_map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}

// A box of shared memory at src into a 2-D tensor map at (c0 column, c1 row), as one bulk store of this thread's
// current bulk group (parts of the box outside the tensor are not written). The shared-memory writes it reads must
// be ordered before it: wgmma::fence_async_smem() in each writing thread, then a barrier.
__device__ __forceinline__ void store_2d(const void* tensor_map, int c0, int c1, const void* src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tensor_map)),
               "r"(c0), "r"(c1), "r"(smem_u32(src))
               : "memory");
}
// store_2d's form for a 5-D tensor map (coordinates innermost first, in elements).
__device__ __forceinline__ void store_5d(const void* tensor_map, int c0, int c1, int c2, int c3, int c4, const void* src) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tensor_map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(src))
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's bulk groups still read their shared memory (it may be written again).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until at most N of this thread's bulk groups are still in flight (their writes done).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Named barrier `id` (1-15; 0 is __syncthreads) over `threads` threads: sync waits, arrive does not.
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// n warpgroups taking turns in a ring of named barriers first .. first + n - 1: warpgroup c waits on first + c (begin)
// and, once it has issued what the turn guards, hands the turn on by arriving on the next one's (end). start() by
// every warpgroup before its first turn lets warpgroup 0 go first (the last one arrives on barrier `first`); the
// last warpgroup's last end() is left out, so that each barrier sees as many arrivals as waits. A lone warpgroup's
// barrier counts only its own 128 threads: its arrival completes one by itself and its wait passes at once.
struct TurnRing {
  int own, next, threads;
  bool last;
  __device__ TurnRing(int first, int c, int n)
      : own(first + c), next(first + (c + 1 == n ? 0 : c + 1)), threads(n > 1 ? 256 : 128), last(c + 1 == n) {}
  __device__ void start() const {
    if (last) bar_arrive(next, threads);
  }
  __device__ void begin() const { bar_sync(own, threads); }
  __device__ void end() const { bar_arrive(next, threads); }
};

// Registers per thread of the calling warpgroup (a multiple of 8 in 24-256; needs a register cap at entry).
template <int N>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
#endif

}  // namespace atelier::cuda::tma
