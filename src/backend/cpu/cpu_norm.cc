// Normalisations on the CPU: GroupNorm (+ fused activation), LayerNorm, RMSNorm.
// torch's formulas: biased variance, eps inside the square root, y = (x - mean) / sqrt(var + eps) * g + b.
// Statistics are accumulated in double over two passes (mean, then squared deviations), so they do not
// drift on the 16k-element rows of large images; the normalisation itself is f32.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/packed_operands.h"

namespace atelier {
namespace {

constexpr int64_t kParallelElems = 1 << 15;

struct Moments {
  float center;     // the mean rounded to f32: x - center is exact for x near the mean (Sterbenz)
  double residual;  // mean - center, the rounding that the f32 center lost
  double rstd;      // 1 / sqrt(var + eps)
};

// Statistics are gathered in blocks short enough for f32 partial sums (16 SIMD lanes of 16 values each)
// to be exact to a few ulp; the blocks are combined in double.
constexpr int64_t kBlock = 256;

ATELIER_SIMD_CLONES
double sum_blocks(const float* x, int64_t n) {
  double total = 0.0;
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t len = std::min(kBlock, n - i0);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < len; ++i) s += x[i0 + i];
    total += s;
  }
  return total;
}

// Sums of (x - c) and (x - c)^2 over x[0..n).
ATELIER_SIMD_CLONES
void deviation_sums(const float* x, int64_t n, float c, double* s1, double* s2) {
  double t1 = 0.0, t2 = 0.0;
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t len = std::min(kBlock, n - i0);
    float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
    for (int64_t i = 0; i < len; ++i) {
      const float d = x[i0 + i] - c;
      a += d;
      b += d * d;
    }
    t1 += a;
    t2 += b;
  }
  *s1 = t1;
  *s2 = t2;
}

// o = (x - center) * scale + shift
ATELIER_SIMD_CLONES
void scale_shift_span(float* o, const float* x, int64_t n, float center, float scale, float shift) {
  for (int64_t i = 0; i < n; ++i) o[i] = (x[i] - center) * scale + shift;
}

// o = ((x - center) * rstd - lost) * g + b, g/b per element (null: 1 / 0)
ATELIER_SIMD_CLONES
void layer_norm_span(float* o, const float* x, int64_t n, float center, float rstd, float lost, const float* g, const float* b) {
  if (g && b) {
    for (int64_t i = 0; i < n; ++i) o[i] = ((x[i] - center) * rstd - lost) * g[i] + b[i];
  } else if (g) {
    for (int64_t i = 0; i < n; ++i) o[i] = ((x[i] - center) * rstd - lost) * g[i];
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = (x[i] - center) * rstd - lost + (b ? b[i] : 0.0f);
  }
}

// o = x * rstd * g (g null: 1)
ATELIER_SIMD_CLONES
void rms_span(float* o, const float* x, int64_t n, float rstd, const float* g) {
  if (g) {
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] * rstd * g[i];
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] * rstd;
  }
}

ATELIER_SIMD_CLONES
double sum_squares(const float* x, int64_t n) {
  double total = 0.0;
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t len = std::min(kBlock, n - i0);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < len; ++i) s += x[i0 + i] * x[i0 + i];
    total += s;
  }
  return total;
}

// Mean and inverse standard deviation of x[0..n) (biased variance), two passes.
Moments moments(const float* x, int64_t n, float eps) {
  if (n == 0) return {0.0f, 0.0, 1.0 / std::sqrt(double(eps))};
  const float meanf = float(sum_blocks(x, n) / double(n));
  double corr = 0.0, sq = 0.0;  // corr: sum of deviations from the rounded first-pass mean
  deviation_sums(x, n, meanf, &corr, &sq);
  // The deviations refine the mean: mean = meanf + corr / n, and
  // sum((x - mean)^2) = sum((x - meanf)^2) - n * (mean - meanf)^2.
  const double refined = double(meanf) + corr / double(n);
  double var = (sq - corr * corr / double(n)) / double(n);
  if (var < 0.0) var = 0.0;
  const float center = float(refined);
  return {center, refined - double(center), 1.0 / std::sqrt(var + double(eps))};
}

}  // namespace

// x [N, C, S] contiguous (S = product of the trailing dims); stats per (n, group of C/groups channels).
// y = (x - center) * scale[c] + shift[c] with scale = rstd * gamma[c] and shift = beta[c] - residual * scale,
// which is (x - mean) / sqrt(var + eps) * gamma + beta without the cancellation of x * scale - mean * scale
// when the mean is large against the spread.
void CpuBackend::group_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps, UnaryOp act) {
  if (!x.is_contiguous() || !out.is_contiguous()) {  // tests' channels-last mode (set_channels_last_for_tests)
    return through_packed(*this, out, x, [&](Tensor& oc, const Tensor& xc) { group_norm(oc, xc, gamma, beta, groups, eps, act); });
  }
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t s = c ? x.numel() / (n * c) : 0;
  const int64_t cg = c / groups;
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  const float* g = gamma.defined() ? gamma.data<float>() : nullptr;
  const float* b = beta.defined() ? beta.data<float>() : nullptr;
#pragma omp parallel for schedule(dynamic, 1) if (x.numel() > kParallelElems)
  for (int64_t item = 0; item < n * groups; ++item) {
    const int64_t base = item * cg * s;
    const Moments m = moments(xp + base, cg * s, eps);
    const int64_t c0 = (item % groups) * cg;
    for (int64_t ci = 0; ci < cg; ++ci) {
      const float gain = g ? g[c0 + ci] : 1.0f;
      const float scale = float(m.rstd * gain);
      const float shift = float((b ? b[c0 + ci] : 0.0f) - m.residual * m.rstd * gain);
      const float* xr = xp + base + ci * s;
      float* o = op + base + ci * s;
      scale_shift_span(o, xr, s, m.center, scale, shift);
      if (act != UnaryOp::kIdentity) cpu::unary_span(o, o, s, act);
    }
  }
}

// x [R, D] contiguous, normalised per row.
void CpuBackend::layer_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  const int64_t d = x.size(-1);
  const int64_t rows = d ? x.numel() / d : 0;
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  const float* g = gamma.defined() ? gamma.data<float>() : nullptr;
  const float* b = beta.defined() ? beta.data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * d;
    float* o = op + r * d;
    const Moments m = moments(xr, d, eps);
    layer_norm_span(o, xr, d, m.center, float(m.rstd), float(m.residual * m.rstd), g, b);
  }
}

namespace cpu {
void rms_row(float* o, const float* x, int64_t n, float eps, const float* g) {
  const float rstd = float(1.0 / std::sqrt(sum_squares(x, n) / double(n) + double(eps)));
  rms_span(o, x, n, rstd, g);
}
}  // namespace cpu

// x [R, D] contiguous: y = x / sqrt(mean(x^2) + eps) * gamma.
void CpuBackend::rms_norm(Tensor& out, const Tensor& x, const Tensor& gamma, float eps) {
  const int64_t d = x.size(-1);
  const int64_t rows = d ? x.numel() / d : 0;
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  const float* g = gamma.defined() ? gamma.data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    cpu::rms_row(op + r * d, xp + r * d, d, eps, g);
  }
}

}  // namespace atelier
