// The op API front end: validates shapes, dtypes and devices (throwing atelier::Error with an
// invalid-argument Status that says what is supported), allocates outputs on the inputs' device, builds
// the views the backends expect (broadcast strides, split heads) and calls that device's Backend.
#include "backend/ops.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/ops_internal.h"
#include "core/trace.h"

namespace atelier::ops {
namespace detail {

// FLOPs as torch's FlopCounterMode counts them: 2 per multiply-add (see core/trace.h).
uint64_t gemm_flops(int64_t batch, int64_t m, int64_t n, int64_t k) { return 2 * uint64_t(batch) * uint64_t(m) * uint64_t(n) * uint64_t(k); }

[[noreturn]] void fail(const std::string& op, const std::string& msg) {
  throw Error(invalid_argument(op + ": " + msg));
}

void require(bool cond, const std::string& op, const std::string& msg) {
  if (!cond) fail(op, msg);
}

Backend& backend_of(const Tensor& x) { return backend_for(x.device()); }

void require_defined(const Tensor& x, const std::string& op, const char* what) {
  require(x.defined(), op, std::string(what) + " is an undefined tensor");
}

void require_f32(const Tensor& x, const std::string& op, const char* what) {
  require_defined(x, op, what);
  if (x.device().is_cpu())
    require(x.dtype() == DType::F32, op,
            std::string(what) + " has dtype " + std::string(dtype_name(x.dtype())) +
                "; the CPU backend computes in f32 (use ops::cast first)");
  else
    require(x.dtype() == DType::F32 || x.dtype() == DType::F16 || x.dtype() == DType::BF16, op,
            std::string(what) + " has dtype " + std::string(dtype_name(x.dtype())) + "; supported are f32, f16, bf16");
}

void require_same_device(const Tensor& a, const Tensor& b, const std::string& op) {
  require(a.device() == b.device(), op, "inputs on different devices (" + a.device().str() + " and " + b.device().str() + ")");
}

int normalize_dim(int dim, int64_t rank, const std::string& op) {
  const int d = dim < 0 ? dim + int(rank) : dim;
  require(d >= 0 && d < rank, op, "dim " + std::to_string(dim) + " out of range for rank " + std::to_string(rank));
  return d;
}

Tensor empty_like_shape(const Tensor& x, const Shape& shape) { return Tensor::empty(shape, x.dtype(), x.device()); }

// Contiguous unless the optional tensor is undefined.
Tensor contiguous_opt(const Tensor& x) { return x.defined() ? contiguous(x) : x; }

bool wants_channels_last(const Tensor& x) { return x.dim() == 4 && backend_of(x).prefers_channels_last(x.dtype()); }

Tensor empty_like_layout(const Tensor& x, const Shape& shape) {
  if (x.is_channels_last() && x.shape() == shape) return Tensor::empty_channels_last(shape, x.dtype(), x.device());
  return empty_like_shape(x, shape);
}

Tensor nhwc_order(const Tensor& x) { return x.permute({0, 2, 3, 1}); }

// x (any rank <= shape's) viewed with `shape` by numpy broadcasting: missing leading dims and size-1 dims
// get stride 0.
Tensor broadcast_to(const Tensor& x, const Shape& shape, const std::string& op) {
  const int64_t r = int64_t(shape.size()), xr = x.dim();
  require(xr <= r, op, "cannot broadcast " + shape_str(x.shape()) + " to " + shape_str(shape));
  Shape strides(r, 0);
  for (int64_t i = 0; i < xr; ++i) {
    const int64_t d = r - xr + i;
    const int64_t xs = x.shape()[i];
    require(xs == shape[d] || xs == 1, op, "cannot broadcast " + shape_str(x.shape()) + " to " + shape_str(shape));
    strides[d] = xs == 1 ? 0 : x.strides()[i];
  }
  return Tensor(x.buffer(), shape, strides, x.dtype(), x.offset());
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& op) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    require(da == db || da == 1 || db == 1, op, "shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// [.., R, C] readable in place by a row-major BLAS: unit column stride and a row stride that is a valid
// leading dimension (>= C; any for a single row). The batch dim may have any stride, 0 included.
bool blas_friendly(const Tensor& m) {
  if (m.dim() < 2) return m.is_contiguous();
  const int64_t rows = m.size(-2), cols = m.size(-1);
  const int64_t rs = m.strides()[m.dim() - 2], cs = m.strides()[m.dim() - 1];
  return cs == 1 && (rs >= cols || rows == 1);
}

// m [B, R, C] as a GEMM operand that BLAS reads in place: as is, or, when it is a transposed view of a
// row-major matrix (unit stride on R), the underlying matrix with *trans flipped; otherwise packed.
Tensor blas_operand(const Tensor& m, bool* trans) {
  if (blas_friendly(m)) return m;
  Tensor t = m.transpose(1, 2);
  if (blas_friendly(t)) {
    *trans = !*trans;
    return t;
  }
  return contiguous(m);
}

// x [B, S, H*D] with unit last stride -> [B, H, S, D] view (no copy).
Tensor split_heads(const Tensor& x, int64_t heads, const std::string& op) {
  require(x.dim() == 3, op, "expects [B, S, H*D] inputs, got " + shape_str(x.shape()));
  const int64_t c = x.size(2);
  require(heads > 0 && c % heads == 0, op, "channels " + std::to_string(c) + " not divisible by " + std::to_string(heads) + " heads");
  Tensor y = x.strides()[2] == 1 ? x : contiguous(x);
  const int64_t d = c / heads;
  const Shape shape{y.size(0), heads, y.size(1), d};
  const Shape strides{y.strides()[0], d, y.strides()[1], 1};
  return Tensor(y.buffer(), shape, strides, y.dtype(), y.offset());
}

}  // namespace detail

using namespace detail;  // NOLINT: the helpers are this file's own
using trace::Category;

// --- layout ---------------------------------------------------------------------------------------

// No range of its own: most calls return x unchanged, and a copy shows up as the clone it makes.
Tensor contiguous(const Tensor& x) {
  require_defined(x, "contiguous", "x");
  if (x.is_contiguous()) return x;
  return clone(x);
}

Tensor clone(const Tensor& x) {
  trace::Scope range("clone", Category::kOp);
  require_defined(x, "clone", "x");
  Tensor out = empty_like_shape(x, x.shape());
  backend_of(x).copy(out, x);
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  trace::Scope range("cast", Category::kOp);
  require_defined(x, "cast", "x");
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  backend_of(x).copy(out, x);
  return out;
}

Tensor to_device(const Tensor& x, Device dev) {
  trace::Scope range("to_device", Category::kOp);
  require_defined(x, "to_device", "x");
  if (x.device() == dev) return x;
  return contiguous(x).to(dev);
}

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  trace::Scope range("concat", Category::kOp);
  require(!xs.empty(), "concat", "no inputs");
  const Tensor& first = xs[0];
  require_defined(first, "concat", "xs[0]");
  const int d = normalize_dim(dim, first.dim(), "concat");
  Shape shape = first.shape();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    require_defined(x, "concat", "an input");
    require_same_device(first, x, "concat");
    require(x.dtype() == first.dtype(), "concat", "inputs have different dtypes");
    require(x.dim() == first.dim(), "concat", "inputs have different ranks: " + shape_str(first.shape()) + " and " + shape_str(x.shape()));
    for (int64_t k = 0; k < x.dim(); ++k)
      require(k == d || x.shape()[k] == shape[k], "concat",
              "shapes " + shape_str(first.shape()) + " and " + shape_str(x.shape()) + " differ outside dim " + std::to_string(d));
    total += x.shape()[d];
  }
  shape[d] = total;
  // Channels-last inputs (a UNet's skip connections) give a channels-last output: each part is then a
  // copy of [N, H, W, C_i] rows into [N, H, W, C] rows.
  bool channels_last = d == 1 && wants_channels_last(first);
  for (const Tensor& x : xs) channels_last = channels_last && x.is_channels_last();
  Tensor out = channels_last ? Tensor::empty_channels_last(shape, first.dtype(), first.device()) : empty_like_shape(first, shape);
  if (channels_last && backend_of(first).concat_channels_last(out, xs)) return out;
  // Part by part, handed over together: a device may move parts that are plain runs of bytes (a concatenation
  // along the first dimension: a CFG batch's rows) in one launch.
  std::vector<std::pair<Tensor, Tensor>> parts;
  int64_t at = 0;
  for (const Tensor& x : xs) {
    Tensor part = out.narrow(d, at, x.shape()[d]);
    if (x.numel() > 0) parts.emplace_back(channels_last ? nhwc_order(part) : part, channels_last ? nhwc_order(x) : x);
    at += x.shape()[d];
  }
  backend_of(first).copy_many(parts);
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int n, int dim) {
  trace::Scope range("chunk", Category::kOp);
  require_defined(x, "chunk", "x");
  const int d = normalize_dim(dim, x.dim(), "chunk");
  require(n > 0 && x.shape()[d] % n == 0, "chunk",
          "size " + std::to_string(x.shape()[d]) + " of dim " + std::to_string(d) + " is not divisible into " + std::to_string(n) + " parts");
  const int64_t len = x.shape()[d] / n;
  std::vector<Tensor> parts;
  parts.reserve(n);
  for (int i = 0; i < n; ++i) parts.push_back(x.narrow(d, i * len, len));
  return parts;
}

