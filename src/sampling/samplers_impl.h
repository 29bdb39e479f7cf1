// Internal: the concrete sampler families behind make_sampler, and helpers they share.
#pragma once
#include <memory>
#include <string>

#include "sampling/sampler.h"

namespace atelier::sampling::detail {

// A sampler of type T for the config, initialised for `steps` steps (its init's error, if any).
template <typename T>
Expected<std::unique_ptr<Sampler>> build_sampler(const SchedulerConfig& config, int steps) {
  auto s = std::make_unique<T>(config);
  ATELIER_RETURN_IF_ERROR(s->init(steps));
  return std::unique_ptr<Sampler>(std::move(s));
}

// Euler, Euler ancestral, Heun (sigma space: x = x0 + sigma * eps).
Expected<std::unique_ptr<Sampler>> make_euler_family(const SchedulerConfig& config, int steps);
// DDIM and LCM (alpha-bar space: x = sqrt(a) * x0 + sqrt(1 - a) * eps).
Expected<std::unique_ptr<Sampler>> make_ddim_family(const SchedulerConfig& config, int steps);
// DPM-Solver++ 2M and 2M SDE.
Expected<std::unique_ptr<Sampler>> make_dpm_solver(const SchedulerConfig& config, int steps);

// x0 estimate of a model output for a sample x = alpha * x0 + sigma * eps, per prediction type:
// epsilon (x - sigma * m) / alpha, v_prediction alpha * x - sigma * m, sample m.
LinearExpr x0_from_prediction(const std::string& prediction_type, double alpha, double sigma);
// The same for sigma-space samplers (x = x0 + sigma * eps, alpha = 1), where v_prediction is defined on the
// scaled input: x0 = m * (-sigma / sqrt(sigma^2 + 1)) + x / (sigma^2 + 1).
LinearExpr x0_sigma_space(const std::string& prediction_type, double sigma);
// Routes an x0 estimate through StepUpdate::clamp when the config clips samples; returns what to use as x0.
LinearExpr clip_if_configured(const SchedulerConfig& config, const LinearExpr& x0, StepUpdate& update);

}  // namespace atelier::sampling::detail
