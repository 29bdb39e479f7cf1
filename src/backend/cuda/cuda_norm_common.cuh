// What the normalisation kernel files share (cuda_norm.cu: NCHW group norm, layer/RMS norms;
// cuda_norm_modulate.cu: adaLN modulation; cuda_group_norm_nhwc.cu: channels-last group norm): the affine
// parameters as the kernels see them, the 16-byte vector type their loads and stores use, the block size of
// the block-per-row kernels.
#pragma once
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_device.cuh"
#include "core/tensor.h"

namespace atelier::cuda {

// gamma/beta as raw pointers with their dtypes (either may be absent: gamma 1, beta 0).
struct NormAffine {
  const void* gamma = nullptr;
  const void* beta = nullptr;
  DType gamma_dtype = DType::F32, beta_dtype = DType::F32;
};

inline NormAffine affine_of(const Tensor& gamma, const Tensor& beta) {
  NormAffine a;
  if (gamma.defined()) {
    a.gamma = gamma.raw();
    a.gamma_dtype = gamma.dtype();
  }
  if (beta.defined()) {
    a.beta = beta.raw();
    a.beta_dtype = beta.dtype();
  }
  return a;
}

constexpr int kVecBytes = 16;

// Blocks of `kernel` (`threads` threads, `smem` bytes of dynamic shared memory) that fit on one SM of the current
// device, from the occupancy calculator, asked once per device, kernel and shape (cuda_group_norm_nhwc.cu); 0 where
// the calculator fails. Past 48 KB the caller must have raised the kernel's dynamic shared-memory limit first: the
// calculator counts only what that limit allows.
int blocks_per_sm(const void* kernel, int threads, size_t smem);

// Threads of the one-block-per-row normalisation kernels, and how many a row of d elements gets.
constexpr int kNormThreads = 256;
inline int row_threads(int64_t d) { return d <= 256 ? 64 : d <= 1024 ? 128 : kNormThreads; }

template <typename T>
struct alignas(kVecBytes) Vec {
  static constexpr int kWidth = kVecBytes / int(sizeof(T));
  T v[kWidth];
};

// A channels-last norm's input as it lies: one tensor [rows][c], or two side by side along channels (a UNet's skip
// concatenation read where its parts lie, never copied together): channels [0, c1) from x (rows of c1), [c1, c) from
// x2 (rows of c - c1). c1 is a multiple of the vector width, so that each 16-byte vector lies in one of them.
struct ChannelSources {
  const void* x2 = nullptr;  // null: one source (c1 is then c)
  int c1 = 0;
};

// The vector of channels ch.. (ch a multiple of the width) of pixel row `row`, as a pointer to its first row's and
// the stride between rows, in vectors.
template <typename T>
__device__ __forceinline__ const Vec<T>* source_rows(const T* x, const ChannelSources& s, int c, int64_t row, int ch, int& stride) {
  constexpr int V = Vec<T>::kWidth;
  if (s.x2 == nullptr || ch < s.c1) {
    const int cx = s.x2 == nullptr ? c : s.c1;
    stride = cx / V;
    return reinterpret_cast<const Vec<T>*>(x + row * cx + ch);
  }
  const int c2 = c - s.c1;
  stride = c2 / V;
  return reinterpret_cast<const Vec<T>*>(static_cast<const T*>(s.x2) + row * c2 + (ch - s.c1));
}
// One element: channel ch of pixel row `row`.
template <typename T>
__device__ __forceinline__ T source_at(const T* x, const ChannelSources& s, int c, int64_t row, int ch) {
  if (s.x2 == nullptr) return x[row * c + ch];
  return ch < s.c1 ? x[row * s.c1 + ch] : static_cast<const T*>(s.x2)[row * (c - s.c1) + (ch - s.c1)];
}

// max(amax, |v[e]|) over a vector's values, NaN ignored (as fmaxf ignores it); 16-bit values in pairs (the
// same result: max and abs are exact).
template <typename T>
__device__ __forceinline__ float vec_abs_max(float amax, const Vec<T>& v) {
  if constexpr (sizeof(T) == 2) {
    pair_t<T> m = __habs2(pair_at(v.v, 0));
#pragma unroll
    for (int p = 1; p < Vec<T>::kWidth / 2; ++p) m = pair_abs_max(m, pair_at(v.v, p));
    return fmaxf(amax, pair_max_f32(m));
  } else {
#pragma unroll
    for (int e = 0; e < Vec<T>::kWidth; ++e) amax = fmaxf(amax, fabsf(to_f32(v.v[e])));
    return amax;
  }
}

// A vector's values over their row's scale as e4m3 bytes (RowDivider's quotients, paired conversions, low byte
// first), element 0 first, written to p (aligned to the W bytes: 8 for a 16-bit vector, 4 for f32) in one store.
template <typename T>
__device__ __forceinline__ void store_e4m3(uint8_t* p, const Vec<T>& v, const RowDivider& div) {
  constexpr int W = Vec<T>::kWidth;
  static_assert(W == 4 || W == 8, "e4m3 vectors of 4 or 8 bytes");
  const auto pair = [&](int e) {
    const float2 q = make_float2(div.quotient(to_f32(v.v[e])), div.quotient(to_f32(v.v[e + 1])));
    return uint32_t(static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(q, __NV_SATFINITE, __NV_E4M3)));
  };
  uint32_t w[W / 4];
#pragma unroll
  for (int k = 0; k < W / 4; ++k) w[k] = pair(4 * k) | pair(4 * k + 2) << 16;
  if constexpr (W == 8) *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  else *reinterpret_cast<uint32_t*>(p) = w[0];
}

