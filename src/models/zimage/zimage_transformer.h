// The Z-Image transformer (diffusers' ZImageTransformer2DModel, "S3-DiT"): latents are patchified (patch 2,
// frame patch 1) and embedded; a noise refiner (adaLN-modulated blocks) runs over the image tokens and a
// context refiner (unmodulated blocks) over the caption tokens; then the image and caption tokens form one
// sequence for the main blocks, and a final adaLN layer maps the image tokens back to patches.
// Each sequence is padded to a multiple of 32 tokens with a learned pad token (the padding is attended to,
// as in the reference). Attention uses per-head RMS QK norm and 3-axis RoPE (frame/caption index, row,
// column) in complex (interleaved-pair) form.
//
// Layouts: diffusers' folder (`all_x_embedder.2-1`, `attention.to_q`, `attention.norm_q`, ...) and the
// original single file (`x_embedder`, fused `attention.qkv`, `attention.out`, `attention.q_norm`, ...,
// optionally under `model.diffusion_model.`).
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/graph_runner.h"
#include "models/common/layers.h"
#include "models/common/table_cache.h"
#include "models/common/weights.h"

namespace atelier {

struct ZImageConfig {
  // Defaults are Z-Image-Turbo's (diffusers' ZImageTransformer2DModel defaults).
  int64_t in_channels = 16;
  int64_t dim = 3840;
  int n_layers = 30;
  int n_refiner_layers = 2;
  int n_heads = 30;
  float norm_eps = 1e-5f;
  bool qk_norm = true;
  int64_t cap_feat_dim = 2560;
  double rope_theta = 256.0;
  double t_scale = 1000.0;
  std::vector<int64_t> axes_dims = {32, 48, 48};
  std::vector<int64_t> axes_lens = {1024, 512, 512};
  int patch_size = 2;
  int f_patch_size = 1;

  int64_t head_dim() const { return dim / n_heads; }
  // min(dim, 256): the width of the adaLN conditioning (the timestep embedding).
  int64_t adaln_dim() const;
  int64_t ffn_dim() const { return int64_t(double(dim) / 3.0 * 8.0); }  // int(dim / 3 * 8), as the reference

  static Expected<ZImageConfig> from_json(const nlohmann::json& j);
  static Expected<ZImageConfig> from_file(const std::string& path);
  // From the shapes of a checkpoint (either layout); RoPE axes keep the defaults when they fit the head
  // size, else they are split as Z-Image splits 128 (1/4, 3/8, 3/8).
  static Expected<ZImageConfig> detect(const WeightStore& store);
  Status validate() const;
};

enum class ZImageLayout { kDiffusers, kOriginal };

// Which layout `store` holds, and the key prefix of the original layout ("" or "model.diffusion_model.").
Expected<ZImageLayout> detect_zimage_layout(const WeightStore& store, std::string* prefix = nullptr);
// True when `store` looks like a Z-Image transformer in either layout.
bool is_zimage_transformer(const WeightStore& store);

struct ZImageBlock {
  Linear to_q, to_k, to_v, to_out;  // no biases; q/k/v are views of qkv once stacked
  Linear qkv;                       // [to_q; to_k; to_v] stacked (the file's fused tensor, or a copy): one GEMM
  RMSNorm norm_q, norm_k;           // over head_dim
  RMSNorm attention_norm1, attention_norm2, ffn_norm1, ffn_norm2;
  Linear w1, w2, w3;                // SwiGLU feed-forward: w2(silu(w1 x) * w3 x)
  Linear w31;                       // [w3; w1] stacked (w3 and w1 are views of it), when both are bound: one GEMM
                                    // gives (value, gate) for ops::glu's value * silu(gate)
  Linear adaLN_modulation;          // [4 dim, adaln_dim] (scale_msa, gate_msa, scale_mlp, gate_mlp); absent
                                    // in the context refiner
  Fp8Bounds attn_bounds;            // not a checkpoint key: |q|, |k| bounds from the norms (quantize_fp8)
};

class ZImageTransformer {
 public:
  static Expected<ZImageTransformer> load(const WeightStore& store, const ZImageConfig& config, Device device,
                                          DType dtype = DType::F32);

