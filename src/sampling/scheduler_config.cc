#include "sampling/scheduler_config.h"

#include <cmath>
#include <limits>
#include <set>

#include "io/json_util.h"

namespace atelier::sampling {
namespace {

using nlohmann::json;

// Bare Python-json words are replaced by these strings before parsing, then turned back into floats.
constexpr const char* kNegInfToken = "@@atelier:-Infinity@@";
constexpr const char* kPosInfToken = "@@atelier:Infinity@@";
constexpr const char* kNanToken = "@@atelier:NaN@@";

// The __init__ signatures of diffusers 0.40's scheduler classes (parameter name -> default).
json euler_defaults() {
  return json::parse(R"({
    "num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02, "beta_schedule": "linear",
    "trained_betas": null, "prediction_type": "epsilon", "interpolation_type": "linear",
    "use_karras_sigmas": false, "use_exponential_sigmas": false, "use_beta_sigmas": false,
    "sigma_min": null, "sigma_max": null, "timestep_spacing": "linspace", "timestep_type": "discrete",
    "steps_offset": 0, "rescale_betas_zero_snr": false, "final_sigmas_type": "zero"})");
}

json euler_ancestral_defaults() {
  return json::parse(R"({
    "num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02, "beta_schedule": "linear",
    "trained_betas": null, "prediction_type": "epsilon", "timestep_spacing": "linspace", "steps_offset": 0,
    "rescale_betas_zero_snr": false})");
}

json heun_defaults() {
  return json::parse(R"({
    "num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "linear",
    "trained_betas": null, "prediction_type": "epsilon", "use_karras_sigmas": false,
    "use_exponential_sigmas": false, "use_beta_sigmas": false, "clip_sample": false, "clip_sample_range": 1.0,
    "timestep_spacing": "linspace", "steps_offset": 0})");
}

json ddim_defaults() {
  return json::parse(R"({
    "num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02, "beta_schedule": "linear",
    "trained_betas": null, "clip_sample": true, "set_alpha_to_one": true, "steps_offset": 0,
    "prediction_type": "epsilon", "thresholding": false, "dynamic_thresholding_ratio": 0.995,
    "clip_sample_range": 1.0, "sample_max_value": 1.0, "timestep_spacing": "leading",
    "rescale_betas_zero_snr": false})");
}

json dpm_defaults() {
  json j = json::parse(R"({
    "num_train_timesteps": 1000, "beta_start": 0.0001, "beta_end": 0.02, "beta_schedule": "linear",
    "trained_betas": null, "solver_order": 2, "prediction_type": "epsilon", "thresholding": false,
    "dynamic_thresholding_ratio": 0.995, "sample_max_value": 1.0, "algorithm_type": "dpmsolver++",
    "solver_type": "midpoint", "lower_order_final": true, "euler_at_final": false,
    "use_karras_sigmas": false, "use_exponential_sigmas": false, "use_beta_sigmas": false,
    "use_lu_lambdas": false, "use_flow_sigmas": false, "flow_shift": 1.0, "final_sigmas_type": "zero",
    "variance_type": null, "timestep_spacing": "linspace", "steps_offset": 0,
    "rescale_betas_zero_snr": false, "use_dynamic_shifting": false, "time_shift_type": "exponential"})");
  j["lambda_min_clipped"] = -std::numeric_limits<double>::infinity();
  return j;
}

json lcm_defaults() {
  return json::parse(R"({
    "num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "trained_betas": null, "original_inference_steps": 50, "clip_sample": false, "clip_sample_range": 1.0,
    "set_alpha_to_one": true, "steps_offset": 0, "prediction_type": "epsilon", "thresholding": false,
    "dynamic_thresholding_ratio": 0.995, "sample_max_value": 1.0, "timestep_spacing": "leading",
    "timestep_scaling": 10.0, "rescale_betas_zero_snr": false})");
}

