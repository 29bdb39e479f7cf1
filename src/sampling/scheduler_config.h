// Scheduler configuration resolved exactly as diffusers' `SchedulerClass.from_config(model_config, **overrides)`:
// each init parameter of the sampler's class takes the value from the model's scheduler_config.json when the
// key is there (whatever class wrote the file: SD 1.5 ships a PNDMScheduler config), otherwise THAT class's
// own default (timestep_spacing is "linspace" for Euler but "leading" for DDIM). Keys the class does not
// have are ignored, keys listed in "_use_default_values" are treated as absent, and the overrides (the
// sampler name's algorithm and schedule, then the caller's) win over both.
#pragma once
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "sampling/sampler_names.h"

namespace atelier::sampling {

// The longest training schedule a scheduler config may ask for (published ones train on 1000 steps): the tables are
// this long, so a hostile config must not size them freely (2e9 took 20 GB and a minute).
constexpr int kMaxTrainTimesteps = 100000;

struct SchedulerConfig {
  SamplerKind kind = SamplerKind::kEuler;
  // Every init parameter of the class with its resolved value: what diffusers prints as `scheduler.config`
  // (less the private "_..." entries). -inf is stored as a float infinity.
  nlohmann::json resolved;

  // --- every class ---
  int num_train_timesteps = 1000;
  double beta_start = 0.0001;
  double beta_end = 0.02;
  std::string beta_schedule = "linear";
  std::optional<std::vector<double>> trained_betas;
  std::string prediction_type = "epsilon";  // epsilon | v_prediction | sample
  std::string timestep_spacing = "linspace";
  int steps_offset = 0;
  bool rescale_betas_zero_snr = false;  // not a parameter of Heun (stays false)
  // --- sigma schedules (Euler, Heun, DPM-Solver) ---
  bool use_karras_sigmas = false;
  bool use_exponential_sigmas = false;
  std::optional<double> sigma_min, sigma_max;  // Euler only
  std::string final_sigmas_type = "zero";       // Euler, DPM-Solver
  std::string timestep_type = "discrete";       // Euler: "continuous" + v_prediction gives 0.25*log(sigma)
  // --- DDIM, LCM, Heun ---
  bool clip_sample = false;
  double clip_sample_range = 1.0;
  bool set_alpha_to_one = true;  // DDIM, LCM
  // --- DPM-Solver ---
  int solver_order = 2;
  std::string algorithm_type = "dpmsolver++";  // dpmsolver++ | sde-dpmsolver++
  std::string solver_type = "midpoint";         // midpoint | heun
  bool lower_order_final = true;
  bool euler_at_final = false;
  bool use_lu_lambdas = false;
  double lambda_min_clipped = -std::numeric_limits<double>::infinity();
  // --- LCM ---
  int original_inference_steps = 50;
  double timestep_scaling = 10.0;
};

// Parses a scheduler_config.json text. Python's json writes NaN / Infinity / -Infinity as bare words (a
// DPMSolverMultistepScheduler config has "lambda_min_clipped": -Infinity); they are accepted and stored as
// float values.
Expected<nlohmann::json> parse_config_json(std::string_view text);

// model_config: the model's scheduler_config.json (null or {} = none: every key takes the class default).
// overrides: explicit settings, e.g. {"timestep_spacing": "trailing"}; a key the class does not have is an
// error. Settings diffusers accepts but this engine does not implement (thresholding, beta sigmas, flow
// sigmas, learned variance, log_linear interpolation, solver_order 3) give an unsupported error.
Expected<SchedulerConfig> resolve_scheduler_config(const nlohmann::json& model_config, SamplerSpec spec,
                                                   const nlohmann::json& overrides = nlohmann::json::object());

// The init parameters of `kind`'s diffusers class with their defaults.
const nlohmann::json& class_defaults(SamplerKind kind);

}  // namespace atelier::sampling
