// The op API's rotary position embedding and attention (see ops.h): validation, the output views the backends
// write (heads merged where asked), and FP8 attention, also after a normalising rope whose q/k a backend may
// make in e4m3 in the rope's own pass.
#include <cmath>
#include <string>

#include "backend/ops.h"
#include "backend/ops_internal.h"
#include "core/trace.h"

namespace atelier::ops {
using namespace detail;  // NOLINT: the op API's own helpers
using trace::Category;

// --- rotary position embedding --------------------------------------------------------------------

namespace {
// rope's operands as the backend takes them, validated (x [B, A, C, D] with positions along seq_dim, cos/sin
// [S, D/2] values in x's dtype, the RMS weight [D]): x with a unit last stride, cos/sin as contiguous [S, D/2],
// the RMS weight contiguous.
struct RopeOperands {
  Tensor x, cos, sin;
  RopeRms rms;
};

RopeOperands rope_operands(const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms, const std::string& op) {
  require_f32(x, op, "x");
  require_f32(cos, op, "cos");
  require_f32(sin, op, "sin");
  require_same_device(x, cos, op);
  require_same_device(x, sin, op);
  require(x.dim() == 4, op, "expects x [B, A, C, D], got " + shape_str(x.shape()));
  require(seq_dim == 1 || seq_dim == 2, op, "positions must lie along dim 1 or 2");
  const int64_t d = x.size(3), s = x.size(seq_dim);
  require(d % 2 == 0, op, "the last dim must be even (pairs), got " + std::to_string(d));
  require(cos.dtype() == x.dtype() && sin.dtype() == x.dtype(), op, "cos/sin must have x's dtype");
  require(cos.numel() == s * d / 2 && sin.numel() == s * d / 2, op,
          "cos/sin must hold [" + std::to_string(s) + ", " + std::to_string(d / 2) + "] values, got " + shape_str(cos.shape()));
  RopeRms rc;
  if (rms.on) {
    require_affine(rms.gamma, d, op, "rms gamma");
    rc = {true, contiguous_opt(rms.gamma), rms.eps};
  }
  return {x.strides()[3] == 1 ? x : contiguous(x), contiguous(cos).reshape({s, d / 2}), contiguous(sin).reshape({s, d / 2}), rc};
}

Tensor rope_impl(const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms, const Tensor& into) {
  trace::Scope range("rope", Category::kOp);
  const std::string op = into.defined() ? "rope_into" : "rope";
  const RopeOperands r = rope_operands(x, cos, sin, seq_dim, rms, op);
  if (into.defined()) require_destination(into, x, x.shape(), op);
  Tensor out = into.defined() ? into : empty_like_shape(x, x.shape());
  backend_of(x).rope(out, r.x, r.cos, r.sin, seq_dim, r.rms);
  return out;
}
}  // namespace

Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms) {
  return rope_impl(x, cos, sin, seq_dim, rms, Tensor());
}

void rope_into(Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms) {
  require_defined(out, "rope_into", "out");
  rope_impl(x, cos, sin, seq_dim, rms, out);
}

namespace {
// rope's operands of x [B, H, S, D] (positions along dim 2) in runs: the whole (unit last stride, tables [S,
// D/2]), each run's positions [start, start + n) with their rows of the tables and the run's norm (contiguous
// gamma), and those runs as the backend takes them.
struct RopeRunOperands {
  RopeOperands whole;
  std::vector<RopeOperands> parts;
  std::vector<RopeRmsRun> runs;
};

RopeRunOperands rope_run_operands(const Tensor& x, const Tensor& cos, const Tensor& sin, const std::vector<RopeRmsRun>& runs,
                                  const std::string& op) {
  RopeRunOperands r{rope_operands(x, cos, sin, 2, {}, op), {}, {}};
  require(!runs.empty(), op, "needs at least one run of positions");
  const int64_t s = x.size(2);
  int64_t start = 0;
  for (const RopeRmsRun& run : runs) {
    require(run.positions > 0 && run.positions <= s - start, op,
            "runs of positions must be positive and lie within the sequence of " + std::to_string(s) + ", got " +
                std::to_string(run.positions) + " from " + std::to_string(start));
    const RopeOperands& w = r.whole;
    r.parts.push_back(rope_operands(w.x.narrow(2, start, run.positions), w.cos.narrow(0, start, run.positions),
                                    w.sin.narrow(0, start, run.positions), 2, run.rms, op));
    r.runs.push_back({run.positions, r.parts.back().rms});
    start += run.positions;
  }
  require(start == s, op, "runs cover " + std::to_string(start) + " of the sequence's " + std::to_string(s) + " positions");
  return r;
}
}  // namespace

