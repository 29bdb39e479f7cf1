// FP8 (e4m3) linear layers on the GPU (see Backend::quantize_rows_fp8 / gemm_fp8): row-wise quantization, one
// block per row, and the scaled product on Hopper's FP8 tensor cores through cuBLASLt (GemmEngine::run_fp8).
// Where cuBLASLt has no FP8 algorithm (an sm_80 card, odd alignments) both operands are dequantized into the
// output dtype and the ordinary GEMM runs: slower and rounded once more, but the same product.
#include <cuda_fp8.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_norm_common.cuh"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {
namespace {

constexpr int kQuantThreads = 256;
constexpr int kVec = 8;                // 16-bit elements per 16-byte load

// One block per row: amax over the row, scale = f8e4m3_scale(amax), then each element divided (RowDivider: the
// correctly rounded quotient, as the CPU backend's division, so that both make the same bytes) and rounded to
// e4m3. The row is read twice; the second read comes from L2. vec: 16-bit T, cols and ld multiples of 8,
// 16-byte aligned rows.
template <typename T>
__global__ void quantize_rows_kernel(uint8_t* q, float* scale, const T* x, int64_t cols, int64_t ld, bool vec) {
  __shared__ float scratch[32];
  const T* row = x + int64_t(blockIdx.x) * ld;
  uint8_t* out = q + int64_t(blockIdx.x) * cols;
  const auto each_vec = [&](auto&& fn) {  // fn(column, vector): the 16-byte vectors of a 16-bit row
    if constexpr (sizeof(T) == 2)
      for (int64_t c = int64_t(threadIdx.x) * kVec; c < cols; c += int64_t(blockDim.x) * kVec)
        fn(c, *reinterpret_cast<const Vec<T>*>(row + c));
  };
  float amax = 0.0f;
  if (vec) {
    each_vec([&](int64_t, const Vec<T>& v) { amax = vec_abs_max(amax, v); });
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) amax = fmaxf(amax, fabsf(to_f32(row[c])));
  }
  const RowDivider div = fp8_row_divider(block_max(amax, scratch));
  if (threadIdx.x == 0) scale[blockIdx.x] = div.s;
  if (vec) {
    each_vec([&](int64_t c, const Vec<T>& v) { store_e4m3(out + c, v, div); });
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      out[c] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(div.quotient(to_f32(row[c])), __NV_SATFINITE, __NV_E4M3));
  }
}

// The same for 16-bit rows of at most kRegRowMaxVecs 16-byte vectors, held in registers: VPT vectors per
// thread, all loaded before the row's amax is reduced (one read of the row, VPT loads in flight per thread),
// the division through RowDivider and the bytes converted in pairs. The kernel above re-reads the row (and,
// before session 19, divided element by element): instruction-bound at ~35% of the memory bandwidth (ncu, FLUX
// FP8 step, session 12).
// Up to 512 threads per row: FLUX's GELU rows (12288 columns) as 4 vectors per thread in 384 threads rather than
// 8 in 192 (88 registers, 3 blocks per SM): 2.68 -> 2.54 ms of a FLUX FP8 step (ncu, session 16).
constexpr int kRegRowMaxThreads = 512;
constexpr int kRegRowMaxVpt = 8;
constexpr int64_t kRegRowMaxVecs = int64_t(kRegRowMaxThreads) * kRegRowMaxVpt;

template <typename T, int VPT>
__global__ void __launch_bounds__(kRegRowMaxThreads) quantize_rows_reg_kernel(uint8_t* q, float* scale, const T* x, int64_t cols,
                                                                             int64_t ld) {
  static_assert(sizeof(T) == 2, "16-bit rows");
  __shared__ float scratch[32];
  const Vec<T>* row = reinterpret_cast<const Vec<T>*>(x + int64_t(blockIdx.x) * ld);
  const int vecs = int(cols / kVec);
  Vec<T> v[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = int(threadIdx.x) + i * int(blockDim.x);
    v[i] = c < vecs ? row[c] : Vec<T>{};
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) amax = vec_abs_max(amax, v[i]);
  const RowDivider div = fp8_row_divider(block_max(amax, scratch));
  if (threadIdx.x == 0) scale[blockIdx.x] = div.s;
  uint8_t* out = q + int64_t(blockIdx.x) * cols;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int c = int(threadIdx.x) + i * int(blockDim.x);
    if (c < vecs) store_e4m3(out + int64_t(c) * kVec, v[i], div);
  }
}

