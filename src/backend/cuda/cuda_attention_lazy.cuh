// The lazy running max, shared by the flash-attention kernels (cuda_attention_wgmma.cu, cuda_attention.cu; switch and
// counters: cuda_attention_lazy.h).
//
// A softmax is the same for any subtracted max m (P V and the row sum scale alike) as long as the exponentials stay
// inside f32. So key tiles after the first take their exponentials against the running max of the tiles before,
// without a max over S: P may exceed 1, and O needs no rescale. This takes the max's FMNMX chain and shuffles, alpha's
// exponentials and O's rescale off every tile (session 54: 9-15% of the d40 wgmma kernel, 11-12% at d64 and d128).
// Each tile's row sums bound its P (no extra instruction per score): where a thread's share of a row's tile sum
// passes kLazyCap, its warp rescales that row exactly by a power of two (lazy_rescale_exponent); where an exponential
// overflowed (scores 128 ln 2 = 89 over the running max within one tile) nothing can be rescaled, and the warp
// recomputes its rows from global memory at the end (exact_rows).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_attention_lazy.h"
#include "backend/cuda/cuda_attention_views.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace atelier::cuda {

// The bound on a thread's share of a row's sum over one tile, by P's type: up to it, P stays unrescaled. For bf16
// P, 2^64: each P is then inside bf16's range (f32's exponent bits), and O and l, sums of at most 2^31 keys' P (x |v|
// for O), stay below 2^95 x max |v|: inside f32 for any |v| below 2^32; a row's scaled scores must grow by 64 ln 2 = 44
// over their running max within one tile to pass it. f16's largest value is 65504, so its P rescales from 2^15
// (scores grown by 10.4).
template <typename T>
constexpr float kLazyCap = std::is_same_v<T, __half> ? 32768.0f : 18446744073709551616.0f;  // 2^15, 2^64
constexpr int kFloatExpBias = 127, kFloatMantBits = 23;

// For a row's largest P, mx in (1, inf): e with 2^(e-1) <= mx < 2^e (at most 127: 2^-127 is f32's smallest normal
// power of two, so P then ends below 2), and r = 2^-e in `r`. P, l and O times r and m + e are the exact rescale.
__device__ __forceinline__ int lazy_rescale_exponent(float mx, float& r) {
  const int e = min(((__float_as_int(mx) >> kFloatMantBits) & 0xff) - (kFloatExpBias - 1), kFloatExpBias);
  r = __int_as_float((kFloatExpBias - e) << kFloatMantBits);
  return e;
}

// One row's settlement once its warp voted to rescale (every lane calls it): thread_mx is this thread's largest P of
// the row, whose quad (lanes 4k .. 4k + 3, as both kernels' accumulator layouts spread a row) gives the row's; tile_sum
// this thread's share of the tile's sum. Updates the row's l and m and returns the factor its P and O are to be
// multiplied by (1 where the row did not pass 1, or overflowed: then exact_needed is set).
__device__ __forceinline__ float lazy_settle_row(float thread_mx, float tile_sum, float& l, float& m,
                                                 bool& exact_needed) {
  float mx = fmaxf(thread_mx, __shfl_xor_sync(0xffffffffu, thread_mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  if (mx == INFINITY) exact_needed = true;
  if (!(mx > 1.0f && mx < INFINITY)) {
    l += tile_sum;
    return 1.0f;
  }
  float r;
  const int e = lazy_rescale_exponent(mx, r);
  l = (l + tile_sum) * r;
  m += float(e);
  return r;
}

// One warp recomputes `rows` query rows from row0 of head h in batch b exactly, from global memory (the lazy max's
// fallback after an overflow; never met in SD's or FLUX's attention): per row, the max over all keys, then the
// exponentials' sum and P V, the head dim (at most kMaxD) spread over the lanes; out in T. Slow (two passes over the
// keys per row) and only for such rows. Counts the warp in *counter. Inlined: a call would hold the kernel to the
// calling convention's registers (the mma.sync kernels spilled up to 10x more with it).
template <typename T, int kMaxD>
__device__ __forceinline__ void exact_rows(const AttentionViews& v, int b, int h, int row0, int rows, int lane,
                                        unsigned long long* counter) {
  constexpr int kPerLane = (kMaxD + 31) / 32;
  const int kvh = h / v.group;
  const float scale_log2 = v.scale * kLog2e;
  const T* kb = static_cast<const T*>(v.k) + int64_t(b) * v.ks0 + int64_t(kvh) * v.ks1;
  const T* vb = static_cast<const T*>(v.v) + int64_t(b) * v.vs0 + int64_t(kvh) * v.vs1;
  T* og = static_cast<T*>(v.out) + int64_t(b) * v.os0 + int64_t(h) * v.os1;
  if (lane == 0) atomicAdd(counter, 1ull);
  for (int row = row0; row < min(row0 + rows, v.sq); ++row) {
    const T* qr = static_cast<const T*>(v.q) + int64_t(b) * v.qs0 + int64_t(h) * v.qs1 + int64_t(row) * v.qs2;
    float q[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) q[i] = lane + 32 * i < v.d ? to_f32(qr[lane + 32 * i]) : 0.0f;
    const auto score = [&](int key) {  // log2 units
      float part = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (lane + 32 * i < v.d) part = fmaf(q[i], to_f32(kb[int64_t(key) * v.ks2 + lane + 32 * i]), part);
#pragma unroll
      for (int w = 16; w > 0; w /= 2) part += __shfl_xor_sync(0xffffffffu, part, w);
      return part * scale_log2;
    };
    float mx = -INFINITY;
    for (int key = 0; key < v.sk; ++key) mx = fmaxf(mx, score(key));
    float sum = 0.0f, o[kPerLane] = {};
    for (int key = 0; key < v.sk; ++key) {
      const float pr = fast_exp2(score(key) - mx);
      sum += pr;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (lane + 32 * i < v.d) o[i] = fmaf(pr, to_f32(vb[int64_t(key) * v.vs2 + lane + 32 * i]), o[i]);
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i < v.d) og[int64_t(row) * v.os2 + lane + 32 * i] = from_f32<T>(o[i] / sum);
  }
}

// A kernel file's two rare-path counters (__device__ unsigned long long symbols), read back (host; synchronizes).
template <class Counter>
LazyMaxCounts read_lazy_max_counts(const Counter& rescales, const Counter& exact_rows) {
  LazyMaxCounts c{};
  ATELIER_CUDA_OK(cudaMemcpyFromSymbol(&c.rescaled_warp_tiles, rescales, sizeof(c.rescaled_warp_tiles)));
  ATELIER_CUDA_OK(cudaMemcpyFromSymbol(&c.exact_warps, exact_rows, sizeof(c.exact_warps)));
  return c;
}

}  // namespace atelier::cuda