Tensor rope_runs(const Tensor& x, const Tensor& cos, const Tensor& sin, const std::vector<RopeRmsRun>& runs) {
  const RopeRunOperands r = rope_run_operands(x, cos, sin, runs, "rope_runs");
  if (r.parts.size() == 1) return rope(x, cos, sin, 2, runs[0].rms);
  const int64_t b = x.size(0), h = x.size(1), s = x.size(2), d = x.size(3);
  if (b > 1) {  // the runs' rows of a [B, S, H, D] buffer are not contiguous: rope each, then concatenate
    std::vector<Tensor> roped;
    for (const RopeOperands& p : r.parts) roped.push_back(rope(p.x, p.cos, p.sin, 2, p.rms));
    return concat(roped, 2);
  }
  Tensor out = empty_like_shape(x, {1, s, h, d});
  int64_t start = 0;
  for (const RopeOperands& p : r.parts) {
    Tensor rows = out.narrow(1, start, p.x.size(2));
    rope_into(rows, p.x.permute({0, 2, 1, 3}), p.cos, p.sin, 1, p.rms);
    start += p.x.size(2);
  }
  return out.permute({0, 2, 1, 3});
}

// --- attention ------------------------------------------------------------------------------------

namespace {
// Q K^T and P V of [B*H] heads, as torch counts scaled_dot_product_attention; the softmax is not counted.
void count_attention_flops(int64_t bh, int64_t sq, int64_t sk, int64_t d, int64_t dv) {
  trace::count_flops(gemm_flops(bh, sq, sk, d) + gemm_flops(bh, sq, dv, sk));
}

// out [B, Sq, H, Dv] as an FP8 GEMM's input: x its [B, Sq, H * Dv] view, q/scale fresh [B*Sq, H*Dv] e4m3 rows
// and [B*Sq] scales for the backend (or a quantization) to fill.
Fp8Rows merged_rows_of(const Tensor& out) {
  const int64_t b = out.size(0), sq = out.size(1), hdv = out.size(2) * out.size(3);
  return Fp8Rows{out.reshape({b, sq, hdv}), Tensor::empty({b * sq, hdv}, DType::F8E4M3, out.device()),
                 Tensor::empty({b * sq}, DType::F32, out.device())};
}

// Validates, then runs attention into a fresh output: [B, H, Sq, Dv] contiguous, or with merged_heads the
// same values in a [B, Sq, H, Dv] buffer (returned in that shape), written there by the backend directly.
// With `rows` (FP8, heads merged): the result's rows as an FP8 GEMM's input too, from the backend's e4m3 output
// where it has one (then the result itself is written only with x_values), else quantized here (inside this
// op's trace range).
Tensor attention_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale, bool merged_heads,
                      bool fp8 = false, const Fp8Bounds& bounds = {}, Fp8Rows* rows = nullptr, bool x_values = true) {
  trace::Scope range(fp8 ? "attention_fp8" : "attention", Category::kOp);
  const std::string op = fp8 ? "attention_fp8" : "attention";
  require_f32(q, op, "q");
  require_f32(k, op, "k");
  require_f32(v, op, "v");
  require_same_device(q, k, op);
  require_same_device(q, v, op);
  require(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
          "expects q [B, H, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv], got " + shape_str(q.shape()) + ", " + shape_str(k.shape()) + ", " + shape_str(v.shape()));
  const int64_t b = q.size(0), h = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t hk = k.size(1), sk = k.size(2), dv = v.size(3);
  require(k.size(0) == b && v.size(0) == b, op, "batch sizes differ");
  require(k.size(3) == d, op, "q and k head dims differ: " + shape_str(q.shape()) + " vs " + shape_str(k.shape()));
  require(v.size(1) == hk && v.size(2) == sk, op, "k " + shape_str(k.shape()) + " and v " + shape_str(v.shape()) + " differ in heads or length");
  require(sk > 0, op, "empty key sequence (Sk = 0): softmax over nothing is undefined");
  require(hk >= 1 && h % hk == 0, op, "query heads " + std::to_string(h) + " not a multiple of kv heads " + std::to_string(hk));
  // The backend reads rows of the last dim in place: unit inner stride, row stride a valid leading dim.
  auto unit_last = [](const Tensor& t) {
    const bool ok = t.strides()[3] == 1 && (t.strides()[2] >= t.size(3) || t.size(2) == 1);
    return ok ? t : contiguous(t);
  };
  Tensor mask4;
  if (mask.defined()) {
    require_f32(mask, op, "mask");
    require_same_device(q, mask, op);
    mask4 = broadcast_to(mask, {b, h, sq, sk}, op);
    if (mask4.strides()[3] != 1 && mask4.strides()[3] != 0) mask4 = broadcast_to(contiguous(mask), {b, h, sq, sk}, op);
  }
  if (scale == 0.0f) scale = float(1.0 / std::sqrt(double(d)));
  Tensor out = merged_heads ? empty_like_shape(q, {b, sq, h, dv}) : empty_like_shape(q, {b, h, sq, dv});
  Tensor out_view = merged_heads ? out.permute({0, 2, 1, 3}) : out;
  count_attention_flops(b * h, sq, sk, d, dv);
  if (range.active()) range.set_detail("q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ", v " + shape_str(v.shape()));
  if (fp8) {
    require(!mask.defined() && hk == h, op, "takes no mask and as many k/v heads as q heads");
    require(bounds.q >= 0.0f && bounds.k >= 0.0f && std::isfinite(bounds.q) && std::isfinite(bounds.k), op,
            "bounds must be finite and not negative (0: none)");
    if (!rows) {
      backend_of(q).attention_fp8(out_view, unit_last(q), unit_last(k), unit_last(v), scale, bounds);
    } else {
      *rows = merged_rows_of(out);
      if (backend_of(q).attention_fp8_rows(out_view, rows->q, rows->scale, unit_last(q), unit_last(k), unit_last(v), scale, bounds,
                                           x_values))
        rows->x_values = x_values;
      else  // the result's rows quantized into the buffers made for them, as quantize_activation_fp8 does
        backend_of(q).quantize_rows_fp8(rows->q, rows->scale, rows->x.reshape({b * sq, h * dv}));
    }
  } else {
    backend_of(q).attention(out_view, unit_last(q), unit_last(k), unit_last(v), mask4, scale);
  }
  return out;
}
}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) {
  return attention_impl(q, k, v, mask, scale, /*merged_heads=*/false);
}

