#include "models/flux/flux_transformer.h"

#include <cmath>

#include "models/sd/unet.h"

namespace atelier {

namespace {

constexpr int kTimeFeatures = 256;         // Timesteps(num_channels=256) in CombinedTimestepGuidanceTextProjEmbeddings
constexpr float kTimestepScale = 1000.0f;  // the pipeline passes t / 1000; the model multiplies back
constexpr float kNormEps = 1e-6f;          // adaLN layer norms and the q/k RMS norms
constexpr int kDoubleMods = 6, kSingleMods = 3, kFinalMods = 2;

// Loads a fused linear [sum(sizes), in] (BFL) and makes each part a view of it along the output dim.
void load_fused(WeightLoader& w, const std::string& key, int64_t in, const std::vector<std::pair<Linear*, int64_t>>& parts) {
  int64_t total = 0;
  for (const auto& p : parts) total += p.second;
  Linear fused;
  w.linear(fused, key, in, total);
  if (!fused.weight.defined() || !fused.bias.defined()) return;
  int64_t at = 0;
  for (const auto& [lin, size] : parts) {
    *lin = fused.output_rows(at, size);
    at += size;
  }
}

void load_embedder(WeightLoader& w, FluxMlpEmbedder& e, const std::string& key, int64_t in, int64_t d) {
  w.linear(e.linear_1, key + ".linear_1", in, d);
  w.linear(e.linear_2, key + ".linear_2", d, d);
}

// Keys starting with "@" are file names already (the BFL fused tensors; see the KeyMap in load()).
void load_double(WeightLoader w, FluxLayout layout, const FluxConfig& c, int i, FluxDoubleBlock& b) {
  const int64_t d = c.inner_dim(), hd = c.head_dim;
  w.linear(b.norm1_linear, "norm1.linear", d, kDoubleMods * d);
  w.linear(b.norm1_context_linear, "norm1_context.linear", d, kDoubleMods * d);
  if (layout == FluxLayout::kBfl) {
    const std::string blk = "double_blocks." + std::to_string(i) + ".";
    load_fused(w, "@" + blk + "img_attn.qkv", d, {{&b.to_q, d}, {&b.to_k, d}, {&b.to_v, d}});
    load_fused(w, "@" + blk + "txt_attn.qkv", d, {{&b.add_q_proj, d}, {&b.add_k_proj, d}, {&b.add_v_proj, d}});
  } else {
    w.linear(b.to_q, "attn.to_q", d, d);
    w.linear(b.to_k, "attn.to_k", d, d);
    w.linear(b.to_v, "attn.to_v", d, d);
    w.linear(b.add_q_proj, "attn.add_q_proj", d, d);
    w.linear(b.add_k_proj, "attn.add_k_proj", d, d);
    w.linear(b.add_v_proj, "attn.add_v_proj", d, d);
  }
  w.rms_norm(b.norm_q, "attn.norm_q", hd, kNormEps);
  w.rms_norm(b.norm_k, "attn.norm_k", hd, kNormEps);
  w.rms_norm(b.norm_added_q, "attn.norm_added_q", hd, kNormEps);
  w.rms_norm(b.norm_added_k, "attn.norm_added_k", hd, kNormEps);
  w.linear(b.to_out, "attn.to_out.0", d, d);
  w.linear(b.to_add_out, "attn.to_add_out", d, d);
  w.linear(b.ff_proj, "ff.net.0.proj", d, c.mlp_dim());
  w.linear(b.ff_out, "ff.net.2", c.mlp_dim(), d);
  w.linear(b.ff_context_proj, "ff_context.net.0.proj", d, c.mlp_dim());
  w.linear(b.ff_context_out, "ff_context.net.2", c.mlp_dim(), d);
}

void load_single(WeightLoader w, FluxLayout layout, const FluxConfig& c, int i, FluxSingleBlock& b) {
  const int64_t d = c.inner_dim(), hd = c.head_dim;
  w.linear(b.norm_linear, "norm.linear", d, kSingleMods * d);
  if (layout == FluxLayout::kBfl) {
    load_fused(w, "@single_blocks." + std::to_string(i) + ".linear1", d,
               {{&b.to_q, d}, {&b.to_k, d}, {&b.to_v, d}, {&b.proj_mlp, c.mlp_dim()}});
  } else {
    w.linear(b.to_q, "attn.to_q", d, d);
    w.linear(b.to_k, "attn.to_k", d, d);
    w.linear(b.to_v, "attn.to_v", d, d);
    w.linear(b.proj_mlp, "proj_mlp", d, c.mlp_dim());
  }
  w.rms_norm(b.norm_q, "attn.norm_q", hd, kNormEps);
  w.rms_norm(b.norm_k, "attn.norm_k", hd, kNormEps);
  w.linear(b.proj_out, "proj_out", d + c.mlp_dim(), d);
}

// [B, k*D] modulation vector -> k contiguous [B, 1, D] parts (broadcast over the sequence).
std::vector<Tensor> modulations(const Tensor& emb, int k) {
  std::vector<Tensor> parts = ops::chunk(emb, k, 1);
  for (Tensor& p : parts) p = ops::contiguous(p).unsqueeze(1);
  return parts;
}

// x [B, N, D], shift/scale [B, 1, D] -> layer_norm(x) * (1 + scale) + shift (no affine, eps 1e-6), one pass.
Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) {
  return ops::norm_modulate(x, NormKind::kLayer, kNormEps, Tensor(), {.scale = scale, .shift = shift});
}
// The same for the layers that read it: with FP8 layers its rows are quantized in the same pass.
ops::Fp8Rows modulate_for(const Tensor& x, const Tensor& shift, const Tensor& scale, const std::vector<const Linear*>& readers) {
  return norm_modulate_for(x, NormKind::kLayer, kNormEps, Tensor(), {.scale = scale, .shift = shift}, readers);
}

// q or k heads [B, N, H, hd] (a view) -> RMS-normalised over hd and rotated, [B, H, N, hd]: one pass that
// reads the projection's output in place (ops::rope with its norm prologue) and writes the attention layout.
Tensor norm_rope(const Tensor& x, const RMSNorm& norm, const Tensor& cos, const Tensor& sin) {
  return ops::rope(x.permute({0, 2, 1, 3}), cos, sin, 2, rope_rms(&norm));
}

}  // namespace

