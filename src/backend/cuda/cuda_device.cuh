// Device-side helpers shared by the CUDA kernels: element conversions (f32 compute for f16/bf16 storage,
// round to nearest even as torch does), the activation formulas (the CPU backend's, in f32 with CUDA's
// precise libm: no fast-math, so f32 results agree with the CPU to rounding), runtime-typed loads for small
// auxiliary tensors, strided index arithmetic, and block reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>
#include <cstring>

#include "backend/backend.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_strided.h"

namespace atelier::cuda {

// --- conversions ----------------------------------------------------------------------------------------

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// --- paired 16-bit arithmetic ---------------------------------------------------------------------------
// Two 16-bit values in one register (__nv_bfloat162 / __half2), added or multiplied by one paired instruction
// rounded once to nearest even. That gives the same bits as the f32 operation rounded to T, which is how the
// unfused ops round: a product of two 16-bit values is exact in f32, and a sum rounded first to f32's 24 bits
// then to T's 8 (bf16) or 11 (f16) is rounded correctly, double rounding being innocuous when 24 >= 2p + 2.
// The _rn forms keep the compiler from contracting a product and a sum into one FMA (one rounding fewer).
// Why: a chain of per-element roundings (f32 result -> T -> f32) made the DiT glue kernels instruction-bound on
// the conversions (ncu: norm_modulate at ~1 TB/s with the SMs 71% busy); a paired op replaces two products,
// two conversions and two unpackings.
template <typename T> struct PairOf;
template <> struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type from_floats(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
  static __device__ __forceinline__ type splat(__nv_bfloat16 v) { return __bfloat162bfloat162(v); }
};
template <> struct PairOf<__half> {
  using type = __half2;
  static __device__ __forceinline__ type from_floats(float lo, float hi) { return __floats2half2_rn(lo, hi); }
  static __device__ __forceinline__ type splat(__half v) { return __half2half2(v); }
};
template <typename T> using pair_t = typename PairOf<T>::type;

// Element pair p (elements 2p, 2p + 1) of an array of 16-bit values, as one paired register.
template <typename T>
__device__ __forceinline__ pair_t<T>& pair_at(T* v, int p) { return reinterpret_cast<pair_t<T>*>(v)[p]; }
template <typename T>
__device__ __forceinline__ const pair_t<T>& pair_at(const T* v, int p) { return reinterpret_cast<const pair_t<T>*>(v)[p]; }

// (a, b) -> (-a, b): the low half's sign flipped (exact, as negation is).
template <typename P>
__device__ __forceinline__ P negate_low(P v) {
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  u ^= 0x8000u;
  memcpy(&v, &u, sizeof(u));
  return v;
}

// A running max of |v| over pairs (the halves kept apart), and its value as f32: NaN is ignored, as fmaxf
// ignores it, so the result is the fmaxf(|v|) reduction's over the same values.
template <typename P>
__device__ __forceinline__ P pair_abs_max(P acc, P v) { return __hmax2(acc, __habs2(v)); }
template <typename P>
__device__ __forceinline__ float pair_max_f32(P v) { return fmaxf(__low2float(v), __high2float(v)); }

// Reads element i of a small tensor whose dtype is only known at run time (gamma, beta, bias, masks):
// the branch is uniform across the grid, so it costs a few instructions, not divergence.
__device__ __forceinline__ float load_any(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// --- activations (torch's formulas; the CPU backend's unary_scalar) ------------------------------------

__device__ __forceinline__ float apply_unary(float x, UnaryOp op) {
  constexpr float kSqrtHalf = 0.70710678118654752440f;
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  constexpr float kGeluTanhCoeff = 0.044715f;
  constexpr float kQuickGeluAlpha = 1.702f;
  switch (op) {
    case UnaryOp::kIdentity: return x;
    case UnaryOp::kSilu: return x / (1.0f + expf(-x));
    // erfc(-y) == 1 + erf(y) without the cancellation that loses all digits for x << 0.
    case UnaryOp::kGelu: return 0.5f * x * erfcf(-x * kSqrtHalf);
    case UnaryOp::kGeluTanh: return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluTanhCoeff * x * x * x)));
    case UnaryOp::kQuickGelu: return x / (1.0f + expf(-kQuickGeluAlpha * x));
    case UnaryOp::kRelu: return x > 0.0f ? x : 0.0f;
    case UnaryOp::kSigmoid: return 1.0f / (1.0f + expf(-x));
    case UnaryOp::kTanh: return tanhf(x);
    case UnaryOp::kExp: return expf(x);
    case UnaryOp::kSqrt: return sqrtf(x);
    case UnaryOp::kRsqrt: return 1.0f / sqrtf(x);
    case UnaryOp::kSquare: return x * x;
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kSin: return sinf(x);
    case UnaryOp::kCos: return cosf(x);
  }
  return x;
}

