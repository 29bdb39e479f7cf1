// DPMSolverMultistepScheduler (diffusers 0.40) with algorithm_type dpmsolver++ (DPM++ 2M) or
// sde-dpmsolver++ (DPM++ 2M SDE), solver_order 1 or 2, solver_type midpoint or heun. The sample lives in
// variance-preserving space: x = alpha_t * x0 + sigma_t * eps with alpha_t = 1 / sqrt(sigma^2 + 1).
#include <algorithm>
#include <cmath>

#include "sampling/samplers_impl.h"

namespace atelier::sampling::detail {
namespace {

// Above this many timesteps diffusers stops forcing lower-order final steps.
constexpr size_t kLowerOrderFinalMaxSteps = 15;

struct VP {
  double alpha, sigma, lambda;
};
// _sigma_to_alpha_sigma_t plus lambda = log(alpha) - log(sigma) (+inf at sigma 0).
VP vp_of(float s) {
  const double alpha = 1.0 / std::sqrt(double(s) * s + 1.0);
  const double sigma = double(s) * alpha;
  return {alpha, sigma, std::log(alpha) - std::log(sigma)};
}

class DPMSolverSampler final : public Sampler {
 public:
  explicit DPMSolverSampler(SchedulerConfig c) : Sampler(std::move(c)) {}

  Status init(int steps) {
    ATELIER_ASSIGN_OR_RETURN(train_, make_train_schedule(config_));
    steps_ = steps;
    sde_ = config_.algorithm_type == "sde-dpmsolver++";
    std::vector<double> ts = spaced(steps);
    std::vector<double> sig;
    const std::vector<float>& table = train_.sigmas;
    const bool round_ts = config_.beta_schedule != "squaredcos_cap_v2";
    if (config_.use_karras_sigmas || config_.use_exponential_sigmas) {
      sig = config_.use_karras_sigmas ? karras_sigmas(table.front(), table.back(), steps)
                                      : exponential_sigmas(table.front(), table.back(), steps);
      ts.clear();
      for (double s : sig) ts.push_back(sigma_to_t(s, train_.log_sigmas));
      if (config_.use_karras_sigmas && round_ts) {
        for (double& t : ts) t = np_round(t);
      }
    } else if (config_.use_lu_lambdas) {
      // _convert_to_lu over the log-sigma table (rho 1), then sigmas = exp(lambdas).
      const std::vector<double> ramp = np_linspace(0, 1, steps);
      const double lmin = train_.log_sigmas.front(), lmax = train_.log_sigmas.back();
      ts.clear();
      for (double r : ramp) sig.push_back(std::exp(lmax + r * (lmin - lmax)));
      for (double s : sig) ts.push_back(sigma_to_t(s, train_.log_sigmas));
      if (round_ts) {
        for (double& t : ts) t = np_round(t);
      }
    } else {
      for (double t : ts) sig.push_back(interp_table(t, table));
    }
    for (double s : sig) sigmas_.push_back(float(s));
    sigmas_.push_back(config_.final_sigmas_type == "sigma_min" ? table.front() : 0.0f);
    for (double t : ts) timesteps_.push_back(float(int64_t(t)));  // .to(torch.int64) truncates
    init_noise_sigma_ = 1.0f;
    if (timesteps_.empty()) return invalid_argument("dpm-solver: the schedule has no timesteps");
    return Status::ok();
  }

 protected:
  ModelCall make_call(int i) const override { return {i, timesteps_[size_t(i)], 1.0f, 1.0f}; }

  NoiseRule make_noise_rule(int i) const override {
    // add_noise in float32: alpha_t = 1 / (sigma^2 + 1) ** 0.5, sigma_t = sigma * alpha_t.
    const float s = sigmas_[size_t(i)];
    const float alpha = 1.0f / std::sqrt(s * s + 1.0f);
    return {alpha, s * alpha};
  }

  StepUpdate make_update(int i) const override {
    const size_t n = timesteps_.size();
    const bool last = size_t(i) == n - 1;
    const bool lower_order_final =
        last && (config_.euler_at_final || (config_.lower_order_final && n < kLowerOrderFinalMaxSteps) ||
                 config_.final_sigmas_type == "zero");
    const VP s0 = vp_of(sigmas_[size_t(i)]), t = vp_of(sigmas_[size_t(i) + 1]);
    StepUpdate u;
    u.draws_noise = sde_;  // randn(model_output.shape) on every step, the last one included
    // convert_model_output: the x0 prediction m0.
    const LinearExpr m0 = x0_from_prediction(config_.prediction_type, s0.alpha, s0.sigma);
    u.denoised = m0;
    const bool first_order = config_.solver_order == 1 || lower_order_nums_ < 1 || lower_order_final;
    u.next_sample = first_order ? first_order_update(m0, s0, t) : second_order_update(m0, i, s0, t);
    if (!last) u.saves[0] = {SlotWrite::Action::kSet, m0};
    return u;
  }

