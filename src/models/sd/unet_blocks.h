// The blocks of the SD UNet (diffusers' ResnetBlock2D, Attention, BasicTransformerBlock, Transformer2DModel,
// CrossAttnDownBlock2D/DownBlock2D, UNetMidBlock2DCrossAttn, CrossAttnUpBlock2D/UpBlock2D). Each block
// describes its parameters once, through a ParamSource, so the same code loads weights from a file, fills
// them with random values (benchmarks), or lists their names and shapes (key-coverage tests).
// Forward passes call only the op API; shapes are NCHW for images and [B, tokens, channels] for sequences.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/common/layers.h"

namespace atelier {

// Where parameters come from. `fill(field, key, shape)` sets a field from the full canonical key (diffusers
// name) and the shape the model expects; scopes prefix keys the way the model nests its modules.
class ParamSource {
 public:
  using Fill = std::function<void(Tensor& field, const std::string& key, const Shape& shape)>;
  explicit ParamSource(Fill fill) : fill_(std::make_shared<const Fill>(std::move(fill))) {}

  ParamSource scope(const std::string& name) const;
  void tensor(Tensor& field, const std::string& key, const Shape& shape) const;
  void linear(Linear& l, const std::string& key, int64_t in, int64_t out, bool bias = true) const;
  // A square kernel k with "same" padding unless `pad` is given.
  void conv(Conv2d& c, const std::string& key, int64_t in, int64_t out, int k, int stride = 1, int pad = -1) const;
  void group_norm(GroupNorm& n, const std::string& key, int64_t channels, int groups, float eps) const;
  void layer_norm(LayerNorm& n, const std::string& key, int64_t dim, float eps) const;

 private:
  std::shared_ptr<const Fill> fill_;
  std::string scope_;
};

// What every block of one UNet call shares. The projections of the two inputs every block reads the same way
// (the time embedding: each resnet's time_emb_proj; the text context: each cross-attention's to_k and to_v)
// are made for all blocks at once, one GEMM each (UNet::stack_shared_projections): at SD 1.5's batch 2 they were
// 54 GEMMs of 4-6 us each, mostly launch and weight reads. Blocks whose column offset is unset (-1) project
// for themselves.
struct UNetConditioning {
  Tensor temb_act;    // [B, temb]: the time embedding after SiLU
  Tensor time_proj;   // [B, sum of the resnets' out channels]: resnet r's projection at columns [r.time_col, + out)
  Tensor context;     // [B, Sc, cross_dim]
  Tensor context_kv;  // [B, Sc, sum over cross-attentions of 2 dim]: keys at k_col, values at v_col
};

// diffusers' ResnetBlock2D with the default time-embedding mode (added after conv1).
struct ResnetBlock {
  GroupNorm norm1, norm2;
  Conv2d conv1, conv2;
  Linear time_emb_proj;
  Conv2d conv_shortcut;        // 1x1, only when in != out channels (weight undefined otherwise)
  float output_scale = 1.0f;   // output = (shortcut + h) / output_scale
  int64_t time_col = -1;       // time_emb_proj's columns in UNetConditioning::time_proj (-1: not stacked)

  void build(const ParamSource& p, int64_t in, int64_t out, int64_t temb, int groups, float eps);
  // x [B, in, H, W] -> [B, out, H, W]
  Tensor forward(const Tensor& x, const UNetConditioning& cond) const;
  // The same of two inputs side by side along channels, [B, in1 + in2, H, W] (an up block's running tensor and its
  // skip): their only readers, norm1 and the shortcut, read them where they lie where the device can.
  Tensor forward(const ops::ChannelConcat& x, const UNetConditioning& cond) const;

 private:
  template <class X>
  Tensor forward_impl(const X& x, const UNetConditioning& cond) const;
};

// Multi-head attention with bias-free q/k/v projections; the output projection is left to the caller, who
// fuses it with the residual add.
struct Attention {
  Linear to_q, to_k, to_v, to_out;
  // Self-attention only: to_q, to_k and to_v stacked [3 dim, dim] (the three become views of it), so that one
  // GEMM reads x once instead of three reading it each.
  Linear to_qkv;
  int heads = 8;
  // Attention to the context: to_k's and to_v's columns in UNetConditioning::context_kv (-1: not stacked).
  int64_t k_col = -1, v_col = -1;

