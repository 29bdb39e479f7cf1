// Applies the samplers' updates to a batch in which every sample may be at a different step of a different
// sampler: each output (the new samples, each saved tensor that some sample writes) is ONE
// ops::lincomb_per_sample over the batched operands, so on a GPU a sampler step is one fused kernel per
// output. Clipping samplers (clip_sample) add one lincomb plus a max/min for the clamp.
#pragma once
#include <span>
#include <vector>

#include "core/tensor.h"
#include "sampling/sampler.h"

namespace atelier::sampling {

// x [S, ...] -> [S, ...]: every sample times its sampler's next input scale (scale_model_input).
Tensor scale_model_inputs(std::span<Sampler* const> samplers, const Tensor& x);
// The timestep each sample's next model call gets.
std::vector<float> model_timesteps(std::span<Sampler* const> samplers);

// x, model_output [S, ...] (row s belongs to samplers[s]; model_output is after CFG). Draws each sample's
// noise from its own source with shape [1, ...], applies the updates, stores the saved tensors in the
// samplers (views of the batched results: no copy while the batch keeps its order) and advances them.
// denoised, when given, receives the x0 estimates [S, ...] (previews). Returns the new samples [S, ...].
Tensor apply_step(std::span<Sampler* const> samplers, const Tensor& x, const Tensor& model_output,
                  Tensor* denoised = nullptr);

namespace detail {
// apply_step with the shape the noise sources are asked for (Sampler::step passes its sample's own shape).
Tensor apply_step_with_shape(std::span<Sampler* const> samplers, const Tensor& x, const Tensor& model_output,
                             const Shape& noise_shape, Tensor* denoised);
}  // namespace detail

}  // namespace atelier::sampling