std::pair<Tensor, Tensor> flux_rope_tables(const Tensor& ids, const std::array<int, 3>& axes, double theta) {
  const std::vector<float> pos = ids.to_vector();
  const int64_t n = ids.size(0), axes_n = ids.size(1);
  ATELIER_CHECK(axes_n == 3, "FLUX position ids must have 3 axes");
  const int64_t half = (axes[0] + axes[1] + axes[2]) / 2;
  std::vector<float> cos(size_t(n * half)), sin(size_t(n * half));
  for (int64_t r = 0; r < n; ++r) {
    int64_t col = 0;
    for (int a = 0; a < 3; ++a) {
      const int dim = axes[size_t(a)];
      for (int j = 0; j < dim / 2; ++j, ++col) {
        // freqs = 1 / theta ** (arange(0, dim, 2) / dim) in float64; outer product with the float position.
        const double freq = 1.0 / std::pow(theta, double(2 * j) / double(dim));
        const double angle = double(pos[size_t(r * 3 + a)]) * freq;
        cos[size_t(r * half + col)] = float(std::cos(angle));
        sin[size_t(r * half + col)] = float(std::sin(angle));
      }
    }
  }
  return {Tensor::from_vector(cos, {n, half}), Tensor::from_vector(sin, {n, half})};
}