  // self_attention: k and v project x itself (not a context), and the projections are fused.
  void build(const ParamSource& p, int64_t dim, int64_t kv_dim, int heads, bool self_attention);
  // x [B, S, dim], kv [B, Skv, kv_dim] (undefined: self-attention), kv_proj [B, Skv, *] (the stacked projection
  // of kv, or undefined) -> heads merged, before to_out: [B, S, dim]
  Tensor attend(const Tensor& x, const Tensor& kv, const Tensor& kv_proj = {}) const;
};

// LayerNorm -> self-attention, LayerNorm -> cross-attention, LayerNorm -> GEGLU feed-forward, each residual.
struct TransformerBlock {
  LayerNorm norm1, norm2, norm3;
  Attention attn1, attn2;
  Linear ff_in, ff_out;                 // ff.net.0.proj (dim -> 2 * 4 dim), ff.net.2 (4 dim -> dim)
  bool only_cross_attention = false;    // attn1 attends to the context as well

  void build(const ParamSource& p, int64_t dim, int64_t cross_dim, int heads, bool only_cross);
  // h [B, S, dim] -> [B, S, dim]; h is taken (std::move it in) so that the residuals accumulate in place.
  Tensor forward(Tensor h, const UNetConditioning& cond) const;
};

// Transformer2DModel (continuous input): GroupNorm -> proj_in -> transformer blocks -> proj_out -> + input.
// proj_in/proj_out are 1x1 convolutions in SD 1 and linears in SD 2; both are the same per-pixel matrix, so
// they are held as Linear (the loader accepts [C, C, 1, 1] for [C, C]) and applied to [B, H*W, C].
struct Transformer2D {
  GroupNorm norm;
  Linear proj_in, proj_out;
  std::vector<TransformerBlock> blocks;

  void build(const ParamSource& p, int64_t channels, int64_t cross_dim, int heads, int depth, int groups,
             bool only_cross);
  // x [B, C, H, W] -> [B, C, H, W]
  Tensor forward(const Tensor& x, const UNetConditioning& cond) const;
};

// One down level: resnets (each followed by an attention in CrossAttnDownBlock2D) and an optional stride-2
// downsampler. Pushes every intermediate output onto `skips` for the up path.
struct DownBlock {
  std::vector<ResnetBlock> resnets;
  std::vector<Transformer2D> attentions;  // empty for DownBlock2D
  Conv2d downsampler;                     // weight undefined on the last level
  bool pad_before_downsample = false;     // downsample_padding 0: pad right/bottom by 1 first (diffusers)

  // x [B, Cin, H, W] -> [B, Cout, H', W'] (H' = ceil(H / 2) when downsampling)
  Tensor forward(const Tensor& x, const UNetConditioning& cond, std::vector<Tensor>& skips) const;
};

// UNetMidBlock2DCrossAttn: resnet, then (attention, resnet) pairs.
struct MidBlock {
  std::vector<ResnetBlock> resnets;
  std::vector<Transformer2D> attentions;

  // x [B, C, H, W] -> same
  Tensor forward(const Tensor& x, const UNetConditioning& cond) const;
};

// One up level: each resnet takes the running tensor concatenated with the last skip; optional nearest
// upsampler to the next skip's size (2x, or 2x - 1 where the down path met an odd size) followed by a conv.
struct UpBlock {
  std::vector<ResnetBlock> resnets;
  std::vector<Transformer2D> attentions;  // empty for UpBlock2D
  Conv2d upsampler;                       // weight undefined on the last up block

  // x [B, Cprev, h, w] -> [B, Cout, H, W]; consumes resnets.size() skips from the back of `skips`, and
  // upsamples to the size of the skip left on top (when there is an upsampler).
  Tensor forward(const Tensor& x, const UNetConditioning& cond, std::vector<Tensor>& skips) const;
};

// x [B, C, h, w] -> [B, C, H, W] with H in {2h - 1, 2h}, W in {2w - 1, 2w}: torch's nearest interpolation
// to an explicit size, which for these sizes equals 2x nearest upsampling cropped to the size.
Tensor upsample_nearest_to(const Tensor& x, int64_t height, int64_t width);

}  // namespace atelier
