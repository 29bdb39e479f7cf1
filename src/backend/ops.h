// The op API that model code is written against. Every function validates its inputs (shape, dtype,
// device), allocates the output on the inputs' device and calls that device's Backend. Model code never
// asks which backend it runs on. Shapes are given next to each function; "..." is any number of leading dims.
#pragma once
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace atelier::ops {

// --- layout ---------------------------------------------------------------------------------------
Tensor contiguous(const Tensor& x);                 // packed copy unless already contiguous
Tensor clone(const Tensor& x);                      // always a packed copy
Tensor cast(const Tensor& x, DType dtype);          // packed copy in another dtype
Tensor to_device(const Tensor& x, Device dev);
// [...] views -> one tensor; all inputs equal but along `dim`.
Tensor concat(const std::vector<Tensor>& xs, int dim);
// Two images side by side along channels, first [N, C1, H, W] and second [N, C2, H, W] as [N, C1 + C2, H, W]
// (a UNet's skip concatenation), for the ops that can read the parts where they lie: group_norm and conv2d below.
// Their only readers in a UNet, so the concatenation need never be written; joined() writes it (ops::concat) at
// the first reader that needs it (a device that cannot read the parts, the residual of a block without a
// shortcut convolution) and keeps it for the others.
class ChannelConcat {
 public:
  ChannelConcat(Tensor first, Tensor second);  // same device, dtype, N, H and W (checked)
  const Tensor& first() const { return first_; }
  const Tensor& second() const { return second_; }
  const Shape& shape() const { return shape_; }
  int64_t size(int d) const { return shape_[size_t(d)]; }
  const Tensor& joined() const;
  bool is_joined() const { return joined_.defined(); }

 private:
  Tensor first_, second_;
  Shape shape_;
  mutable Tensor joined_;
};
// Views: `n` equal parts along `dim` (size must divide).
std::vector<Tensor> chunk(const Tensor& x, int n, int dim);
// x [N, C, H, W] -> [N, C, H*f, W*f], nearest neighbour (torch's interpolate(mode="nearest")).
Tensor upsample_nearest2d(const Tensor& x, int factor);
// x [N, C, H, W] -> [N, C, H+top+bottom, W+left+right], constant padding.
Tensor pad2d(const Tensor& x, int left, int right, int top, int bottom, float value = 0.0f);
// ids [N] (i32/i64), table [V, D] -> [N, D]
Tensor embedding(const Tensor& ids, const Tensor& table);

// --- elementwise ----------------------------------------------------------------------------------
Tensor unary(const Tensor& x, UnaryOp op);
inline Tensor silu(const Tensor& x) { return unary(x, UnaryOp::kSilu); }
inline Tensor gelu(const Tensor& x) { return unary(x, UnaryOp::kGelu); }
inline Tensor gelu_tanh(const Tensor& x) { return unary(x, UnaryOp::kGeluTanh); }
inline Tensor quick_gelu(const Tensor& x) { return unary(x, UnaryOp::kQuickGelu); }
// numpy-style broadcasting of a and b.
Tensor binary(const Tensor& a, const Tensor& b, BinaryOp op);
inline Tensor add(const Tensor& a, const Tensor& b) { return binary(a, b, BinaryOp::kAdd); }
inline Tensor sub(const Tensor& a, const Tensor& b) { return binary(a, b, BinaryOp::kSub); }
inline Tensor mul(const Tensor& a, const Tensor& b) { return binary(a, b, BinaryOp::kMul); }
inline Tensor div(const Tensor& a, const Tensor& b) { return binary(a, b, BinaryOp::kDiv); }
// alpha * x + beta
Tensor affine(const Tensor& x, float alpha, float beta = 0.0f);
// sum_i c[i] * xs[i]; all xs the same shape.
Tensor lincomb(const std::vector<Tensor>& xs, const std::vector<float>& coeffs);
// Per-sample coefficients: xs [S, ...], coeffs row-major [S, xs.size()].
Tensor lincomb_per_sample(const std::vector<Tensor>& xs, const std::vector<float>& coeffs);
// --- diffusion glue (ops_diffusion.cc): a device may fuse each into one kernel, with the same bits ---
// Classifier-free guidance: cond, uncond [S, ...] f32, scales [S] -> uncond + scales[s] * (cond - uncond) per row s,
// rounded as diffusers' three ops round it (one kernel, no upload of the scales).
Tensor guidance_combine(const Tensor& cond, const Tensor& uncond, const std::vector<float>& scales);
// A UNet's sinusoidal timestep features: t [rows] or [1] f32, freqs [half] (any shape of half values) f32 ->
// [rows, dim] in `dtype`: sin(t * freq) then cos(t * freq) (cos first with flip_sin_to_cos), zeros past 2 * half;
// products and functions in f32 as ops::mul and ops::unary compute them, then rounded to dtype once.
Tensor timestep_features(const Tensor& t, const Tensor& freqs, bool flip_sin_to_cos, int64_t dim, int64_t rows, DType dtype);
// x [..., 2H] -> [..., H] = first half * act(second half)  (GEGLU: act = kGelu)
Tensor glu(const Tensor& x, UnaryOp act);
// softmax over the last dim
Tensor softmax(const Tensor& x);

// --- linear algebra -------------------------------------------------------------------------------
// x [..., in], w [out, in], b [out] (optional) -> [..., out]; act fused after the bias.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = {}, UnaryOp act = UnaryOp::kIdentity);
// x [..., in], w [2H, in] (value rows, then gate rows), b [2H] optional -> [..., H] = glu(linear(x, w, b), act):
// (x w[:H]^T + b[:H]) * act(x w[H:]^T + b[H:]) (GEGLU with kGelu), in one kernel where the backend has one
// (Backend::linear_glu: the [..., 2H] product is then never written).
Tensor linear_glu(const Tensor& x, const Tensor& w, const Tensor& b, UnaryOp act);
// Same plus a residual of the output's shape: x @ w^T + b + residual (fused epilogue).
Tensor linear_residual(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual);
// The same with the residual given up by the caller: where no other tensor shares its buffer (contiguous, x's
// dtype), the product accumulates onto it in place and the result is that buffer. cuBLASLt's products that
// accumulate onto their output run at the plain product's speed, those that read a separate residual up to 2x
// slower (docs/performance.md, session 26); a residual that is still shared is read where it is, as above.
Tensor linear_residual(const Tensor& x, const Tensor& w, const Tensor& b, Tensor&& residual);
// linear(x, w, b, act) written into `out` (contiguous, the result's shape, x's dtype and device): e.g. a row
// range of a larger buffer that several projections fill, so that no concatenation copies them together.
void linear_into(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b = {}, UnaryOp act = UnaryOp::kIdentity);
// a [B, M, K] or [M, K], b [B, K, N] or [K, N] (transposes as flagged) -> [B, M, N]; batch 1 broadcasts.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false, float alpha = 1.0f);
// --- FP8 (e4m3) linear layers -----------------------------------------------------------------------
// w [R, C] (any float dtype, unit last stride) -> (q [R, C] f8e4m3, scale [R] f32) on w's device: each row
// scaled by f8e4m3_scale of its own amax, a power of two ("row-wise" scaling: the output channels of a weight,
// the tokens of an activation), so q * scale[r] stands for row r to within e4m3's 3 mantissa bits.
std::pair<Tensor, Tensor> quantize_rows_fp8(const Tensor& w);
// x [..., in] in the compute dtype, w8 [out, in] f8e4m3 with per-row ws [out] f32 (quantize_rows_fp8; w8 may
// be a column view of a wider weight), b [out] optional -> [..., out] in x's dtype: x is quantized per row on
// the fly, the product accumulates in f32 and is rescaled by both row scales; act fused after the bias, an
// optional residual (the output's shape) added as linear_residual does.
Tensor linear_fp8(const Tensor& x, const Tensor& w8, const Tensor& ws, const Tensor& b = {},
                  UnaryOp act = UnaryOp::kIdentity, const Tensor& residual = {});
// An activation x [..., in] with its rows quantized as linear_fp8 quantizes them (q [m, in] f8e4m3, scale [m]
// f32, m = rows of x), once for several FP8 products that read x; q undefined: not quantized (yet).
// x_values false: x gives the shape, dtype and device only (its values were never written: an op skipped the
// pass because only FP8 products read the rows); a layer that would read x then refuses.
struct Fp8Rows {
  Tensor x, q, scale;
  bool x_values = true;
};
Fp8Rows quantize_activation_fp8(const Tensor& x);
// linear_fp8 from rows quantized already (quantized here when x.q is undefined): the same values.
Tensor linear_fp8(const Fp8Rows& x, const Tensor& w8, const Tensor& ws, const Tensor& b = {},
                  UnaryOp act = UnaryOp::kIdentity, const Tensor& residual = {});
// linear_fp8 into `out`, as linear_into.
void linear_fp8_into(Tensor& out, const Fp8Rows& x, const Tensor& w8, const Tensor& ws, const Tensor& b = {},
                     UnaryOp act = UnaryOp::kIdentity);
// out [..., out] += x [..., in] @ w8^T (ws its row scales; no bias, no activation), in place: linear_fp8 with
// out as its residual, without the residual's copy (the product accumulates onto out where it is).
void linear_fp8_accumulate(Tensor& out, const Fp8Rows& x, const Tensor& w8, const Tensor& ws);
// residual + gate * linear_fp8(x, w8, ws, b): an adaLN block's gated residual branch (residual [B, N, out]
// contiguous or not, gate [B, 1, out] or [B, out] in residual's dtype). The residual is taken (moved in): where
// nothing else holds its memory and the backend folds the gate into the product (Backend::gemm_fp8_gated: one
// sample, the gate times the weight's row scales and the bias), the product accumulates onto it in place (no
// 16-bit product written and read again, no residual pass) and it is returned; else linear_fp8 and
// norm_modulate's gated residual pass into a fresh tensor. The sums differ in their 16-bit roundings only.
Tensor linear_fp8_gated_residual(Tensor&& residual, const Fp8Rows& x, const Tensor& w8, const Tensor& ws, const Tensor& b,
                                 const Tensor& gate);
// x [N, C, H, W], w [O, C/g, kh, kw], b [O] optional -> [N, O, Ho, Wo] (+ addend, optional, broadcastable
// to the output: a per-sample [N, O, 1, 1] bias or a residual, added in the convolution's output pass).
// Channels-last on a device that prefers it (Backend::prefers_channels_last); the values are the same.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p, const Tensor& addend = {});
// The same of x.first() and x.second() side by side, without their concatenation where the device reads them in
// place (Backend::conv2d_concat); the same values either way.
Tensor conv2d(const ChannelConcat& x, const Tensor& w, const Tensor& b, const Conv2dParams& p, const Tensor& addend = {});
// h [N, C, H, W], w [O, C, kh, kw], b [O] optional; x [N, Cs, Ho, Wo], ws [O, Cs, 1, 1], bs [O] optional ->
// [N, O, Ho, Wo] = conv2d(h, w, b, p) + conv2d(x, ws, bs): a resnet's second convolution plus its 1x1 shortcut. Where
// the device accumulates both in one pass (Backend::conv2d_shortcut) the shortcut's output is never written; else
// the shortcut runs first and joins conv2's output pass as its addend. The sums differ in one 16-bit rounding (the
// shortcut's output) and the order of the bias additions.
Tensor conv2d_with_shortcut(const Tensor& h, const Tensor& w, const Tensor& b, const Conv2dParams& p, const Tensor& x,
                            const Tensor& ws, const Tensor& bs);
Tensor conv2d_with_shortcut(const Tensor& h, const Tensor& w, const Tensor& b, const Conv2dParams& p, const ChannelConcat& x,
                            const Tensor& ws, const Tensor& bs);
// x [N, C, H, W], w [O, C/g, kh, kw], b [O] optional -> [N, O, Ho, Wo] = conv2d(upsample_nearest2d(x, 2), w, b, p), the
// convolution of the 2H x 2W upsampled input: an upsampler (nearest 2x, then a convolution). Where the device computes
// the 3x3 stride-1 padding-1 case without the upsampled tensor (Backend::upsample2x_conv2d) it does; the FLOPs counted
// are the convolution's on the upsampled tensor either way (the model's, not the device's).
Tensor upsample2x_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p);