// Replaces NaN / Infinity / -Infinity outside string literals with sentinel strings.
std::string quote_python_floats(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    auto word = [&](std::string_view w) { return text.substr(i, w.size()) == w; };
    if (word("-Infinity")) {
      out += std::string("\"") + kNegInfToken + "\"";
      i += 8;
    } else if (word("Infinity")) {
      out += std::string("\"") + kPosInfToken + "\"";
      i += 7;
    } else if (word("NaN")) {
      out += std::string("\"") + kNanToken + "\"";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

void restore_python_floats(json& j) {
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == kNegInfToken) j = -std::numeric_limits<double>::infinity();
    else if (s == kPosInfToken) j = std::numeric_limits<double>::infinity();
    else if (s == kNanToken) j = std::numeric_limits<double>::quiet_NaN();
  } else if (j.is_structured()) {
    for (auto& v : j) restore_python_floats(v);
  }
}

std::string keys_of(const json& j) {
  std::string out;
  for (auto it = j.begin(); it != j.end(); ++it) out += (out.empty() ? "" : ", ") + it.key();
  return out;
}

// Typed reads of the resolved config by json_to's rules (io/json_util.h), but for booleans (Python's truthiness);
// a wrong type is reported with the key and the class.
class Reader {
 public:
  Reader(const json& j, std::string_view cls) : j_(j), cls_(cls) {}
  const Status& status() const { return status_; }
  bool has(const char* key) const { return j_.contains(key); }

  double number(const char* key, double fallback) {
    double out = fallback;
    if (has(key) && !json_to(j_.at(key), &out)) fail(key, "a number");
    return out;
  }
  int integer(const char* key, int fallback) {
    if (!has(key)) return fallback;
    int64_t wide = 0;  // json_to: integers and integral floats; an int's range on top (get<int> would wrap)
    if (json_to(j_.at(key), &wide) && wide >= std::numeric_limits<int>::min() && wide <= std::numeric_limits<int>::max())
      return int(wide);
    return fail(key, "an integer"), fallback;
  }
  bool boolean(const char* key, bool fallback) {
    if (!has(key)) return fallback;
    const json& v = j_.at(key);
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_null()) return false;  // Python treats None as false in these checks
    if (v.is_number_integer()) return v.get<int>() != 0;
    return fail(key, "true or false"), fallback;
  }
  std::string string(const char* key, const std::string& fallback) {
    if (!has(key) || j_.at(key).is_null()) return fallback;
    std::string out = fallback;
    if (!json_to(j_.at(key), &out)) fail(key, "a string");
    return out;
  }
  std::optional<double> optional_number(const char* key) {
    if (!has(key) || j_.at(key).is_null()) return std::nullopt;
    return number(key, 0.0);
  }
  std::optional<std::vector<double>> number_list(const char* key) {
    if (!has(key) || j_.at(key).is_null()) return std::nullopt;
    const json& v = j_.at(key);
    std::vector<double> out;
    if (v.is_array()) {
      for (const auto& x : v) {
        if (!json_to(x, &out.emplace_back())) return fail(key, "a list of numbers"), std::nullopt;
      }
      return out;
    }
    return fail(key, "a list of numbers"), std::nullopt;
  }

 private:
  void fail(const char* key, const char* expected) {
    if (status_.is_ok()) {
      status_ = invalid_argument(std::string(cls_) + " setting '" + key + "' must be " + expected + ", got " +
                                 j_.at(key).dump());
    }
  }
  const json& j_;
  std::string_view cls_;
  Status status_;
};

Status one_of(const std::string& cls, const char* key, const std::string& value,
              std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return Status::ok();
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  return unsupported(cls + " setting " + key + "='" + value + "' is not supported; supported: " + list);
}

Status reject_if(bool cond, const std::string& cls, const std::string& what) {
  return cond ? unsupported(cls + ": " + what) : Status::ok();
}

// The sampler name fixes these, as `from_config(config, **overrides)` would.
json name_overrides(SamplerSpec spec) {
  json o = json::object();
  if (spec.kind == SamplerKind::kDPMpp2M || spec.kind == SamplerKind::kDPMpp2MSDE) {
    o["algorithm_type"] = spec.kind == SamplerKind::kDPMpp2M ? "dpmsolver++" : "sde-dpmsolver++";
    o["solver_order"] = 2;
  }
  if (spec.schedule != ScheduleKind::kDefault) {
    o["use_karras_sigmas"] = spec.schedule == ScheduleKind::kKarras;
    o["use_exponential_sigmas"] = spec.schedule == ScheduleKind::kExponential;
    o["use_beta_sigmas"] = false;
  }
  return o;
}