// GELU in its erf form, x/2 (1 + erf(x/sqrt 2)), without a branch: with u = |x| and h = erfc(u/sqrt 2) / 2, GELU is
// x (1 - h) for x >= 0 and x h below; h = 2^(u r(u) - 1) with r a degree-6 polynomial fitted to log2(erfc(u/sqrt 2)) / u
// over [0, 3.92 sqrt 2] (scripts/fit_gelu_erfc.py: iteratively reweighted least squares towards the minimax fit;
// exponent error <= 5.4e-6; u is clamped there, where erfc < 2^-27). Twelve instructions (a clamp, seven FMAs, the
// exp2, 1 - h, a select, a product) against erff's form's ~28 and a branch: the fused GEGLU epilogue runs 64 per thread
// and tile. Session 57 took |x|'s scaling into the fit and the halving into the exponent (15 -> 12). max(x, 0) - u h
// would save one more but makes GELU(+inf) NaN; that 11-instruction form, timed on an H100, cut the level-0 GEGLU at
// 16 rows by 8.9% in instructions and 6% in cycles (docs/performance.md, "Session 57"). This form has not been timed
// alone against it; session 58's H200 standing (CFG step 4.600 ms) runs it.
// Against the exact GELU: absolute error <= 6.7e-7 (erff's form: 6.7e-7, the f32 product's rounding), relative error
// <= 6.4e-6 for |x| <= 5.5, where erff's 1 + erf cancels on the negative side (relative error up to 0.57 there).
// Host and device (tests/cuda_gelu_poly_test.cu checks it on the host, in CI).
__host__ __device__ __forceinline__ float gelu_erfc_poly(float x) {
  constexpr float kClamp = 5.5437172f;  // 3.92 sqrt 2
  constexpr float c[7] = {-1.1512106657028198f,   -0.4585586488246918f,  -0.05386587604880333f,  0.008460470475256443f,
                          -0.0009179132175631821f, 5.9908677940256894e-05f, -1.7450876157454331e-06f};
  const float u = fminf(fabsf(x), kClamp);
  // Horner's rule written out (a #pragma unroll would warn in the host compilation).
  const float r = fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(c[6], u, c[5]), u, c[4]), u, c[3]), u, c[2]), u, c[1]), u, c[0]);
  const float h = fast_exp2(fmaf(r, u, -1.0f));
  return x * (x >= 0.0f ? 1.0f - h : h);
}

// The activation for a result stored as T. A 16-bit result rounds away everything past 2^-9 (bf16) or 2^-12
// (f16) of relative precision, so SiLU and GELU take the hardware's approximate exp and division (SiLU) and
// a branch-free erfc (GELU, still the exact erf form, not the tanh approximation; gelu_erfc_poly). The accurate
// forms made the group-norm+SiLU apply and the GEGLU kernels instruction-bound (ncu: SM throughput 76% at 41% of
// DRAM bandwidth). f32 results keep torch's accurate formulas.
template <typename T>
__device__ __forceinline__ float apply_unary_for(float x, UnaryOp op) {
  if constexpr (sizeof(T) == 2) {
    if (op == UnaryOp::kSilu) return __fdividef(x, 1.0f + __expf(-x));
    if (op == UnaryOp::kGelu) return gelu_erfc_poly(x);
  }
  return apply_unary(x, op);
}

