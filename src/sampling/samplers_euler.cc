// EulerDiscreteScheduler, EulerAncestralDiscreteScheduler and HeunDiscreteScheduler (diffusers 0.40).
#include <algorithm>
#include <cmath>

#include "sampling/samplers_impl.h"

namespace atelier::sampling::detail {
namespace {

// scale_model_input: sample / (sigma**2 + 1) ** 0.5, the divisor evaluated in float32 as torch does.
ModelCall sigma_call(int index, float timestep, float sigma) {
  const float divisor = std::sqrt(sigma * sigma + 1.0f);
  return {index, timestep, float(1.0 / double(divisor)), divisor};
}

// set_timesteps shared by the three classes (Heun has no final_sigmas_type / sigma_min / sigma_max and
// ends on 0). Returns timesteps (float32 values in double) and sigmas without the final entry.
struct SigmaPlan {
  std::vector<double> timesteps;
  std::vector<double> sigmas;
};

Expected<SigmaPlan> plan_sigmas(const SchedulerConfig& c, const TrainSchedule& train, int steps) {
  SigmaPlan p;
  ATELIER_ASSIGN_OR_RETURN(p.timesteps, spaced_timesteps(c, steps));
  for (double t : p.timesteps) p.sigmas.push_back(interp_table(t, train.sigmas));
  if (c.use_karras_sigmas || c.use_exponential_sigmas) {
    const double smin = c.sigma_min.value_or(p.sigmas.back());
    const double smax = c.sigma_max.value_or(p.sigmas.front());
    // Karras uses num_inference_steps, exponential the same value here (both are `steps`).
    p.sigmas = c.use_karras_sigmas ? karras_sigmas(smin, smax, steps) : exponential_sigmas(smin, smax, steps);
    p.timesteps.clear();
    for (double s : p.sigmas) p.timesteps.push_back(sigma_to_t(s, train.log_sigmas));
  }
  return p;
}

float max_of(const std::vector<float>& v) { return *std::max_element(v.begin(), v.end()); }

class SigmaSampler : public Sampler {
 protected:
  using Sampler::Sampler;
  Status init_common(int steps) {
    ATELIER_ASSIGN_OR_RETURN(train_, make_train_schedule(config_));
    steps_ = steps;
    return Status::ok();
  }
  void set_init_noise_sigma() {
    const float m = max_of(sigmas_);
    const bool plain = config_.timestep_spacing == "linspace" || config_.timestep_spacing == "trailing";
    init_noise_sigma_ = plain ? m : std::sqrt(m * m + 1.0f);
  }
  NoiseRule make_noise_rule(int index) const override { return {1.0f, sigmas_[size_t(index)]}; }
};

class EulerSampler final : public SigmaSampler {
 public:
  explicit EulerSampler(SchedulerConfig c) : SigmaSampler(std::move(c)) {}

  Status init(int steps) {
    ATELIER_RETURN_IF_ERROR(init_common(steps));
    ATELIER_ASSIGN_OR_RETURN(SigmaPlan p, plan_sigmas(config_, train_, steps));
    for (double s : p.sigmas) sigmas_.push_back(float(s));
    sigmas_.push_back(config_.final_sigmas_type == "sigma_min" ? train_.sigmas.front() : 0.0f);
    const bool continuous_v = config_.timestep_type == "continuous" && config_.prediction_type == "v_prediction";
    for (size_t i = 0; i < p.timesteps.size(); ++i) {
      timesteps_.push_back(continuous_v ? 0.25f * float(std::log(double(sigmas_[i]))) : float(p.timesteps[i]));
    }
    set_init_noise_sigma();
    return Status::ok();
  }

 protected:
  ModelCall make_call(int i) const override { return sigma_call(i, timesteps_[size_t(i)], sigmas_[size_t(i)]); }

  // s_churn = 0 (the pipeline's default), so sigma_hat = sigma and no noise is drawn.
  StepUpdate make_update(int i) const override {
    const float sigma = sigmas_[size_t(i)];
    const float dt = sigmas_[size_t(i) + 1] - sigma;
    StepUpdate u;
    u.denoised = x0_sigma_space(config_.prediction_type, sigma);
    const LinearExpr derivative = (LinearExpr::of(Operand::kSample) - u.denoised) / sigma;
    u.next_sample = LinearExpr::of(Operand::kSample) + derivative * dt;
    return u;
  }
};

class EulerAncestralSampler final : public SigmaSampler {
 public:
  explicit EulerAncestralSampler(SchedulerConfig c) : SigmaSampler(std::move(c)) {}

  Status init(int steps) {
    ATELIER_RETURN_IF_ERROR(init_common(steps));
    ATELIER_ASSIGN_OR_RETURN(SigmaPlan p, plan_sigmas(config_, train_, steps));
    for (double t : p.timesteps) timesteps_.push_back(float(t));
    for (double s : p.sigmas) sigmas_.push_back(float(s));
    sigmas_.push_back(0.0f);
    set_init_noise_sigma();
    return Status::ok();
  }

