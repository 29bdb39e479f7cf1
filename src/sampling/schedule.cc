#include "sampling/schedule.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace atelier::sampling {
namespace {

constexpr double kMaxBeta = 0.999;       // betas_for_alpha_bar's cap
constexpr double kKarrasRho = 7.0;       // "7.0 is the value used in the paper"
constexpr double kMinSigmaForLog = 1e-10;
// numpy's float32 log kernel: log(x) = e * ln2 + P(y) / Q(y), y = m - 1 with the mantissa m in
// (sqrt(1/2), sqrt(2)], P and Q degree-5 minimax polynomials evaluated with FMAs.
constexpr float kLogP[6] = {0.0f, 9.999999999999998702752e-01f, 2.112677543073053063722e+00f,
                            1.480000633576506585156e+00f, 3.808837741388407920751e-01f,
                            2.589979117907922693523e-02f};
constexpr float kLogQ[6] = {1.0f, 2.612677543073109236779e+00f, 2.453006071784736363091e+00f,
                            9.864942958519418960339e-01f, 1.546476374983906719538e-01f,
                            5.875095403124574342950e-03f};
constexpr float kLn2f = 0.693147180559945309417232121458176568f;
constexpr float kSqrtHalff = 0.707106781186547524400844362104849039f;
constexpr uint32_t kTwoPow100Bits = 0x71800000u;  // denormals are scaled by 2^100 first
constexpr float kDenormalShift = 100.0f;

constexpr float kZeroSnrAlphaBar = 1.0f / 16777216.0f;  // 2**-24, diffusers' stand-in for alpha_bar = 0

// betas_for_alpha_bar: python float64 loop, stored as float32.
std::vector<float> betas_for_alpha_bar(int n, bool exp_transform) {
  auto alpha_bar = [&](double t) {
    if (exp_transform) return std::exp(t * -12.0);
    const double c = std::cos((t + 0.008) / 1.008 * M_PI / 2);
    return c * c;
  };
  std::vector<float> betas(n);
  for (int i = 0; i < n; ++i) {
    const double t1 = double(i) / n, t2 = double(i + 1) / n;
    betas[i] = float(std::min(1 - alpha_bar(t2) / alpha_bar(t1), kMaxBeta));
  }
  return betas;
}

// torch.cumprod on float32: the running product is kept in double, each output rounded to float.
std::vector<float> cumprod_f32(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  double acc = 1.0;
  for (size_t i = 0; i < x.size(); ++i) {
    acc *= double(x[i]);
    out[i] = float(acc);
  }
  return out;
}

std::vector<float> one_minus(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = 1.0f - x[i];
  return out;
}

// rescale_zero_terminal_snr (arXiv 2305.08891, Algorithm 1), in float32 as torch computes it.
std::vector<float> rescale_zero_terminal_snr(const std::vector<float>& betas) {
  std::vector<float> s = cumprod_f32(one_minus(betas));
  for (float& v : s) v = std::sqrt(v);
  const float s0 = s.front(), s_last = s.back();
  const float scale = s0 / (s0 - s_last);
  for (float& v : s) v = (v - s_last) * scale;
  std::vector<float> alphas(s.size());
  float prev = 0.0f;
  for (size_t i = 0; i < s.size(); ++i) {
    const float alpha_bar = s[i] * s[i];
    alphas[i] = i == 0 ? alpha_bar : alpha_bar / prev;
    prev = alpha_bar;
  }
  return one_minus(alphas);
}

}  // namespace

std::vector<float> torch_linspace_f32(double start, double end, int n) {
  if (n <= 0) return {};
  const float s = float(start), e = float(end);
  if (n == 1) return {s};
  const float step = (e - s) / float(n - 1);
  const int halfway = n / 2;
  std::vector<float> out(n);
  for (int i = 0; i < n; ++i) {
    out[i] = i < halfway ? std::fma(step, float(i), s) : std::fma(-step, float(n - i - 1), e);
  }
  return out;
}

std::vector<double> np_linspace(double start, double end, int n, bool endpoint) {
  if (n <= 0) return {};
  const int div = endpoint ? n - 1 : n;
  std::vector<double> out(n);
  const double delta = end - start;
  if (div == 0) {
    out[0] = start;
    return out;
  }
  const double step = delta / div;
  for (int i = 0; i < n; ++i) out[i] = (step == 0 ? double(i) / div * delta : double(i) * step) + start;
  if (endpoint && n > 1) out[n - 1] = end;
  return out;
}

std::vector<double> np_arange(double start, double stop, double step) {
  const double len = std::ceil((stop - start) / step);
  if (!(len > 0)) return {};
  std::vector<double> out(static_cast<size_t>(len));
  out[0] = start;
  if (out.size() > 1) out[1] = start + step;
  // numpy fills from the first two values: delta = (start + step) - start.
  const double delta = out.size() > 1 ? out[1] - out[0] : step;
  for (size_t i = 2; i < out.size(); ++i) out[i] = start + double(i) * delta;
  return out;
}

float numpy_log_f32(float x) {
  if (std::isnan(x) || (std::isinf(x) && x > 0)) return x;
  if (x < 0) return -std::numeric_limits<float>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<float>::infinity();
  float shift = 0.0f;
  if (x < FLT_MIN) {
    float scale;
    std::memcpy(&scale, &kTwoPow100Bits, sizeof scale);
    x *= scale;
    shift = kDenormalShift;
  }
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  float e = float(int(bits >> 23) - 126) - shift;  // x = m * 2^e with m in [0.5, 1)
  const uint32_t mbits = (bits & 0x007FFFFFu) | 0x3F000000u;
  float m;
  std::memcpy(&m, &mbits, sizeof m);
  if (m <= kSqrtHalff) {
    m = m + m;
    e = e - 1.0f;
  }
  const float y = m - 1.0f;
  float num = kLogP[5], den = kLogQ[5];
  for (int k = 4; k >= 0; --k) {
    num = std::fma(num, y, kLogP[k]);
    den = std::fma(den, y, kLogQ[k]);
  }
  return std::fma(e, kLn2f, num / den);
}

