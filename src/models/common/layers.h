// Typed building blocks for model definitions. Field names follow checkpoint keys (weight, bias), so a
// model struct reads like its state dict; the forward passes call only the op API (backend/ops.h).
#pragma once
#include <array>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/ops.h"

namespace atelier {

// residual + gate * y (residual, y [B, N, D]; gate [B, 1, D]): an adaLN block's gated residual, one pass.
inline Tensor gated_add(const Tensor& residual, const Tensor& gate, const Tensor& y) {
  NormModulation m;
  m.gate = gate;
  m.residual = residual;
  return ops::norm_modulate(y, NormKind::kNone, 0.0f, Tensor(), m);
}

struct Linear {
  Tensor weight;        // [out, in]; f8e4m3 once quantized (quantize_fp8)
  Tensor bias;          // [out] or undefined
  Tensor weight_scale{};  // [out] f32 row scales of an f8e4m3 weight; undefined otherwise
  // x [..., in] -> [..., out]
  Tensor operator()(const Tensor& x, UnaryOp act = UnaryOp::kIdentity) const {
    return (*this)(ops::Fp8Rows{x, Tensor(), Tensor()}, act);
  }
  // The same from x's rows quantized already (ops::Fp8Rows: one quantization for several FP8 layers that read
  // x; quantized here when they are not); a layer not in FP8 reads x itself.
  Tensor operator()(const ops::Fp8Rows& x, UnaryOp act = UnaryOp::kIdentity) const {
    if (is_fp8()) return ops::linear_fp8(x, weight, weight_scale, bias, act);
    ATELIER_CHECK(x.x_values, "a layer not in FP8 was given rows whose activations were never written (Fp8Rows::x_values)");
    return ops::linear(x.x, weight, bias, act);
  }
  // The same written into `out` (contiguous [..., out]: e.g. rows of a buffer that several layers fill).
  void into(Tensor& out, const ops::Fp8Rows& x, UnaryOp act = UnaryOp::kIdentity) const {
    if (is_fp8()) return ops::linear_fp8_into(out, x, weight, weight_scale, bias, act);
    ops::linear_into(out, x.x, weight, bias, act);
  }
  // x [..., in] -> [..., out / 2] = value * act(gate), the layer's outputs split in halves (GEGLU with kGelu):
  // one kernel where the backend has one (ops::linear_glu), so the [..., out] product is not written.
  Tensor glu(const Tensor& x, UnaryOp act) const {
    if (is_fp8()) return ops::glu((*this)(x), act);
    return ops::linear_glu(x, weight, bias, act);
  }
  // x [..., in] -> residual + x @ weight^T + bias, residual [..., out] (one fused epilogue).
  Tensor with_residual(const Tensor& x, const Tensor& residual) const {
    if (is_fp8()) return ops::linear_fp8(x, weight, weight_scale, bias, UnaryOp::kIdentity, residual);
    return ops::linear_residual(x, weight, bias, residual);
  }
  // The same with the residual given up: accumulated onto in place where nothing else shares its buffer
  // (ops::linear_residual's overload), e.g. a block's hidden state h = to_out.with_residual(a, std::move(h)).
  Tensor with_residual(const Tensor& x, Tensor&& residual) const {
    if (is_fp8()) return ops::linear_fp8(x, weight, weight_scale, bias, UnaryOp::kIdentity, residual);
    return ops::linear_residual(x, weight, bias, std::move(residual));
  }
  // out [..., out] += x [..., in] @ weight^T (the bias is not added): in place for an FP8 layer (its GEMM
  // accumulates onto out) and where nothing but `out` holds its buffer, else out becomes a fresh
  // linear_residual output (the residual read where it is). The same values either way as with_residual(x, out)
  // without the bias.
  void accumulate_into(Tensor& out, const ops::Fp8Rows& x) const {
    if (is_fp8()) return ops::linear_fp8_accumulate(out, x, weight, weight_scale);
    ATELIER_CHECK(x.x_values, "a layer not in FP8 was given rows whose activations were never written (Fp8Rows::x_values)");
    out = ops::linear_residual(x.x, weight, Tensor(), std::move(out));
  }
  // residual + gate * layer(x) (residual [B, N, out], gate [B, 1, out]): an adaLN block's gated residual
  // branch. The residual is taken: an FP8 layer may accumulate onto its memory in place with the gate folded
  // into the product (ops::linear_fp8_gated_residual); else the layer's output and one gated-residual pass.
  Tensor gated_residual(Tensor&& residual, const Tensor& gate, const ops::Fp8Rows& x) const {
    if (is_fp8()) return ops::linear_fp8_gated_residual(std::move(residual), x, weight, weight_scale, bias, gate);
    return gated_add(residual, gate, (*this)(x));
  }
  // The layer restricted to inputs [start, start + n) (a view of the weight's columns), without the bias:
  // a product over concatenated inputs as a sum of products over the parts.
  Linear input_columns(int64_t start, int64_t n) const { return Linear{weight.narrow(1, start, n), Tensor(), weight_scale}; }
  // Outputs [start, start + n) (a view of the weight's rows): the parts of a fused projection.
  Linear output_rows(int64_t start, int64_t n) const {
    return Linear{weight.narrow(0, start, n), bias.defined() ? bias.narrow(0, start, n) : Tensor(),
                  weight_scale.defined() ? weight_scale.narrow(0, start, n) : Tensor()};
  }
  // Replaces the weight with its row-wise FP8 quantization (ops::quantize_rows_fp8): half the bytes of bf16,
  // and products on FP8 tensor cores where the device has them. The bias stays in the compute dtype.
  void quantize_fp8() {
    if (!weight.defined() || is_fp8()) return;
    std::tie(weight, weight_scale) = ops::quantize_rows_fp8(weight);
  }
  bool is_fp8() const { return weight.defined() && weight.dtype() == DType::F8E4M3; }
  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }
};

