// The op API's FP8 (e4m3) linear layers: row-wise quantization and the scaled product (see ops.h).
#include <string>
#include <utility>

#include "backend/ops.h"
#include "backend/ops_internal.h"
#include "core/trace.h"

namespace atelier::ops {
using namespace detail;  // NOLINT: the op API's own helpers

namespace {
// A 2-D [R, C] view of w with a unit last stride (or a contiguous copy).
Tensor matrix_rows(const Tensor& w, const std::string& op) {
  require(w.dim() == 2, op, "expects a [rows, cols] matrix, got " + shape_str(w.shape()));
  return w.strides()[1] == 1 || w.size(1) == 1 ? w : contiguous(w);
}
}  // namespace

std::pair<Tensor, Tensor> quantize_rows_fp8(const Tensor& w) {
  trace::Scope range("quantize_rows_fp8", trace::Category::kOp);
  const std::string op = "quantize_rows_fp8";
  require_f32(w, op, "w");
  const Tensor x = matrix_rows(w, op);
  Tensor q = Tensor::empty(x.shape(), DType::F8E4M3, x.device());
  Tensor scale = Tensor::empty({x.size(0)}, DType::F32, x.device());
  if (x.numel() > 0) backend_of(x).quantize_rows_fp8(q, scale, x);
  return {q, scale};
}

// x [..., in] -> its rows [m, in] as f8e4m3 with [m] f32 scales (and x itself).
Fp8Rows quantize_activation_fp8(const Tensor& x) {
  trace::Scope range("quantize_activation_fp8", trace::Category::kOp);
  const std::string op = "linear_fp8";
  require_f32(x, op, "x");
  const int64_t k = x.dim() > 0 ? x.size(-1) : 0, m = x.numel() / std::max<int64_t>(k, 1);
  Fp8Rows r{x, Tensor::empty({m, k}, DType::F8E4M3, x.device()), Tensor::empty({m}, DType::F32, x.device())};
  if (m == 0 || k == 0) return r;
  const Tensor r3 = rows_view(x);  // [1, m, k], rows possibly strided
  const Tensor rows(r3.buffer(), {m, k}, {r3.strides()[1], 1}, r3.dtype(), r3.offset());
  backend_of(x).quantize_rows_fp8(r.q, r.scale, rows);
  return r;
}

// x [..., in] -> [..., out]; w8 [out, in] f8e4m3, ws [out] f32, b [out] and residual [..., out] optional.
Tensor linear_fp8(const Tensor& x, const Tensor& w8, const Tensor& ws, const Tensor& b, UnaryOp act, const Tensor& residual) {
  return linear_fp8(Fp8Rows{x, Tensor(), Tensor()}, w8, ws, b, act, residual);
}

namespace {
// into defined: the output written there, accumulated onto its values where `accumulate` is set. gate
// defined (with into and accumulate): into += gate * product through Backend::gemm_fp8_gated, *gated telling
// whether it ran (nothing was written where it did not).
Tensor linear_fp8_impl(const Fp8Rows& xr, const Tensor& w8, const Tensor& ws, const Tensor& b, UnaryOp act, const Tensor& residual,
                       const Tensor& into, bool accumulate = false, const Tensor& gate = Tensor(), bool* gated = nullptr) {
  const Tensor& x = xr.x;
  trace::Scope range("linear_fp8", trace::Category::kOp);
  if (range.active()) range.set_detail(shape_str(x.shape()) + " x " + shape_str(w8.shape()) + "^T");
  const std::string op = "linear_fp8";
  require_f32(x, op, "x");
  require_defined(w8, op, "w8");
  require_defined(ws, op, "ws");
  require(w8.dtype() == DType::F8E4M3, op, "w8 must be f8e4m3 (ops::quantize_rows_fp8), got " + std::string(dtype_name(w8.dtype())));
  require(ws.dtype() == DType::F32, op, "ws must be f32 row scales");
  require_same_device(x, w8, op);
  require_same_device(x, ws, op);
  require(w8.dim() == 2 && w8.strides()[1] == 1, op, "w8 must be [out, in] with a unit last stride, got " + shape_str(w8.shape()));
  require(ws.dim() == 1 && ws.size(0) == w8.size(0) && ws.is_contiguous(), op,
          "ws must be [" + std::to_string(w8.size(0)) + "] contiguous, got " + shape_str(ws.shape()));
  if (residual.defined()) require(residual.dtype() == x.dtype(), op, "residual must have x's dtype");
  float beta = 0.0f;
  Tensor out = linear_output(x, w8, "w8", b, residual, op, &beta, nullptr, into);
  if (accumulate) beta = 1.0f;
  const int64_t m = x.numel() / std::max<int64_t>(x.size(-1), 1), n = w8.size(0), k = w8.size(1);
  if (m == 0 || n == 0) return out;
  require(xr.q.defined() || xr.x_values, op, "x holds no values (Fp8Rows::x_values) and its rows are not quantized");
  const Fp8Rows q = xr.q.defined() ? xr : quantize_activation_fp8(x);
  require(q.q.dim() == 2 && q.q.size(0) == m && q.q.size(1) == k && q.scale.numel() == m, op,
          "quantized rows " + shape_str(q.q.shape()) + " do not match x " + shape_str(x.shape()));
  Tensor out2 = out.reshape({m, n});
  const Tensor bias = b.defined() ? (b.dtype() == x.dtype() ? contiguous(b) : cast(b, x.dtype())) : Tensor();
  if (gate.defined()) {
    *gated = backend_of(x).gemm_fp8_gated(out2, q.q, q.scale, w8, ws, bias, gate);
    if (*gated) trace::count_flops(gemm_flops(1, m, n, k));
    return out;
  }
  trace::count_flops(gemm_flops(1, m, n, k));
  backend_of(x).gemm_fp8(out2, q.q, q.scale, w8, ws, bias, beta, act);
  return out;
}
}  // namespace

Tensor linear_fp8(const Fp8Rows& xr, const Tensor& w8, const Tensor& ws, const Tensor& b, UnaryOp act, const Tensor& residual) {
  return linear_fp8_impl(xr, w8, ws, b, act, residual, Tensor());
}

void linear_fp8_into(Tensor& out, const Fp8Rows& x, const Tensor& w8, const Tensor& ws, const Tensor& b, UnaryOp act) {
  require_defined(out, "linear_fp8", "out");
  linear_fp8_impl(x, w8, ws, b, act, Tensor(), out);
}

void linear_fp8_accumulate(Tensor& out, const Fp8Rows& x, const Tensor& w8, const Tensor& ws) {
  require_defined(out, "linear_fp8", "out");
  linear_fp8_impl(x, w8, ws, Tensor(), UnaryOp::kIdentity, Tensor(), out, /*accumulate=*/true);
}

Tensor linear_fp8_gated_residual(Tensor&& residual, const Fp8Rows& x, const Tensor& w8, const Tensor& ws, const Tensor& b,
                                 const Tensor& gate) {
  const std::string op = "linear_fp8_gated_residual";
  trace::Scope range("linear_fp8_gated", trace::Category::kOp);  // one op, whichever way it runs
  Tensor res = std::move(residual);  // the caller's handle is gone: only other holders can still see its memory
  require_defined(res, op, "residual");
  require_defined(gate, op, "gate");
  require_defined(w8, op, "w8");
  require_f32(res, op, "residual");
  require_f32(gate, op, "gate");
  require_same_device(res, gate, op);
  const int64_t out_features = w8.dim() == 2 ? w8.size(0) : -1;
  require(res.dim() == 3 && res.size(2) == out_features, op,
          "residual must be [B, N, " + std::to_string(out_features) + "], got " + shape_str(res.shape()));
  require(gate.dtype() == res.dtype() && gate.numel() == res.size(0) * out_features, op,
          "gate must hold [B, " + std::to_string(out_features) + "] values in the residual's dtype, got " + shape_str(gate.shape()));
  require(x.q.defined() || x.x_values, op, "x holds no values (Fp8Rows::x_values) and its rows are not quantized");
  const Fp8Rows rows = x.q.defined() ? x : quantize_activation_fp8(x.x);  // once, whichever product runs
  if (res.size(0) == 1 && res.is_contiguous() && res.buffer().use_count() == 1 && res.dtype() == x.x.dtype()) {
    bool gated = false;
    linear_fp8_impl(rows, w8, ws, b, UnaryOp::kIdentity, Tensor(), res, /*accumulate=*/true, contiguous(gate).reshape({out_features}),
                    &gated);
    if (gated) return res;
  }
  NormModulation m;
  m.gate = gate;
  m.residual = res;
  return norm_modulate(linear_fp8(rows, w8, ws, b), NormKind::kNone, 0.0f, Tensor(), m);
}

}  // namespace atelier::ops