double np_round(double x) {
  // Round half to even, independent of the current floating-point rounding mode.
  const double r = std::round(x);
  if (std::abs(x - std::trunc(x)) == 0.5) return 2.0 * std::round(x / 2.0);
  return r;
}

Expected<TrainSchedule> make_train_schedule(const SchedulerConfig& c) {
  TrainSchedule ts;
  const int n = c.num_train_timesteps;
  if (c.trained_betas) {
    ts.betas.assign(c.trained_betas->begin(), c.trained_betas->end());
  } else if (c.beta_schedule == "linear") {
    ts.betas = torch_linspace_f32(c.beta_start, c.beta_end, n);
  } else if (c.beta_schedule == "scaled_linear") {
    ts.betas = torch_linspace_f32(std::sqrt(c.beta_start), std::sqrt(c.beta_end), n);
    for (float& b : ts.betas) b = b * b;
  } else if (c.beta_schedule == "squaredcos_cap_v2") {
    ts.betas = betas_for_alpha_bar(n, /*exp_transform=*/false);
  } else if (c.beta_schedule == "exp") {
    ts.betas = betas_for_alpha_bar(n, /*exp_transform=*/true);
  } else {
    return unsupported("beta_schedule '" + c.beta_schedule + "' is not supported");
  }
  if (c.rescale_betas_zero_snr) ts.betas = rescale_zero_terminal_snr(ts.betas);
  ts.alphas_cumprod = cumprod_f32(one_minus(ts.betas));
  // Euler, Euler ancestral and DPM-Solver replace the exact zero by 2^-24 (DDIM and LCM keep it).
  const bool patches_last = c.kind == SamplerKind::kEuler || c.kind == SamplerKind::kEulerAncestral ||
                            c.kind == SamplerKind::kDPMpp2M || c.kind == SamplerKind::kDPMpp2MSDE;
  if (c.rescale_betas_zero_snr && patches_last) ts.alphas_cumprod.back() = kZeroSnrAlphaBar;
  ts.sigmas.resize(n);
  ts.log_sigmas.resize(n);
  for (int i = 0; i < n; ++i) {
    const float a = ts.alphas_cumprod[i];
    ts.sigmas[i] = std::sqrt((1.0f - a) / a);
    ts.log_sigmas[i] = numpy_log_f32(ts.sigmas[i]);
  }
  return ts;
}

double interp_table(double x, const std::vector<float>& table) {
  const int n = int(table.size());
  if (std::isnan(x)) return x;
  if (x <= 0) return table.front();
  if (x >= n - 1) return table.back();
  const int j = int(std::floor(x));
  if (double(j) == x) return table[j];
  const double slope = double(table[j + 1]) - double(table[j]);  // xp spacing is 1
  return slope * (x - j) + double(table[j]);
}

double sigma_to_t(double sigma, const std::vector<float>& log_sigmas) {
  const double log_sigma = std::log(std::max(sigma, kMinSigmaForLog));
  const int n = int(log_sigmas.size());
  // The last index whose log-sigma is <= log_sigma (0 when none), clipped to n - 2.
  int low = 0;
  for (int i = 0; i < n; ++i) {
    if (log_sigma - double(log_sigmas[i]) >= 0) low = i;
  }
  low = std::min(low, n - 2);
  const float lo = log_sigmas[low], hi = log_sigmas[low + 1];
  double w = (double(lo) - log_sigma) / double(lo - hi);
  w = std::clamp(w, 0.0, 1.0);
  return (1 - w) * low + w * (low + 1);
}

std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int n) {
  const std::vector<double> ramp = np_linspace(0, 1, n);
  const double min_inv_rho = std::pow(sigma_min, 1 / kKarrasRho);
  const double max_inv_rho = std::pow(sigma_max, 1 / kKarrasRho);
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) out[i] = std::pow(max_inv_rho + ramp[i] * (min_inv_rho - max_inv_rho), kKarrasRho);
  return out;
}

std::vector<double> exponential_sigmas(double sigma_min, double sigma_max, int n) {
  std::vector<double> out = np_linspace(std::log(sigma_max), std::log(sigma_min), n);
  for (double& v : out) v = std::exp(v);
  return out;
}

Expected<std::vector<double>> spaced_timesteps(const SchedulerConfig& c, int steps) {
  const int T = c.num_train_timesteps;
  std::vector<double> ts;
  if (c.timestep_spacing == "linspace") {
    ts = np_linspace(0, T - 1, steps);
    for (double& t : ts) t = double(float(t));  // dtype=np.float32
    std::reverse(ts.begin(), ts.end());
  } else if (c.timestep_spacing == "leading") {
    const int step_ratio = T / steps;
    for (int i = steps - 1; i >= 0; --i) ts.push_back(double(i) * step_ratio + c.steps_offset);
  } else if (c.timestep_spacing == "trailing") {
    ts = np_arange(T, 0, -double(T) / steps);
    for (double& t : ts) t = double(float(np_round(t))) - 1;
  } else {
    return unsupported("timestep_spacing '" + c.timestep_spacing +
                       "' is not supported; supported: linspace, leading, trailing");
  }
  return ts;
}

}  // namespace atelier::sampling