// --- normalisation --------------------------------------------------------------------------------
// x [N, C, *]: statistics per (sample, group); gamma/beta [C]; act fused (GroupNorm+SiLU). offset [N, C]
// (optional, x's dtype) is added per (sample, channel) first: the norm of x + offset[:, :, None, None], which is
// how a resnet's time embedding reaches its second norm without a pass of its own.
Tensor group_norm(const Tensor& x, int groups, const Tensor& gamma, const Tensor& beta, float eps,
                  UnaryOp act = UnaryOp::kIdentity, const Tensor& offset = {});
// The same of x.first() and x.second() side by side (no offset), without their concatenation where the device
// reads them in place (Backend::group_norm_concat); the same values either way.
Tensor group_norm(const ChannelConcat& x, int groups, const Tensor& gamma, const Tensor& beta, float eps,
                  UnaryOp act = UnaryOp::kIdentity);
// x [..., D]
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps);
Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps);

// x [B, T, D] -> [B, T, D]: n = norm(x) * gamma (kind: none / LayerNorm without affine / RMSNorm; gamma [D]
// optional), then n * (1 + scale) + shift, then residual + gate * n, each part optional: scale/shift/gate
// hold [B, D] values ([B, 1, D] as models keep them), residual is [B, T, D]. One pass for the adaLN
// modulation and gated residuals of FLUX and Z-Image blocks, rounded step by step as the unfused ops.
Tensor norm_modulate(const Tensor& x, NormKind kind, float eps, const Tensor& gamma, const NormModulation& m);
// The same, with the result's rows also quantized for FP8 products (Fp8Rows: x the [B, T, D] result, q/scale
// what quantize_activation_fp8 of it gives), in one pass where the backend can (CUDA). keep_values false: only
// FP8 products read the result (Fp8Rows::x_values false), so the backend may leave its 16-bit rows unwritten.
Fp8Rows norm_modulate_fp8(const Tensor& x, NormKind kind, float eps, const Tensor& gamma, const NormModulation& m,
                          bool keep_values = true);

