// Elementwise CPU ops: activations, broadcast binary ops, the fused linear combination, GLU, softmax.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_vecmath.h"

namespace atelier {
namespace cpu {

// Elementwise loops below this many elements stay on one thread.
constexpr int64_t kParallelElems = 1 << 15;
// exp overflows f32 above this; vm::exp saturates there, the kExp op returns inf as torch does.
constexpr float kExpOverflow = 88.72283935546875f;

ATELIER_SIMD_CLONES
void unary_span(float* out, const float* x, int64_t n, UnaryOp op) {
  constexpr float kSqrtHalf = 0.70710678118654752440f;
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  constexpr float kGeluTanhCoeff = 0.044715f;
  constexpr float kQuickGeluAlpha = 1.702f;
  switch (op) {
    case UnaryOp::kIdentity:
      if (out != x) std::copy(x, x + n, out);
      return;
    case UnaryOp::kSilu:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] / (1.0f + vm::exp(-x[i]));
      return;
    case UnaryOp::kGelu:
      for (int64_t i = 0; i < n; ++i) out[i] = 0.5f * x[i] * (1.0f + vm::erf(x[i] * kSqrtHalf));
      return;
    case UnaryOp::kGeluTanh:
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        out[i] = 0.5f * v * (1.0f + vm::tanh(kSqrt2OverPi * (v + kGeluTanhCoeff * v * v * v)));
      }
      return;
    case UnaryOp::kQuickGelu:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] / (1.0f + vm::exp(-kQuickGeluAlpha * x[i]));
      return;
    case UnaryOp::kRelu:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
      return;
    case UnaryOp::kSigmoid:
      for (int64_t i = 0; i < n; ++i) out[i] = vm::sigmoid(x[i]);
      return;
    case UnaryOp::kTanh:
      for (int64_t i = 0; i < n; ++i) out[i] = vm::tanh(x[i]);
      return;
    case UnaryOp::kExp:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] > kExpOverflow ? INFINITY : vm::exp(x[i]);
      return;
    case UnaryOp::kSqrt:
      for (int64_t i = 0; i < n; ++i) out[i] = std::sqrt(x[i]);
      return;
    case UnaryOp::kRsqrt:
      for (int64_t i = 0; i < n; ++i) out[i] = 1.0f / std::sqrt(x[i]);
      return;
    case UnaryOp::kSquare:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] * x[i];
      return;
    case UnaryOp::kNeg:
      for (int64_t i = 0; i < n; ++i) out[i] = -x[i];
      return;
    case UnaryOp::kSin:  // timestep features: libm's float sin, within an ulp of torch's
      for (int64_t i = 0; i < n; ++i) out[i] = std::sin(x[i]);
      return;
    case UnaryOp::kCos:
      for (int64_t i = 0; i < n; ++i) out[i] = std::cos(x[i]);
      return;
  }
}

ATELIER_SIMD_CLONES
double exp_span_sum(float* x, int64_t n, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float e = vm::exp(x[i] - shift);
    x[i] = e;
    sum += e;
  }
  return sum;
}

ATELIER_SIMD_CLONES
float max_span(const float* x, int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace cpu

namespace {

constexpr int64_t kChunk = 1 << 14;  // elements per parallel work item in flat loops

// Shape and per-operand strides with adjacent dims merged wherever all operands allow it, so that a
// contiguous or simply broadcast operation becomes one or two long loops.
struct Collapsed {
  Shape shape;
  std::vector<Shape> strides;  // one per operand
};

Collapsed collapse(const Shape& shape, const std::vector<const Shape*>& strides) {
  Collapsed c;
  c.strides.resize(strides.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;  // size-1 dims never move the offset
    bool merge = !c.shape.empty();
    for (size_t o = 0; o < strides.size() && merge; ++o)
      merge = c.strides[o].back() == (*strides[o])[d] * shape[d];
    if (merge) {
      c.shape.back() *= shape[d];
      for (size_t o = 0; o < strides.size(); ++o) c.strides[o].back() = (*strides[o])[d];
    } else {
      c.shape.push_back(shape[d]);
      for (size_t o = 0; o < strides.size(); ++o) c.strides[o].push_back((*strides[o])[d]);
    }
  }
  if (c.shape.empty()) {
    c.shape.push_back(1);
    for (auto& s : c.strides) s.push_back(1);
  }
  return c;
}

inline int64_t offset_of(int64_t flat, const Shape& shape, const Shape& strides) {
  int64_t off = 0;
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    off += (flat % shape[d]) * strides[d];
    flat /= shape[d];
  }
  return off;
}

template <typename F>
inline void binary_row(float* o, const float* a, int64_t sa, const float* b, int64_t sb, int64_t n, F f) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const float bv = *b;
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const float av = *a;
    for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i * sa], b[i * sb]);
  }
}

template <typename F>
void binary_apply(Tensor& out, const Tensor& a, const Tensor& b, F f) {
  const Shape ostr = out.strides();
  Collapsed c = collapse(out.shape(), {&ostr, &a.strides(), &b.strides()});
  const int64_t inner = c.shape.back();
  const int64_t outer = out.numel() / inner;
  const Shape& os = c.strides[0];
  const Shape& as = c.strides[1];
  const Shape& bs = c.strides[2];
  float* op = out.data<float>();
  const float* ap = a.data<float>();
  const float* bp = b.data<float>();
  // Long rows are cut in chunks so that even a single row spreads over the team.
  const int64_t chunks_per_row = (inner + kChunk - 1) / kChunk;
  const int64_t items = outer * chunks_per_row;
#pragma omp parallel for schedule(static) if (out.numel() > cpu::kParallelElems && items > 1)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t row = it / chunks_per_row, i0 = (it % chunks_per_row) * kChunk;
    const int64_t len = std::min(kChunk, inner - i0);
    const int64_t base = row * inner;
    const int64_t oo = offset_of(base, c.shape, os) + i0 * os.back();
    const int64_t ao = offset_of(base, c.shape, as) + i0 * as.back();
    const int64_t bo = offset_of(base, c.shape, bs) + i0 * bs.back();
    binary_row(op + oo, ap + ao, as.back(), bp + bo, bs.back(), len, f);
  }
}

}  // namespace