  void on_advance() override { lower_order_nums_ = std::min(lower_order_nums_ + 1, config_.solver_order); }

 private:
  std::vector<double> spaced(int steps) const {
    const int T = config_.num_train_timesteps;
    const int last_timestep = T - clipped_index();
    std::vector<double> ts;
    if (config_.timestep_spacing == "linspace") {
      std::vector<double> v = np_linspace(0, last_timestep - 1, steps + 1);
      for (size_t k = v.size() - 1; k >= 1; --k) ts.push_back(np_round(v[k]));  // [::-1][:-1]
    } else if (config_.timestep_spacing == "leading") {
      const int ratio = last_timestep / (steps + 1);
      for (int k = steps; k >= 1; --k) ts.push_back(double(k * ratio + config_.steps_offset));
    } else {  // trailing
      for (double t : np_arange(last_timestep, 0, -double(T) / steps)) ts.push_back(np_round(t) - 1);
    }
    return ts;
  }

  // torch.searchsorted(flip(lambda_t), lambda_min_clipped): how many of the noisiest timesteps to drop.
  int clipped_index() const {
    const float clip = float(config_.lambda_min_clipped);
    int count = 0;
    for (auto it = train_.alphas_cumprod.rbegin(); it != train_.alphas_cumprod.rend(); ++it) {
      const float lambda = std::log(std::sqrt(*it)) - std::log(std::sqrt(1.0f - *it));
      if (!(lambda < clip)) break;
      ++count;
    }
    return count;
  }

  LinearExpr first_order_update(const LinearExpr& m0, const VP& s, const VP& t) const {
    const double h = t.lambda - s.lambda;
    const LinearExpr x = LinearExpr::of(Operand::kSample);
    if (!sde_) return x * (t.sigma / s.sigma) - m0 * (t.alpha * (std::exp(-h) - 1.0));
    return x * (t.sigma / s.sigma * std::exp(-h)) + m0 * (t.alpha * (1.0 - std::exp(-2.0 * h))) +
           LinearExpr::of(Operand::kNoise, t.sigma * std::sqrt(1.0 - std::exp(-2.0 * h)));
  }

  LinearExpr second_order_update(const LinearExpr& m0, int i, const VP& s0, const VP& t) const {
    const VP s1 = vp_of(sigmas_[size_t(i) - 1]);
    const double h = t.lambda - s0.lambda, h0 = s0.lambda - s1.lambda;
    const double r0 = h0 / h;
    const LinearExpr x = LinearExpr::of(Operand::kSample), m1 = LinearExpr::of(Operand::kSaved0);
    const LinearExpr d1 = (m0 - m1) * (1.0 / r0);
    const bool midpoint = config_.solver_type == "midpoint";
    if (!sde_) {
      const double a = t.alpha * (std::exp(-h) - 1.0);
      const double d1_coeff = midpoint ? -0.5 * a : t.alpha * ((std::exp(-h) - 1.0) / h + 1.0);
      return x * (t.sigma / s0.sigma) - m0 * a + d1 * d1_coeff;
    }
    const double b = t.alpha * (1.0 - std::exp(-2.0 * h));
    const double d1_coeff = midpoint ? 0.5 * b : t.alpha * ((1.0 - std::exp(-2.0 * h)) / (-2.0 * h) + 1.0);
    return x * (t.sigma / s0.sigma * std::exp(-h)) + m0 * b + d1 * d1_coeff +
           LinearExpr::of(Operand::kNoise, t.sigma * std::sqrt(1.0 - std::exp(-2.0 * h)));
  }

  bool sde_ = false;
  int lower_order_nums_ = 0;
};

}  // namespace

Expected<std::unique_ptr<Sampler>> make_dpm_solver(const SchedulerConfig& config, int steps) {
  auto s = std::make_unique<DPMSolverSampler>(config);
  ATELIER_RETURN_IF_ERROR(s->init(steps));
  return std::unique_ptr<Sampler>(std::move(s));
}

}  // namespace atelier::sampling::detail