  const ZImageConfig& config() const { return config_; }
  Device device() const { return device_; }

  // One sample: latents [C, F, H, W], t in [0, 1] (the pipeline's (1000 - timestep) / 1000), caption
  // features [L, cap_feat_dim] -> the model output [C, F, H, W] (the pipeline negates it for the scheduler).
  // Past the timestep features and rotary tables (host work), the call runs through graphs(): on CUDA, replayed
  // as one recorded graph from the second call of a shape on.
  Expected<Tensor> forward(const Tensor& latents, float t, const Tensor& caption) const;

  // The recorded-execution cache of forward() (see backend/graph_runner.h), as FluxTransformer's.
  GraphRunner& graphs() const { return *graphs_; }
  void set_graph_options(GraphRunner::Options options) { graphs_ = std::make_shared<GraphRunner>(options); }

  // Every block projection (attention, feed-forward, adaLN) to FP8 with per-row scales (Linear::quantize_fp8);
  // the embedders and the final layer stay in the compute dtype. `--dtype fp8`.
  void quantize_fp8();
  // Stacks every block's w3 and w1 into w31 and q/k/v into qkv (see ZImageBlock); load() calls it.
  void stack_projections();

 private:
  // latents [C, F, H, W] (any float dtype, on the device), caption [L, cap_feat_dim], adaln [1, adaln_dim],
  // tables: the rotary (cos, sin) of the image, the caption and the unified stream -> [C, F, H, W] f32. Reads
  // no host value: recordable.
  Tensor transform(const Tensor& latents, const Tensor& caption, const Tensor& adaln, const std::vector<Tensor>& tables) const;
  // x [1, S, dim], adaln [1, adaln_dim] or undefined, cos/sin [S, 1, hd/2, 1] -> [1, S, dim]
  Tensor block_forward(const ZImageBlock& b, const Tensor& x, const Tensor& adaln, const Tensor& cos, const Tensor& sin) const;
  // x [1, S, dim] (its rows quantized already where the projections are in FP8) -> attention output [1, S, dim]
  Tensor attention(const ZImageBlock& b, const ops::Fp8Rows& x, const Tensor& cos, const Tensor& sin) const;
  // t -> adaLN conditioning [1, adaln_dim]
  Tensor timestep_embedding(float t) const;
  // Rotary cos/sin [S, 1, hd/2, 1] for position ids [S, 3] (host).
  std::pair<Tensor, Tensor> rope(const std::vector<std::array<int64_t, 3>>& pos) const;

  ZImageConfig config_;
  Device device_;
  DType dtype_ = DType::F32;  // the weights' dtype: inputs and rotary tables are cast to it, the output back to f32
  bool fp8_attention_ = false;  // quantize_fp8(): attention in FP8 too (attention_rows_for)
  Linear x_embedder_;          // [dim, pF*p*p*C]
  Linear t_mlp0_, t_mlp2_;     // timestep MLP: [1024, 256], [adaln_dim, 1024]
  RMSNorm cap_norm_;           // cap_embedder.0
  Linear cap_linear_;          // cap_embedder.1
  Tensor x_pad_token_, cap_pad_token_;  // [1, dim]
  std::vector<ZImageBlock> noise_refiner_, context_refiner_, layers_;
  // Rotary tables of the last position layout: image, caption, and the unified stream's (cos, sin) each.
  std::shared_ptr<TableCache> rope_cache_ = std::make_shared<TableCache>();
  Linear final_adaLN_, final_linear_;
  std::shared_ptr<GraphRunner> graphs_ = std::make_shared<GraphRunner>(GraphRunner::dit_options());
};

}  // namespace atelier