Status read_common(Reader& r, SchedulerConfig& c) {
  c.num_train_timesteps = r.integer("num_train_timesteps", c.num_train_timesteps);
  c.beta_start = r.number("beta_start", c.beta_start);
  c.beta_end = r.number("beta_end", c.beta_end);
  c.beta_schedule = r.string("beta_schedule", c.beta_schedule);
  c.trained_betas = r.number_list("trained_betas");
  c.prediction_type = r.string("prediction_type", c.prediction_type);
  c.timestep_spacing = r.string("timestep_spacing", c.timestep_spacing);
  c.steps_offset = r.integer("steps_offset", c.steps_offset);
  c.rescale_betas_zero_snr = r.boolean("rescale_betas_zero_snr", false);
  c.use_karras_sigmas = r.boolean("use_karras_sigmas", false);
  c.use_exponential_sigmas = r.boolean("use_exponential_sigmas", false);
  c.sigma_min = r.optional_number("sigma_min");
  c.sigma_max = r.optional_number("sigma_max");
  c.final_sigmas_type = r.string("final_sigmas_type", c.final_sigmas_type);
  c.timestep_type = r.string("timestep_type", c.timestep_type);
  c.clip_sample = r.boolean("clip_sample", false);
  c.clip_sample_range = r.number("clip_sample_range", c.clip_sample_range);
  c.set_alpha_to_one = r.boolean("set_alpha_to_one", c.set_alpha_to_one);
  c.solver_order = r.integer("solver_order", c.solver_order);
  c.algorithm_type = r.string("algorithm_type", c.algorithm_type);
  c.solver_type = r.string("solver_type", c.solver_type);
  c.lower_order_final = r.boolean("lower_order_final", c.lower_order_final);
  c.euler_at_final = r.boolean("euler_at_final", c.euler_at_final);
  c.use_lu_lambdas = r.boolean("use_lu_lambdas", false);
  c.lambda_min_clipped = r.number("lambda_min_clipped", c.lambda_min_clipped);
  c.original_inference_steps = r.integer("original_inference_steps", c.original_inference_steps);
  c.timestep_scaling = r.number("timestep_scaling", c.timestep_scaling);
  return r.status();
}

