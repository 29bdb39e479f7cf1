// DDIMScheduler (eta 0) and LCMScheduler (diffusers 0.40): integer timesteps, alpha-bar space.
#include <cmath>

#include "sampling/samplers_impl.h"

namespace atelier::sampling::detail {
namespace {

class AlphaSampler : public Sampler {
 protected:
  using Sampler::Sampler;

  Status check_timesteps() const {
    for (float t : timesteps_) {
      if (t < 0 || t >= float(config_.num_train_timesteps)) {
        return invalid_argument(std::string(sampler_name(kind())) + ": planned timestep " +
                                std::to_string(int(t)) + " is outside [0, " +
                                std::to_string(config_.num_train_timesteps) + ") (check steps_offset)");
      }
    }
    return Status::ok();
  }
  float alpha_bar(int t) const { return train_.alphas_cumprod[size_t(t)]; }
  // set_alpha_to_one: the "previous" alpha-bar before timestep 0.
  float final_alpha_bar() const { return config_.set_alpha_to_one ? 1.0f : train_.alphas_cumprod.front(); }

  ModelCall make_call(int i) const override { return {i, timesteps_[size_t(i)], 1.0f, 1.0f}; }
  NoiseRule make_noise_rule(int i) const override {
    const float a = alpha_bar(int(timesteps_[size_t(i)]));
    return {std::sqrt(a), std::sqrt(1.0f - a)};
  }
  LinearExpr x0_at(int t, StepUpdate& u) const {
    const float a = alpha_bar(t);
    const LinearExpr x0 = x0_from_prediction(config_.prediction_type, std::sqrt(a), std::sqrt(1.0f - a));
    return clip_if_configured(config_, x0, u);
  }
};

class DDIMSampler final : public AlphaSampler {
 public:
  explicit DDIMSampler(SchedulerConfig c) : AlphaSampler(std::move(c)) {}

  Status init(int steps) {
    const int T = config_.num_train_timesteps;
    if (steps > T) {
      return invalid_argument("ddim: steps (" + std::to_string(steps) + ") cannot exceed num_train_timesteps (" +
                              std::to_string(T) + ")");
    }
    ATELIER_ASSIGN_OR_RETURN(train_, make_train_schedule(config_));
    steps_ = steps;
    std::vector<double> ts;
    if (config_.timestep_spacing == "linspace") {
      for (double t : np_linspace(0, T - 1, steps)) ts.insert(ts.begin(), np_round(t));
    } else if (config_.timestep_spacing == "leading") {
      const int ratio = T / steps;
      for (int i = steps - 1; i >= 0; --i) ts.push_back(double(i * ratio + config_.steps_offset));
    } else {  // trailing
      for (double t : np_arange(T, 0, -double(T) / steps)) ts.push_back(np_round(t) - 1);
    }
    for (double t : ts) timesteps_.push_back(float(t));
    return check_timesteps();
  }

 protected:
  StepUpdate make_update(int i) const override {
    const int T = config_.num_train_timesteps;
    const int t = int(timesteps_[size_t(i)]);
    const int prev = t - T / steps_;  // DDIM steps back by T // steps, whatever the spacing
    const float a = alpha_bar(t);
    const float a_prev = prev >= 0 ? alpha_bar(prev) : final_alpha_bar();
    const double sa = std::sqrt(a), sb = std::sqrt(1.0f - a);
    StepUpdate u;
    // pred_epsilon comes from the unclipped prediction (use_clipped_model_output is off).
    LinearExpr eps;
    const LinearExpr x = LinearExpr::of(Operand::kSample), m = LinearExpr::of(Operand::kModelOutput);
    if (config_.prediction_type == "epsilon") eps = m;
    else if (config_.prediction_type == "sample") eps = (x - m * sa) / sb;
    else eps = m * sa + x * sb;  // v_prediction
    u.denoised = x0_at(t, u);
    // eta = 0: std_dev_t = 0, so the direction term is sqrt(1 - a_prev) * eps and no noise is drawn.
    u.next_sample = u.denoised * std::sqrt(double(a_prev)) + eps * std::sqrt(double(1.0f - a_prev));
    return u;
  }
};

class LCMSampler final : public AlphaSampler {
 public:
  explicit LCMSampler(SchedulerConfig c) : AlphaSampler(std::move(c)) {}

  Status init(int steps) {
    const int T = config_.num_train_timesteps;
    const int original = config_.original_inference_steps;
    if (original > T) {
      return invalid_argument("lcm: original_inference_steps (" + std::to_string(original) +
                              ") cannot exceed num_train_timesteps (" + std::to_string(T) + ")");
    }
    if (steps > T) {
      return invalid_argument("lcm: steps (" + std::to_string(steps) + ") cannot exceed num_train_timesteps (" +
                              std::to_string(T) + ")");
    }
    if (steps > original) {
      return invalid_argument("lcm: steps (" + std::to_string(steps) +
                              ") cannot exceed original_inference_steps (" + std::to_string(original) + ")");
    }
    ATELIER_ASSIGN_OR_RETURN(train_, make_train_schedule(config_));
    steps_ = steps;
    // The distillation schedule k-1, 2k-1, ... (k = T // original), reversed, sampled at floor(linspace).
    const int k = T / original;
    std::vector<int> origin;
    for (int i = original; i >= 1; --i) origin.push_back(i * k - 1);
    for (double idx : np_linspace(0, double(origin.size()), steps, /*endpoint=*/false)) {
      timesteps_.push_back(float(origin[size_t(std::floor(idx))]));
    }
    return check_timesteps();
  }

 protected:
  StepUpdate make_update(int i) const override {
    const int t = int(timesteps_[size_t(i)]);
    const int prev = size_t(i) + 1 < timesteps_.size() ? int(timesteps_[size_t(i) + 1]) : t;
    const float a_prev = prev >= 0 ? alpha_bar(prev) : final_alpha_bar();
    // get_scalings_for_boundary_condition_discrete, in float32 (the timestep tensor times a python float).
    constexpr float kSigmaData2 = 0.25f;  // sigma_data = 0.5
    const float scaled = float(t) * float(config_.timestep_scaling);
    const float c_skip = kSigmaData2 / (scaled * scaled + kSigmaData2);
    const float c_out = scaled / std::sqrt(scaled * scaled + kSigmaData2);
    StepUpdate u;
    const LinearExpr x0 = x0_at(t, u);
    u.denoised = x0 * c_out + LinearExpr::of(Operand::kSample, c_skip);
    if (i != steps_ - 1) {
      u.draws_noise = true;
      u.next_sample = u.denoised * std::sqrt(double(a_prev)) +
                      LinearExpr::of(Operand::kNoise, std::sqrt(double(1.0f - a_prev)));
    } else {
      u.next_sample = u.denoised;
    }
    return u;
  }
};

}  // namespace

Expected<std::unique_ptr<Sampler>> make_ddim_family(const SchedulerConfig& config, int steps) {
  switch (config.kind) {
    case SamplerKind::kDDIM: return build_sampler<DDIMSampler>(config, steps);
    case SamplerKind::kLCM: return build_sampler<LCMSampler>(config, steps);
    default: return internal_error("make_ddim_family: not DDIM or LCM");
  }
}

}  // namespace atelier::sampling::detail
