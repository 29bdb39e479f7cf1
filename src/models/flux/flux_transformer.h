// FLUX.1's transformer (diffusers' FluxTransformer2DModel): MM-DiT double-stream blocks (separate image and
// text weights, joint attention), then single-stream blocks over the concatenated [text; image] sequence
// (attention and MLP in parallel from one modulated input), 3-axis RoPE over (index, row, col) position ids,
// RMS-normalised queries and keys, adaLN-Zero modulation from timestep + distilled guidance + CLIP pooled
// embeddings, and a final adaLN-continuous norm. Field names follow diffusers' checkpoint keys.
//
// Inputs as FluxPipeline passes them: packed latents [B, L, 64] (2x2 patches of the 16-channel latent),
// T5 tokens [B, S, 4096], CLIP pooled [B, 768], position ids img [L, 3] / txt [S, 3] (float), the timestep as
// sigma in [0, 1] (the model multiplies by 1000) and the guidance scale (also multiplied by 1000).
#pragma once
#include <array>
#include <memory>
#include <utility>
#include <vector>

#include "backend/graph_runner.h"
#include "models/common/layers.h"
#include "models/common/table_cache.h"
#include "models/common/weights.h"
#include "models/flux/flux_config.h"

namespace atelier {

// linear_1 -> SiLU -> linear_2 (TimestepEmbedding and PixArtAlphaTextProjection alike).
struct FluxMlpEmbedder {
  Linear linear_1, linear_2;
};

struct FluxDoubleBlock {
  Linear norm1_linear, norm1_context_linear;  // norm1.linear / norm1_context.linear: 6 modulations each
  Linear to_q, to_k, to_v, add_q_proj, add_k_proj, add_v_proj;  // attn.*
  Linear to_qkv, add_qkv;  // [to_q; to_k; to_v] and [add_q_proj; ...] stacked (the six are views of them): one
                           // GEMM per stream (stack_linears; unbound where stacking does not apply)
  RMSNorm norm_q, norm_k, norm_added_q, norm_added_k;          // attn.* over head_dim
  Linear to_out, to_add_out;                                    // attn.to_out.0, attn.to_add_out
  Linear ff_proj, ff_out, ff_context_proj, ff_context_out;      // ff(.context).net.0.proj / net.2
  Fp8Bounds attn_bounds;  // not a checkpoint key: |q|, |k| bounds from the norms (quantize_fp8; FP8 attention)
};

struct FluxSingleBlock {
  Linear norm_linear;          // norm.linear: 3 modulations
  Linear to_q, to_k, to_v;     // attn.*
  Linear to_qkv;               // the three stacked (they are views of it), as in FluxDoubleBlock
  RMSNorm norm_q, norm_k;      // attn.*
  Linear proj_mlp, proj_out;   // proj_out takes [attention, mlp] concatenated
  Fp8Bounds attn_bounds;       // as in FluxDoubleBlock
};

struct FluxInputs {
  Tensor hidden_states;          // [B, L, in_channels]
  Tensor encoder_hidden_states;  // [B, S, joint_attention_dim]
  Tensor pooled;                 // [B, pooled_projection_dim]
  Tensor img_ids;                // [L, 3] f32 (host or device)
  Tensor txt_ids;                // [S, 3] f32
  std::vector<float> timestep;   // one per sample: sigma (t / 1000)
  std::vector<float> guidance;   // one per sample; ignored by models without guidance embeds
};

class FluxTransformer {
 public:
  // Reads every tensor from `store` in `layout` under `prefix`, checking shapes. CPU needs dtype f32.
  // fp8_blocks: the blocks' projections stored in f8e4m3 are kept in FP8 (WeightLoader::keep_fp8_linears;
  // quantize_fp8() then quantizes the others).
  static Expected<FluxTransformer> load(const WeightStore& store, FluxLayout layout, const FluxConfig& config,
                                        Device device, DType dtype = DType::F32, const std::string& prefix = "",
                                        bool fp8_blocks = false);

  const FluxConfig& config() const { return config_; }
  Device device() const { return device_; }

  // -> velocity [B, L, out_channels] f32 on the model's device (inputs of any float dtype). The blocks run
  // through graphs(): on CUDA, replayed as one recorded graph from the second call of a shape on.
  Expected<Tensor> forward(const FluxInputs& in) const;

  // The recorded-execution cache of forward() (see backend/graph_runner.h): statistics, and a way to switch
  // recording off (tests compare the two). A copy of the model shares it until one of them sets new options.
  GraphRunner& graphs() const { return *graphs_; }
  void set_graph_options(GraphRunner::Options options) { graphs_ = std::make_shared<GraphRunner>(options); }

