#include "sampling/flow_match.h"

#include <cmath>

#include "backend/ops.h"
#include "io/json_util.h"
#include "sampling/schedule.h"

namespace atelier::sampling {
namespace {

constexpr int kMaxFlowSteps = 10000;  // as make_sampler: a server must not allocate without bound
constexpr const char* kContext = "flow-match scheduler config";

// `key`'s value, or `fallback` where it is absent or null; a value of another type throws Error naming the key.
template <typename T>
T field_or(const nlohmann::json& j, const char* key, T fallback) {
  read_config_field(j, key, fallback, kContext);
  return fallback;
}

// The shifting stages of set_timesteps in the precision diffusers runs them in: T = float when the
// pipeline gave sigmas (np.float32 array, python scalars cast to float32), double on the default path.
template <typename T>
std::vector<T> shift_sigmas(const FlowMatchConfig& c, std::vector<T> s, std::optional<double> mu) {
  if (c.use_dynamic_shifting) {
    const bool exponential = c.time_shift_type == "exponential";
    const T a = exponential ? T(std::exp(*mu)) : T(*mu);
    for (T& v : s) v = a / (a + (T(1) / v - T(1)));
  } else {
    const T shift = T(c.shift), shift_m1 = T(c.shift - 1.0);
    for (T& v : s) v = shift * v / (T(1) + shift_m1 * v);
  }
  if (c.shift_terminal && *c.shift_terminal != 0.0) {
    // stretch_shift_to_terminal: the last sigma becomes shift_terminal.
    const double scale = double(T(1) - s.back()) / (1.0 - *c.shift_terminal);
    for (T& v : s) v = T(1) - T((T(1) - v) / T(scale));
  }
  return s;
}

// parse_flow_match_config's reads and checks; a value of the wrong type throws Error (read_config_field).
Status read_flow_match_config(const nlohmann::json& j, FlowMatchConfig& c) {
  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling"}) {
    if (field_or<bool>(j, key, false)) {
      return unsupported(std::string("FlowMatchEulerDiscreteScheduler with ") + key +
                         " is not supported (plain and shifted sigma schedules are)");
    }
  }
  c.num_train_timesteps = field_or<int>(j, "num_train_timesteps", c.num_train_timesteps);
  c.shift = field_or<double>(j, "shift", c.shift);
  c.use_dynamic_shifting = field_or<bool>(j, "use_dynamic_shifting", false);
  c.base_shift = field_or<double>(j, "base_shift", c.base_shift);
  c.max_shift = field_or<double>(j, "max_shift", c.max_shift);
  c.base_image_seq_len = field_or<int64_t>(j, "base_image_seq_len", c.base_image_seq_len);
  c.max_image_seq_len = field_or<int64_t>(j, "max_image_seq_len", c.max_image_seq_len);
  c.invert_sigmas = field_or<bool>(j, "invert_sigmas", false);
  // diffusers applies the stretch when shift_terminal is truthy: 0 and null leave it off.
  if (const double t = field_or<double>(j, "shift_terminal", 0.0); t != 0.0) c.shift_terminal = t;
  c.time_shift_type = field_or<std::string>(j, "time_shift_type", c.time_shift_type);
  if (c.time_shift_type != "exponential" && c.time_shift_type != "linear") {
    return unsupported("time_shift_type '" + c.time_shift_type + "' is not supported (exponential, linear)");
  }
  if (c.num_train_timesteps < 1 || c.num_train_timesteps > kMaxTrainTimesteps)
    return invalid_argument(std::string(kContext) + ": num_train_timesteps must be 1.." + std::to_string(kMaxTrainTimesteps));
  if (c.max_image_seq_len == c.base_image_seq_len && c.use_dynamic_shifting) {
    return invalid_argument("base_image_seq_len and max_image_seq_len must differ for dynamic shifting");
  }
  // sigma' = shift * s / (1 + (shift - 1) * s): 0 collapses every sigma to 0, a negative shift divides by zero inside
  // (0, 1]. diffusers does not check; its images are then noise or NaN.
  if (!(std::isfinite(c.shift) && c.shift > 0.0))
    return invalid_argument(std::string(kContext) + ": shift must be a finite number > 0");
  for (const double v : {c.base_shift, c.max_shift})
    if (!std::isfinite(v)) return invalid_argument(std::string(kContext) + ": base_shift and max_shift must be finite");
  if (c.shift_terminal && !(std::isfinite(*c.shift_terminal) && *c.shift_terminal >= 0.0 && *c.shift_terminal < 1.0))
    return invalid_argument(std::string(kContext) + ": shift_terminal must be in [0, 1)");
  return Status::ok();
}

}  // namespace