// The DType of a kernel's element type T.
template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float> ? DType::F32 : std::is_same_v<T, __half> ? DType::F16 : DType::BF16;
}

// Parameter p (gamma or beta) at channels c0 .. c0 + W - 1 into out[], `fallback` where p is absent. A vector
// load where p is stored as T and the run is 16-byte aligned (the common case: weights cast to the compute
// dtype), element loads otherwise: a dtype switch per element cost more than the row's own loads in the
// layer norms of SD's 320-channel tokens.
template <typename T, int W>
__device__ __forceinline__ void load_param_run(float (&out)[W], const void* p, DType dtype, int64_t c0, float fallback) {
  if (p == nullptr) {
#pragma unroll
    for (int e = 0; e < W; ++e) out[e] = fallback;
    return;
  }
  constexpr DType kT = dtype_of<T>();
  const T* tp = static_cast<const T*>(p) + c0;
  if constexpr (W == Vec<T>::kWidth) {
    if (dtype == kT && reinterpret_cast<uintptr_t>(tp) % kVecBytes == 0) {
      const Vec<T> v = *reinterpret_cast<const Vec<T>*>(tp);
#pragma unroll
      for (int e = 0; e < W; ++e) out[e] = to_f32(v.v[e]);
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < W; ++e) out[e] = load_any(p, dtype, c0 + e);
}

// A row's 1 / sqrt(mean(x^2) + eps) from this lane's VPL vectors (their values as f32 into f): the squares
// summed in order over the lane's vectors, then over the row's LANES lanes by shuffles (rms_norm_vec_kernel
// takes one vector per lane, the normalising rope two for heads of 128). Every lane of the warp must call it (a
// lane past the last row with zero vectors).
template <typename T, int LANES, int VPL>
__device__ __forceinline__ float lanes_row_rstd(const Vec<T> (&v)[VPL], float (&f)[VPL][Vec<T>::kWidth], float eps) {
  constexpr int V = Vec<T>::kWidth;
  float q = 0.0f;
#pragma unroll
  for (int i = 0; i < VPL; ++i)
#pragma unroll
    for (int e = 0; e < V; ++e) {
      f[i][e] = to_f32(v[i].v[e]);
      q += f[i][e] * f[i][e];
    }
#pragma unroll
  for (int m = LANES / 2; m > 0; m >>= 1) q += __shfl_xor_sync(0xffffffffu, q, m);
  return 1.0f / sqrtf(q / float(LANES * VPL * V) + eps);
}

}  // namespace atelier::cuda