Tensor attention_merged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) {
  Tensor out = attention_impl(q, k, v, mask, scale, /*merged_heads=*/true);  // [B, Sq, H, Dv]
  return out.reshape({out.size(0), out.size(1), out.size(2) * out.size(3)});
}

Tensor attention_merged_fp8(const Tensor& q, const Tensor& k, const Tensor& v, float scale, const Fp8Bounds& bounds) {
  Tensor out = attention_impl(q, k, v, Tensor(), scale, /*merged_heads=*/true, /*fp8=*/true, bounds);  // [B, Sq, H, Dv]
  return out.reshape({out.size(0), out.size(1), out.size(2) * out.size(3)});
}

Fp8Rows attention_merged_fp8_rows(const Tensor& q, const Tensor& k, const Tensor& v, float scale, const Fp8Bounds& bounds,
                                  bool x_values) {
  Fp8Rows rows;
  attention_impl(q, k, v, Tensor(), scale, /*merged_heads=*/true, /*fp8=*/true, bounds, &rows, x_values);  // x [B, Sq, H * Dv]
  return rows;
}

Tensor multi_head_attention(const Tensor& q, const Tensor& k, const Tensor& v, int heads, int kv_heads, const Tensor& mask) {
  trace::Scope range("multi_head_attention", Category::kOp);
  const std::string op = "multi_head_attention";
  require_f32(q, op, "q");
  require_f32(k, op, "k");
  require_f32(v, op, "v");
  if (kv_heads == 0) kv_heads = heads;
  Tensor qh = split_heads(q, heads, op);
  Tensor kh = split_heads(k, kv_heads, op);
  Tensor vh = split_heads(v, kv_heads, op);
  return attention_merged(qh, kh, vh, mask);  // [B, Sq, H*Dv]: the heads merged by the backend's writes
}