// x [N, C, H, W] -> [N, C, H*f, W*f]: out[.., y, x] = in[.., y/f, x/f], which is torch's nearest mode
// (source index floor(dst * (1/f))). One strided copy: out seen as [N, C, H, f, W, f], the input
// broadcast over the two f dims.
Tensor upsample_nearest2d(const Tensor& x, int factor) {
  trace::Scope range("upsample_nearest2d", Category::kOp);
  require_defined(x, "upsample_nearest2d", "x");
  require(x.dim() == 4, "upsample_nearest2d", "expects x [N, C, H, W], got " + shape_str(x.shape()));
  require(factor >= 1, "upsample_nearest2d", "factor must be a positive integer, got " + std::to_string(factor));
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), f = factor;
  if (x.is_channels_last() && wants_channels_last(x)) {
    // Channels-last stays so (one strided copy)
    Tensor out = Tensor::empty_channels_last({n, c, h * f, w * f}, x.dtype(), x.device());
    if (out.numel() > 0) backend_of(x).upsample_nearest2d_channels_last(out, x, factor);
    return out;
  }
  Tensor out = empty_like_shape(x, {n, c, h * f, w * f});
  if (out.numel() > 0) backend_of(x).upsample_nearest2d(out, x, factor);
  return out;
}

Tensor pad2d(const Tensor& x, int left, int right, int top, int bottom, float value) {
  trace::Scope range("pad2d", Category::kOp);
  require_defined(x, "pad2d", "x");
  require(x.dim() == 4, "pad2d", "expects x [N, C, H, W], got " + shape_str(x.shape()));
  require(left >= 0 && right >= 0 && top >= 0 && bottom >= 0, "pad2d", "negative padding is not supported");
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  Tensor out = empty_like_shape(x, {n, c, h + top + bottom, w + left + right});
  Backend& be = backend_of(x);
  be.fill(out, value);
  Tensor inner = out.narrow(2, top, h).narrow(3, left, w);
  if (x.numel() > 0) be.copy(inner, x);
  return out;
}

