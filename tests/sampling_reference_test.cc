// Samplers against a literal (line-by-line, double precision) transcription of diffusers' step() code, and
// the convergence order of the deterministic solvers on Gaussian data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

#include "sampling/sampler.h"
#include "sampling_test_util.h"

namespace atelier::sampling {
namespace {

// --- a literal transcription of diffusers' step() functions, in double ------------------------------------
//
// The samplers above compose each step into coefficients; these references follow diffusers' code line by
// line instead (pred_original_sample, derivative, model_outputs list, lower_order_nums ...), on the tables
// the plan produced (which the golden test checks). Random model outputs exercise every term, including
// the ones a point mass makes vanish (DPM-Solver's D1, Heun's slope average).

using Vec = std::vector<double>;

Vec axpby(double a, const Vec& x, double b, const Vec& y) {
  Vec r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = a * x[i] + b * y[i];
  return r;
}

struct Reference {
  const Sampler& plan;  // tables only: timesteps, sigmas, alphas_cumprod
  const SchedulerConfig& c;
  std::function<Vec()> randn;
  int step_index = 0;
  // Heun state
  std::optional<Vec> prev_derivative, heun_sample;
  double heun_dt = 0;
  // DPM-Solver state
  std::vector<Vec> model_outputs;
  int lower_order_nums = 0;

  double sig(int i) const { return plan.sigmas()[size_t(i)]; }
  double ac(int t) const { return plan.train_schedule().alphas_cumprod[size_t(t)]; }
  Vec clip(Vec x) const {
    if (c.clip_sample) for (double& v : x) v = std::clamp(v, -c.clip_sample_range, c.clip_sample_range);
    return x;
  }
  // x0 for x = alpha * x0 + sigma * eps
  Vec pred_vp(const Vec& m, const Vec& x, double alpha, double sigma) const {
    if (c.prediction_type == "epsilon") return axpby(1 / alpha, x, -sigma / alpha, m);
    if (c.prediction_type == "v_prediction") return axpby(alpha, x, -sigma, m);
    return m;
  }
  // Euler-family pred_original_sample
  Vec pred_sigma(const Vec& m, const Vec& x, double s) const {
    if (c.prediction_type == "epsilon") return axpby(1, x, -s, m);
    if (c.prediction_type == "v_prediction") return axpby(1 / (s * s + 1), x, -s / std::sqrt(s * s + 1), m);
    return m;
  }

  Vec step(const Vec& m, const Vec& x) {
    Vec out;
    switch (plan.kind()) {
      case SamplerKind::kEuler: {
        const double s = sig(step_index);
        const Vec pred = pred_sigma(m, x, s);
        const Vec d = axpby(1 / s, x, -1 / s, pred);
        out = axpby(1, x, sig(step_index + 1) - s, d);
        break;
      }
      case SamplerKind::kEulerAncestral: {
        const double s = sig(step_index), from = s, to = sig(step_index + 1);
        const Vec pred = pred_sigma(m, x, s);
        const double up = std::sqrt(to * to * (from * from - to * to) / (from * from));
        const double down = std::sqrt(to * to - up * up);
        const Vec d = axpby(1 / s, x, -1 / s, pred);
        out = axpby(1, axpby(1, x, down - s, d), up, randn());
        break;
      }
      case SamplerKind::kHeun: out = heun(m, x); break;
      case SamplerKind::kDDIM: {
        const int t = int(plan.timesteps()[size_t(step_index)]);
        const int prev = t - c.num_train_timesteps / plan.num_inference_steps();
        const double a = ac(t), ap = prev >= 0 ? ac(prev) : (c.set_alpha_to_one ? 1.0 : ac(0)), b = 1 - a;
        Vec pred, eps;
        if (c.prediction_type == "epsilon") { pred = axpby(1 / std::sqrt(a), x, -std::sqrt(b) / std::sqrt(a), m); eps = m; }
        else if (c.prediction_type == "sample") { pred = m; eps = axpby(1 / std::sqrt(b), x, -std::sqrt(a) / std::sqrt(b), pred); }
        else { pred = axpby(std::sqrt(a), x, -std::sqrt(b), m); eps = axpby(std::sqrt(a), m, std::sqrt(b), x); }
        pred = clip(pred);
        out = axpby(std::sqrt(ap), pred, std::sqrt(1 - ap), eps);
        break;
      }
      case SamplerKind::kLCM: {
        const int t = int(plan.timesteps()[size_t(step_index)]);
        const int prev = size_t(step_index) + 1 < plan.timesteps().size() ? int(plan.timesteps()[size_t(step_index) + 1]) : t;
        const double a = ac(t), ap = ac(prev);
        const double scaled = t * c.timestep_scaling;
        const double c_skip = 0.25 / (scaled * scaled + 0.25), c_out = scaled / std::sqrt(scaled * scaled + 0.25);
        const Vec pred = clip(pred_vp(m, x, std::sqrt(a), std::sqrt(1 - a)));
        const Vec denoised = axpby(c_out, pred, c_skip, x);
        out = step_index != plan.num_inference_steps() - 1 ? axpby(std::sqrt(ap), denoised, std::sqrt(1 - ap), randn())
                                                           : denoised;
        break;
      }
      case SamplerKind::kDPMpp2M:
      case SamplerKind::kDPMpp2MSDE: out = dpm(m, x); break;
    }
    ++step_index;
    return out;
  }

