#include "sampling/sampler.h"

#include <cmath>

#include "sampling/samplers_impl.h"
#include "sampling/stepper.h"

namespace atelier::sampling {

bool LinearExpr::empty() const {
  for (double c : coeff) {
    if (c != 0.0) return false;
  }
  return true;
}

LinearExpr LinearExpr::operator+(const LinearExpr& o) const {
  LinearExpr r;
  for (int i = 0; i < kNumOperands; ++i) r.coeff[i] = coeff[i] + o.coeff[i];
  return r;
}

LinearExpr LinearExpr::operator-(const LinearExpr& o) const {
  LinearExpr r;
  for (int i = 0; i < kNumOperands; ++i) r.coeff[i] = coeff[i] - o.coeff[i];
  return r;
}

LinearExpr LinearExpr::operator*(double s) const {
  LinearExpr r;
  for (int i = 0; i < kNumOperands; ++i) r.coeff[i] = coeff[i] * s;
  return r;
}

namespace detail {

LinearExpr x0_from_prediction(const std::string& prediction_type, double alpha, double sigma) {
  const LinearExpr x = LinearExpr::of(Operand::kSample), m = LinearExpr::of(Operand::kModelOutput);
  if (prediction_type == "epsilon") return (x - m * sigma) / alpha;
  if (prediction_type == "v_prediction") return x * alpha - m * sigma;
  return m;  // sample (validated when the config was resolved)
}

LinearExpr x0_sigma_space(const std::string& prediction_type, double sigma) {
  const LinearExpr x = LinearExpr::of(Operand::kSample), m = LinearExpr::of(Operand::kModelOutput);
  if (prediction_type == "epsilon") return x - m * sigma;
  if (prediction_type == "v_prediction") {
    const double s2 = sigma * sigma + 1.0;
    return m * (-sigma / std::sqrt(s2)) + x / s2;
  }
  return m;
}

LinearExpr clip_if_configured(const SchedulerConfig& config, const LinearExpr& x0, StepUpdate& update) {
  if (!config.clip_sample) return x0;
  update.clamp = ClampSpec{x0, float(config.clip_sample_range)};
  return LinearExpr::of(Operand::kClamped);
}

}  // namespace detail

int img2img_steps(int steps, double strength) {
  const int init_timestep = std::min(int(double(steps) * strength), steps);
  return steps - std::max(steps - init_timestep, 0);
}

Status Sampler::set_strength(double strength) {
  if (call_ != begin_index_) return invalid_argument("set_strength must be called before the first model call");
  if (!(strength >= 0.0 && strength <= 1.0)) {
    return invalid_argument("strength must be in [0, 1], got " + std::to_string(strength));
  }
  // StableDiffusionImg2ImgPipeline.get_timesteps.
  const int t_start = steps_ - img2img_steps(steps_, strength);
  if (steps_ - t_start < 1) {
    return invalid_argument("strength " + std::to_string(strength) + " with " + std::to_string(steps_) +
                            " steps leaves no step to run; raise the strength or the steps");
  }
  begin_index_ = t_start * order_;
  if (begin_index_ >= int(timesteps_.size())) return invalid_argument("strength leaves no timestep to run");
  call_ = begin_index_;
  return Status::ok();
}

NoiseRule Sampler::noise_rule() const { return make_noise_rule(begin_index_); }

ModelCall Sampler::next_call() const {
  ATELIER_CHECK(!done(), "next_call on a finished sampler");
  return make_call(call_);
}

StepUpdate Sampler::update() const {
  ATELIER_CHECK(!done(), "update on a finished sampler");
  return make_update(call_);
}

void Sampler::advance(const std::array<std::optional<Tensor>, kNumSavedSlots>& saved) {
  ATELIER_CHECK(!done(), "advance on a finished sampler");
  for (int i = 0; i < kNumSavedSlots; ++i) {
    if (saved[size_t(i)]) saved_[size_t(i)] = *saved[size_t(i)];
  }
  on_advance();
  ++call_;
}

Tensor Sampler::step(const Tensor& x, const Tensor& model_output) {
  Sampler* self = this;
  return detail::apply_step_with_shape(std::span<Sampler* const>(&self, 1), x.unsqueeze(0),
                                       model_output.unsqueeze(0), x.shape(), nullptr)
      .squeeze(0);
}

Expected<std::unique_ptr<Sampler>> make_sampler(const SchedulerConfig& config, int steps) {
  if (steps < 1) return invalid_argument("steps must be at least 1, got " + std::to_string(steps));
  if (steps > kMaxSteps) {
    return invalid_argument("steps must be at most " + std::to_string(kMaxSteps) + ", got " + std::to_string(steps));
  }
  switch (config.kind) {
    case SamplerKind::kEuler:
    case SamplerKind::kEulerAncestral:
    case SamplerKind::kHeun: return detail::make_euler_family(config, steps);
    case SamplerKind::kDDIM:
    case SamplerKind::kLCM: return detail::make_ddim_family(config, steps);
    case SamplerKind::kDPMpp2M:
    case SamplerKind::kDPMpp2MSDE: return detail::make_dpm_solver(config, steps);
  }
  return internal_error("unknown sampler kind");
}

Expected<std::unique_ptr<Sampler>> make_sampler(const nlohmann::json& model_scheduler_config, SamplerSpec spec,
                                                int steps, const nlohmann::json& overrides) {
  ATELIER_ASSIGN_OR_RETURN(SchedulerConfig config, resolve_scheduler_config(model_scheduler_config, spec, overrides));
  return make_sampler(config, steps);
}

Expected<std::unique_ptr<Sampler>> make_sampler(const nlohmann::json& model_scheduler_config,
                                                std::string_view sampler_name, int steps,
                                                const nlohmann::json& overrides) {
  ATELIER_ASSIGN_OR_RETURN(SamplerSpec spec, parse_sampler(sampler_name));
  return make_sampler(model_scheduler_config, spec, steps, overrides);
}

}  // namespace atelier::sampling
