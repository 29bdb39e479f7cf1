// Normalisations on the CPU: GroupNorm (+ fused activation), LayerNorm, RMSNorm.
// torch's formulas: biased variance, eps inside the square root, y = (x - mean) / sqrt(var + eps) * g + b.
// Statistics are accumulated in double over two passes (mean, then squared deviations), so they do not
// drift on the 16k-element rows of large images; the normalisation itself is f32.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace atelier {
namespace {

constexpr int64_t kParallelElems = 1 << 15;

struct Moments {
  double mean;
  double rstd;  // 1 / sqrt(var + eps)
};

// Mean and inverse standard deviation of x[0..n) (biased variance).
Moments moments(const float* x, int64_t n, float eps) {
  // Float partial sums over short blocks keep the loops vectorisable; blocks are combined in double.
  constexpr int64_t kBlock = 256;
  double sum = 0.0;
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t i1 = std::min(n, i0 + kBlock);
    float s = 0.0f;
    for (int64_t i = i0; i < i1; ++i) s += x[i];
    sum += s;
  }
  const double mean = n ? sum / double(n) : 0.0;
  const float meanf = float(mean);
  double sq = 0.0;
  double corr = 0.0;  // sum of deviations from the rounded mean, to correct for its rounding
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t i1 = std::min(n, i0 + kBlock);
    float s2 = 0.0f, s1 = 0.0f;
    for (int64_t i = i0; i < i1; ++i) {
      const float d = x[i] - meanf;
      s1 += d;
      s2 += d * d;
    }
    sq += s2;
    corr += s1;
  }
  // The deviations from the rounded first-pass mean refine it: mean = meanf + corr / n, and
  // sum((x - mean)^2) = sum((x - meanf)^2) - n * (mean - meanf)^2.
  if (n == 0) return {0.0, 1.0 / std::sqrt(double(eps))};
  const double refined = double(meanf) + corr / double(n);
  double var = (sq - corr * corr / double(n)) / double(n);
  if (var < 0.0) var = 0.0;
  return {refined, 1.0 / std::sqrt(var + double(eps))};
}

}  // namespace

// x [N, C, S] contiguous (S = product of the trailing dims); stats per (n, group of C/groups channels).
// y = x * scale[c] + shift[c] with scale = rstd * gamma[c], shift = beta[c] - mean * scale, then act.
void CpuBackend::group_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps, UnaryOp act) {
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
      const float shift = float((b ? b[c0 + ci] : 0.0f) - m.mean * m.rstd * gain);
      const float* xr = xp + base + ci * s;
      float* o = op + base + ci * s;
      for (int64_t i = 0; i < s; ++i) o[i] = xr[i] * scale + shift;
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
    const float mean = float(m.mean), rstd = float(m.rstd);
    for (int64_t j = 0; j < d; ++j) {
      const float y = (xr[j] - mean) * rstd;
      o[j] = y * (g ? g[j] : 1.0f) + (b ? b[j] : 0.0f);
    }
  }
}

// x [R, D] contiguous: y = x / sqrt(mean(x^2) + eps) * gamma.
void CpuBackend::rms_norm(Tensor& out, const Tensor& x, const Tensor& gamma, float eps) {
  const int64_t d = x.size(-1);
  const int64_t rows = d ? x.numel() / d : 0;
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  const float* g = gamma.defined() ? gamma.data<float>() : nullptr;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * d;
    float* o = op + r * d;
    double sq = 0.0;
    for (int64_t j = 0; j < d; ++j) sq += double(xr[j]) * xr[j];
    const float rstd = float(1.0 / std::sqrt(sq / double(d) + double(eps)));
    for (int64_t j = 0; j < d; ++j) o[j] = xr[j] * rstd * (g ? g[j] : 1.0f);
  }
}

}  // namespace atelier