// Launches quantize_rows_reg_kernel with the fewest vectors per thread that cover the row in at most
// kRegRowMaxThreads threads; false where the row is longer (the two-read kernel runs).
template <typename T>
bool launch_quantize_rows_reg(cudaStream_t stream, uint8_t* q, float* scale, const T* x, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t vecs = cols / kVec;
  if (vecs > kRegRowMaxVecs) return false;
  int vpt = 1;
  while (int64_t(vpt) * kRegRowMaxThreads < vecs) vpt *= 2;
  const int threads = int((vecs + vpt - 1) / vpt + 31) / 32 * 32;
  const auto go = [&](auto k) {
    quantize_rows_reg_kernel<T, decltype(k)::value><<<unsigned(rows), threads, 0, stream>>>(q, scale, x, cols, ld);
  };
  switch (vpt) {
    case 1: go(std::integral_constant<int, 1>{}); break;
    case 2: go(std::integral_constant<int, 2>{}); break;
    case 4: go(std::integral_constant<int, 4>{}); break;
    default: go(std::integral_constant<int, kRegRowMaxVpt>{}); break;
  }
  return true;
}

// out [R, C] (contiguous, T) = e4m3 q [R, C] (row stride ldq) * scale[r]: the fallback's dequantization.
template <typename T>
__global__ void dequantize_rows_kernel(T* out, const uint8_t* q, const float* scale, int64_t rows, int64_t cols, int64_t ldq) {
  const int64_t total = rows * cols;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t r = i / cols, c = i % cols;
    __nv_fp8_e4m3 v;
    v.__x = q[r * ldq + c];
    out[i] = from_f32<T>(float(v) * scale[r]);
  }
}

template <typename T>
__global__ void fp8_scale_epilogue_kernel(T* c, const T* raw, const float* xs, const float* ws, const T* bias, float beta,
                                          UnaryOp act, int64_t m, int64_t n) {
  const int64_t total = m * n;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t r = i / n, j = i % n;
    float v = to_f32(raw[i]) * xs[r] * ws[j];
    if (bias) v += to_f32(bias[j]);
    if (beta != 0.0f) v += beta * to_f32(c[i]);
    c[i] = from_f32<T>(apply_unary(v, act));
  }
}

// --- FP8 GEMV (one activation row) -------------------------------------------------------------------------
// The stacked adaLN modulation of a DiT step is one row against ~1M weight rows ([1, 3072] x [1,050,624, 3072]^T
// for FLUX: 3.2 GB of e4m3): cuBLASLt's FP8 kernels read it at ~2.5 TB/s (they are made for many rows). Here a
// warp per output row streams its weight row in 16-byte loads; x, decoded to f32 once per block, sits in shared
// memory laid out so that lane l's value j of its i-th chunk is at (i * 16 + j) * 32 + l (conflict-free). The
// e4m3 products are exact in f32, as on the tensor cores and the CPU; only the summation order differs.
constexpr int kGemvThreads = 256;
constexpr int kGemvChunk = 16;                        // e4m3 bytes per 16-byte load
constexpr int kGemvRoundCols = 32 * kGemvChunk;       // columns per round of a warp's loads (512)
constexpr int kGemvMaxCols = 8192;                    // x in shared memory: 32 KB of f32

__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t pair) {
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3)));
}

// out[r] = act(xs[0] ws[r] (x8 . w8[r]) + bias[r] + beta out[r]) for r < n; k a multiple of kGemvRoundCols.
template <typename T>
__global__ void __launch_bounds__(kGemvThreads) gemv_fp8_kernel(T* out, const uint8_t* x8, const float* xs, const uint8_t* w8,
                                                                int64_t ldw, const float* ws, const T* bias, float beta,
                                                                UnaryOp act, int64_t n, int k) {
  extern __shared__ float xf[];
  const int lane = threadIdx.x & 31, rounds = k / kGemvRoundCols;
  for (int idx = threadIdx.x; idx < k; idx += blockDim.x) {
    const int l = idx % 32, j = (idx / 32) % kGemvChunk, i = idx / kGemvRoundCols;
    __nv_fp8_e4m3 v;
    v.__x = x8[(i * 32 + l) * kGemvChunk + j];
    xf[idx] = float(v);
  }
  __syncthreads();
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const float xscale = xs[0];
  for (int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; row < n; row += warps) {
    const uint4* wr = reinterpret_cast<const uint4*>(w8 + row * ldw);
    float acc = 0.0f;
#pragma unroll 2
    for (int i = 0; i < rounds; ++i) {
      const uint4 u = __ldg(wr + i * 32 + lane);
      const uint32_t words[4] = {u.x, u.y, u.z, u.w};
      const float* xi = xf + i * kGemvChunk * 32 + lane;
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 f = e4m3x2_to_float2(uint16_t(words[q] >> (16 * h)));
          const int j = q * 4 + h * 2;
          acc = fmaf(f.x, xi[j * 32], acc);
          acc = fmaf(f.y, xi[(j + 1) * 32], acc);
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      float v = acc * xscale * ws[row];
      if (bias) v += to_f32(bias[row]);
      if (beta != 0.0f) v += beta * to_f32(out[row]);
      out[row] = from_f32<T>(apply_unary(v, act));
    }
  }
}