Tensor embedding(const Tensor& ids, const Tensor& table) {
  trace::Scope range("embedding", Category::kOp);
  const std::string op = "embedding";
  require_defined(ids, op, "ids");
  require_f32(table, op, "table");
  require_same_device(ids, table, op);
  require(ids.dtype() == DType::I32 || ids.dtype() == DType::I64, op,
          "ids must be i32 or i64, got " + std::string(dtype_name(ids.dtype())));
  require(table.dim() == 2, op, "table must be [V, D], got " + shape_str(table.shape()));
  Tensor flat_ids = contiguous(ids);
  Tensor t = contiguous(table);
  Tensor out = Tensor::empty({flat_ids.numel(), t.size(1)}, t.dtype(), t.device());
  Tensor ids1 = flat_ids.reshape({flat_ids.numel()});
  backend_of(t).embedding(out, ids1, t);
  Shape shape = ids.shape();
  shape.push_back(t.size(1));
  return out.reshape(shape);
}

// --- elementwise ----------------------------------------------------------------------------------

Tensor unary(const Tensor& x, UnaryOp op) {
  trace::Scope range("unary", Category::kOp);
  require_f32(x, "unary", "x");
  Tensor xc = x.is_channels_last() ? x : contiguous(x);
  Tensor out = empty_like_layout(xc, xc.shape());
  if (xc.is_channels_last()) {  // same layout: elementwise over the packed [N, H, W, C] order
    Tensor o = nhwc_order(out);
    backend_of(x).unary(o, nhwc_order(xc), op);
    return out;
  }
  backend_of(x).unary(out, xc, op);
  return out;
}

Tensor binary(const Tensor& a, const Tensor& b, BinaryOp op) {
  trace::Scope range("binary", Category::kOp);
  require_f32(a, "binary", "a");
  require_f32(b, "binary", "b");
  require_same_device(a, b, "binary");
  require(a.dtype() == b.dtype(), "binary", "a and b have different dtypes");
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "binary");
  // The output takes a channels-last operand's layout (residual adds between convolution outputs).
  const Tensor& like = a.is_channels_last() && a.shape() == shape ? a : b;
  Tensor out = empty_like_layout(like, shape);
  const Tensor ab = broadcast_to(a, shape, "binary"), bb = broadcast_to(b, shape, "binary");
  if (out.is_channels_last()) {
    Tensor o = nhwc_order(out);
    backend_of(a).binary(o, nhwc_order(ab), nhwc_order(bb), op);
    return out;
  }
  backend_of(a).binary(out, ab, bb, op);
  return out;
}

Tensor affine(const Tensor& x, float alpha, float beta) {
  trace::Scope range("affine", Category::kOp);
  require_f32(x, "affine", "x");
  Tensor xc = contiguous(x);
  Tensor out = empty_like_shape(xc, xc.shape());
  backend_of(x).lincomb(out, {xc}, {alpha}, 1);
  if (beta == 0.0f) return out;
  // The offset is a second (rare) pass: a broadcast scalar through binary keeps the backend contract small.
  Tensor b = Tensor::full({1}, beta, x.device());
  if (b.dtype() != x.dtype()) b = cast(b, x.dtype());
  Tensor shifted = empty_like_shape(xc, xc.shape());
  backend_of(x).binary(shifted, out, broadcast_to(b, xc.shape(), "affine"), BinaryOp::kAdd);
  return shifted;
}