struct Conv2d {
  Tensor weight;  // [out, in/groups, kh, kw]
  Tensor bias;    // [out] or undefined
  Conv2dParams params;
  // x [N, in, H, W] -> [N, out, Ho, Wo] (+ addend broadcastable to it: a per-sample [N, out, 1, 1] bias or a
  // residual, added in the convolution's output pass)
  Tensor operator()(const Tensor& x, const Tensor& addend = {}) const { return ops::conv2d(x, weight, bias, params, addend); }
  // The same of two inputs side by side along channels (a skip concatenation, read where its parts lie)
  Tensor operator()(const ops::ChannelConcat& x, const Tensor& addend = {}) const { return ops::conv2d(x, weight, bias, params, addend); }
  // h [N, in, H, W] -> [N, out, Ho, Wo] plus `shortcut` (a 1x1 convolution) of x [N, Cs, Ho, Wo] (a tensor or two
  // parts side by side): a resnet's second convolution and its shortcut in one op (ops::conv2d_with_shortcut)
  template <class X>
  Tensor with_shortcut(const Tensor& h, const Conv2d& shortcut, const X& x) const {
    return ops::conv2d_with_shortcut(h, weight, bias, params, x, shortcut.weight, shortcut.bias);
  }
  // x [N, in, H, W] -> [N, out, Ho, Wo] of x upsampled 2x (nearest): an upsampler (ops::upsample2x_conv2d)
  Tensor upsampled2x(const Tensor& x) const { return ops::upsample2x_conv2d(x, weight, bias, params); }
};

struct GroupNorm {
  Tensor weight, bias;  // [C]
  int groups = 32;
  float eps = 1e-5f;
  // x [N, C, *] -> same; act fused after the affine (GroupNorm + SiLU in resnets); offset [N, C] optional, added
  // to x per (sample, channel) before the norm (ops::group_norm)
  Tensor operator()(const Tensor& x, UnaryOp act = UnaryOp::kIdentity, const Tensor& offset = {}) const {
    return ops::group_norm(x, groups, weight, bias, eps, act, offset);
  }
  // The same of two inputs side by side along channels (a skip concatenation, read where its parts lie)
  Tensor operator()(const ops::ChannelConcat& x, UnaryOp act = UnaryOp::kIdentity) const {
    return ops::group_norm(x, groups, weight, bias, eps, act);
  }
};

struct LayerNorm {
  Tensor weight, bias;  // [D]
  float eps = 1e-5f;
  // x [..., D] -> same
  Tensor operator()(const Tensor& x) const { return ops::layer_norm(x, weight, bias, eps); }
};

struct RMSNorm {
  Tensor weight;  // [D]
  float eps = 1e-6f;
  Tensor operator()(const Tensor& x) const { return ops::rms_norm(x, weight, eps); }
};

// The rows of `parts` stacked into `stacked` (one GEMM gives every part's outputs), each part then a view of
// its rows: a view of the parts' own buffer where they already lie there in order (a fused checkpoint
// tensor: no copy), else a concatenation (the parts' own tensors are freed). Returns false, changing
// nothing, where stacking does not apply: a part unbound or in FP8 (a file's per-tensor scales), biases on
// some parts only, widths or dtypes that differ.
bool stack_linears(Linear& stacked, const std::vector<Linear*>& parts);
// Each part a view of its rows of `stacked` again (after stacked.quantize_fp8(), say), in order.
void point_into(const Linear& stacked, const std::vector<Linear*>& parts);
// `--dtype fp8` on a stacked projection: quantized as one (per-row scales: the same bytes as its parts
// apart) and its parts pointed into it again; where it is unbound (not stacked), each part on its own.
void quantize_stacked(Linear& stacked, const std::vector<Linear*>& parts);