Tensor flux_apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  // diffusers: x * cos + stack(-x_odd, x_even) * sin, products rounded before the sum: what ops::rope does
  // on interleaved pairs, positions along dim 2.
  return ops::rope(x, cos, sin, 2);
}

Expected<FluxTransformer> FluxTransformer::load(const WeightStore& store, FluxLayout layout, const FluxConfig& c,
                                                Device device, DType dtype, const std::string& prefix, bool fp8_blocks) {
  FluxTransformer m;
  m.config_ = c;
  m.device_ = device;
  m.dtype_ = dtype;
  // BFL: plain renames through flux_bfl_key; a key with "@" names the file's key after it, whatever the
  // scope before it (the fused BFL tensors, split in load_fused).
  KeyMap map = [bfl = layout == FluxLayout::kBfl](const std::string& k) {
    const size_t at = k.find('@');
    if (at != std::string::npos) return k.substr(at + 1);
    return bfl ? flux_bfl_key(k) : k;
  };
  WeightLoader w(store, device, dtype, map, prefix);
  const int64_t d = c.inner_dim();
  w.linear(m.x_embedder_, "x_embedder", c.in_channels, d);
  w.linear(m.context_embedder_, "context_embedder", c.joint_attention_dim, d);
  load_embedder(w, m.timestep_embedder_, "time_text_embed.timestep_embedder", kTimeFeatures, d);
  if (c.guidance_embeds) load_embedder(w, m.guidance_embedder_, "time_text_embed.guidance_embedder", kTimeFeatures, d);
  load_embedder(w, m.text_embedder_, "time_text_embed.text_embedder", c.pooled_projection_dim, d);
  WeightLoader blocks = w;  // the embedders and the final layer above and below always in the compute dtype
  blocks.keep_fp8_linears(fp8_blocks);
  m.double_blocks_.resize(size_t(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    load_double(blocks.scope("transformer_blocks." + std::to_string(i)), layout, c, i, m.double_blocks_[size_t(i)]);
  }
  m.single_blocks_.resize(size_t(c.num_single_layers));
  for (int i = 0; i < c.num_single_layers; ++i) {
    load_single(blocks.scope("single_transformer_blocks." + std::to_string(i)), layout, c, i, m.single_blocks_[size_t(i)]);
  }
  w.linear(m.norm_out_linear_, "norm_out.linear", d, kFinalMods * d);
  w.linear(m.proj_out_, "proj_out", d, c.out_channels);
  ATELIER_RETURN_IF_ERROR(w.finish());
  if (layout == FluxLayout::kBfl) {
    // BFL's final adaLN emits (shift, scale); diffusers' AdaLayerNormContinuous reads (scale, shift).
    Linear& f = m.norm_out_linear_;
    Status st = catch_status([&] {
      f.weight = ops::concat({f.weight.narrow(0, d, d), f.weight.narrow(0, 0, d)}, 0);
      f.bias = ops::concat({f.bias.narrow(0, d, d), f.bias.narrow(0, 0, d)}, 0);
      return Status::ok();
    });
    ATELIER_RETURN_IF_ERROR(st);
  }
  ATELIER_RETURN_IF_ERROR(catch_status([&] {
    m.stack_projections();
    return Status::ok();
  }));
  return m;
}

void FluxTransformer::stack_projections() {
  graphs_ = std::make_shared<GraphRunner>(graphs_->options());  // as in quantize_fp8
  for (FluxDoubleBlock& b : double_blocks_) {
    stack_linears(b.to_qkv, {&b.to_q, &b.to_k, &b.to_v});
    stack_linears(b.add_qkv, {&b.add_q_proj, &b.add_k_proj, &b.add_v_proj});
  }
  for (FluxSingleBlock& b : single_blocks_) stack_linears(b.to_qkv, {&b.to_q, &b.to_k, &b.to_v});
  stack_linears(modulation_, modulation_parts());
}

std::vector<Linear*> FluxTransformer::modulation_parts() {
  std::vector<Linear*> parts;
  for (FluxDoubleBlock& b : double_blocks_) parts.insert(parts.end(), {&b.norm1_linear, &b.norm1_context_linear});
  for (FluxSingleBlock& b : single_blocks_) parts.push_back(&b.norm_linear);
  parts.push_back(&norm_out_linear_);
  return parts;
}

void FluxTransformer::quantize_fp8() {
  // Recordings read the weights they were made with: a fresh runner (not shared with copies of the model).
  graphs_ = std::make_shared<GraphRunner>(graphs_->options());
  fp8_attention_ = true;
  const int64_t hd = config_.head_dim;
  for (FluxDoubleBlock& b : double_blocks_)  // q and k hold both streams' rows: the larger bound of the two
    b.attn_bounds = {std::max(rms_rope_bound(b.norm_q, hd), rms_rope_bound(b.norm_added_q, hd)),
                     std::max(rms_rope_bound(b.norm_k, hd), rms_rope_bound(b.norm_added_k, hd))};
  for (FluxSingleBlock& b : single_blocks_) b.attn_bounds = {rms_rope_bound(b.norm_q, hd), rms_rope_bound(b.norm_k, hd)};
  for (FluxDoubleBlock& b : double_blocks_) {
    quantize_stacked(b.to_qkv, {&b.to_q, &b.to_k, &b.to_v});
    quantize_stacked(b.add_qkv, {&b.add_q_proj, &b.add_k_proj, &b.add_v_proj});
    for (Linear* l : {&b.to_out, &b.to_add_out, &b.ff_proj, &b.ff_out, &b.ff_context_proj, &b.ff_context_out})
      l->quantize_fp8();
  }
  for (FluxSingleBlock& b : single_blocks_) {
    quantize_stacked(b.to_qkv, {&b.to_q, &b.to_k, &b.to_v});
    for (Linear* l : {&b.proj_mlp, &b.proj_out}) l->quantize_fp8();
  }
  // The blocks' modulation linears (norm_out.linear, the final layer's, stays in the compute dtype: it is
  // not stacked then; its rows are the stack's last, so they are cut off and kept as they are).
  std::vector<Linear*> parts = modulation_parts();
  parts.pop_back();
  if (modulation_.weight.defined()) {
    const Linear final_layer = norm_out_linear_;
    modulation_ = modulation_.output_rows(0, modulation_.out_features() - final_layer.out_features());
    // Copies: views would keep the whole compute-dtype stack alive.
    norm_out_linear_ = Linear{ops::clone(final_layer.weight),
                              final_layer.bias.defined() ? ops::clone(final_layer.bias) : Tensor(), Tensor()};
  }
  quantize_stacked(modulation_, parts);
}

Tensor FluxTransformer::in_dtype(const Tensor& x) const { return x.dtype() == dtype_ ? x : ops::cast(x, dtype_); }

Tensor FluxTransformer::conditioning(const FluxInputs& in) const {
  auto embed = [&](const FluxMlpEmbedder& e, const Tensor& x) { return e.linear_2(e.linear_1(x, UnaryOp::kSilu)); };
  auto time_features = [&](const std::vector<float>& values) {
    std::vector<float> scaled(values.size());
    for (size_t i = 0; i < values.size(); ++i) scaled[i] = values[i] * kTimestepScale;
    return ops::cast(timestep_embedding(scaled, kTimeFeatures, /*flip_sin_to_cos=*/true, 0.0f), dtype_).to(device_);
  };
  Tensor temb = embed(timestep_embedder_, time_features(in.timestep));
  if (config_.guidance_embeds) temb = ops::add(temb, embed(guidance_embedder_, time_features(in.guidance)));
  return ops::add(temb, embed(text_embedder_, in_dtype(in.pooled.to(device_))));
}

void FluxTransformer::double_block(const FluxDoubleBlock& b, Tensor& img, Tensor& txt, const Tensor& mod_img,
                                   const Tensor& mod_txt, const Tensor& cos, const Tensor& sin) const {
  const auto mi = modulations(mod_img, kDoubleMods);  // shift, scale, gate (attn), (mlp)
  const auto mt = modulations(mod_txt, kDoubleMods);
  const ops::Fp8Rows ni = modulate_for(img, mi[0], mi[1], {&b.to_q}), nt = modulate_for(txt, mt[0], mt[1], {&b.add_q_proj});
  const ops::Fp8Rows a = joint_attention(b, nt, ni, cos, sin);  // x [B, S + L, H * hd]
  const int64_t s = txt.size(1), l = img.size(1);
  // Each branch's gated residual (gate * branch + residual): FP8 output layers fold the gate into their product
  // and accumulate onto the residual stream in place (Linear::gated_residual).
  img = b.to_out.gated_residual(std::move(img), mi[2], token_rows(a, s, l));
  txt = b.to_add_out.gated_residual(std::move(txt), mt[2], token_rows(a, 0, s));
  const Tensor hi = b.ff_proj(modulate_for(img, mi[3], mi[4], {&b.ff_proj}), UnaryOp::kGeluTanh);
  img = b.ff_out.gated_residual(std::move(img), mi[5], ops::Fp8Rows{hi, Tensor(), Tensor()});
  const Tensor ht = b.ff_context_proj(modulate_for(txt, mt[3], mt[4], {&b.ff_context_proj}), UnaryOp::kGeluTanh);
  txt = b.ff_context_out.gated_residual(std::move(txt), mt[5], ops::Fp8Rows{ht, Tensor(), Tensor()});
}

ops::Fp8Rows FluxTransformer::joint_attention(const FluxDoubleBlock& b, const ops::Fp8Rows& nt, const ops::Fp8Rows& ni,
                                              const Tensor& cos, const Tensor& sin) const {
  const int64_t h = config_.num_heads, batch = ni.x.size(0), s = nt.x.size(1), l = ni.x.size(1);
  // Only the output projections read the result; batched, each stream's tokens are taken from its values.
  const bool x_values = batch > 1;
  if (batch == 1 && b.to_qkv.weight.defined() && b.add_qkv.weight.defined()) {
    // Each stream's q/k/v GEMM writes its rows of one [1, S + L, 3, H, hd] buffer (text first, then image, as
    // the ids are concatenated), and q and k are roped in two runs of positions, each with its stream's norms:
    // no concatenation copies (59 per 1024² step, 1.3 ms on the H200 in session 12); with FP8 attention the
    // rope passes write e4m3 q and k themselves.
    const int64_t inner = b.to_qkv.out_features();
    Tensor joint = Tensor::empty({1, s + l, inner}, ni.x.dtype(), ni.x.device());
    Tensor rows_t = joint.narrow(1, 0, s), rows_i = joint.narrow(1, s, l);
    b.add_qkv.into(rows_t, nt);
    b.to_qkv.into(rows_i, ni);
    const Tensor h5 = joint.reshape({1, s + l, 3, h, inner / (3 * h)});
    const auto heads = [&](int which) { return h5.select(2, which).permute({0, 2, 1, 3}); };  // [1, H, S + L, hd]
    const std::vector<RopeRmsRun> q_runs{{s, rope_rms(&b.norm_added_q)}, {l, rope_rms(&b.norm_q)}};
    const std::vector<RopeRmsRun> k_runs{{s, rope_rms(&b.norm_added_k)}, {l, rope_rms(&b.norm_k)}};
    return rope_attention_rows_for(fp8_attention_, heads(0), heads(1), heads(2), cos, sin, q_runs, k_runs, b.attn_bounds,
                                   x_values);
  }
  const Tensor cos_t = cos.narrow(0, 0, s), sin_t = sin.narrow(0, 0, s), cos_i = cos.narrow(0, s, l), sin_i = sin.narrow(0, s, l);
  const auto [qi, ki, vi] = qkv_heads(b.to_qkv, b.to_q, b.to_k, b.to_v, ni, h);  // [B, L, H, hd] each
  const auto [qt, kt, vt] = qkv_heads(b.add_qkv, b.add_q_proj, b.add_k_proj, b.add_v_proj, nt, h);
  const Tensor q = ops::concat({norm_rope(qt, b.norm_added_q, cos_t, sin_t), norm_rope(qi, b.norm_q, cos_i, sin_i)}, 2);
  const Tensor k = ops::concat({norm_rope(kt, b.norm_added_k, cos_t, sin_t), norm_rope(ki, b.norm_k, cos_i, sin_i)}, 2);
  const Tensor v = ops::concat({vt, vi}, 1).permute({0, 2, 1, 3});
  return attention_rows_for(fp8_attention_, q, k, v, b.attn_bounds, x_values);
}

Tensor FluxTransformer::single_block(const FluxSingleBlock& b, Tensor x, const Tensor& mod, const Tensor& cos,
                                     const Tensor& sin) const {
  const int h = config_.num_heads;
  const auto m = modulations(mod, kSingleMods);  // shift, scale, gate
  // n feeds the MLP and the q/k/v GEMMs: with FP8 blocks its rows are quantized once for both.
  const ops::Fp8Rows n = modulate_for(x, m[0], m[1], {&b.proj_mlp, &b.to_q});
  const Tensor mlp = b.proj_mlp(n, UnaryOp::kGeluTanh);
  const auto [q, k, v] = qkv_heads(b.to_qkv, b.to_q, b.to_k, b.to_v, n, h);
  const ops::Fp8Rows a = rope_attention_rows_for(fp8_attention_, q.permute({0, 2, 1, 3}), k.permute({0, 2, 1, 3}), v.permute({0, 2, 1, 3}),
                                                 cos, sin, rope_rms(&b.norm_q), rope_rms(&b.norm_k), b.attn_bounds, /*x_values=*/false);
  // proj_out(concat(a, mlp)) as two GEMMs over the weight's column blocks (views, read in place), the
  // second accumulating onto the first's output in place: the [B, N, d + mlp] concat is never written (2.7
  // ms of a 1024² step on the H200), nor a copy of the first output. The sum is rounded once more than in
  // one GEMM: within the bf16 noise.
  const int64_t d = a.x.size(2);
  Linear attn_part = b.proj_out.input_columns(0, d);
  attn_part.bias = b.proj_out.bias;
  const Linear mlp_part = b.proj_out.input_columns(d, mlp.size(2));
  const ops::Fp8Rows mlp_rows{mlp, Tensor(), Tensor()};
  if (b.proj_out.is_fp8() && x.size(0) == 1) {
    // Both parts' products straight onto the residual stream, the gate folded into each (one sample's gate:
    // batched, the per-part gated passes would cost more than the one below).
    Tensor y = attn_part.gated_residual(std::move(x), m[2], a);
    return mlp_part.gated_residual(std::move(y), m[2], mlp_rows);
  }
  Tensor y = attn_part(a);
  mlp_part.accumulate_into(y, mlp_rows);
  return gated_add(x, m[2], y);
}

Tensor FluxTransformer::run(const FluxInputs& in) const {
  const FluxConfig& c = config_;
  const int64_t batch = in.hidden_states.size(0), l = in.hidden_states.size(1), s = in.encoder_hidden_states.size(1);
  ATELIER_CHECK(in.hidden_states.dim() == 3 && in.hidden_states.size(2) == c.in_channels, "FLUX: hidden_states must be [B, L, in_channels]");
  ATELIER_CHECK(in.encoder_hidden_states.dim() == 3 && in.encoder_hidden_states.size(0) == batch &&
                    in.encoder_hidden_states.size(2) == c.joint_attention_dim,
                "FLUX: encoder_hidden_states must be [B, S, joint_attention_dim]");
  ATELIER_CHECK(in.pooled.dim() == 2 && in.pooled.size(0) == batch && in.pooled.size(1) == c.pooled_projection_dim,
                "FLUX: pooled must be [B, pooled_projection_dim]");
  ATELIER_CHECK(in.img_ids.dim() == 2 && in.img_ids.size(0) == l && in.txt_ids.dim() == 2 && in.txt_ids.size(0) == s,
                "FLUX: img_ids [L, 3] and txt_ids [S, 3] must match the sequences");
  ATELIER_CHECK(int64_t(in.timestep.size()) == batch, "FLUX: one timestep per sample");
  ATELIER_CHECK(!c.guidance_embeds || int64_t(in.guidance.size()) == batch, "FLUX: one guidance value per sample");
  const Tensor temb_act = ops::silu(conditioning(in));
  const Tensor ids = ops::concat({ops::contiguous(in.txt_ids.to(Device::cpu())), ops::contiguous(in.img_ids.to(Device::cpu()))}, 0);
  const std::vector<Tensor> tables = rope_cache_->get(ids.to_vector(), [&] {
    auto [cos_h, sin_h] = flux_rope_tables(ids, c.axes_dims_rope, c.rope_theta);
    return std::vector<Tensor>{ops::cast(cos_h, dtype_).to(device_), ops::cast(sin_h, dtype_).to(device_)};
  });
  // Everything below reads no host value: on CUDA it is recorded once per shape and replayed (the tables
  // are inputs too: they follow the ids' values, not only their shapes).
  return graphs_->run({in.hidden_states, in.encoder_hidden_states, temb_act, tables[0], tables[1]}, device_,
                      [this](const std::vector<Tensor>& v) { return transform(v[0], v[1], v[2], v[3], v[4]); });
}

Tensor FluxTransformer::transform(const Tensor& hidden, const Tensor& context, const Tensor& temb_act,
                                  const Tensor& cos, const Tensor& sin) const {
  const int64_t s = context.size(1), l = hidden.size(1);
  // Inputs in the weights' dtype (a bf16 model is fed f32 latents and text states); the output back in f32.
  Tensor img = x_embedder_(in_dtype(hidden));
  Tensor txt = context_embedder_(in_dtype(context));
  // Every modulation from one GEMV where they are stacked (modulation_), each linear's columns in
  // modulation_parts() order; else one GEMV each.
  const Tensor all_mods = modulation_.weight.defined() ? modulation_(temb_act) : Tensor();
  int64_t at = 0;
  const auto mod = [&](const Linear& lin) {
    const int64_t n = lin.out_features();
    if (!all_mods.defined() || at + n > all_mods.size(1)) return lin(temb_act);
    at += n;
    return all_mods.narrow(1, at - n, n);
  };
  for (const FluxDoubleBlock& b : double_blocks_) {
    const Tensor mod_img = mod(b.norm1_linear);
    double_block(b, img, txt, mod_img, mod(b.norm1_context_linear), cos, sin);
  }
  Tensor x = ops::concat({txt, img}, 1);
  for (const FluxSingleBlock& b : single_blocks_) x = single_block(b, std::move(x), mod(b.norm_linear), cos, sin);
  img = ops::contiguous(x.narrow(1, s, l));
  const auto mo = modulations(mod(norm_out_linear_), kFinalMods);  // scale, shift
  const Tensor out = proj_out_(modulate(img, mo[1], mo[0]));
  return out.dtype() == DType::F32 ? out : ops::cast(out, DType::F32);
}

Expected<Tensor> FluxTransformer::forward(const FluxInputs& in) const {
  Tensor out;
  Status st = catch_status([&] {
    out = run(in);
    return Status::ok();
  });
  if (!st) return st;
  return out;
}

}  // namespace atelier