namespace {
Tensor lincomb_impl(const std::vector<Tensor>& xs, const std::vector<float>& coeffs, bool per_sample, const std::string& op) {
  require(!xs.empty(), op, "no inputs");
  std::vector<Tensor> inputs;
  inputs.reserve(xs.size());
  for (const Tensor& x : xs) {
    require_f32(x, op, "an input");
    require_same_device(xs[0], x, op);
    require(x.shape() == xs[0].shape(), op, "inputs differ in shape: " + shape_str(xs[0].shape()) + " and " + shape_str(x.shape()));
    require(x.dtype() == xs[0].dtype(), op, "inputs differ in dtype");
    inputs.push_back(contiguous(x));
  }
  int rows = 1;
  if (per_sample) {
    require(xs[0].dim() >= 1, op, "per-sample coefficients need inputs with a sample dim");
    rows = int(xs[0].size(0));
  }
  require(coeffs.size() == size_t(rows) * xs.size(), op,
          std::to_string(coeffs.size()) + " coefficients for " + std::to_string(rows) + " sample rows x " + std::to_string(xs.size()) + " inputs");
  Tensor out = empty_like_shape(inputs[0], inputs[0].shape());
  backend_of(out).lincomb(out, inputs, coeffs, rows);
  return out;
}
}  // namespace

Tensor lincomb(const std::vector<Tensor>& xs, const std::vector<float>& coeffs) {
  trace::Scope range("lincomb", Category::kOp);
  return lincomb_impl(xs, coeffs, false, "lincomb");
}

Tensor lincomb_per_sample(const std::vector<Tensor>& xs, const std::vector<float>& coeffs) {
  trace::Scope range("lincomb_per_sample", Category::kOp);
  return lincomb_impl(xs, coeffs, true, "lincomb_per_sample");
}

Tensor glu(const Tensor& x, UnaryOp act) {
  trace::Scope range("glu", Category::kOp);
  if (range.active()) range.set_detail(shape_str(x.shape()));
  require_f32(x, "glu", "x");
  require(x.dim() >= 1 && x.size(-1) % 2 == 0, "glu", "last dim must be even, got " + shape_str(x.shape()));
  Tensor xc = contiguous(x);
  Shape shape = xc.shape();
  shape.back() /= 2;
  Tensor out = empty_like_shape(xc, shape);
  backend_of(x).glu(out, xc, act);
  return out;
}

Tensor softmax(const Tensor& x) {
  trace::Scope range("softmax", Category::kOp);
  require_f32(x, "softmax", "x");
  require(x.dim() >= 1, "softmax", "needs at least one dim");
  Tensor xc = contiguous(x);
  Tensor out = empty_like_shape(xc, xc.shape());
  backend_of(x).softmax(out, xc);
  return out;
}

// --- linear algebra -------------------------------------------------------------------------------

namespace detail {
Tensor rows_view(const Tensor& x) {
  const int64_t k = x.size(-1);
  const int64_t m = k ? x.numel() / k : 0;
  if (x.is_contiguous()) return x.reshape({1, m, k});
  if (x.dim() >= 2 && x.strides().back() == 1) {
    const int64_t rs = x.strides()[x.dim() - 2];
    bool collapses = rs >= k;
    int64_t expect = rs;
    for (int64_t d = x.dim() - 2; d >= 0 && collapses; --d) {
      if (x.shape()[d] != 1 && x.strides()[d] != expect) collapses = false;
      expect *= x.shape()[d];
    }
    if (collapses) return Tensor(x.buffer(), {1, m, k}, {m * rs, rs, 1}, x.dtype(), x.offset());
  }
  return contiguous(x).reshape({1, m, k});
}

void require_destination(const Tensor& into, const Tensor& x, const Shape& shape, const std::string& op) {
  require(into.shape() == shape, op, "the destination " + shape_str(into.shape()) + " must have the result's shape " + shape_str(shape));
  require(into.dtype() == x.dtype(), op, "the destination must have x's dtype");
  require_same_device(x, into, op);
  require(into.is_contiguous(), op, "the destination must be contiguous (e.g. a row range of a larger buffer)");
}

Tensor linear_output(const Tensor& x, const Tensor& w, const char* w_name, const Tensor& b, const Tensor& residual,
                     const std::string& op, float* beta, Tensor* addend, const Tensor& into) {
  const std::string wn = w_name;
  require(x.dim() >= 1 && x.size(-1) == w.size(1), op,
          "x " + shape_str(x.shape()) + " does not match " + wn + " " + shape_str(w.shape()) + " (x [..., in], " + wn +
              " [out, in])");
  if (b.defined()) {
    require_f32(b, op, "b");
    require(b.dim() == 1 && b.size(0) == w.size(0), op, "bias must be [" + std::to_string(w.size(0)) + "], got " + shape_str(b.shape()));
  }
  Shape shape = x.shape();
  shape.back() = w.size(0);
  *beta = 0.0f;
  if (into.defined()) {
    require(!residual.defined(), op, "takes a destination or a residual, not both");
    require_destination(into, x, shape, op);
    return into;
  }
  if (!residual.defined()) return empty_like_shape(x, shape);
  require_f32(residual, op, "residual");
  require(residual.shape() == shape, op, "residual " + shape_str(residual.shape()) + " must have the output's shape " + shape_str(shape));
  *beta = 1.0f;
  if (addend && residual.dtype() == x.dtype()) {  // the GEMM reads the residual where it is and writes a fresh output
    *addend = contiguous(residual);
    return empty_like_shape(x, shape);
  }
  return clone(residual);  // the product accumulates onto it
}
}  // namespace detail