// out = op(x); x and out contiguous, same shape.
void CpuBackend::unary(Tensor& out, const Tensor& x, UnaryOp op) {
  ATELIER_CHECK(x.is_contiguous() && out.is_contiguous(), "unary: contiguous tensors expected");
  const int64_t n = x.numel();
  const float* xp = x.data<float>();
  float* op_ = out.data<float>();
  const int64_t items = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > cpu::kParallelElems)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t i0 = it * kChunk;
    cpu::unary_span(op_ + i0, xp + i0, std::min(kChunk, n - i0), op);
  }
}

// out = a op b; a and b are views with out's shape (zero strides broadcast), out contiguous.
void CpuBackend::binary(Tensor& out, const Tensor& a, const Tensor& b, BinaryOp op) {
  ATELIER_CHECK(a.shape() == out.shape() && b.shape() == out.shape(), "binary: operands must be broadcast to the output shape");
  if (out.numel() == 0) return;
  switch (op) {
    case BinaryOp::kAdd: binary_apply(out, a, b, [](float x, float y) { return x + y; }); return;
    case BinaryOp::kSub: binary_apply(out, a, b, [](float x, float y) { return x - y; }); return;
    case BinaryOp::kMul: binary_apply(out, a, b, [](float x, float y) { return x * y; }); return;
    case BinaryOp::kDiv: binary_apply(out, a, b, [](float x, float y) { return x / y; }); return;
    // NaN propagates from either side, as torch.maximum/minimum do.
    case BinaryOp::kMax: binary_apply(out, a, b, [](float x, float y) { return (x != x || x > y) ? x : y; }); return;
    case BinaryOp::kMin: binary_apply(out, a, b, [](float x, float y) { return (x != x || x < y) ? x : y; }); return;
  }
}

// out[s, ...] = sum_i coeffs[s * n + i] * inputs[i][s, ...] (coeff_rows == 1: one row for all samples).
// All tensors contiguous with out's shape. One pass over memory whatever the number of inputs.
void CpuBackend::lincomb(Tensor& out, const std::vector<Tensor>& inputs, const std::vector<float>& coeffs, int coeff_rows) {
  const int64_t n_in = int64_t(inputs.size());
  ATELIER_CHECK(n_in >= 1 && int64_t(coeffs.size()) == n_in * coeff_rows, "lincomb: coefficient count");
  const int64_t total = out.numel();
  if (total == 0) return;
  const int64_t samples = coeff_rows == 1 ? 1 : out.size(0);
  const int64_t per_sample = total / samples;
  std::vector<const float*> ins(n_in);
  for (int64_t i = 0; i < n_in; ++i) {
    ATELIER_CHECK(inputs[i].is_contiguous() && inputs[i].numel() == total, "lincomb: inputs must be contiguous with out's shape");
    ins[i] = inputs[i].data<float>();
  }
  float* o = out.data<float>();
  const int64_t chunks = (per_sample + kChunk - 1) / kChunk;
  const int64_t items = samples * chunks;
#pragma omp parallel for schedule(static) if (total > cpu::kParallelElems)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t s = it / chunks, i0 = (it % chunks) * kChunk;
    const int64_t len = std::min(kChunk, per_sample - i0);
    const int64_t base = s * per_sample + i0;
    const float* c = coeffs.data() + (coeff_rows == 1 ? 0 : s * n_in);
    float* dst = o + base;
    const float c0 = c[0];
    const float* x0 = ins[0] + base;
    for (int64_t j = 0; j < len; ++j) dst[j] = c0 * x0[j];
    for (int64_t i = 1; i < n_in; ++i) {
      const float ci = c[i];
      const float* xi = ins[i] + base;
      for (int64_t j = 0; j < len; ++j) dst[j] += ci * xi[j];
    }
  }
}

// x [R, 2H] -> out [R, H] = x[:, :H] * act(x[:, H:]); both contiguous.
void CpuBackend::glu(Tensor& out, const Tensor& x, UnaryOp act) {
  const int64_t h = out.size(-1);
  const int64_t rows = h ? out.numel() / h : 0;
  const float* xp = x.data<float>();
  float* op = out.data<float>();
#pragma omp parallel for schedule(static) if (out.numel() > cpu::kParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    float* o = op + r * h;
    const float* xr = xp + r * 2 * h;
    cpu::unary_span(o, xr + h, h, act);
    for (int64_t j = 0; j < h; ++j) o[j] *= xr[j];
  }
}

// Softmax over the last dim of contiguous x; out may alias x.
void CpuBackend::softmax(Tensor& out, const Tensor& x) {
  const int64_t d = x.size(-1);
  const int64_t rows = d ? x.numel() / d : 0;
  const float* xp = x.data<float>();
  float* op = out.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > cpu::kParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * d;
    float* o = op + r * d;
    float mx = cpu::max_span(xr, d);
    if (mx == -INFINITY) mx = 0.0f;  // fully masked row: all exps are 0 and the row becomes NaN, as in torch
    if (o != xr) std::copy(xr, xr + d, o);
    const double sum = cpu::exp_span_sum(o, d, mx);
    const float inv = float(1.0 / sum);
    for (int64_t j = 0; j < d; ++j) o[j] *= inv;
  }
}

}  // namespace atelier
