// The CLIP text encoder of Stable Diffusion: SD 1.x's CLIP ViT-L/14 (transformers' CLIPTextModel) and SD 2.x's
// OpenCLIP ViT-H/14 text tower, from any of the layouts in clip_keymaps.h. Pre-norm transformer with a causal
// mask; the output is the last hidden state after the final layer norm, as diffusers' pipelines use it.
//
// Clip skip follows A1111: 1 = the last layer, 2 = the penultimate layer's output (then the final layer
// norm), and so on. A model may skip layers by default (`default_skip`): SD 2.x runs OpenCLIP up to its
// penultimate layer, so an SD 2.x single file loads with default_skip 2, and clip_skip 1 on it gives what
// diffusers gives with the converted text encoder (which simply has one layer fewer).
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "backend/graph_runner.h"
#include "models/clip/clip_config.h"
#include "models/clip/clip_keymaps.h"
#include "models/common/layers.h"
#include "models/common/weights.h"

namespace atelier {

struct ClipEncoderLayer {
  LayerNorm layer_norm1, layer_norm2;
  Linear q_proj, k_proj, v_proj, out_proj;  // OpenCLIP's fused in_proj is split into views of one buffer
  Linear fc1, fc2;
};

struct ClipTextOutput {
  Tensor hidden;  // [B, S, D]: the requested layer's output (after the final layer norm unless asked not to)
  Tensor pooled;  // [B, D], or [B, projection_dim] when projected: the last layer's state at the EOS position
};

struct ClipPooledOptions {
  int clip_skip = 1;              // for `hidden` only; `pooled` always comes from the last layer
  bool project = true;            // apply the text projection when the checkpoint has one
  bool hidden_final_norm = true;  // false: `hidden` is the raw layer output (SDXL takes it so)
};

class ClipTextModel {
 public:
  // Loads every tensor the configuration needs from `store` in `layout`, checking shapes; one error lists
  // every missing or mis-shaped key. `default_skip` (>= 1) overrides the layout's default (2 for OpenCLIP,
  // 1 otherwise); layers that can never run under it are not loaded. The CPU backend needs dtype f32.
  static Expected<ClipTextModel> load(const WeightStore& store, ClipLayout layout, const ClipTextConfig& config,
                                      Device device, DType dtype = DType::F32,
                                      std::optional<int> default_skip = std::nullopt);

  // Seeded random weights (std 0.02, unit layer norms) of `config` in transformers' layout, loaded through
  // load(): the built-in benchmark configurations' text encoder (clip_random.cc).
  static Expected<ClipTextModel> random(const ClipTextConfig& config, uint64_t seed, Device device,
                                        DType dtype = DType::F32);

  const ClipTextConfig& config() const { return config_; }
  int default_skip() const { return default_skip_; }
  // Largest clip_skip accepted: every layer skipped, down to the embeddings.
  int max_clip_skip() const;
  bool has_projection() const { return text_projection_.weight.defined(); }
  Device device() const { return device_; }

  // The recorded-execution cache of forward() for one clip skip (see backend/graph_runner.h): a prompt's
  // encoding is ~110 small launches, most of its time on a GPU (~3.5 ms on an H200 eager). A server encodes
  // 1..64 prompts at once; the buckets keep that to a few recordings of a few MB each.
  GraphRunner& graphs(int clip_skip = 1) const;
  void set_graph_options(GraphRunner::Options options);
  // The buckets above; recording off with ATELIER_TEXT_GRAPHS=0 (or every recording with ATELIER_GRAPHS=0).
  static GraphRunner::Options default_graph_options();

  // ids [B, S] i32/i64 (S <= max_position_embeddings, on any device) -> last_hidden_state [B, S, D]. On a device
  // that records its work (CUDA) a shape's calls after the first replay one graph per clip skip (graphs()).
  Expected<Tensor> forward(const Tensor& ids, int clip_skip = 1) const;
  // ids [B, S] -> hidden [B, S, D] per options, pooled [B, D] or [B, projection_dim]. Pooling position as in
  // transformers: argmax(ids) when eos_token_id is 2, else the first position whose id is eos_token_id.
  Expected<ClipTextOutput> forward_with_pooled(const Tensor& ids, const ClipPooledOptions& options = {}) const;

 private:
  ClipTextModel() = default;  // made only by load(), which binds the weights and the runners
  // Index of the deepest layer run for `clip_skip`, as a count of layers; error when out of range.
  Expected<int> layers_for_skip(int clip_skip) const;
  // ids [B, S] (host copy) -> validated; error names the problem.
  Status check_ids(const Tensor& host_ids) const;
  // ids [B, S] on the model's device -> [B, S, D]
  Tensor embed(const Tensor& ids) const;
  // x [B, S, D], mask [1, 1, S, S] -> [B, S, D]
  Tensor layer_forward(const ClipEncoderLayer& layer, const Tensor& x, const Tensor& mask) const;
  // Additive causal mask [1, 1, S, S] on the model's device: causal_mask_ itself at the longest S, else its
  // top-left corner (a copy made on the device, so that a recorded call may make it).
  Tensor causal_mask(int64_t seq) const;
  // The layers up to `depth` and the final norm: forward() once its inputs are checked.
  Tensor run(const Tensor& ids, int depth) const;
  // host_ids [B, S], last [B, S, D] (after the final norm) -> [B, D] rows at the pooling positions
  Tensor pool(const Tensor& host_ids, const Tensor& last) const;

  ClipTextConfig config_;
  int default_skip_ = 1;
  Device device_;
  DType dtype_ = DType::F32;
  Embedding token_embedding_;
  Tensor position_embedding_;  // [P, D]
  std::vector<ClipEncoderLayer> layers_;
  LayerNorm final_layer_norm_;
  Linear text_projection_;  // [projection_dim, D], no bias; undefined when the checkpoint has none
  // [1, 1, P, P] for P = max_position_embeddings, made once on the device: a recorded call may not upload a
  // host buffer (it would be frozen into the recording and freed after it).
  Tensor causal_mask_;
  // One runner per layer depth (index: depth, 0 = the embeddings), shared by copies of the model as its weights are.
  std::vector<std::shared_ptr<GraphRunner>> graphs_;
};

// A1111's prompt emphasis "(word:1.2)": hidden [B, S, D], weights [B, S] (host f32) -> hidden with each token's
// vector multiplied by its weight, then the whole tensor rescaled so that its mean equals the original mean.
Expected<Tensor> apply_emphasis(const Tensor& hidden, const Tensor& weights);

}  // namespace atelier