Expected<FlowMatchConfig> parse_flow_match_config(const nlohmann::json& j) {
  FlowMatchConfig c;
  if (j.is_null()) return c;
  if (!j.is_object()) return invalid_argument("flow-match scheduler config must be a JSON object");
  Status st = catch_status([&] { return read_flow_match_config(j, c); });
  if (!st) return st;
  return c;
}

double flow_match_mu(const FlowMatchConfig& c, int64_t image_seq_len) {
  const double m = (c.max_shift - c.base_shift) / double(c.max_image_seq_len - c.base_image_seq_len);
  const double b = c.base_shift - m * double(c.base_image_seq_len);
  return double(image_seq_len) * m + b;
}

std::vector<double> flux_sigmas(int steps) { return np_linspace(1.0, 1.0 / steps, steps); }

Expected<FlowMatchEuler> FlowMatchEuler::create(const FlowMatchConfig& c, int steps, const FlowMatchPlanOptions& o) {
  if (o.sigmas) steps = int(o.sigmas->size());
  if (steps < 1 || steps > kMaxFlowSteps) {
    return invalid_argument("steps must be in [1, " + std::to_string(kMaxFlowSteps) + "], got " + std::to_string(steps));
  }
  if (c.use_dynamic_shifting && !o.mu) {
    return invalid_argument("this flow-match scheduler uses dynamic shifting: mu is required");
  }
  const int T = c.num_train_timesteps;
  std::vector<float> sig(steps);
  if (o.sigmas) {
    std::vector<float> s32(o.sigmas->begin(), o.sigmas->end());
    for (float v : s32) {
      if (!(v > 0.0f && v <= 1.0f)) return invalid_argument("flow-match sigmas must lie in (0, 1]");
    }
    sig = shift_sigmas<float>(c, std::move(s32), o.mu);
  } else {
    // __init__'s table: sigma_max = 1 (shifted 1 stays 1); sigma_min = the shifted 1/T in float32 (unshifted
    // with dynamic shifting, where __init__ leaves the table alone).
    float smin = float(1) / float(T);
    if (!c.use_dynamic_shifting) smin = float(c.shift) * smin / (1.0f + float(c.shift - 1.0) * smin);
    const double sigma_max = o.sigma_max.value_or(1.0), sigma_min = o.sigma_min.value_or(double(smin));
    std::vector<double> s = np_linspace(sigma_max * T, sigma_min * T, steps);
    for (double& v : s) v /= T;
    s = shift_sigmas<double>(c, std::move(s), o.mu);
    for (int i = 0; i < steps; ++i) sig[i] = float(s[i]);
  }
  FlowMatchEuler f;
  if (c.invert_sigmas) {
    for (float& v : sig) v = 1.0f - v;
  }
  f.timesteps_.resize(steps);
  for (int i = 0; i < steps; ++i) f.timesteps_[i] = sig[i] * float(T);
  f.sigmas_ = sig;
  f.sigmas_.push_back(c.invert_sigmas ? 1.0f : 0.0f);
  return f;
}

Status FlowMatchEuler::set_begin_index(int index) {
  if (index < 0 || index >= num_inference_steps()) return invalid_argument("begin index out of range");
  index_ = index;
  return Status::ok();
}

Tensor FlowMatchEuler::step(const Tensor& x, const Tensor& velocity) {
  ATELIER_CHECK(!done(), "flow-match step after the last step");
  const float dt = sigma_next() - sigma();
  Tensor out = ops::lincomb({ops::contiguous(x), ops::contiguous(velocity)}, {1.0f, dt});
  advance();
  return out;
}

Tensor FlowMatchEuler::scale_noise(const Tensor& x0, const Tensor& noise) const {
  const float s = sigma();
  return ops::lincomb({ops::contiguous(noise), ops::contiguous(x0)}, {s, 1.0f - s});
}

}  // namespace atelier::sampling
