// Internal helpers shared by the CPU op files: the scalar activation formulas (torch's), in-place
// activation over a span, and the single-threaded GEMM that every parallel CPU kernel is built from.
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/backend.h"

// Compiles a loop-heavy function for AVX-512, AVX2+FMA and the baseline, picked at load time (the
// library is built for baseline x86-64 unless ATELIER_NATIVE is on).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATELIER_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ATELIER_SIMD_CLONES
#endif

namespace atelier::cpu {

// torch's formulas, in f32. gelu is the exact erf form; gelu_tanh the tanh approximation.
inline float unary_scalar(float x, UnaryOp op) {
  constexpr float kSqrtHalf = 0.70710678118654752440f;
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  constexpr float kGeluTanhCoeff = 0.044715f;
  constexpr float kQuickGeluAlpha = 1.702f;
  switch (op) {
    case UnaryOp::kIdentity: return x;
    case UnaryOp::kSilu: return x / (1.0f + std::exp(-x));
    case UnaryOp::kGelu: return 0.5f * x * (1.0f + std::erf(x * kSqrtHalf));
    case UnaryOp::kGeluTanh: return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluTanhCoeff * x * x * x)));
    case UnaryOp::kQuickGelu: return x / (1.0f + std::exp(-kQuickGeluAlpha * x));
    case UnaryOp::kRelu: return x > 0.0f ? x : 0.0f;
    case UnaryOp::kSigmoid: return 1.0f / (1.0f + std::exp(-x));
    case UnaryOp::kTanh: return std::tanh(x);
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kSqrt: return std::sqrt(x);
    case UnaryOp::kRsqrt: return 1.0f / std::sqrt(x);
    case UnaryOp::kSquare: return x * x;
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kSin: return std::sin(x);
    case UnaryOp::kCos: return std::cos(x);
  }
  return x;
}

// out[i] = op(x[i]) for i < n (out may equal x). Vectorised where the build allows.
void unary_span(float* out, const float* x, int64_t n, UnaryOp op);

// x[i] = exp(x[i] - shift) in place; returns the sum of the results. The softmax kernel.
double exp_span_sum(float* x, int64_t n, float shift);

// max of x[0..n) (-inf for n == 0).
float max_span(const float* x, int64_t n);

// RMS norm of one row: o[i] = x[i] * rstd * g[i] (g null: 1) with rstd = 1 / sqrt(mean(x^2) + eps), the
// mean's sum taken in blocks of f32 added in f64. Backend::rms_norm and the normalising rope share it.
void rms_row(float* o, const float* x, int64_t n, float eps, const float* g);

// One-time OpenBLAS set-up (core selection, single-threaded mode); called when the CPU backend is
// created and again (cheaply) before each product.
void init_blas();

// C[M, N] = alpha * op(A) @ op(B) + beta * C, row-major, single-threaded: callers split work across
// OpenMP threads themselves (see cpu_gemm.cc for why OpenBLAS never threads on its own here).
void sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Fused (flash-style) attention with AVX-512 kernels (cpu_attention_fused.cc), same contract as
// Backend::attention. Returns false, doing nothing, where the CPU lacks AVX-512, the heads are wider than
// it pays off for (the GEMM path is faster there), or it is switched off.
bool attention_fused(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale);
// Switches the fused path on or off (tests compare it with the GEMM path).
void set_fused_attention(bool enabled);

// 3x3 stride-1 ungrouped convolution by Winograd F(2x2, 3x3) (cpu_conv_winograd.cc), same contract as
// Backend::conv2d. Returns false, doing nothing, for other shapes, small images or thin layers.
bool conv2d_winograd(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);
// Switches the Winograd path on or off (tests compare it with im2col).
void set_winograd_conv(bool enabled);

// Below this many multiply-adds a product is not worth a parallel region.
constexpr double kMinParallelMacs = 1 << 18;

// Number of threads an OpenMP parallel region will use here.
int max_threads();

}  // namespace atelier::cpu
