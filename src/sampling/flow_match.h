// Flow matching with diffusers' FlowMatchEulerDiscreteScheduler semantics (FLUX, SD3, Z-Image, ...).
//
// The model predicts a velocity v; one Euler step is x_next = x + (sigma_next - sigma) * v, with
// sigma = 1 pure noise and sigma = 0 the clean sample. The plan (set_timesteps) reproduces diffusers'
// arithmetic, including which parts are float32 and which float64, so sigmas and timesteps come out
// bit-equal:
//   1. sigmas: given by the pipeline (FLUX passes np.linspace(1, 1/steps, steps), see flux_sigmas(); they
//      are cast to float32 and everything after is float32), or, when none are given,
//      linspace(sigma_max*T, sigma_min*T, steps) / T in float64 (sigma_min may be overridden: Z-Image
//      sets scheduler.sigma_min = 0).
//   2. shifting: dynamic (use_dynamic_shifting) with `mu` from the caller, usually flow_match_mu() of the
//      image sequence length: exponential exp(mu) / (exp(mu) + (1/s - 1)) or linear mu / (mu + (1/s - 1));
//      otherwise the static shift: shift * s / (1 + (shift - 1) * s).
//   3. optional shift_terminal stretch; then timesteps = sigmas * num_train_timesteps (float32) and a final
//      sigma of 0 is appended (invert_sigmas appends 1 after s -> 1 - s).
// The model gets timesteps()[i] (FLUX divides it by 1000 and the transformer multiplies back).
//
// Usage (one sample; batched callers use sigma()/sigma_next() to build their own lincomb):
//   auto cfg = parse_flow_match_config(scheduler_json).value();
//   FlowMatchPlanOptions o;  o.sigmas = flux_sigmas(steps);  o.mu = flow_match_mu(cfg, image_seq_len);
//   auto s = FlowMatchEuler::create(cfg, steps, o).value();
//   while (!s.done()) { v = model(x, s.timestep()); x = s.step(x, v); }
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace atelier::sampling {

// FlowMatchEulerDiscreteScheduler's init parameters (diffusers' defaults).
struct FlowMatchConfig {
  int num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5;
  double max_shift = 1.15;
  int64_t base_image_seq_len = 256;
  int64_t max_image_seq_len = 4096;
  bool invert_sigmas = false;
  std::optional<double> shift_terminal;
  std::string time_shift_type = "exponential";  // exponential | linear
};

// Reads a scheduler_config.json object (null or {} = all defaults). Karras/exponential/beta sigmas and
// stochastic sampling are refused with an unsupported error; unknown keys are ignored.
Expected<FlowMatchConfig> parse_flow_match_config(const nlohmann::json& scheduler_config);

// diffusers' calculate_shift: mu linear in the image sequence length (the number of packed latent tokens),
// base_shift at base_image_seq_len, max_shift at max_image_seq_len (float64).
double flow_match_mu(const FlowMatchConfig& config, int64_t image_seq_len);

// The sigmas the FLUX pipeline passes: np.linspace(1.0, 1/steps, steps) (float64).
std::vector<double> flux_sigmas(int steps);

struct FlowMatchPlanOptions {
  std::optional<std::vector<double>> sigmas;  // set_timesteps(sigmas=...); their count sets the steps
  std::optional<double> mu;                   // required with use_dynamic_shifting
  std::optional<double> sigma_min;            // overrides scheduler.sigma_min (default path only)
  std::optional<double> sigma_max;            // overrides scheduler.sigma_max (default path only)
};

class FlowMatchEuler {
 public:
  // steps in [1, 10000] (ignored when options.sigmas is given: their count is the step count).
  static Expected<FlowMatchEuler> create(const FlowMatchConfig& config, int steps,
                                         const FlowMatchPlanOptions& options = {});

  int num_inference_steps() const { return int(timesteps_.size()); }
  const std::vector<float>& timesteps() const { return timesteps_; }  // one per step
  const std::vector<float>& sigmas() const { return sigmas_; }        // steps + 1 (terminal appended)

  // img2img: start at step `index` (diffusers' set_begin_index); scale_noise below uses sigmas()[index].
  Status set_begin_index(int index);
  int step_index() const { return index_; }
  bool done() const { return index_ >= num_inference_steps(); }
  float timestep() const { return timesteps_.at(size_t(index_)); }
  float sigma() const { return sigmas_.at(size_t(index_)); }
  float sigma_next() const { return sigmas_.at(size_t(index_) + 1); }

  // x [any], v [same] -> x + (sigma_next - sigma) * v (float32 dt as diffusers computes it); advances.
  Tensor step(const Tensor& x, const Tensor& velocity);
  // Moves to the next step without computing (a batched caller applied the update itself).
  void advance() { ++index_; }

  // scale_noise at the current step: sigma * noise + (1 - sigma) * x0; shapes equal.
  Tensor scale_noise(const Tensor& x0, const Tensor& noise) const;

 private:
  FlowMatchEuler() = default;
  std::vector<float> timesteps_;
  std::vector<float> sigmas_;
  int index_ = 0;
};

}  // namespace atelier::sampling