namespace {

// accumulate: `into` holds the residual, and the product is added onto it (beta = 1).
Tensor linear_impl(const Tensor& x, const Tensor& w, const Tensor& b, UnaryOp act, const Tensor& residual, const std::string& op,
                   const Tensor& into = Tensor(), bool accumulate = false) {
  require_f32(x, op, "x");
  require_f32(w, op, "w");
  require_same_device(x, w, op);
  require(w.dim() == 2, op, "w must be [out, in], got " + shape_str(w.shape()));
  GemmParams p;
  Tensor out = linear_output(x, w, "w", b, residual, op, &p.beta, &p.addend, into);
  if (accumulate) p.beta = 1.0f;
  if (p.addend.defined()) p.addend = p.addend.reshape({1, p.addend.numel() / w.size(0), w.size(0)});
  Tensor a = rows_view(x);
  p.trans_b = true;  // w [out, in] is b^T
  Tensor bm = blas_operand(w.unsqueeze(0), &p.trans_b);
  p.epilogue = act;
  Tensor out3 = out.reshape({1, a.size(1), w.size(0)});
  trace::count_flops(gemm_flops(1, a.size(1), w.size(0), w.size(1)));
  backend_of(x).gemm(out3, a, bm, contiguous_opt(b), p);
  return out;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, UnaryOp act) {
  trace::Scope range("linear", Category::kOp);
  if (range.active()) range.set_detail(shape_str(x.shape()) + " x " + shape_str(w.shape()) + "^T");
  return linear_impl(x, w, b, act, Tensor(), "linear");
}

void linear_into(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, UnaryOp act) {
  trace::Scope range("linear", Category::kOp);
  if (range.active()) range.set_detail(shape_str(x.shape()) + " x " + shape_str(w.shape()) + "^T (into a view)");
  require_defined(out, "linear_into", "out");
  linear_impl(x, w, b, act, Tensor(), "linear_into", out);
}

Tensor linear_glu(const Tensor& x, const Tensor& w, const Tensor& b, UnaryOp act) {
  const std::string op = "linear_glu";
  require_defined(x, op, "x");
  require_defined(w, op, "w");
  require(w.dim() == 2 && w.size(0) % 2 == 0, op, "w must be [2H, in] (value rows, then gate rows), got " + shape_str(w.shape()));
  require(x.dim() >= 1 && x.size(-1) == w.size(1), op, "x " + shape_str(x.shape()) + " does not match w " + shape_str(w.shape()));
  require(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), op,
          "bias must be [" + std::to_string(w.size(0)) + "], got " + shape_str(b.shape()));
  const bool one_dtype = w.dtype() == x.dtype() && (!b.defined() || b.dtype() == x.dtype());
  if (one_dtype && x.numel() > 0 && w.size(0) > 0) {
    trace::Scope range("linear_glu", Category::kOp);
    if (range.active()) range.set_detail(shape_str(x.shape()) + " x " + shape_str(w.shape()) + "^T");
    // The backend allocates only where it takes the case: the usual answer (the CPU; CUDA unless
    // ATELIER_FUSED_GLU) costs no buffer and no copy.
    if (Tensor out = backend_of(x).linear_glu(x, w, b, act); out.defined()) {
      trace::count_flops(gemm_flops(1, x.numel() / x.size(-1), w.size(0), w.size(1)));
      return out;
    }
  }
  return glu(linear(x, w, b), act);
}

Tensor linear_residual(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual) {
  trace::Scope range("linear_residual", Category::kOp);
  if (range.active()) range.set_detail(shape_str(x.shape()) + " x " + shape_str(w.shape()) + "^T");
  require_defined(residual, "linear_residual", "residual");
  return linear_impl(x, w, b, UnaryOp::kIdentity, residual, "linear_residual");
}

namespace {
// ATELIER_INPLACE_RESIDUAL=0 reads every residual where it is (for comparisons).
bool in_place_residuals() {
  static const bool on = [] {
    const char* v = std::getenv("ATELIER_INPLACE_RESIDUAL");
    return !v || std::strcmp(v, "0") != 0;
  }();
  return on;
}
}  // namespace