  Vec heun(const Vec& m, const Vec& x) {
    const bool first = !prev_derivative.has_value();
    const double s = first ? sig(step_index) : sig(step_index - 1);
    const double next = first ? sig(step_index + 1) : sig(step_index);
    const Vec pred = clip(pred_sigma(m, x, first ? s : next));
    if (first) {
      const Vec d = axpby(1 / s, x, -1 / s, pred);
      prev_derivative = d;
      heun_dt = next - s;
      heun_sample = x;
      return axpby(1, x, heun_dt, d);
    }
    const Vec d2 = axpby(1 / next, x, -1 / next, pred);
    const Vec d = axpby(0.5, *prev_derivative, 0.5, d2);
    const Vec out = axpby(1, *heun_sample, heun_dt, d);
    prev_derivative.reset();
    heun_sample.reset();
    return out;
  }

  static std::tuple<double, double, double> vp(double s) {
    const double alpha = 1 / std::sqrt(s * s + 1), sigma = s * alpha;
    return {alpha, sigma, std::log(alpha) - std::log(sigma)};
  }

  Vec dpm(const Vec& m, const Vec& x) {
    const size_t n = plan.timesteps().size();
    const bool lof = size_t(step_index) == n - 1 &&
                     (c.euler_at_final || (c.lower_order_final && n < 15) || c.final_sigmas_type == "zero");
    const auto [a0, s0, l0] = vp(sig(step_index));
    const Vec m0 = pred_vp(m, x, a0, s0);
    model_outputs.push_back(m0);
    const bool sde = c.algorithm_type == "sde-dpmsolver++";
    const Vec noise = sde ? randn() : Vec(x.size(), 0.0);
    const auto [at, st, lt] = vp(sig(step_index + 1));
    const double h = lt - l0;
    Vec out;
    if (c.solver_order == 1 || lower_order_nums < 1 || lof) {
      out = sde ? axpby(1, axpby(st / s0 * std::exp(-h), x, at * (1 - std::exp(-2 * h)), m0), st * std::sqrt(1 - std::exp(-2 * h)), noise)
                : axpby(st / s0, x, -(at * (std::exp(-h) - 1)), m0);
    } else {
      const auto [a1, s1, l1] = vp(sig(step_index - 1));
      const Vec& m1 = model_outputs[model_outputs.size() - 2];
      const double r0 = (l0 - l1) / h;
      const Vec D1 = axpby(1 / r0, m0, -1 / r0, m1);
      const bool mid = c.solver_type == "midpoint";
      if (!sde) {
        const double A = at * (std::exp(-h) - 1);
        out = axpby(1, axpby(st / s0, x, -A, m0), mid ? -0.5 * A : at * ((std::exp(-h) - 1) / h + 1), D1);
      } else {
        const double B = at * (1 - std::exp(-2 * h));
        out = axpby(1, axpby(st / s0 * std::exp(-h), x, B, m0), mid ? 0.5 * B : at * ((1 - std::exp(-2 * h)) / (-2 * h) + 1), D1);
        out = axpby(1, out, st * std::sqrt(1 - std::exp(-2 * h)), noise);
      }
    }
    if (lower_order_nums < c.solver_order) ++lower_order_nums;
    return out;
  }
};

TEST(SamplingReference, StepsMatchALiteralTranscriptionOfDiffusers) {
  const json sd = {{"beta_schedule", "scaled_linear"}, {"beta_start", 0.00085}, {"beta_end", 0.012},
                   {"steps_offset", 1}, {"set_alpha_to_one", false}};
  struct Variant {
    const char* name;
    json overrides;
  };
  std::vector<Variant> variants;
  for (const char* name : {"euler", "euler_a", "heun", "ddim", "lcm", "dpmpp_2m", "dpmpp_2m_sde", "euler_karras",
                           "heun_exponential", "dpmpp_2m_karras", "dpmpp_2m_sde_exponential"}) {
    for (const char* pred : {"epsilon", "v_prediction", "sample"}) {
      if (std::string(name) == "euler_a" && std::string(pred) == "sample") continue;
      variants.push_back({name, {{"prediction_type", pred}}});
    }
  }
  variants.push_back({"dpmpp_2m", {{"solver_type", "heun"}}});
  variants.push_back({"dpmpp_2m_sde", {{"solver_type", "heun"}}});
  variants.push_back({"dpmpp_2m", {{"final_sigmas_type", "sigma_min"}, {"timestep_spacing", "trailing"}}});
  variants.push_back({"dpmpp_2m", {{"euler_at_final", true}, {"lower_order_final", false}, {"final_sigmas_type", "sigma_min"}}});
  variants.push_back({"ddim", {{"clip_sample", true}, {"clip_sample_range", 1.5}, {"timestep_spacing", "trailing"}}});
  variants.push_back({"heun", {{"clip_sample", true}, {"timestep_spacing", "leading"}}});
  variants.push_back({"lcm", {{"clip_sample", true}, {"original_inference_steps", 40}}});
  variants.push_back({"lcm", {{"timestep_scaling", 0.05}}});  // makes c_skip matter
  variants.push_back({"euler", {{"timestep_spacing", "trailing"}, {"final_sigmas_type", "sigma_min"}}});
  variants.push_back({"euler_a", {{"timestep_spacing", "leading"}}});
  double worst = 0;
  for (const Variant& v : variants) {
    for (int steps : {3, 8, 20}) {
      SCOPED_TRACE(std::string(v.name) + " " + v.overrides.dump() + " " + std::to_string(steps) + " steps");
      auto s = make(sd, v.name, steps, v.overrides);
      ASSERT_TRUE(s);
      constexpr int64_t kN = 8;
      s->set_noise_source(gaussian_source(42));
      const NoiseSource ref_noise = gaussian_source(42);
      Reference ref{*s, s->config(), [&] { Vec r; for (float f : ref_noise({1, kN}).to_vector()) r.push_back(f); return r; }};
      std::mt19937 gen{static_cast<uint32_t>(steps)};
      std::normal_distribution<float> nd;
      std::vector<float> x0(kN);
      for (float& f : x0) f = nd(gen) * s->init_noise_sigma();
      Tensor x = Tensor::from_vector(x0, {1, kN});
      Vec xr(x0.begin(), x0.end());
      while (!s->done()) {
        std::vector<float> m(kN);
        for (float& f : m) f = nd(gen);
        x = s->step(x, Tensor::from_vector(m, {1, kN}));
        xr = ref.step(Vec(m.begin(), m.end()), xr);
        double scale = 1, err = 0;
        for (size_t i = 0; i < xr.size(); ++i) scale = std::max(scale, std::abs(xr[i]));
        const auto got = x.to_vector();
        for (size_t i = 0; i < xr.size(); ++i) err = std::max(err, std::abs(got[i] - xr[i]) / scale);
        worst = std::max(worst, err);
        ASSERT_LE(err, 1e-5) << "call " << s->call_index();
      }
      EXPECT_EQ(ref.step_index, int(s->timesteps().size()));
    }
  }
  std::printf("[ reference ] %zu variants x 3 step counts: max diff %.3g (relative to the largest |x|)\n",
              variants.size(), worst);
}

// Gaussian data N(0, sd^2): the probability-flow ODE is solved exactly by x(s) = x(s0) *
// sqrt(sd^2 + s^2) / sqrt(sd^2 + s0^2) in sigma space, so the error measures each solver's order. It is
// taken where sigma first drops below 1 (the last steps of the linspace schedule do not shrink in
// log-sigma as steps grow, so the end point is no measure of order): second-order solvers (Heun, DPM++ 2M)
// must beat Euler/DDIM by far, and their error must shrink about 4x when the steps double.
TEST(SamplingReference, GaussianDataSolverOrder) {
  constexpr double kSd = 0.5;
  constexpr double kCheckSigma = 1.0;
  const json sd = {{"beta_schedule", "scaled_linear"}, {"beta_start", 0.00085}, {"beta_end", 0.012},
                   {"steps_offset", 1}, {"set_alpha_to_one", true}, {"clip_sample", false}};
  // The sample's noise level in sigma space and the factor that maps the sample to sigma space.
  auto sigma_space = [](const Sampler& s) -> std::pair<double, double> {
    const auto [alpha, sigma] = model_noise_level(s);
    const bool vp = s.kind() != SamplerKind::kEuler && s.kind() != SamplerKind::kHeun;
    return {sigma / alpha, vp ? 1 / alpha : 1.0};
  };
  auto error_at_check = [&](const char* name, int steps) {
    auto s = make(sd, name, steps);
    double x = 1.7 * s->init_noise_sigma();
    const auto [s0, to_sigma0] = sigma_space(*s);
    const double x_start = x * to_sigma0;
    // Heun's state is a corrected one only before its first-order (even) calls.
    while (sigma_space(*s).first >= kCheckSigma || s->call_index() % s->order() != 0) {
      const auto [alpha, sigma] = model_noise_level(*s);
      const double x_in = x * s->next_call().input_scale;
      // E[x0 | x_in] for x_in = alpha x0 + sigma eps, x0 ~ N(0, sd^2); eps = (x_in - alpha x0_hat) / sigma.
      const double x0_hat = alpha * kSd * kSd / (alpha * alpha * kSd * kSd + sigma * sigma) * x_in;
      const double eps = (x_in - alpha * x0_hat) / sigma;
      x = s->step(Tensor::from_vector({float(x)}, {1, 1}), Tensor::from_vector({float(eps)}, {1, 1})).to_vector()[0];
    }
    const auto [s1, to_sigma1] = sigma_space(*s);
    const double exact = x_start * std::sqrt(kSd * kSd + s1 * s1) / std::sqrt(kSd * kSd + s0 * s0);
    return std::abs(x * to_sigma1 - exact) / std::abs(exact);
  };
  const double euler = error_at_check("euler", 20), ddim = error_at_check("ddim", 20);
  const double heun = error_at_check("heun", 10), dpm = error_at_check("dpmpp_2m", 20);  // heun: 19 calls
  const double dpm_k = error_at_check("dpmpp_2m_karras", 20);
  std::printf("[ order ] relative error at sigma ~1, ~20 model calls: euler %.2e ddim %.2e heun(10 steps) %.2e "
              "dpmpp_2m %.2e dpmpp_2m_karras %.2e\n", euler, ddim, heun, dpm, dpm_k);
  // Same schedule, same number of model calls: the multistep solver wins by far.
  EXPECT_LT(dpm, euler / 5);
  EXPECT_LT(dpm, ddim / 5);
  // Doubling the steps: about 4x less error for second order, about 2x for first order.
  std::printf("[ order ] error ratio 40 -> 80 steps:");
  for (const char* name : {"heun", "dpmpp_2m", "dpmpp_2m_karras", "euler", "ddim"}) {
    const double e1 = error_at_check(name, 40), e2 = error_at_check(name, 80);
    std::printf(" %s %.2f", name, e1 / e2);
    const bool second_order = std::string(name) != "euler" && std::string(name) != "ddim";
    if (second_order) EXPECT_GT(e1 / e2, 3.0) << name << " " << e1 << " -> " << e2;
    else EXPECT_LT(e1 / e2, 2.5) << name << " " << e1 << " -> " << e2;
  }
  std::printf("\n");
}

}  // namespace
}  // namespace atelier::sampling