  // Every projection of the double and single blocks (attention, MLP, adaLN modulation) to FP8 with per-row
  // scales (Linear::quantize_fp8); the embedders and the final layer stay in the compute dtype. `--dtype fp8`.
  void quantize_fp8();
  // Stacks every block's q/k/v projections (to_qkv, add_qkv), and every adaLN modulation linear into
  // modulation_; load() calls it.
  void stack_projections();

 private:
  // x in the model's dtype (a copy unless it already is).
  Tensor in_dtype(const Tensor& x) const;
  // temb [B, D] from timesteps, guidance and pooled text.
  Tensor conditioning(const FluxInputs& in) const;
  // x [B, L, in] etc. -> [B, L, out]; throws on shape errors. The host-side work (timestep features, rotary
  // tables) runs here, the rest in transform() through graphs_.
  Tensor run(const FluxInputs& in) const;
  // hidden [B, L, in_channels], context [B, S, joint_attention_dim] (any float dtype, on the device),
  // temb_act silu(temb) [B, D], cos/sin [S + L, head_dim / 2] -> velocity [B, L, out_channels] f32. Reads no
  // host value: recordable.
  Tensor transform(const Tensor& hidden, const Tensor& context, const Tensor& temb_act, const Tensor& cos,
                   const Tensor& sin) const;
  // Runs one double block in place on (img [B, L, D], txt [B, S, D]); mod_img/mod_txt [B, 6 D]: the outputs
  // of norm1.linear / norm1_context.linear.
  void double_block(const FluxDoubleBlock& b, Tensor& img, Tensor& txt, const Tensor& mod_img, const Tensor& mod_txt,
                    const Tensor& cos, const Tensor& sin) const;
  // A double block's joint attention from its modulated text (nt [B, S, D]) and image (ni [B, L, D]) rows: q, k
  // (RMS-normed, rotated) and v of the joint sequence (text first; cos/sin its tables) -> rows x [B, S + L, D]
  // (attention_rows_for: e4m3 rows too with FP8 attention).
  ops::Fp8Rows joint_attention(const FluxDoubleBlock& b, const ops::Fp8Rows& nt, const ops::Fp8Rows& ni, const Tensor& cos,
                               const Tensor& sin) const;
  // x [B, S+L, D], mod [B, 3 D] (norm.linear's output) -> same as x. x is taken: its memory may hold the result.
  Tensor single_block(const FluxSingleBlock& b, Tensor x, const Tensor& mod, const Tensor& cos, const Tensor& sin) const;
  // The adaLN modulation linears in the order transform() reads them: each double block's norm1.linear and
  // norm1_context.linear, each single block's norm.linear, norm_out.linear.
  std::vector<Linear*> modulation_parts();

  FluxConfig config_;
  Device device_;
  DType dtype_ = DType::F32;
  bool fp8_attention_ = false;  // quantize_fp8(): attention in FP8 too (attention_rows_for)
  Linear x_embedder_, context_embedder_;
  FluxMlpEmbedder timestep_embedder_, guidance_embedder_, text_embedder_;
  std::vector<FluxDoubleBlock> double_blocks_;
  std::vector<FluxSingleBlock> single_blocks_;
  Linear norm_out_linear_, proj_out_;  // norm_out.linear: (scale, shift)
  // Every modulation linear stacked (modulation_parts(), views of it): all of them read silu(temb), so one
  // GEMV per step computes every block's modulation (57 GEMVs of [1, 3072] rows fewer at FLUX.1-dev's size;
  // weight-bound: 6.5 GB in bf16). Unbound where stacking does not apply (stack_linears).
  Linear modulation_;
  std::shared_ptr<TableCache> rope_cache_ = std::make_shared<TableCache>();  // cos, sin of the last ids
  std::shared_ptr<GraphRunner> graphs_ = std::make_shared<GraphRunner>(GraphRunner::dit_options());
};

// FluxPosEmbed: ids [N, 3] (f32, any device) -> cos, sin [N, head_dim / 2] f32 host tensors, one entry per
// rotated pair (diffusers repeats each twice, interleaved), computed in float64 as diffusers does and rounded once.
std::pair<Tensor, Tensor> flux_rope_tables(const Tensor& ids, const std::array<int, 3>& axes_dims, double theta);

// apply_rotary_emb with interleaved pairs: x [B, H, N, D], cos/sin [N, D/2] (on x's device) ->
// x * cos + rotate(x) * sin with rotate(x)[2i] = -x[2i+1], rotate(x)[2i+1] = x[2i].
Tensor flux_apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin);

}  // namespace atelier