// The adaLN gate folded into an FP8 product's column scales and bias: gws[j] = ws[j] * gate[j] (f32) and
// gbias[j] = bias[j] * gate[j] rounded to T (bias may be null), so that the product's epilogue computes
// gate * (scaled product + bias) and the residual as its accumulation (beta = 1).
template <typename T>
__global__ void gate_scales_kernel(float* gws, T* gbias, const float* ws, const T* bias, const T* gate, int64_t n) {
  for (int64_t j = global_thread(); j < n; j += grid_threads()) {
    const float g = to_f32(gate[j]);
    gws[j] = ws[j] * g;
    if (bias) gbias[j] = from_f32<T>(to_f32(bias[j]) * g);
  }
}

}  // namespace

// out [1, N] (16-bit) = the FP8 product of one row through gemv_fp8_kernel; false (nothing launched) where
// the shapes or alignments do not fit it (k a multiple of 512 up to 8192, 16-byte aligned weight rows).
bool launch_gemv_fp8(const Fp8GemmCall& call, cudaStream_t stream) {
  if (call.m != 1 || call.k % kGemvRoundCols != 0 || call.k > kGemvMaxCols || call.ldw % kGemvChunk != 0 ||
      reinterpret_cast<uintptr_t>(call.w) % 16 != 0 || (call.c_dtype != DType::BF16 && call.c_dtype != DType::F16))
    return false;
  constexpr int kBlocksPerSmWave = 8 * 132;  // enough blocks to fill an H200 several times over; grid-stride beyond
  const int warps_per_block = kGemvThreads / 32;
  const unsigned blocks = unsigned(std::min<int64_t>((call.n + warps_per_block - 1) / warps_per_block, kBlocksPerSmWave));
  const size_t smem = size_t(call.k) * sizeof(float);
  dispatch_float(call.c_dtype, "fp8 gemv", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      gemv_fp8_kernel<T><<<blocks, kGemvThreads, smem, stream>>>(
          static_cast<T*>(call.c), static_cast<const uint8_t*>(call.x), call.x_scale, static_cast<const uint8_t*>(call.w), call.ldw,
          call.w_scale, static_cast<const T*>(call.bias), call.beta, call.act, call.n, int(call.k));
    }
  });
  ATELIER_CUDA_LAUNCHED();
  return true;
}

void launch_fp8_scale_epilogue(const Fp8GemmCall& call, const void* raw, cudaStream_t stream) {
  dispatch_float(call.c_dtype, "fp8 epilogue", [&](auto tag) {
    using T = decltype(tag);
    fp8_scale_epilogue_kernel<T><<<grid_for(call.m * call.n), kThreads, 0, stream>>>(
        static_cast<T*>(call.c), static_cast<const T*>(raw), call.x_scale, call.w_scale, static_cast<const T*>(call.bias),
        call.beta, call.act, call.m, call.n);
  });
  ATELIER_CUDA_LAUNCHED();
}

// x [R, C] (unit last stride) -> q [R, C] e4m3, scale [R] f32.
void CudaBackend::quantize_rows_fp8(Tensor& q, Tensor& scale, const Tensor& x) {
  const int64_t rows = x.size(0), cols = x.size(1), ld = rows > 1 ? x.strides()[0] : cols;
  if (rows == 0) return;
  ATELIER_CHECK(q.is_contiguous() && scale.is_contiguous() && (x.strides()[1] == 1 || cols == 1),
                "quantize_rows_fp8: unit-stride rows and contiguous outputs expected");
  ATELIER_CHECK(rows < (int64_t(1) << 31), "quantize_rows_fp8: too many rows for one launch");
  NvtxRange range("quantize_rows_fp8");
  DeviceGuard guard(index_);
  dispatch_float(x.dtype(), "quantize_rows_fp8", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = sizeof(T) == 2 && cols % kVec == 0 && ld % kVec == 0 && aligned16(x.raw()) && aligned16(q.raw());
    if constexpr (sizeof(T) == 2) {
      if (vec &&
          launch_quantize_rows_reg<T>(stream_, static_cast<uint8_t*>(q.raw()), scale.data<float>(), x.data<T>(), rows, cols, ld))
        return;
    }
    quantize_rows_kernel<T><<<unsigned(rows), kQuantThreads, 0, stream_>>>(static_cast<uint8_t*>(q.raw()), scale.data<float>(),
                                                                            x.data<T>(), cols, ld, vec);
  });
  ATELIER_CUDA_LAUNCHED();
}