// --- rotary position embedding --------------------------------------------------------------------
// x [B, A, C, D] (a strided view is fine: FLUX passes q permuted to [B, H, N, D]), positions along dim
// seq_dim (1 or 2); cos/sin hold [S, D/2] values (any shape of that size) in x's dtype. Interleaved pairs
// (x[2i], x[2i+1]) rotated as complex numbers by cos + i sin -> [B, A, C, D] contiguous. One pass instead of
// the reference's copy, four products, two sums and a concat. With rms.on, rope(rms_norm(x, gamma, eps), ...)
// in the same pass (the same values: each normalised row rounded to the dtype before the rotation).
Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms = {});
// rope written into `out` (contiguous, x's shape, dtype and device), as linear_into.
void rope_into(Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms = {});
// rope of x [B, H, S, D] (positions along dim 2) in runs of positions, each with its RMS norm (the runs cover
// S in order: RopeRmsRun) -> [B, H, S, D]. One run: rope(x, cos, sin, 2, rms). Several at batch 1: each run
// written into its rows of one token-major buffer (the result is a view of [1, S, H, D] memory: no
// concatenation); at larger batches the runs' ropes concatenated.
Tensor rope_runs(const Tensor& x, const Tensor& cos, const Tensor& sin, const std::vector<RopeRmsRun>& runs);