Tensor linear_residual(const Tensor& x, const Tensor& w, const Tensor& b, Tensor&& residual) {
  Tensor res = std::move(residual);  // the caller's handle is gone: only other holders can still see its memory
  require_defined(res, "linear_residual", "residual");
  require_defined(x, "linear_residual", "x");
  Shape shape = x.shape();
  shape.back() = w.dim() == 2 ? w.size(0) : -1;
  const bool sole = in_place_residuals() && res.buffer() && res.buffer().use_count() == 1 && res.is_contiguous();
  if (!sole || res.shape() != shape || res.dtype() != x.dtype() || res.device() != x.device())
    return linear_residual(x, w, b, static_cast<const Tensor&>(res));
  trace::Scope range("linear_residual", Category::kOp);
  if (range.active()) range.set_detail(shape_str(x.shape()) + " x " + shape_str(w.shape()) + "^T (onto the residual)");
  linear_impl(x, w, b, UnaryOp::kIdentity, Tensor(), "linear_residual", res, /*accumulate=*/true);
  return res;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, float alpha) {
  trace::Scope range("matmul", Category::kOp);
  const std::string op = "matmul";
  require_f32(a, op, "a");
  require_f32(b, op, "b");
  require_same_device(a, b, op);
  require((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3), op,
          "expects [B, M, K] or [M, K] operands, got " + shape_str(a.shape()) + " and " + shape_str(b.shape()));
  const bool ta0 = trans_a, tb0 = trans_b;
  Tensor a3 = a.dim() == 2 ? a.unsqueeze(0) : a;
  Tensor b3 = b.dim() == 2 ? b.unsqueeze(0) : b;
  a3 = blas_operand(a3, &trans_a);
  b3 = blas_operand(b3, &trans_b);
  const int64_t ba = a3.size(0), bb = b3.size(0);
  require(ba == bb || ba == 1 || bb == 1, op, "batch sizes " + std::to_string(ba) + " and " + std::to_string(bb) + " do not broadcast");
  const int64_t m = trans_a ? a3.size(2) : a3.size(1);
  const int64_t ka = trans_a ? a3.size(1) : a3.size(2);
  const int64_t kb = trans_b ? b3.size(2) : b3.size(1);
  const int64_t n = trans_b ? b3.size(1) : b3.size(2);
  require(ka == kb, op, "inner dims differ: " + shape_str(a.shape()) + (ta0 ? "^T" : "") + " @ " + shape_str(b.shape()) + (tb0 ? "^T" : ""));
  const int64_t batch = std::max(ba, bb);
  Tensor out = empty_like_shape(a, {batch, m, n});
  GemmParams p;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.alpha = alpha;
  trace::count_flops(gemm_flops(batch, m, n, ka));
  if (range.active()) range.set_detail(shape_str(a.shape()) + (ta0 ? "^T" : "") + " x " + shape_str(b.shape()) + (tb0 ? "^T" : ""));
  backend_of(a).gemm(out, a3, b3, Tensor(), p);
  if (a.dim() == 2 && b.dim() == 2) return out.reshape({m, n});
  return out;
}

namespace detail {

Shape conv2d_output_shape(const Tensor& x, const Shape& xs, const Tensor& w, const Tensor& b, const Conv2dParams& p,
                          const std::string& op) {
  require_f32(x, op, "x");
  require_f32(w, op, "w");
  require_same_device(x, w, op);
  require(xs.size() == 4, op, "x must be [N, C, H, W], got " + shape_str(xs));
  require(w.dim() == 4, op, "w must be [O, C/groups, kh, kw], got " + shape_str(w.shape()));
  require(p.groups >= 1 && p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1 && p.pad_h >= 0 && p.pad_w >= 0,
          op, "groups, strides and dilations must be >= 1 and paddings >= 0");
  const int64_t c = xs[1], o = w.size(0), g = p.groups;
  require(c % g == 0 && o % g == 0, op, "channels " + std::to_string(c) + " in / " + std::to_string(o) + " out not divisible by groups " + std::to_string(g));
  require(w.size(1) == c / g, op, "w " + shape_str(w.shape()) + " does not match x " + shape_str(xs) + " with groups " + std::to_string(g));
  if (b.defined()) {
    require_f32(b, op, "b");
    require(b.dim() == 1 && b.size(0) == o, op, "bias must be [" + std::to_string(o) + "], got " + shape_str(b.shape()));
  }
  const int64_t ekh = int64_t(p.dilation_h) * (w.size(2) - 1) + 1, ekw = int64_t(p.dilation_w) * (w.size(3) - 1) + 1;
  const int64_t hp = xs[2] + 2 * p.pad_h, wp = xs[3] + 2 * p.pad_w;
  require(hp >= ekh && wp >= ekw, op, "kernel " + shape_str(w.shape()) + " larger than the padded input " + shape_str(xs));
  return {xs[0], o, (hp - ekh) / p.stride_h + 1, (wp - ekw) / p.stride_w + 1};
}

void count_conv_flops(const Shape& out, const Tensor& w) {
  trace::count_flops(gemm_flops(out[0], out[1] * out[2], out[3], w.size(1) * w.size(2) * w.size(3)));
}

Tensor conv2d_addend(const Tensor& x, const Tensor& addend, const Shape& out_shape, const std::string& op) {
  if (!addend.defined()) return Tensor();
  require_f32(addend, op, "addend");
  require_same_device(x, addend, op);
  return broadcast_to(addend.dtype() == x.dtype() ? addend : cast(addend, x.dtype()), out_shape, op);
}

void require_group_norm(const Tensor& x, const Shape& shape, int groups, const Tensor& gamma, const Tensor& beta, const std::string& op) {
  require_f32(x, op, "x");
  require(shape.size() >= 2, op, "x must be [N, C, *], got " + shape_str(shape));
  require(groups >= 1 && shape[1] % groups == 0, op, "channels " + std::to_string(shape[1]) + " not divisible by groups " + std::to_string(groups));
  require_affine(gamma, shape[1], op, "gamma");
  require_affine(beta, shape[1], op, "beta");
}

}  // namespace detail

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p, const Tensor& addend) {
  trace::Scope range("conv2d", Category::kOp);
  const std::string op = "conv2d";
  require_defined(x, op, "x");
  const Shape out_shape = conv2d_output_shape(x, x.shape(), w, b, p, op);
  const Tensor add = conv2d_addend(x, addend, out_shape, op);
  const bool channels_last = wants_channels_last(x);
  Tensor out = channels_last ? Tensor::empty_channels_last(out_shape, x.dtype(), x.device()) : empty_like_shape(x, out_shape);
  count_conv_flops(out_shape, w);
  if (range.active()) range.set_detail(shape_str(x.shape()) + " * " + shape_str(w.shape()) + " -> " + shape_str(out.shape()));
  const Tensor xin = channels_last && x.is_channels_last() ? x : contiguous(x);
  backend_of(x).conv2d(out, xin, contiguous(w), contiguous_opt(b), p, add);
  return out;
}