// x [B, N, in] -> q, k, v as heads [B, N, H, D]: views of one [B, N, 3, H, D] output where `qkv` (the three
// stacked) is bound, else three GEMMs.
std::array<Tensor, 3> qkv_heads(const Linear& qkv, const Linear& q, const Linear& k, const Linear& v, const ops::Fp8Rows& x,
                                int64_t heads);
inline std::array<Tensor, 3> qkv_heads(const Linear& qkv, const Linear& q, const Linear& k, const Linear& v, const Tensor& x,
                                       int64_t heads) {
  return qkv_heads(qkv, q, k, v, ops::Fp8Rows{x, Tensor(), Tensor()}, heads);
}
// ops::norm_modulate of x (x [B, T, D]) as ops::Fp8Rows for the layers that read it: where any of them is in
// FP8, its rows quantized in the same pass (ops::norm_modulate_fp8), else not quantized.
ops::Fp8Rows norm_modulate_for(const Tensor& x, NormKind kind, float eps, const Tensor& gamma, const NormModulation& m,
                               const std::vector<const Linear*>& readers);

// Heads-merged attention q [B, H, Sq, D], k/v [B, H, Sk, D] -> [B, Sq, H*D] as the input of the projections
// that read it. With fp8 (DiT blocks under --dtype fp8): q, k, v in FP8 (with q/k bounds where known) and the
// result's rows in e4m3 too (ops::attention_merged_fp8_rows: cuDNN's e4m3 output itself where it ran); else
// ops::attention_merged, not quantized.
// x_values false: only FP8 layers read the result (the 16-bit values are then not written where the backend
// hands over its e4m3 rows: Fp8Rows::x_values).
inline ops::Fp8Rows attention_rows_for(bool fp8, const Tensor& q, const Tensor& k, const Tensor& v, const Fp8Bounds& bounds = {},
                                       bool x_values = true) {
  if (fp8) return ops::attention_merged_fp8_rows(q, k, v, 0.0f, bounds, x_values);
  return {ops::attention_merged(q, k, v), Tensor(), Tensor()};
}
// The same of rope(qx) and rope(kx) (qx, kx [B, H, S, D] before their rope, positions along dim 2, each with
// its RMS norm): with fp8, ops::rope_attention_merged_fp8_rows (bounded q and k may go to e4m3 straight from
// the rope pass, never written in 16 bits).
inline ops::Fp8Rows rope_attention_rows_for(bool fp8, const Tensor& qx, const Tensor& kx, const Tensor& v, const Tensor& cos,
                                            const Tensor& sin, const RopeRms& rms_q, const RopeRms& rms_k, const Fp8Bounds& bounds = {},
                                            bool x_values = true) {
  if (fp8) return ops::rope_attention_merged_fp8_rows(qx, kx, v, cos, sin, rms_q, rms_k, bounds, x_values);
  return attention_rows_for(false, ops::rope(qx, cos, sin, 2, rms_q), ops::rope(kx, cos, sin, 2, rms_k), v, bounds, x_values);
}
// The same with q and k roped in runs of positions, each with its norm (a joint attention's streams: ops::rope_runs).
inline ops::Fp8Rows rope_attention_rows_for(bool fp8, const Tensor& qx, const Tensor& kx, const Tensor& v, const Tensor& cos,
                                            const Tensor& sin, const std::vector<RopeRmsRun>& q_runs,
                                            const std::vector<RopeRmsRun>& k_runs, const Fp8Bounds& bounds = {},
                                            bool x_values = true) {
  if (fp8) return ops::rope_attention_merged_fp8_rows(qx, kx, v, cos, sin, q_runs, k_runs, bounds, x_values);
  return attention_rows_for(false, ops::rope_runs(qx, cos, sin, q_runs), ops::rope_runs(kx, cos, sin, k_runs), v, bounds, x_values);
}
// Tokens [start, start + n) of r (x [B, N, C], rows [B*N, C]): views where B is 1 (its rows lie together),
// else x's tokens alone (their rows are quantized again by the layer that reads them).
ops::Fp8Rows token_rows(const ops::Fp8Rows& r, int64_t start, int64_t n);

// An upper bound of |x| for x RMS-normed over rows of `dim` elements with `norm`'s weight and then rotated
// (rope): sqrt(dim) * max|gamma| (a row's whole energy in one pair), with room for the 16-bit roundings of the
// norm and the rotation (< 1.2%); Fp8Bounds for FP8 attention. Reads the weight to the host: call it once, at
// load or quantization time, not in a forward pass.
float rms_rope_bound(const RMSNorm& norm, int64_t dim);

// ops::rope's RMS prologue for a q/k norm (null: none; an unbound weight: no gamma).
inline RopeRms rope_rms(const RMSNorm* n) { return n ? RopeRms{true, n->weight, n->eps} : RopeRms{}; }

struct Embedding {
  Tensor weight;  // [V, D]
  // ids [N] -> [N, D]
  Tensor operator()(const Tensor& ids) const { return ops::embedding(ids, weight); }
};

}  // namespace atelier
