// A layer norm folded into the gated linear unit after it (SD's norm3 and GEGLU; CudaBackend::layer_norm_linear_glu,
// ATELIER_LN_FOLD=1, an A/B switch written in session 38 and not yet run on a GPU).
//
// With LN(x) = (x - mean) rstd gamma + beta per row, a product with w [n, k] is
//   LN(x) w^T = rstd (x (w gamma)^T) - rstd mean g + w beta,   g[c] = sum_k (w gamma)[c, k],
// so the product reads x itself and its epilogue applies the row's rstd and -mean rstd and the column's g and
// w beta + bias (cuda_gemm_wgmma.cu, epilogue_glu's LN). What it saves: the norm's write of the normalised rows and
// the product's read of them; what it adds: one read of x for the rows' statistics (docs/cuda.md, session 38).
// g is summed from the rounded bf16 w gamma the product uses, so that the mean's part cancels up to the f32
// accumulation; g and w beta + bias stay in f32. The folded weights are made once per (weight, norm) and kept
// while the weight's buffer lives, as the channels-last convolution weights are (nhwc_weight).
#include "backend/cuda/cuda_ln_fold.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_norm_common.cuh"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {
namespace {

constexpr int kStatsRowsPerBlock = 8;  // one warp per row
constexpr int kFoldThreads = 256;      // one block per weight row
using BfVec = Vec<__nv_bfloat16>;      // the rows' 16-byte loads: 8 values
std::atomic<int64_t> g_fold_calls{0};

bool& fold_flag() {
  static bool on = env_is("ATELIER_LN_FOLD", "1");
  return on;
}

// stats[r] = (rstd, -mean rstd) of row r of x [rows, d] (d a multiple of 8, rows 16-byte aligned): the mean, then
// the mean square of the deviations from it (a second read of the row, from L1), as the layer norm's two passes.
__global__ void __launch_bounds__(kStatsRowsPerBlock * 32)
    ln_row_stats_kernel(float2* stats, const __nv_bfloat16* x, int64_t rows, int d, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kStatsRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (row >= rows) return;  // a whole warp: its shuffles need no absent lanes
  const auto* xp = reinterpret_cast<const BfVec*>(x + row * d);
  const int nvec = d / BfVec::kWidth;
  float s = 0.0f;
  for (int v = lane; v < nvec; v += 32) {
    const BfVec xv = xp[v];
#pragma unroll
    for (int i = 0; i < BfVec::kWidth; ++i) s += to_f32(xv.v[i]);
  }
  const float mean = warp_sum(s) / float(d);
  float q = 0.0f;
  for (int v = lane; v < nvec; v += 32) {
    const BfVec xv = xp[v];
#pragma unroll
    for (int i = 0; i < BfVec::kWidth; ++i) {
      const float dev = to_f32(xv.v[i]) - mean;
      q = fmaf(dev, dev, q);
    }
  }
  const float rstd = rsqrtf(warp_sum(q) / float(d) + eps);
  if (lane == 0) stats[row] = make_float2(rstd, -mean * rstd);
}

// One block per row c of w [rows, k]: wf[c, :] = bf16(w[c, :] gamma), g[c] = the sum of wf[c, :] as rounded,
// b[c] = w[c, :] . beta + bias[c] (beta, bias may be null).
__global__ void __launch_bounds__(kFoldThreads)
    ln_fold_weights_kernel(__nv_bfloat16* wf, float* g, float* b, const __nv_bfloat16* w, const __nv_bfloat16* gamma,
                           const __nv_bfloat16* beta, const __nv_bfloat16* bias, int k) {
  __shared__ float scratch[64];
  const int64_t base = int64_t(blockIdx.x) * k;
  float gs = 0.0f, bs = 0.0f;
  for (int i = int(threadIdx.x); i < k; i += blockDim.x) {
    const float wv = to_f32(w[base + i]);
    const __nv_bfloat16 f = __float2bfloat16(wv * to_f32(gamma[i]));
    wf[base + i] = f;
    gs += to_f32(f);
    if (beta) bs = fmaf(wv, to_f32(beta[i]), bs);
  }
  block_sum2(gs, bs, scratch);
  if (threadIdx.x == 0) {
    g[blockIdx.x] = gs;
    b[blockIdx.x] = bs + (bias ? to_f32(bias[blockIdx.x]) : 0.0f);
  }
}

// stats [rows][2] f32 = (rstd, -mean rstd) of each row of x [rows, d] (bf16, d a multiple of 8, 16-byte aligned).
void launch_ln_row_stats(float* stats, const void* x, int64_t rows, int64_t d, float eps, cudaStream_t stream) {
  const unsigned blocks = unsigned((rows + kStatsRowsPerBlock - 1) / kStatsRowsPerBlock);
  ln_row_stats_kernel<<<blocks, kStatsRowsPerBlock * 32, 0, stream>>>(reinterpret_cast<float2*>(stats),
                                                                      static_cast<const __nv_bfloat16*>(x), rows, int(d), eps);
  ATELIER_CUDA_LAUNCHED();
}

// w [rows, k], gamma and beta [k], bias [rows] (bf16; beta and bias may be null) -> wf [rows, k] bf16 = w gamma,
// g [rows] f32 = wf's row sums as rounded, b [rows] f32 = w beta + bias.
void launch_ln_fold_weights(void* wf, float* g, float* b, const void* w, const void* gamma, const void* beta, const void* bias,
                            int64_t rows, int64_t k, cudaStream_t stream) {
  ln_fold_weights_kernel<<<unsigned(rows), kFoldThreads, 0, stream>>>(
      static_cast<__nv_bfloat16*>(wf), g, b, static_cast<const __nv_bfloat16*>(w), static_cast<const __nv_bfloat16*>(gamma),
      static_cast<const __nv_bfloat16*>(beta), static_cast<const __nv_bfloat16*>(bias), int(k));
  ATELIER_CUDA_LAUNCHED();
}

}  // namespace

