// ops::conv2d_with_shortcut: a resnet's second convolution plus its 1x1 shortcut, the one sum the block needs. Where
// the device accumulates both products in one pass (Backend::conv2d_shortcut: the shortcut's k-steps after conv2's
// taps) the shortcut's output is never written nor read back; elsewhere the shortcut runs first and joins conv2's
// output pass as its addend, as the resnet did before this op existed.
#include "backend/ops.h"
#include "backend/ops_internal.h"
#include "core/trace.h"

namespace atelier::ops {

using namespace detail;  // NOLINT: the op API's shared helpers
using trace::Category;

namespace {

// The shortcut is a 1x1 convolution of stride 1 without padding (diffusers' conv_shortcut).
constexpr Conv2dParams kShortcutParams{};

// h [N, C, H, W], w [O, C, kh, kw]; the shortcut's input of shape xs [N, Cs, Ho, Wo] as s1 and s2 side by side along
// channels (s2 undefined: s1 alone), ws [O, Cs, 1, 1] -> [N, O, Ho, Wo]. `separate` computes the shortcut's output the
// usual way (the fallback's addend).
template <class Separate>
Tensor with_shortcut(const Tensor& h, const Tensor& w, const Tensor& b, const Conv2dParams& p, const Shape& xs, const Tensor& s1,
                     const Tensor& s2, const Tensor& ws, const Tensor& bs, Separate&& separate) {
  const std::string op = "conv2d_with_shortcut";
  require_defined(h, op, "h");
  require_defined(s1, op, "x");
  require_same_device(h, s1, op);
  const Shape out_shape = conv2d_output_shape(h, h.shape(), w, b, p, op);
  require(ws.defined() && ws.dim() == 4 && ws.size(2) == 1 && ws.size(3) == 1, op,
          "the shortcut's weight must be a 1x1 kernel [O, Cs, 1, 1], got " + (ws.defined() ? shape_str(ws.shape()) : "none"));
  const Shape shortcut_shape = conv2d_output_shape(s1, xs, ws, bs, kShortcutParams, op);
  require(shortcut_shape == out_shape, op,
          "the shortcut's output " + shape_str(shortcut_shape) + " differs from the convolution's " + shape_str(out_shape));
  const bool in_place = out_shape[0] * out_shape[1] * out_shape[2] * out_shape[3] > 0 && p.groups == 1 && wants_channels_last(h) &&
                        h.is_channels_last() && s1.is_channels_last() && (!s2.defined() || s2.is_channels_last()) &&
                        s1.dtype() == h.dtype() && w.dtype() == h.dtype() && ws.dtype() == h.dtype();
  trace::Scope range("conv2d_with_shortcut", Category::kOp);
  if (range.active())
    range.set_detail(shape_str(h.shape()) + " * " + shape_str(w.shape()) + " + " + shape_str(xs) + " * " + shape_str(ws.shape()) +
                     " -> " + shape_str(out_shape));
  const Tensor wc = contiguous(w), bc = contiguous_opt(b);
  if (!in_place) return conv2d(h, wc, bc, p, separate());
  Tensor out = Tensor::empty_channels_last(out_shape, h.dtype(), h.device());
  count_conv_flops(out_shape, w);
  if (backend_of(h).conv2d_shortcut(out, h, wc, bc, p, s1, s2, contiguous(ws), contiguous_opt(bs))) {
    count_conv_flops(out_shape, ws);
    return out;
  }
  // The device declined: the shortcut's output (its FLOPs counted there) as conv2's addend, into the same output.
  const Tensor addend = conv2d_addend(h, separate(), out_shape, op);
  backend_of(h).conv2d(out, h, wc, bc, p, addend);
  return out;
}

}  // namespace

Tensor conv2d_with_shortcut(const Tensor& h, const Tensor& w, const Tensor& b, const Conv2dParams& p, const Tensor& x,
                            const Tensor& ws, const Tensor& bs) {
  require_defined(x, "conv2d_with_shortcut", "x");
  return with_shortcut(h, w, b, p, x.shape(), x, Tensor(), ws, bs, [&] { return conv2d(x, ws, bs, kShortcutParams); });
}

// x's parts go to the device where the concatenation is not written yet (its group norm read them in place);
// otherwise the concatenation is the one input.
Tensor conv2d_with_shortcut(const Tensor& h, const Tensor& w, const Tensor& b, const Conv2dParams& p, const ChannelConcat& x,
                            const Tensor& ws, const Tensor& bs) {
  const auto separate = [&] { return conv2d(x, ws, bs, kShortcutParams); };
  if (x.is_joined()) return with_shortcut(h, w, b, p, x.shape(), x.joined(), Tensor(), ws, bs, separate);
  return with_shortcut(h, w, b, p, x.shape(), x.first(), x.second(), ws, bs, separate);
}

}  // namespace atelier::ops