 protected:
  ModelCall make_call(int i) const override { return sigma_call(i, timesteps_[size_t(i)], sigmas_[size_t(i)]); }

  StepUpdate make_update(int i) const override {
    const float from = sigmas_[size_t(i)], to = sigmas_[size_t(i) + 1];
    // sigma_up / sigma_down in float32 as torch computes them (clamped at 0 where rounding goes negative).
    const float from2 = from * from, to2 = to * to;
    const float up = std::sqrt(std::max(0.0f, to2 * (from2 - to2) / from2));
    const float down = std::sqrt(std::max(0.0f, to2 - up * up));
    StepUpdate u;
    u.draws_noise = true;  // randn(model_output.shape) on every step, the last one included
    u.denoised = x0_sigma_space(config_.prediction_type, from);
    const LinearExpr derivative = (LinearExpr::of(Operand::kSample) - u.denoised) / from;
    u.next_sample = LinearExpr::of(Operand::kSample) + derivative * double(down - from) +
                    LinearExpr::of(Operand::kNoise, up);
    return u;
  }
};

// Heun: timesteps [t0, t1, t1, t2, t2, ...] and sigmas [s0, s1, s1, ..., s_{n-1}, s_{n-1}, 0]; even calls
// are Euler predictions that save (sample, derivative), odd calls correct them with the average slope.
class HeunSampler final : public SigmaSampler {
 public:
  explicit HeunSampler(SchedulerConfig c) : SigmaSampler(std::move(c)) {}

  Status init(int steps) {
    ATELIER_RETURN_IF_ERROR(init_common(steps));
    order_ = 2;
    // Heun has no sigma_min / sigma_max settings, so Karras/exponential span the interpolated ends.
    ATELIER_ASSIGN_OR_RETURN(SigmaPlan p, plan_sigmas(config_, train_, steps));
    std::vector<float> s;
    for (double v : p.sigmas) s.push_back(float(v));
    s.push_back(0.0f);
    sigmas_.push_back(s.front());
    for (size_t i = 1; i + 1 < s.size(); ++i) sigmas_.insert(sigmas_.end(), {s[i], s[i]});
    sigmas_.push_back(s.back());
    timesteps_.push_back(float(p.timesteps.front()));
    for (size_t i = 1; i < p.timesteps.size(); ++i) {
      timesteps_.insert(timesteps_.end(), {float(p.timesteps[i]), float(p.timesteps[i])});
    }
    set_init_noise_sigma();
    return Status::ok();
  }

 protected:
  ModelCall make_call(int i) const override { return sigma_call(i, timesteps_[size_t(i)], sigmas_[size_t(i)]); }

  StepUpdate make_update(int i) const override {
    // begin_index is t_start * 2, so first-order calls are the even ones.
    return i % 2 == 0 ? first_order(i) : second_order(i);
  }

 private:
  StepUpdate first_order(int i) const {
    const float sigma = sigmas_[size_t(i)], next = sigmas_[size_t(i) + 1];
    StepUpdate u;
    u.denoised = clip_if_configured(config_, x0_sigma_space(config_.prediction_type, sigma), u);
    const LinearExpr derivative = (LinearExpr::of(Operand::kSample) - u.denoised) / sigma;
    u.next_sample = LinearExpr::of(Operand::kSample) + derivative * double(next - sigma);
    if (size_t(i) + 1 < timesteps_.size()) {  // the last call is a plain Euler step with nothing to correct
      u.saves[0] = {SlotWrite::Action::kSet, LinearExpr::of(Operand::kSample)};
      u.saves[1] = {SlotWrite::Action::kSet, derivative};
    }
    return u;
  }

  StepUpdate second_order(int i) const {
    const float sigma = sigmas_[size_t(i) - 1], next = sigmas_[size_t(i)];
    StepUpdate u;
    u.denoised = clip_if_configured(config_, x0_sigma_space(config_.prediction_type, next), u);
    const LinearExpr derivative = (LinearExpr::of(Operand::kSample) - u.denoised) / next;
    const LinearExpr average = (LinearExpr::of(Operand::kSaved1) + derivative) * 0.5;
    u.next_sample = LinearExpr::of(Operand::kSaved0) + average * double(next - sigma);
    u.saves[0].action = SlotWrite::Action::kClear;
    u.saves[1].action = SlotWrite::Action::kClear;
    return u;
  }
};

}  // namespace

Expected<std::unique_ptr<Sampler>> make_euler_family(const SchedulerConfig& config, int steps) {
  switch (config.kind) {
    case SamplerKind::kEuler: return build_sampler<EulerSampler>(config, steps);
    case SamplerKind::kEulerAncestral: return build_sampler<EulerAncestralSampler>(config, steps);
    case SamplerKind::kHeun: return build_sampler<HeunSampler>(config, steps);
    default: return internal_error("make_euler_family: not an Euler-family sampler");
  }
}

}  // namespace atelier::sampling::detail