bool ln_fold_enabled() { return fold_flag(); }
void set_ln_fold(bool on) { fold_flag() = on; }
int64_t ln_fold_calls() { return g_fold_calls.load(); }

// w [2H, K] with the norm's gamma folded in, its row sums and w beta + bias, made at the first call of a (weight,
// norm) and kept while w's buffer lives (an address reused by a later model's weight is a new buffer: the old weak
// pointer has expired).
CudaBackend::LnFoldWeights CudaBackend::ln_fold_weights(const Tensor& w, const Tensor& gamma, const Tensor& beta, const Tensor& bias) {
  const int64_t rows = w.size(0), k = w.size(1);
  const void* beta_raw = beta.defined() ? beta.raw() : nullptr;
  const void* bias_raw = bias.defined() ? bias.raw() : nullptr;
  std::lock_guard<std::mutex> lock(nhwc_mu_);
  const auto fits = [&](const LnFoldWeights& e) {
    return e.gamma == gamma.raw() && e.beta == beta_raw && e.bias == bias_raw && e.w.defined() && e.w.shape() == w.shape();
  };
  return weight_entry(ln_fold_weights_, w, fits, [&](LnFoldWeights& e) {
    e.gamma = gamma.raw(), e.beta = beta_raw, e.bias = bias_raw;
    e.w = Tensor::empty({rows, k}, DType::BF16, device());
    e.g = Tensor::empty({rows}, DType::F32, device());
    e.b = Tensor::empty({rows}, DType::F32, device());
    launch_ln_fold_weights(e.w.raw(), e.g.data<float>(), e.b.data<float>(), w.raw(), gamma.raw(), beta_raw, bias_raw, rows, k,
                           stream_);
  });
}

// The GEGLU of layer_norm(x): the row statistics, then the fused GLU kernel on x with the folded weights; an
// undefined tensor where the fold is off or the kernels do not take the case (ops::layer_norm_linear_glu then runs
// the norm and ops::linear_glu).
Tensor CudaBackend::layer_norm_linear_glu(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, const Tensor& w,
                                          const Tensor& bias, UnaryOp act) {
  const auto bf16 = [](const Tensor& t) { return !t.defined() || (t.dtype() == DType::BF16 && t.is_contiguous()); };
  if (!ln_fold_enabled() || !fused_glu_enabled() || !gamma.defined() || !bf16(x) || !bf16(w) || !bf16(gamma) || !bf16(beta) ||
      !bf16(bias) || x.size(-1) % BfVec::kWidth != 0 || !aligned16(x.raw()))
    return Tensor();
  NvtxRange range("layer_norm_linear_glu");
  DeviceGuard guard(index_);
  const int64_t k = x.size(-1), m = x.numel() / k;
  const LnFoldWeights folded = ln_fold_weights(w, gamma, beta, bias);
  Tensor stats = Tensor::empty({m, 2}, DType::F32, device());
  launch_ln_row_stats(stats.data<float>(), x.raw(), m, k, eps, stream_);
  Shape shape = x.shape();
  shape.back() = w.size(0) / 2;
  Tensor out = Tensor::empty(shape, DType::BF16, device());
  OwnGemmArgs a;
  a.x = x.raw();
  a.w = folded.w.raw();
  a.out = out.raw();
  a.m = m, a.k = k, a.n = shape.back();
  a.ldx = a.k, a.ldw = a.k, a.ldo = a.n;
  a.act = act;
  a.ln_rows = stats.data<float>(), a.ln_g = folded.g.data<float>(), a.ln_b = folded.b.data<float>();
  a.sm_count = sm_count_;
  a.max_smem = max_smem_optin_;
  if (!launch_gemm_glu(a, cc_major_, stream_)) return Tensor();
  g_fold_calls.fetch_add(1);
  return out;
}

}  // namespace atelier::cuda
