// For backend kernels that take contiguous (NCHW) tensors only, given an operand in another layout (a
// channels-last activation, Backend::prefers_channels_last): the computation runs on packed copies.
#pragma once
#include <utility>

#include "backend/backend.h"

namespace atelier {

// Calls fn(out', x') where x' is x, or a packed copy of it when x is not contiguous, and out' is out, or a packed
// temporary copied into out afterwards when out is not contiguous. Copies go through `be` (x and out's device).
template <typename Fn>
void through_packed(Backend& be, Tensor& out, const Tensor& x, Fn&& fn) {
  Tensor xc = x;
  if (!x.is_contiguous()) {
    xc = Tensor::empty(x.shape(), x.dtype(), x.device());
    be.copy(xc, x);
  }
  Tensor oc = out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
  std::forward<Fn>(fn)(oc, xc);
  if (oc.raw() != out.raw()) be.copy(out, oc);
}

}  // namespace atelier