// A config number in an error message: JSON text, with NaN and the infinities spelled (json's dump writes null).
std::string number_text(double v) { return std::isfinite(v) ? json(v).dump() : std::isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity"; }

// A beta is a per-step noise variance: outside [0, 1) the alphas' product turns negative or NaN and so do the sigmas
// (diffusers does not check; its samplers then produce NaN images).
Status check_beta(const std::string& cls, const char* key, double beta) {
  if (std::isfinite(beta) && beta >= 0.0 && beta < 1.0) return Status::ok();
  return invalid_argument(cls + ": " + key + " must be in [0, 1), got " + number_text(beta));
}

// Values the schedule is computed from, within the ranges that give finite sigmas.
Status validate_numbers(const std::string& cls, const SchedulerConfig& c) {
  if (c.trained_betas) {
    for (double b : *c.trained_betas) ATELIER_RETURN_IF_ERROR(check_beta(cls, "each of trained_betas", b));
  } else if (c.beta_schedule == "linear" || c.beta_schedule == "scaled_linear") {
    ATELIER_RETURN_IF_ERROR(check_beta(cls, "beta_start", c.beta_start));
    ATELIER_RETURN_IF_ERROR(check_beta(cls, "beta_end", c.beta_end));
  }
  for (const auto& [key, v] : {std::pair{"sigma_min", c.sigma_min}, std::pair{"sigma_max", c.sigma_max}}) {
    if (v && !(std::isfinite(*v) && *v >= 0.0))
      return invalid_argument(cls + ": " + key + " must be a finite number >= 0, got " + number_text(*v));
  }
  if (c.clip_sample && !(std::isfinite(c.clip_sample_range) && c.clip_sample_range > 0.0))
    return invalid_argument(cls + ": clip_sample_range must be a finite number > 0, got " + number_text(c.clip_sample_range));
  if (!std::isfinite(c.timestep_scaling))
    return invalid_argument(cls + ": timestep_scaling must be finite, got " + number_text(c.timestep_scaling));
  return Status::ok();
}

// What diffusers would accept but this engine does not implement, and values diffusers itself rejects.
Status validate(Reader& r, const SchedulerConfig& c) {
  const std::string cls(diffusers_class(c.kind));
  if (c.num_train_timesteps < 2) {
    return invalid_argument(cls + ": num_train_timesteps must be at least 2, got " +
                            std::to_string(c.num_train_timesteps));
  }
  if (c.num_train_timesteps > kMaxTrainTimesteps) {
    return invalid_argument(cls + ": num_train_timesteps must be at most " + std::to_string(kMaxTrainTimesteps) + ", got " +
                            std::to_string(c.num_train_timesteps));
  }
  ATELIER_RETURN_IF_ERROR(validate_numbers(cls, c));
  if (c.trained_betas && int(c.trained_betas->size()) != c.num_train_timesteps) {
    return invalid_argument(cls + ": trained_betas has " + std::to_string(c.trained_betas->size()) +
                            " values but num_train_timesteps is " + std::to_string(c.num_train_timesteps));
  }
  if (!c.trained_betas) {
    if (c.kind == SamplerKind::kHeun) {
      ATELIER_RETURN_IF_ERROR(
          one_of(cls, "beta_schedule", c.beta_schedule, {"linear", "scaled_linear", "squaredcos_cap_v2", "exp"}));
    } else {
      ATELIER_RETURN_IF_ERROR(
          one_of(cls, "beta_schedule", c.beta_schedule, {"linear", "scaled_linear", "squaredcos_cap_v2"}));
    }
  }
  if (c.kind == SamplerKind::kEuler && c.prediction_type == "original_sample") {
    // Euler treats "original_sample" as "sample"; resolve_scheduler_config normalises it.
  } else if (c.kind == SamplerKind::kEulerAncestral) {
    ATELIER_RETURN_IF_ERROR(one_of(cls, "prediction_type", c.prediction_type, {"epsilon", "v_prediction"}));
  } else {
    ATELIER_RETURN_IF_ERROR(
        one_of(cls, "prediction_type", c.prediction_type, {"epsilon", "v_prediction", "sample"}));
  }
  if (c.kind != SamplerKind::kLCM) {  // LCM ignores timestep_spacing
    ATELIER_RETURN_IF_ERROR(one_of(cls, "timestep_spacing", c.timestep_spacing, {"linspace", "leading", "trailing"}));
  }
  ATELIER_RETURN_IF_ERROR(one_of(cls, "final_sigmas_type", c.final_sigmas_type, {"zero", "sigma_min"}));
  ATELIER_RETURN_IF_ERROR(one_of(cls, "timestep_type", c.timestep_type, {"discrete", "continuous"}));
  ATELIER_RETURN_IF_ERROR(
      one_of(cls, "interpolation_type", r.string("interpolation_type", "linear"), {"linear"}));
  ATELIER_RETURN_IF_ERROR(reject_if(r.boolean("use_beta_sigmas", false), cls,
                                    "use_beta_sigmas is not supported (use karras or exponential)"));
  if (c.use_karras_sigmas && c.use_exponential_sigmas) {
    return invalid_argument(cls + ": only one of use_karras_sigmas, use_exponential_sigmas can be set");
  }
  ATELIER_RETURN_IF_ERROR(reject_if(r.boolean("thresholding", false), cls, "thresholding is not supported"));
  ATELIER_RETURN_IF_ERROR(reject_if(r.boolean("use_flow_sigmas", false), cls, "use_flow_sigmas is not supported"));
  ATELIER_RETURN_IF_ERROR(reject_if(!r.string("variance_type", "").empty(), cls,
                                    "variance_type learned/learned_range is not supported"));
  if (c.kind == SamplerKind::kDPMpp2M || c.kind == SamplerKind::kDPMpp2MSDE) {
    ATELIER_RETURN_IF_ERROR(one_of(cls, "solver_order", std::to_string(c.solver_order), {"1", "2"}));
    ATELIER_RETURN_IF_ERROR(one_of(cls, "solver_type", c.solver_type, {"midpoint", "heun"}));
    if (int(c.use_karras_sigmas) + int(c.use_exponential_sigmas) + int(c.use_lu_lambdas) > 1) {
      return invalid_argument(cls + ": only one of use_karras_sigmas, use_exponential_sigmas, use_lu_lambdas");
    }
  }
  if (c.kind == SamplerKind::kLCM && c.original_inference_steps < 1) {
    return invalid_argument(cls + ": original_inference_steps must be at least 1");
  }
  return Status::ok();
}

}  // namespace