Fp8Rows rope_attention_merged_fp8_rows(const Tensor& qx, const Tensor& kx, const Tensor& v, const Tensor& cos, const Tensor& sin,
                                       const RopeRms& rms_q, const RopeRms& rms_k, const Fp8Bounds& bounds, bool x_values) {
  // (the positions of malformed q/k are left to the checks of the runs' version)
  const int64_t sq = qx.dim() == 4 ? qx.size(2) : 0, sk = kx.dim() == 4 ? kx.size(2) : 0;
  return rope_attention_merged_fp8_rows(qx, kx, v, cos, sin, {{sq, rms_q}}, {{sk, rms_k}}, bounds, x_values);
}

Fp8Rows rope_attention_merged_fp8_rows(const Tensor& qx, const Tensor& kx, const Tensor& v, const Tensor& cos, const Tensor& sin,
                                       const std::vector<RopeRmsRun>& q_runs, const std::vector<RopeRmsRun>& k_runs,
                                       const Fp8Bounds& bounds, bool x_values) {
  const std::string op = "rope_attention_fp8";
  const RopeRunOperands rq = rope_run_operands(qx, cos, sin, q_runs, op), rk = rope_run_operands(kx, cos, sin, k_runs, op);
  require_defined(v, op, "v");
  require(v.dim() == 4 && v.size(0) == qx.size(0) && v.size(1) == qx.size(1) && v.size(2) == kx.size(2), op,
          "v must be [B, H, Sk, Dv] beside q " + shape_str(qx.shape()) + " and k " + shape_str(kx.shape()) + ", got " + shape_str(v.shape()));
  // One op range for the whole (the ropes and the attention nested in it where the backend does not fuse them).
  trace::Scope range("attention_fp8", Category::kOp);
  if (bounds.q > 0.0f && bounds.k > 0.0f && std::isfinite(bounds.q) && std::isfinite(bounds.k) && kx.shape() == qx.shape() &&
      v.strides()[3] == 1) {
    const int64_t b = qx.size(0), h = qx.size(1), sq = qx.size(2), d = qx.size(3), sk = kx.size(2), dv = v.size(3);
    const Tensor out = empty_like_shape(qx, {b, sq, h, dv});
    Tensor out_view = out.permute({0, 2, 1, 3});
    Fp8Rows rows = merged_rows_of(out);
    if (backend_of(qx).rope_attention_fp8_rows(out_view, rows.q, rows.scale, rq.whole.x, rk.whole.x, v, rq.whole.cos,
                                               rq.whole.sin, rq.runs, rk.runs, float(1.0 / std::sqrt(double(d))), bounds,
                                               x_values)) {
      count_attention_flops(b * h, sq, sk, d, dv);
      rows.x_values = x_values;
      return rows;
    }
  }
  return attention_merged_fp8_rows(rope_runs(qx, cos, sin, q_runs), rope_runs(kx, cos, sin, k_runs), v, 0.0f, bounds, x_values);
}

}  // namespace atelier::ops