Tensor upsample2x_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p) {
  const std::string op = "upsample2x_conv2d";
  require_defined(x, op, "x");
  require(x.dim() == 4, op, "x must be [N, C, H, W], got " + shape_str(x.shape()));
  const Shape out_shape = conv2d_output_shape(x, {x.size(0), x.size(1), 2 * x.size(2), 2 * x.size(3)}, w, b, p, op);
  const bool upsampler = w.size(2) == 3 && w.size(3) == 3 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 1 && p.pad_w == 1 &&
                         p.dilation_h == 1 && p.dilation_w == 1 && p.groups == 1;
  if (upsampler && x.numel() > 0 && x.is_channels_last() && wants_channels_last(x) && w.dtype() == x.dtype()) {
    trace::Scope range("upsample2x_conv2d", Category::kOp);
    Tensor out = Tensor::empty_channels_last(out_shape, x.dtype(), x.device());
    if (range.active()) range.set_detail(shape_str(x.shape()) + " * " + shape_str(w.shape()) + " -> " + shape_str(out_shape));
    if (backend_of(x).upsample2x_conv2d(out, x, contiguous(w), contiguous_opt(b))) {
      count_conv_flops(out_shape, w);
      return out;
    }
  }
  return conv2d(upsample_nearest2d(x, 2), w, b, p);
}

// --- normalisation --------------------------------------------------------------------------------

namespace detail {
void require_affine(const Tensor& t, int64_t size, const std::string& op, const char* what) {
  if (!t.defined()) return;
  require_f32(t, op, what);
  require(t.numel() == size, op, std::string(what) + " must have " + std::to_string(size) + " elements, got " + shape_str(t.shape()));
}
}  // namespace detail

Tensor group_norm(const Tensor& x, int groups, const Tensor& gamma, const Tensor& beta, float eps, UnaryOp act,
                  const Tensor& offset) {
  trace::Scope range("group_norm", Category::kOp);
  if (range.active())
    range.set_detail(shape_str(x.shape()) + (x.is_channels_last() ? " channels-last" : "") + (offset.defined() ? " + offset" : ""));
  const std::string op = "group_norm";
  require_group_norm(x, x.shape(), groups, gamma, beta, op);
  if (offset.defined()) {
    require_same_device(x, offset, op);
    require(offset.dtype() == x.dtype(), op, "offset must have x's dtype " + std::string(dtype_name(x.dtype())));
    require(offset.dim() == 2 && offset.size(0) == x.size(0) && offset.size(1) == x.size(1), op,
            "offset must be [N, C] = " + shape_str({x.size(0), x.size(1)}) + ", got " + shape_str(offset.shape()));
  }
  Tensor xc = x.is_channels_last() && wants_channels_last(x) ? x : contiguous(x);
  Tensor out = empty_like_layout(xc, xc.shape());
  if (offset.defined()) {
    // The kernels read one sample's channels as a unit-stride run (a narrow of a stacked projection keeps it).
    const Tensor off = offset.strides()[1] == 1 ? offset : contiguous(offset);
    backend_of(x).group_norm_offset(out, xc, off, contiguous_opt(gamma), contiguous_opt(beta), groups, eps, act);
  } else {
    backend_of(x).group_norm(out, xc, contiguous_opt(gamma), contiguous_opt(beta), groups, eps, act);
  }
  return out;
}

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  trace::Scope range("layer_norm", Category::kOp);
  if (range.active()) range.set_detail(shape_str(x.shape()));
  const std::string op = "layer_norm";
  require_f32(x, op, "x");
  require(x.dim() >= 1, op, "x needs at least one dim");
  require_affine(gamma, x.size(-1), op, "gamma");
  require_affine(beta, x.size(-1), op, "beta");
  Tensor xc = contiguous(x);
  Tensor out = empty_like_shape(xc, xc.shape());
  backend_of(x).layer_norm(out, xc, contiguous_opt(gamma), contiguous_opt(beta), eps);
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps) {
  trace::Scope range("rms_norm", Category::kOp);
  const std::string op = "rms_norm";
  require_f32(x, op, "x");
  require(x.dim() >= 1, op, "x needs at least one dim");
  require_affine(gamma, x.size(-1), op, "gamma");
  Tensor xc = contiguous(x);
  Tensor out = empty_like_shape(xc, xc.shape());
  backend_of(x).rms_norm(out, xc, contiguous_opt(gamma), eps);
  return out;
}