// out [M, N] = act(xs[m] ws[n] (x8 . w8^T) + bias + beta * out).
namespace {
// The product's description for the GEMM engine (bias in out's dtype, or null).
Fp8GemmCall fp8_call(Tensor& out, const Tensor& x8, const Tensor& xs, const Tensor& w8, const Tensor& ws, const Tensor& bias,
                     float beta, UnaryOp act) {
  Fp8GemmCall call;
  call.m = x8.size(0);
  call.n = w8.size(0);
  call.k = x8.size(1);
  call.x = x8.raw();
  call.ldx = call.k;
  call.w = w8.raw();
  call.ldw = call.n > 1 ? w8.strides()[0] : call.k;
  call.x_scale = xs.data<float>();
  call.w_scale = ws.data<float>();
  call.c = out.raw();
  call.c_dtype = out.dtype();
  call.beta = beta;
  call.bias = bias.defined() ? bias.raw() : nullptr;
  call.act = act;
  return call;
}
}  // namespace

bool CudaBackend::gemm_fp8_gated(Tensor& out, const Tensor& x8, const Tensor& xs, const Tensor& w8, const Tensor& ws,
                                 const Tensor& bias_in, const Tensor& gate) {
  static const bool on = !env_is("ATELIER_FP8_GATED", "0");
  const DType dt = out.dtype();
  const int64_t m = x8.size(0), n = w8.size(0);
  // One-row products take the GEMV kernel (gemm_fp8), which has no accumulation onto a residual of its own.
  if (!on || (dt != DType::BF16 && dt != DType::F16) || m < 2 || out.dim() != 2 || !out.is_contiguous() ||
      gate.numel() != n || !gate.is_contiguous() || gate.dtype() != dt)
    return false;
  NvtxRange range("gemm_fp8_gated");
  DeviceGuard guard(index_);
  const Tensor bias = as_dtype(bias_in, dt);
  Tensor gated_ws = Tensor::empty({n}, DType::F32, device());
  Tensor gated_bias = bias.defined() ? Tensor::empty({n}, dt, device()) : Tensor();
  dispatch_float(dt, "gemm_fp8_gated", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      gate_scales_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(gated_ws.data<float>(), bias.defined() ? gated_bias.data<T>() : nullptr,
                                                                  ws.data<float>(), bias.defined() ? bias.data<T>() : nullptr,
                                                                  gate.data<T>(), n);
    }
  });
  ATELIER_CUDA_LAUNCHED();
  if (!gemm_engine().run_fp8(fp8_call(out, x8, xs, w8, gated_ws, gated_bias, 1.0f, UnaryOp::kIdentity))) return false;
  ++fp8_gemm_stats().gated;
  return true;
}

void CudaBackend::gemm_fp8(Tensor& out, const Tensor& x8, const Tensor& xs, const Tensor& w8, const Tensor& ws,
                           const Tensor& bias_in, float beta, UnaryOp act) {
  ATELIER_CHECK(out.is_contiguous() && out.dim() == 2, "gemm_fp8: out must be contiguous [M, N]");
  NvtxRange range("gemm_fp8");
  const DType dt = out.dtype();
  const Tensor bias = as_dtype(bias_in, dt);
  const int64_t m = x8.size(0), k = x8.size(1), n = w8.size(0);
  const Fp8GemmCall call = fp8_call(out, x8, xs, w8, ws, bias, beta, act);
  if (dt != DType::F32 && m == 1) {
    DeviceGuard guard(index_);
    if (launch_gemv_fp8(call, stream_)) {
      ++fp8_gemm_stats().gemv;
      return;
    }
  }
  if (dt != DType::F32 && gemm_engine().run_fp8(call)) return;
  // Fallback: both operands dequantized into out's dtype, then the ordinary product.
  ++fp8_gemm_stats().dequantized;
  DeviceGuard guard(index_);
  Tensor a = Tensor::empty({1, m, k}, dt, device()), b = Tensor::empty({1, n, k}, dt, device());
  dispatch_float(dt, "gemm_fp8", [&](auto tag) {
    using T = decltype(tag);
    dequantize_rows_kernel<T><<<grid_for(m * k), kThreads, 0, stream_>>>(a.data<T>(), static_cast<const uint8_t*>(x8.raw()),
                                                                        xs.data<float>(), m, k, k);
    dequantize_rows_kernel<T><<<grid_for(n * k), kThreads, 0, stream_>>>(b.data<T>(), static_cast<const uint8_t*>(w8.raw()),
                                                                        ws.data<float>(), n, k, call.ldw);
  });
  ATELIER_CUDA_LAUNCHED();
  GemmParams p;
  p.trans_b = true;
  p.beta = beta;
  p.epilogue = act;
  Tensor out3 = out.reshape({1, m, n});
  gemm(out3, a, b, bias, p);
}

}  // namespace atelier::cuda