// --- attention ------------------------------------------------------------------------------------
// q [B, H, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv]; H % Hk == 0; mask additive, broadcastable to
// [B, H, Sq, Sk] (undefined = none); scale 0 means 1/sqrt(D). -> [B, H, Sq, Dv]
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = {}, float scale = 0.0f);
// The same values as attention(...).permute(0, 2, 1, 3) reshaped to [B, Sq, H*Dv] (heads merged), written
// there directly: no separate copy to merge the heads.
Tensor attention_merged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = {}, float scale = 0.0f);
// attention_merged with q, k, v quantized to FP8 (e4m3) per tensor, as Backend::attention_fp8 defines it (the
// attention of FLUX's and Z-Image's --dtype fp8 blocks): no mask, as many k/v heads as q heads.
// `bounds`: |q| and |k| bounded in advance (Fp8Bounds: e.g. after an RMS norm), so that no amax pass reads them.
Tensor attention_merged_fp8(const Tensor& q, const Tensor& k, const Tensor& v, float scale = 0.0f, const Fp8Bounds& bounds = {});
// attention_merged_fp8 whose result also comes as an FP8 GEMM's input (x [B, Sq, H*Dv], q [B*Sq, H*Dv] e4m3,
// scale [B*Sq]): where the backend's FP8 attention writes e4m3 itself (cuDNN's on Hopper), those bytes with the
// output's per-tensor scale for every row (no quantizing pass, no second rounding); else x's rows quantized as
// quantize_activation_fp8 quantizes them.
// x_values false: where the e4m3 rows came from the backend, x is not written (Fp8Rows::x_values).
Fp8Rows attention_merged_fp8_rows(const Tensor& q, const Tensor& k, const Tensor& v, float scale = 0.0f,
                                  const Fp8Bounds& bounds = {}, bool x_values = true);
// attention_merged_fp8_rows(rope(qx, cos, sin, 2, rms_q), rope(kx, cos, sin, 2, rms_k), v, 0, bounds, x_values):
// qx [B, H, Sq, D], kx [B, H, Sk, D] before their rope (positions along dim 2), v [B, H, Sk, Dv]. Where q and k
// are bounded the backend may write them in e4m3 from the rope pass itself (Backend::rope_attention_fp8_rows:
// the same bytes, without the 16-bit q and k); elsewhere exactly that sequence.
Fp8Rows rope_attention_merged_fp8_rows(const Tensor& qx, const Tensor& kx, const Tensor& v, const Tensor& cos, const Tensor& sin,
                                       const RopeRms& rms_q, const RopeRms& rms_k, const Fp8Bounds& bounds = {},
                                       bool x_values = true);
// The same with q and k roped in runs of positions, each with its norm (rope_runs: a joint attention's streams).
Fp8Rows rope_attention_merged_fp8_rows(const Tensor& qx, const Tensor& kx, const Tensor& v, const Tensor& cos, const Tensor& sin,
                                       const std::vector<RopeRmsRun>& q_runs, const std::vector<RopeRmsRun>& k_runs,
                                       const Fp8Bounds& bounds = {}, bool x_values = true);
// Convenience for [B, S, H*D] sequences: splits heads, attends, merges -> [B, Sq, H*Dv].
Tensor multi_head_attention(const Tensor& q, const Tensor& k, const Tensor& v, int heads, int kv_heads = 0,
                            const Tensor& mask = {});

}  // namespace atelier::ops