// --- strided indexing -----------------------------------------------------------------------------------

// Element offsets of every operand for logical flat index `flat` over the collapsed shape, in one pass of
// divisions. 32-bit division when the whole index space fits (the common case; 64-bit division is several
// times slower).
template <int N, typename Index>
__device__ __forceinline__ void strided_offsets(const StridedLayout<N>& l, Index flat, int64_t (&off)[N]) {
#pragma unroll
  for (int o = 0; o < N; ++o) off[o] = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d < l.rank) {
      const Index size = Index(l.shape[d]);
      const Index i = flat % size;
      flat /= size;
#pragma unroll
      for (int o = 0; o < N; ++o) off[o] += int64_t(i) * l.stride[o][d];
    }
  }
}

// --- reductions -----------------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory; the call begins and ends with a barrier so it can be reused.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  t = warp_sum(t);
  return t;
}

// Two sums over the block at once (each in block_sum's order, so the same bits as two calls), one barrier
// pair instead of two. `scratch` holds 64 floats of shared memory.
__device__ __forceinline__ void block_sum2(float& a, float& b, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  __syncthreads();
  if (lane == 0) scratch[warp] = a, scratch[32 + warp] = b;
  __syncthreads();
  a = warp_sum(lane < warps ? scratch[lane] : 0.0f);
  b = warp_sum(lane < warps ? scratch[32 + lane] : 0.0f);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : -INFINITY;
  t = warp_max(t);
  return t;
}

// --- FP8 rows (quantize_rows_fp8, and kernels that quantize their own output rows the same way) -----------

// a / b rounded to nearest, on the device whatever the compiler's division flags, and on the host (whose float
// division is IEEE's): one definition of the FP8 scales for kernels and for scales known before a launch.
__host__ __device__ __forceinline__ float ieee_div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// The e4m3 quantization of the many values v of one row (or tensor) whose largest magnitude is amax: its scale
// s = f8e4m3_scale(amax) (core/dtype.h), a power of two, and s's reciprocal r, exact too, so that one product
// v * r is the correctly rounded v / s, the same bits as the CPU backend's division. (Before the scales were
// powers of two, a correctly rounded quotient took a product and Markstein's correction, two more instructions
// per value: the quantizing kernels were issue-bound on them.)
struct RowDivider {
  float s, r;
  __device__ __forceinline__ float quotient(float v) const { return __fmul_rn(v, r); }
};

__host__ __device__ __forceinline__ RowDivider fp8_row_divider(float amax) {
  const float s = f8e4m3_scale(amax);
  return RowDivider{s, ieee_div(1.0f, s)};
}

// Grid-stride loop bounds helper: total threads in the grid.
__device__ __forceinline__ int64_t grid_threads() { return int64_t(gridDim.x) * blockDim.x; }
__device__ __forceinline__ int64_t global_thread() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }

}  // namespace atelier::cuda

namespace atelier::cuda {

constexpr int kThreads = 256;  // default block size of the elementwise kernels

// Blocks for a grid-stride loop over n items (capped: each thread then takes several items).
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  constexpr int64_t kMaxBlocks = int64_t(1) << 20;
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

// Index type of a grid-stride loop over n items: 32-bit when i + grid size cannot overflow it.
inline bool fits_u32(int64_t n) { return n < (int64_t(1) << 31); }

// Calls fn(T{}) for the element type of dtype t (f32, bf16 or f16); other dtypes throw, naming `op`.
template <typename Fn>
void dispatch_float(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F32: fn(float{}); return;
    case DType::BF16: fn(__nv_bfloat16{}); return;
    case DType::F16: fn(__half{}); return;
    default: throw Error(unsupported(std::string(op) + ": dtype " + std::string(dtype_name(t)) + " is not supported on CUDA (f32, bf16, f16 are)"));
  }
}

}  // namespace atelier::cuda