namespace {
// norm_modulate's inputs checked (op names the caller), its modulation made contiguous [B, D] / [B, T, D].
NormModulation checked_modulation(const Tensor& x, NormKind kind, const Tensor& gamma, const NormModulation& m,
                                  const std::string& op) {
  require_f32(x, op, "x");
  require(x.dim() == 3, op, "expects x [B, T, D], got " + shape_str(x.shape()));
  const int64_t b = x.size(0), d = x.size(2);
  require(kind != NormKind::kNone || !gamma.defined(), op, "gamma needs a normalisation");
  require_affine(gamma, d, op, "gamma");
  NormModulation mc;
  const auto vec = [&](const Tensor& t, const char* what) {
    if (!t.defined()) return Tensor();
    require_f32(t, op, what);
    require_same_device(x, t, op);
    require(t.dtype() == x.dtype(), op, std::string(what) + " must have x's dtype");
    require(t.numel() == b * d, op, std::string(what) + " must hold [" + std::to_string(b) + ", " + std::to_string(d) +
                                        "] values, got " + shape_str(t.shape()));
    return contiguous(t).reshape({b, d});
  };
  mc.scale = vec(m.scale, "scale");
  mc.shift = vec(m.shift, "shift");
  mc.gate = vec(m.gate, "gate");
  if (m.residual.defined()) {
    require_f32(m.residual, op, "residual");
    require_same_device(x, m.residual, op);
    require(m.residual.shape() == x.shape() && m.residual.dtype() == x.dtype(), op,
            "residual must have x's shape and dtype, got " + shape_str(m.residual.shape()));
    mc.residual = contiguous(m.residual);
  }
  require(!mc.gate.defined() || mc.residual.defined(), op, "a gate needs a residual");
  return mc;
}
}  // namespace

Tensor norm_modulate(const Tensor& x, NormKind kind, float eps, const Tensor& gamma, const NormModulation& m) {
  trace::Scope range("norm_modulate", Category::kOp);
  const NormModulation mc = checked_modulation(x, kind, gamma, m, "norm_modulate");
  Tensor xc = contiguous(x);
  Tensor out = empty_like_shape(xc, xc.shape());
  backend_of(x).norm_modulate(out, xc, kind, eps, contiguous_opt(gamma), mc);
  return out;
}

Fp8Rows norm_modulate_fp8(const Tensor& x, NormKind kind, float eps, const Tensor& gamma, const NormModulation& m, bool keep_values) {
  trace::Scope range("norm_modulate_fp8", Category::kOp);
  const NormModulation mc = checked_modulation(x, kind, gamma, m, "norm_modulate_fp8");
  Tensor xc = contiguous(x);
  const int64_t rows = x.size(0) * x.size(1), d = x.size(2);
  Fp8Rows r{empty_like_shape(xc, xc.shape()), Tensor::empty({rows, d}, DType::F8E4M3, x.device()),
            Tensor::empty({rows}, DType::F32, x.device()), keep_values};
  backend_of(x).norm_modulate_fp8(r.x, r.q, r.scale, xc, kind, eps, contiguous_opt(gamma), mc, keep_values);
  return r;
}

}  // namespace atelier::ops

namespace atelier {
void Backend::group_norm_offset(Tensor& out, const Tensor& x, const Tensor& offset, const Tensor& gamma, const Tensor& beta,
                                int groups, float eps, UnaryOp act) {
  Tensor per_channel = offset;  // [N, C] -> [N, C, 1, ...] with x's rank, broadcast over x's trailing dims
  while (per_channel.dim() < x.dim()) per_channel = per_channel.unsqueeze(per_channel.dim());
  const Tensor sum = ops::add(x, per_channel);  // in x's layout (channels-last stays so), as out is
  group_norm(out, sum, gamma, beta, groups, eps, act);
}
}  // namespace atelier
