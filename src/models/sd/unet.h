// The Stable Diffusion 1.x/2.x UNet (diffusers' UNet2DConditionModel in its SD variants): timestep
// embedding and time MLP, conv_in, down levels (resnets + cross-attention transformers + downsamplers),
// mid block, up levels with skip connections and upsamplers, conv_norm_out + SiLU + conv_out.
//
// Weights load from diffusers folders or CompVis single files (see unet_keymap_compvis.h); the forward pass
// takes one timestep per sample, so a server can batch samples that are at different denoising steps.
// config.upcast_attention (SD 2.1-v) asks for attention in f32; on the CPU everything is f32 already, so
// it only matters to a backend that computes in bf16/f16.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/graph_runner.h"
#include "core/status.h"
#include "core/tensor.h"
#include "models/sd/unet_blocks.h"
#include "models/sd/unet_config.h"

namespace atelier {

class WeightStore;

class UNet {
 public:
  // Binds every parameter of `config` to `store` (keys in `layout`; a CompVis file's tensors may carry the
  // "model.diffusion_model." prefix or not), checking each shape; all missing or mis-shaped tensors are
  // reported in one error that names their keys as the file spells them.
  static Expected<UNet> load(const WeightStore& store, UNetLayout layout, const UNetConfig& config,
                             Device device = Device::cpu(), DType dtype = DType::F32);
  // Deterministic random weights of the right shapes for `config` (each tensor seeded from `seed` and its
  // name; fan-in scaled so activations stay in range), for benchmarks without a download.
  // `dtype` is the compute dtype of the weights (f32 on the CPU; bf16/f16 on CUDA).
  static Expected<UNet> random(const UNetConfig& config, uint64_t seed, Device device = Device::cpu(),
                               DType dtype = DType::F32);
  // Canonical (diffusers) name and shape of every parameter of a UNet with `config`, in build order.
  static Expected<std::vector<std::pair<std::string, Shape>>> parameter_shapes(const UNetConfig& config);

  // x [B, in_channels, h, w] (any h, w >= 1), timesteps [B] f32 (one per sample; [1] is shared by all),
  // context [B, S, cross_attention_dim] -> noise prediction [B, out_channels, h, w] f32. `result`: kBorrowed
  // for a caller that reads the prediction before its next forward() and keeps none of it (a sampler step),
  // which spares a copy of it at every replayed call (GraphRunner::Result).
  Expected<Tensor> forward(const Tensor& x, const Tensor& timesteps, const Tensor& context,
                           GraphRunner::Result result = GraphRunner::Result::kFresh) const;

  // The recorded-execution cache of forward() (CUDA graphs; see backend/graph_runner.h): its statistics,
  // and a way to switch recording off (tests compare the two) or drop the recordings' memory.
  GraphRunner& graphs() const { return *graphs_; }
  void set_graph_options(GraphRunner::Options options) { graphs_ = std::make_shared<GraphRunner>(options); }

  // Recordings kept and batch buckets (see GraphRunner): a server batches 1..max_batch samples, twice that
  // many UNet rows with CFG; the buckets keep that to a handful of recordings, all of which stay cached.
  static GraphRunner::Options default_graph_options() {
    return {.max_entries = 8, .batch_buckets = {1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64}};
  }

  const UNetConfig& config() const { return config_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }

 private:
  UNet(UNetConfig config, Device device, DType dtype)
      : config_(std::move(config)), device_(device), dtype_(dtype) {}
  void build(const ParamSource& p);
  Status check_inputs(const Tensor& x, const Tensor& timesteps, const Tensor& context) const;
  // Same shapes as forward; inputs already checked.
  Tensor run(const Tensor& x, const Tensor& timesteps, const Tensor& context) const;
  Tensor device_timestep_features(const Tensor& timesteps, int64_t batch) const;  // [batch, C0] in dtype_
  // Stacks every resnet's time_emb_proj into time_proj_ and every cross-attention's to_k/to_v into context_kv_
  // (the per-block Linears become views of the stacked weights); nothing where weights are not bound.
  void stack_shared_projections();

  UNetConfig config_;
  Device device_;
  DType dtype_;
  std::shared_ptr<GraphRunner> graphs_ = std::make_shared<GraphRunner>(default_graph_options());
  Tensor freqs_;  // [1, block_out_channels[0] / 2] f32 on device_: the sinusoids' frequencies
  Linear time_linear_1_, time_linear_2_;
  Conv2d conv_in_;
  std::vector<DownBlock> down_;
  MidBlock mid_;
  std::vector<UpBlock> up_;
  GroupNorm norm_out_;
  Conv2d conv_out_;
  Linear time_proj_;   // [sum of the resnets' out channels, temb]: every resnet's time_emb_proj, stacked
  Linear context_kv_;  // [sum over cross-attentions of 2 dim, cross_dim]: every to_k and to_v of the context
};

// diffusers' sinusoidal timestep features (get_timestep_embedding with max_period 10000), in f32 as torch
// computes them: freq_i = exp(-ln(10000) * i / (dim/2 - freq_shift)); [sin(t freq), cos(t freq)] (swapped
// when flip_sin_to_cos; zero-padded for odd dim). timesteps: one per sample -> host [B, dim] f32.
Tensor timestep_embedding(const std::vector<float>& timesteps, int dim, bool flip_sin_to_cos, float freq_shift);

}  // namespace atelier
