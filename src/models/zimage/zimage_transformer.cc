// Z-Image transformer forward pass (loading and configuration: zimage_load.cc).
#include <cmath>

#include "models/zimage/zimage_transformer.h"

namespace atelier {
namespace {

// Sequences are padded to a multiple of this many tokens (diffusers' SEQ_MULTI_OF).
constexpr int64_t kSeqMultiple = 32;
// Width of the sinusoidal timestep features fed to the timestep MLP, and their max period.
constexpr int64_t kTimestepFreqDim = 256;
constexpr double kTimestepMaxPeriod = 10000.0;
constexpr float kFinalNormEps = 1e-6f;


Tensor on_device(const Tensor& host, Device dev) { return dev.is_cpu() ? host : host.to(dev); }
Tensor as_dtype(const Tensor& x, DType dt) { return x.dtype() == dt ? x : ops::cast(x, dt); }

int64_t padding_for(int64_t n) { return (kSeqMultiple - n % kSeqMultiple) % kSeqMultiple; }

// x [S, D] -> [S + pad, D], the added rows all `pad_token` [1, D].
Tensor pad_rows(const Tensor& x, const Tensor& pad_token, int64_t pad) {
  if (pad == 0) return x;
  std::vector<Tensor> parts = {x};
  for (int64_t i = 0; i < pad; ++i) parts.push_back(pad_token);
  return ops::concat(parts, 0);
}

// Complex (interleaved-pair) rotary embedding: x [1, S, H, hd], cos/sin [S, 1, hd/2, 1] -> same as x; each
// pair (x[2i], x[2i+1]) is multiplied, as a complex number, by cos + i sin; after the RMS norm `norm` (null: none).
Tensor rope_complex(const Tensor& x, const Tensor& cos, const Tensor& sin, const RMSNorm* norm) {
  return ops::rope(x, cos, sin, 1, rope_rms(norm));
}

// n [1, S, dim] (its rows quantized already where the layers are in FP8) -> w2(silu(w1 n) * w3 n) [1, S, dim].
// With w31 stacked: one GEMM and ops::glu's one pass (the product is taken from the f32 SiLU, one rounding
// fewer in 16-bit than the separate ops; as SD's GEGLU).
Tensor feed_forward(const ZImageBlock& b, const ops::Fp8Rows& n) {
  if (b.w31.weight.defined()) return b.w2(ops::glu(b.w31(n), UnaryOp::kSilu));
  return b.w2(ops::mul(b.w1(n, UnaryOp::kSilu), b.w3(n)));
}

}  // namespace

void ZImageTransformer::stack_projections() {
  // Recordings read the weights they were made with: a fresh runner (not shared with copies of the model).
  graphs_ = std::make_shared<GraphRunner>(graphs_->options());
  for (auto* blocks : {&noise_refiner_, &context_refiner_, &layers_})
    for (ZImageBlock& b : *blocks) {
      // Files stored in FP8 keep their tensors (their scales are per tensor, not per row): stack_linears
      // leaves them. The original layout's fused qkv tensor is taken as it lies (a view, no copy).
      stack_linears(b.w31, {&b.w3, &b.w1});
      stack_linears(b.qkv, {&b.to_q, &b.to_k, &b.to_v});
    }
}

void ZImageTransformer::quantize_fp8() {
  graphs_ = std::make_shared<GraphRunner>(graphs_->options());  // as in stack_projections
  fp8_attention_ = true;
  const int64_t hd = config_.head_dim();
  for (auto* blocks : {&noise_refiner_, &context_refiner_, &layers_})
    for (ZImageBlock& b : *blocks) {
      // Bounds where q/k are RMS-normed (rope_complex's prologue); without the norms they are measured.
      if (b.norm_q.weight.defined() && b.norm_k.weight.defined())
        b.attn_bounds = {rms_rope_bound(b.norm_q, hd), rms_rope_bound(b.norm_k, hd)};
      for (Linear* l : {&b.to_out, &b.w2, &b.adaLN_modulation}) l->quantize_fp8();
      quantize_stacked(b.w31, {&b.w3, &b.w1});
      quantize_stacked(b.qkv, {&b.to_q, &b.to_k, &b.to_v});
    }
}

Tensor ZImageTransformer::timestep_embedding(float t) const {
  // As the reference computes it in f32: freqs = exp(-ln(max_period) * i / half), features [cos, sin].
  const int64_t half = kTimestepFreqDim / 2;
  const float neg_log = float(-std::log(kTimestepMaxPeriod));
  const float arg_t = float(double(t) * config_.t_scale);
  std::vector<float> feat(static_cast<size_t>(kTimestepFreqDim));
  for (int64_t i = 0; i < half; ++i) {
    const float freq = std::exp(neg_log * float(i) / float(half));
    const float arg = arg_t * freq;
    feat[size_t(i)] = std::cos(arg);
    feat[size_t(half + i)] = std::sin(arg);
  }
  Tensor f = on_device(as_dtype(Tensor::from_vector(feat, {1, kTimestepFreqDim}), dtype_), device_);
  return t_mlp2_(t_mlp0_(f, UnaryOp::kSilu));
}

std::pair<Tensor, Tensor> ZImageTransformer::rope(const std::vector<std::array<int64_t, 3>>& pos) const {
  // Per axis a of width d: angle = position * theta^(-2j/d) in f64, rounded to f32, then cos/sin in f32.
  const int64_t half = config_.head_dim() / 2, seq = int64_t(pos.size());
  std::vector<float> c(size_t(seq * half)), s(size_t(seq * half));
  std::vector<std::pair<int, double>> freqs;  // (axis, frequency) per complex component
  for (int a = 0; a < 3; ++a) {
    const int64_t d = config_.axes_dims[size_t(a)];
    for (int64_t j = 0; j < d / 2; ++j) freqs.emplace_back(a, 1.0 / std::pow(config_.rope_theta, double(2 * j) / double(d)));
  }
  for (int64_t p = 0; p < seq; ++p)
    for (int64_t j = 0; j < half; ++j) {
      const auto [axis, freq] = freqs[size_t(j)];
      const float angle = float(double(pos[size_t(p)][size_t(axis)]) * freq);
      c[size_t(p * half + j)] = std::cos(angle);
      s[size_t(p * half + j)] = std::sin(angle);
    }
  return {on_device(as_dtype(Tensor::from_vector(c, {seq, 1, half, 1}), dtype_), device_),
          on_device(as_dtype(Tensor::from_vector(s, {seq, 1, half, 1}), dtype_), device_)};
}

Tensor ZImageTransformer::attention(const ZImageBlock& b, const ops::Fp8Rows& x, const Tensor& cos, const Tensor& sin) const {
  const int64_t h = config_.n_heads;
  // q/k/v heads [1, S, H, hd] (views of one GEMM's output); the q/k norms (when the model has them) in the
  // rope's pass.
  const auto [qh, kh, v] = qkv_heads(b.qkv, b.to_q, b.to_k, b.to_v, x, h);
  const RMSNorm* norm_q = b.norm_q.weight.defined() ? &b.norm_q : nullptr;
  const RMSNorm* norm_k = b.norm_k.weight.defined() ? &b.norm_k : nullptr;
  if (fp8_attention_) {  // bounded q/k may go to e4m3 straight from the rope pass (head-major, as cuDNN reads them)
    return b.to_out(rope_attention_rows_for(true, qh.permute({0, 2, 1, 3}), kh.permute({0, 2, 1, 3}), v.permute({0, 2, 1, 3}), cos,
                                            sin, rope_rms(norm_q), rope_rms(norm_k), b.attn_bounds, /*x_values=*/false));
  }
  const Tensor q = rope_complex(qh, cos, sin, norm_q), k = rope_complex(kh, cos, sin, norm_k);
  return b.to_out(attention_rows_for(false, q.permute({0, 2, 1, 3}), k.permute({0, 2, 1, 3}), v.permute({0, 2, 1, 3})));
}

Tensor ZImageTransformer::block_forward(const ZImageBlock& b, const Tensor& x, const Tensor& adaln, const Tensor& cos,
                                        const Tensor& sin) const {
  // Each norm with what follows it is one norm_modulate pass: rms_norm(v) * (1 + scale), or
  // residual + gate * rms_norm(v), rounded step by step as the reference's separate ops.
  const auto norm = [](const RMSNorm& nrm, const Tensor& v, const NormModulation& m) {
    return ops::norm_modulate(v, NormKind::kRms, nrm.eps, nrm.weight, m);
  };
  const auto plain = [](const Tensor& t) { return ops::Fp8Rows{t, Tensor(), Tensor()}; };
  if (!b.adaLN_modulation.weight.defined()) {  // context refiner: no modulation
    Tensor y = norm(b.attention_norm2, attention(b, plain(b.attention_norm1(x)), cos, sin), {.residual = x});
    return norm(b.ffn_norm2, feed_forward(b, plain(b.ffn_norm1(y))), {.residual = y});
  }
  // scale_msa, gate_msa, scale_mlp, gate_mlp: each [1, 1, dim]; scales are applied as 1 + s, gates tanh(g).
  std::vector<Tensor> mod = ops::chunk(b.adaLN_modulation(adaln).unsqueeze(1), 4, 2);
  const Tensor gate_msa = ops::unary(mod[1], UnaryOp::kTanh), gate_mlp = ops::unary(mod[3], UnaryOp::kTanh);
  // The modulated inputs of the q/k/v and feed-forward GEMMs: with FP8 layers, quantized in the norm's pass.
  const auto modulated = [](const RMSNorm& nrm, const Tensor& v, const Tensor& scale, const Linear& reader) {
    return norm_modulate_for(v, NormKind::kRms, nrm.eps, nrm.weight, {.scale = scale}, {&reader});
  };
  Tensor attn = attention(b, modulated(b.attention_norm1, x, mod[0], b.to_q), cos, sin);
  Tensor y = norm(b.attention_norm2, attn, {.gate = gate_msa, .residual = x});
  return norm(b.ffn_norm2, feed_forward(b, modulated(b.ffn_norm1, y, mod[2], b.w1)), {.gate = gate_mlp, .residual = y});
}

Expected<Tensor> ZImageTransformer::forward(const Tensor& latents, float t, const Tensor& caption) const {
  const int64_t c = config_.in_channels, p = config_.patch_size, pf = config_.f_patch_size;
  if (latents.dim() != 4 || latents.size(0) != c || latents.size(1) % pf || latents.size(2) % p || latents.size(3) % p)
    return invalid_argument("Z-Image transformer: latents must be [" + std::to_string(c) + ", F, H, W] with H and W multiples of " +
                            std::to_string(p) + ", got " + shape_str(latents.shape()));
  if (caption.dim() != 2 || caption.size(1) != config_.cap_feat_dim || caption.size(0) < 1)
    return invalid_argument("Z-Image transformer: caption features must be [L >= 1, " + std::to_string(config_.cap_feat_dim) +
                            "], got " + shape_str(caption.shape()));
  return catch_expected<Tensor>([&]() -> Expected<Tensor> {
    const int64_t f = latents.size(1), h = latents.size(2), w = latents.size(3);
    const int64_t ft = f / pf, ht = h / p, wt = w / p, n_img = ft * ht * wt;
    const int64_t n_cap = caption.size(0), cap_pad = padding_for(n_cap), img_pad = padding_for(n_img);
    const Tensor adaln = timestep_embedding(t);

    // Rotary tables of the position ids, which follow from the token grid and the caption length alone:
    // caption tokens (1 + k, 0, 0); image tokens (cap_len_padded + 1 + f, h, w); padding (0, 0, 0).
    const std::vector<float> layout{float(ft), float(ht), float(wt), float(n_cap)};
    const std::vector<Tensor> tables = rope_cache_->get(layout, [&] {
      std::vector<std::array<int64_t, 3>> cap_pos, img_pos;
      for (int64_t k = 0; k < n_cap + cap_pad; ++k) cap_pos.push_back({1 + k, 0, 0});
      for (int64_t a = 0; a < ft; ++a)
        for (int64_t b = 0; b < ht; ++b)
          for (int64_t e = 0; e < wt; ++e) img_pos.push_back({n_cap + cap_pad + 1 + a, b, e});
      for (int64_t k = 0; k < img_pad; ++k) img_pos.push_back({0, 0, 0});
      auto [ic, is] = rope(img_pos);
      auto [cc, cs] = rope(cap_pos);
      return std::vector<Tensor>{ic, is, cc, cs, ops::concat({ic, cc}, 0), ops::concat({is, cs}, 0)};
    });
    std::vector<Tensor> inputs{latents, caption, adaln};
    inputs.insert(inputs.end(), tables.begin(), tables.end());
    // The tables are inputs too (copied into the recording's buffers): the cache may drop the tensors a
    // recording would otherwise read.
    return graphs_->run(inputs, device_, [this](const std::vector<Tensor>& v) {
      return transform(v[0], v[1], v[2], std::vector<Tensor>(v.begin() + 3, v.end()));
    });
  });
}

Tensor ZImageTransformer::transform(const Tensor& latents, const Tensor& caption, const Tensor& adaln,
                                    const std::vector<Tensor>& tables) const {
  const int64_t c = config_.in_channels, p = config_.patch_size, pf = config_.f_patch_size;
  const int64_t f = latents.size(1), h = latents.size(2), w = latents.size(3);
  const int64_t ft = f / pf, ht = h / p, wt = w / p, n_img = ft * ht * wt;
  const int64_t n_cap = caption.size(0), cap_pad = padding_for(n_cap), img_pad = padding_for(n_img);
  const Tensor &img_cos = tables[0], &img_sin = tables[1], &cap_cos = tables[2], &cap_sin = tables[3];

  // Patchify "c (f pf) (h ph) (w pw) -> (f h w) (pf ph pw c)", embed, pad, refine.
  Tensor lat = ops::contiguous(as_dtype(latents, dtype_));
  Tensor patches = ops::contiguous(lat.reshape({c, ft, pf, ht, p, wt, p}).permute({1, 3, 5, 2, 4, 6, 0}))
                       .reshape({n_img, pf * p * p * c});
  Tensor x = pad_rows(x_embedder_(patches), x_pad_token_, img_pad).unsqueeze(0);
  for (const auto& b : noise_refiner_) x = block_forward(b, x, adaln, img_cos, img_sin);

  Tensor ctx = pad_rows(cap_linear_(cap_norm_(as_dtype(caption, dtype_))), cap_pad_token_, cap_pad).unsqueeze(0);
  for (const auto& b : context_refiner_) ctx = block_forward(b, ctx, Tensor(), cap_cos, cap_sin);

  // One stream: image tokens then caption tokens.
  Tensor u = ops::concat({x, ctx}, 1);
  const Tensor &u_cos = tables[4], &u_sin = tables[5];
  for (const auto& b : layers_) u = block_forward(b, u, adaln, u_cos, u_sin);

  // Final layer: LayerNorm (no affine) scaled by 1 + adaLN(silu(c)), then the patch projection.
  const Tensor scale = final_adaLN_(ops::silu(adaln));  // applied as 1 + scale
  Tensor out = final_linear_(ops::norm_modulate(u, NormKind::kLayer, kFinalNormEps, Tensor(), {.scale = scale}));
  // Unpatchify "(f h w) (pf ph pw c) -> c (f pf) (h ph) (w pw)" from the image tokens.
  Tensor img = out.select(0, 0).narrow(0, 0, n_img).reshape({ft, ht, wt, pf, p, p, c});
  return as_dtype(ops::contiguous(img.permute({6, 0, 3, 1, 4, 2, 5})).reshape({c, f, h, w}), DType::F32);
}

}  // namespace atelier
