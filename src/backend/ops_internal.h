// Helpers of the op API front end shared by its source files (ops.cc and the op families split from it,
// e.g. ops_fp8.cc): validation that throws atelier::Error with an invalid-argument Status, and the views the
// backends expect. Not part of the op API: model code includes backend/ops.h only.
#pragma once
#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace atelier::ops::detail {

// FLOPs as torch's FlopCounterMode counts them: 2 per multiply-add (see core/trace.h).
uint64_t gemm_flops(int64_t batch, int64_t m, int64_t n, int64_t k);
[[noreturn]] void fail(const std::string& op, const std::string& msg);
void require(bool cond, const std::string& op, const std::string& msg);
void require_defined(const Tensor& x, const std::string& op, const char* what);
// A compute dtype: f32 on the CPU; f32, f16 or bf16 on CUDA.
void require_f32(const Tensor& x, const std::string& op, const char* what);
void require_same_device(const Tensor& a, const Tensor& b, const std::string& op);
Backend& backend_of(const Tensor& x);
Tensor empty_like_shape(const Tensor& x, const Shape& shape);
// Contiguous unless the optional tensor is undefined.
Tensor contiguous_opt(const Tensor& x);
// Image activations channels-last (Backend::prefers_channels_last): whether x's device wants 4-D tensors of
// x's dtype in that layout; a new tensor of `shape` in x's layout (channels-last when x is and has that
// shape, else contiguous); an [N, C, H, W] view as [N, H, W, C] (contiguous when x is channels-last), in
// which the strided kernels see long unit-stride runs.
bool wants_channels_last(const Tensor& x);
Tensor empty_like_layout(const Tensor& x, const Shape& shape);
Tensor nhwc_order(const Tensor& x);
// x [..., in] -> [1, M, in]: a view when the leading dims collapse into one row index with a unit inner
// stride (e.g. a narrow of the last dim of a contiguous tensor), else a packed copy.
Tensor rows_view(const Tensor& x);
// What every linear layer checks and allocates, whatever its weight's storage: x [..., in] against w [out, in]
// (named w_name in messages), the optional bias [out] and residual [..., out]; returns the output [..., out],
// a copy of the residual (the product accumulates onto it: *beta = 1) or a fresh tensor in x's dtype (*beta = 0).
// With `addend` given, a residual is not copied: *addend is the residual (contiguous) for GemmParams::addend and
// the output is a fresh tensor.
// With `into` defined (and no residual), that tensor is checked (contiguous, the output's shape, x's dtype and
// device) and returned instead of a fresh one: the *_into ops.
Tensor linear_output(const Tensor& x, const Tensor& w, const char* w_name, const Tensor& b, const Tensor& residual,
                     const std::string& op, float* beta, Tensor* addend = nullptr, const Tensor& into = Tensor());
// Checks that `into` can take an op's result of `shape` like x's (contiguous, x's dtype and device).
void require_destination(const Tensor& into, const Tensor& x, const Shape& shape, const std::string& op);
// x (any rank <= shape's) viewed with `shape` by numpy broadcasting: missing leading dims and size-1 dims get
// stride 0.
Tensor broadcast_to(const Tensor& x, const Shape& shape, const std::string& op);
// x [B, S, H*D] with unit last stride -> [B, H, S, D] view (no copy).
Tensor split_heads(const Tensor& x, int64_t heads, const std::string& op);
// An optional affine parameter (gamma, beta): undefined, or `size` values in a compute dtype.
void require_affine(const Tensor& t, int64_t size, const std::string& op, const char* what);

// conv2d's operands checked for an input of shape xs (x's own, the upsampled one, a ChannelConcat's) -> the output's
// shape; and its FLOPs counted (every output element a dot product over (C/g) * kh * kw inputs).
Shape conv2d_output_shape(const Tensor& x, const Shape& xs, const Tensor& w, const Tensor& b, const Conv2dParams& p,
                          const std::string& op);
void count_conv_flops(const Shape& out, const Tensor& w);
// conv2d's optional addend (x's device, a compute dtype) in x's dtype, broadcast to the output's shape.
Tensor conv2d_addend(const Tensor& x, const Tensor& addend, const Shape& out_shape, const std::string& op);
// group_norm's operands checked for an input like x (dtype) of `shape` [N, C, *].
void require_group_norm(const Tensor& x, const Shape& shape, int groups, const Tensor& gamma, const Tensor& beta, const std::string& op);

}  // namespace atelier::ops::detail
