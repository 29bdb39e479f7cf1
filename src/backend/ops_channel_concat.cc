// ops::ChannelConcat and the ops that read its two parts where they lie (group_norm, conv2d): a UNet's skip
// concatenation, whose only readers are a resnet's first norm and its 1x1 shortcut convolution, need never be
// written where the device reads both parts itself (Backend::group_norm_concat, Backend::conv2d_concat). Elsewhere
// the concatenation is made once (ChannelConcat::joined) and the ops read it as a plain tensor.
#include "backend/ops.h"
#include "backend/ops_internal.h"
#include "core/trace.h"

namespace atelier::ops {

using namespace detail;  // NOLINT: the op API's shared helpers
using trace::Category;

namespace {

// Whether the device may read the parts in place: both channels-last where the device wants that layout (the
// backends' two-source kernels read channels-last rows), and nothing joined yet (a reader that had the parts
// concatenated leaves the others the concatenation: reading it costs no more).
bool parts_in_place(const ChannelConcat& x) {
  return !x.is_joined() && wants_channels_last(x.first()) && x.first().is_channels_last() && x.second().is_channels_last();
}

}  // namespace

ChannelConcat::ChannelConcat(Tensor first, Tensor second) : first_(std::move(first)), second_(std::move(second)) {
  const std::string op = "ChannelConcat";
  require_defined(first_, op, "first");
  require_defined(second_, op, "second");
  require_same_device(first_, second_, op);
  require(first_.dtype() == second_.dtype(), op, "the parts have different dtypes");
  require(first_.dim() == 4 && second_.dim() == 4, op,
          "parts must be [N, C, H, W], got " + shape_str(first_.shape()) + " and " + shape_str(second_.shape()));
  require(first_.size(0) == second_.size(0) && first_.size(2) == second_.size(2) && first_.size(3) == second_.size(3), op,
          "parts " + shape_str(first_.shape()) + " and " + shape_str(second_.shape()) + " differ outside the channels");
  shape_ = {first_.size(0), first_.size(1) + second_.size(1), first_.size(2), first_.size(3)};
}

const Tensor& ChannelConcat::joined() const {
  if (!joined_.defined()) joined_ = concat({first_, second_}, 1);
  return joined_;
}

// x [N, C1 + C2, H, W] as two parts -> [N, C1 + C2, H, W]
Tensor group_norm(const ChannelConcat& x, int groups, const Tensor& gamma, const Tensor& beta, float eps, UnaryOp act) {
  if (parts_in_place(x)) {
    trace::Scope range("group_norm", Category::kOp);
    if (range.active()) range.set_detail(shape_str(x.first().shape()) + " + " + shape_str(x.second().shape()) + " channels-last, in place");
    const std::string op = "group_norm";
    require_group_norm(x.first(), x.shape(), groups, gamma, beta, op);
    Tensor out = Tensor::empty_channels_last(x.shape(), x.first().dtype(), x.first().device());
    if (backend_of(x.first()).group_norm_concat(out, x.first(), x.second(), contiguous_opt(gamma), contiguous_opt(beta), groups, eps, act))
      return out;
  }
  return group_norm(x.joined(), groups, gamma, beta, eps, act);
}

// x [N, C1 + C2, H, W] as two parts, w [O, C1 + C2, kh, kw] -> [N, O, Ho, Wo]
Tensor conv2d(const ChannelConcat& x, const Tensor& w, const Tensor& b, const Conv2dParams& p, const Tensor& addend) {
  if (parts_in_place(x) && p.groups == 1) {
    trace::Scope range("conv2d", Category::kOp);
    const std::string op = "conv2d";
    const Shape out_shape = conv2d_output_shape(x.first(), x.shape(), w, b, p, op);
    const Tensor add = conv2d_addend(x.first(), addend, out_shape, op);
    Tensor out = Tensor::empty_channels_last(out_shape, x.first().dtype(), x.first().device());
    if (range.active())
      range.set_detail(shape_str(x.first().shape()) + " + " + shape_str(x.second().shape()) + " * " + shape_str(w.shape()) + " -> " +
                       shape_str(out_shape) + ", in place");
    if (backend_of(x.first()).conv2d_concat(out, x.first(), x.second(), contiguous(w), contiguous_opt(b), p, add)) {
      count_conv_flops(out_shape, w);
      return out;
    }
  }
  return conv2d(x.joined(), w, b, p, addend);
}

}  // namespace atelier::ops