const nlohmann::json& class_defaults(SamplerKind kind) {
  static const json euler = euler_defaults(), ancestral = euler_ancestral_defaults(), heun = heun_defaults(),
                    ddim = ddim_defaults(), dpm = dpm_defaults(), lcm = lcm_defaults();
  switch (kind) {
    case SamplerKind::kEuler: return euler;
    case SamplerKind::kEulerAncestral: return ancestral;
    case SamplerKind::kHeun: return heun;
    case SamplerKind::kDDIM: return ddim;
    case SamplerKind::kDPMpp2M:
    case SamplerKind::kDPMpp2MSDE: return dpm;
    case SamplerKind::kLCM: return lcm;
  }
  return euler;
}

Expected<nlohmann::json> parse_config_json(std::string_view text) {
  bool too_deep = false;  // restore_python_floats recurses: the depth is bounded first
  json j = parse_json_bounded(quote_python_floats(text), &too_deep);
  if (j.is_discarded())
    return invalid_argument(too_deep ? "scheduler config nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"
                                     : std::string("scheduler config is not valid JSON"));
  restore_python_floats(j);
  return j;
}

Expected<SchedulerConfig> resolve_scheduler_config(const nlohmann::json& model_config, SamplerSpec spec,
                                                   const nlohmann::json& overrides) {
  ATELIER_ASSIGN_OR_RETURN(spec, with_schedule(spec, ScheduleKind::kDefault));
  const std::string cls(diffusers_class(spec.kind));
  if (!model_config.is_null() && !model_config.is_object()) {
    return invalid_argument("scheduler config must be a JSON object");
  }
  if (!overrides.is_null() && !overrides.is_object()) {
    return invalid_argument("scheduler overrides must be a JSON object");
  }
  json resolved = class_defaults(spec.kind);
  std::set<std::string> use_defaults;
  if (model_config.is_object() && model_config.contains("_use_default_values") &&
      model_config["_use_default_values"].is_array()) {
    for (const auto& k : model_config["_use_default_values"]) {
      if (k.is_string()) use_defaults.insert(k.get<std::string>());
    }
  }
  for (auto it = resolved.begin(); it != resolved.end(); ++it) {
    if (model_config.is_object() && model_config.contains(it.key()) && !use_defaults.count(it.key())) {
      it.value() = model_config.at(it.key());
    }
  }
  if (overrides.is_object()) {
    for (auto it = overrides.begin(); it != overrides.end(); ++it) {
      if (!resolved.contains(it.key())) {
        return invalid_argument("'" + it.key() + "' is not a setting of " + cls + "; its settings: " +
                                keys_of(resolved));
      }
      resolved[it.key()] = it.value();
    }
  }
  const json by_name = name_overrides(spec);
  for (auto it = by_name.begin(); it != by_name.end(); ++it) resolved[it.key()] = it.value();
  // DPMSolverMultistepScheduler's own remaps of legacy solver types.
  if (resolved.contains("solver_type") && resolved["solver_type"].is_string()) {
    const std::string st = resolved["solver_type"];
    if (st == "logrho" || st == "bh1" || st == "bh2") resolved["solver_type"] = "midpoint";
  }

  SchedulerConfig c;
  c.kind = spec.kind;
  c.resolved = resolved;
  Reader r(resolved, cls);
  ATELIER_RETURN_IF_ERROR(read_common(r, c));
  ATELIER_RETURN_IF_ERROR(validate(r, c));
  if (c.prediction_type == "original_sample") c.prediction_type = "sample";
  return c;
}

}  // namespace atelier::sampling
