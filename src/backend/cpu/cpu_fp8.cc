// FP8 (e4m3) linear layers on the CPU: the reference the CUDA path is checked against. Quantization makes the
// same bytes as the CUDA kernel (IEEE division, round to nearest even, saturation); the product multiplies
// the e4m3 values exactly in f32 (3-bit mantissas), accumulates in f32 through OpenBLAS and applies both row
// scales once at the end, as cuBLASLt's outer-vector scaling does.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace atelier {
namespace {
constexpr int64_t kParallelRows = 16;  // rows below which one thread does the work
}  // namespace

// x [R, C] f32 (unit last stride) -> q [R, C] f8e4m3, scale [R] f32.
void CpuBackend::quantize_rows_fp8(Tensor& q, Tensor& scale, const Tensor& x) {
  const int64_t rows = x.size(0), cols = x.size(1), ld = rows > 1 ? x.strides()[0] : cols;
  const float* src = x.data<float>();
  uint8_t* dst = static_cast<uint8_t*>(q.raw());
  float* sc = scale.data<float>();
#pragma omp parallel for if (rows >= kParallelRows) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * ld;
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
    const float s = f8e4m3_scale(amax);
    sc[r] = s;
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = float_to_f8e4m3(row[c] / s);
  }
}

// x [B, H, S, D] f32 (any strides) -> a contiguous copy holding s * e4m3(x / s), s = f8e4m3_scale(amax) (of the
// bound where one is given): the values an FP8 kernel computes with, quantized as quantize_rows_fp8 quantizes a row.
Tensor CpuBackend::fp8_tensor_values(const Tensor& x, float bound) {
  Tensor c = Tensor::empty(x.shape(), DType::F32, Device::cpu());
  copy(c, x);
  float* p = c.data<float>();
  const int64_t n = c.numel();
  float amax = bound;
  if (bound <= 0.0f)
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(p[i]));
  const float s = f8e4m3_scale(amax);
#pragma omp parallel for if (n >= kParallelRows * 4096) schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = f8e4m3_to_float(float_to_f8e4m3(p[i] / s)) * s;
  return c;
}

// q [B, H, Sq, D], k/v [B, H, Sk, D] -> out [B, H, Sq, D]: Backend::attention_fp8 with f32 probabilities.
void CpuBackend::attention_fp8(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                               const Fp8Bounds& bounds) {
  attention(out, fp8_tensor_values(q, bounds.q), fp8_tensor_values(k, bounds.k), fp8_tensor_values(v, 0.0f), Tensor(), scale);
}

// out [M, N] = act(xs[m] ws[n] (x8 . w8^T) + bias + beta * out); x8 [M, K], w8 [N, K] (row stride >= K).
void CpuBackend::gemm_fp8(Tensor& out, const Tensor& x8, const Tensor& xs, const Tensor& w8, const Tensor& ws,
                          const Tensor& bias, float beta, UnaryOp act) {
  const int64_t m = x8.size(0), k = x8.size(1), n = w8.size(0), ldw = n > 1 ? w8.strides()[0] : k;
  // The e4m3 values as f32 (exact), unscaled: their products are exact in f32 as on the tensor cores.
  Tensor a = Tensor::empty({1, m, k}, DType::F32, Device::cpu()), b = Tensor::empty({1, n, k}, DType::F32, Device::cpu());
  float* ap = a.data<float>();
  float* bp_ = b.data<float>();
  const uint8_t* xq = static_cast<const uint8_t*>(x8.raw());
  const uint8_t* wq = static_cast<const uint8_t*>(w8.raw());
  for (int64_t i = 0; i < m * k; ++i) ap[i] = f8e4m3_to_float(xq[i]);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) bp_[r * k + c] = f8e4m3_to_float(wq[r * ldw + c]);
  Tensor prod_t = Tensor::empty({1, m, n}, DType::F32, Device::cpu());
  GemmParams p;
  p.trans_b = true;
  gemm(prod_t, a, b, Tensor(), p);  // the tiled, threaded f32 product (cpu_gemm.cc)
  const float* prod = prod_t.data<float>();
  float* o = out.data<float>();
  const float* xsc = xs.data<float>();
  const float* wsc = ws.data<float>();
  const float* bp = bias.defined() ? bias.data<float>() : nullptr;
#pragma omp parallel for if (m >= kParallelRows) schedule(static)
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      float v = prod[r * n + c] * xsc[r] * wsc[c];
      if (bp) v += bp[c];
      if (beta != 0.0f) v += beta * o[r * n + c];
      o[r * n + c] = cpu::unary_scalar(v, act);
    }
}

}  // namespace atelier
