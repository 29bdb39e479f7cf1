// Samplers with diffusers' exact semantics, one object per sample, with the update of every step expressed
// as a linear combination of tensors so that a batch of samples at DIFFERENT steps of DIFFERENT samplers is
// advanced with one fused ops::lincomb_per_sample per output (see sampling/stepper.h).
//
// The call sequence a pipeline follows for one sample, mirroring diffusers' StableDiffusionPipeline and
// StableDiffusionImg2ImgPipeline (gen = the pipeline's torch-compatible generator, latent shape [1, 4, h, w]):
//
//   auto s = make_sampler(model_scheduler_json, "DPM++ 2M Karras", steps).value();  // from_config + set_timesteps
//   s->set_noise_source([&](const Shape& shape) { return randn(gen, shape); });     // same generator as below
//   txt2img (prepare_latents):
//     x = randn(gen, latent shape) * s->init_noise_sigma();
//   img2img (get_timesteps, prepare_latents):
//     s->set_strength(strength);                       // before any call; begin_index = t_start * order
//     z = vae.encode(image).latent_dist.sample(gen) * scaling_factor;   // draws from gen first
//     noise = randn(gen, latent shape);                                 // then the add_noise draw
//     NoiseRule r = s->noise_rule();   x = r.x0 * z + r.noise * noise;   // scheduler.add_noise at timesteps[begin]
//   denoising loop:
//     while (!s->done()) {
//       ModelCall c = s->next_call();
//       in = x / c.input_divisor;                      // scale_model_input (or x * c.input_scale)
//       out = unet(cat([in, in]), c.timestep, ...);    // CFG batch; the timestep is a float (fractional for
//       eps = uncond + g * (cond - uncond);            //   Euler-type plans, whole numbers for DDIM/DPM/LCM)
//       x = s->step(x, eps);                           // scheduler.step; draws from gen where diffusers does
//     }
//     image = vae.decode(x / scaling_factor)
//
// Batched (the server): x and the model outputs are [S, ...] with row s belonging to samplers[s];
// scale_model_inputs() and model_timesteps() give the model's inputs, apply_step() replaces scheduler.step.
//
// Noise drawn during sampling, in diffusers' order (one draw of the sample's shape per model call):
//   euler_a: every call, the last included (its coefficient is 0 there); dpmpp_2m_sde: every call, the last
//   included (DPMSolverMultistepScheduler draws plain randn, no Brownian tree); lcm: every call but the last;
//   euler (s_churn 0), heun, ddim (eta 0), dpmpp_2m: never.
// A diffusers batch of B images sharing one generator draws [B, ...] at once; to reproduce it with one
// sampler per image, the pipeline draws the batch and hands each sampler its row (or runs one sampler on
// the whole [B, ...] tensor with step(), which passes the full shape to the noise source).
//
// One "call" is one model evaluation: Heun makes two per step (its last step only one), exactly as
// diffusers' HeunDiscreteScheduler iterates a doubled timestep list with one scheduler.step per model call.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"
#include "sampling/sampler_names.h"
#include "sampling/schedule.h"
#include "sampling/scheduler_config.h"

namespace atelier::sampling {

// Tensors an update combines. kSaved0/kSaved1 are tensors the sampler asked to keep from an earlier call
// (DPM-Solver's previous x0 prediction; Heun's first-stage sample and derivative). kClamped is
// clamp(clamp_source, -range, range), computed first when StepUpdate::clamp is set (clip_sample).
enum class Operand : uint8_t { kSample, kModelOutput, kNoise, kClamped, kSaved0, kSaved1 };
inline constexpr int kNumOperands = 6;
inline constexpr int kNumSavedSlots = 2;

// sum_i coeff[i] * operand_i, coefficients in double (the stepper rounds them to float once).
struct LinearExpr {
  std::array<double, kNumOperands> coeff{};

  static LinearExpr of(Operand o, double c = 1.0) {
    LinearExpr e;
    e[o] = c;
    return e;
  }
  double& operator[](Operand o) { return coeff[size_t(o)]; }
  double operator[](Operand o) const { return coeff[size_t(o)]; }
  bool uses(Operand o) const { return coeff[size_t(o)] != 0.0; }
  bool empty() const;
  LinearExpr operator+(const LinearExpr& o) const;
  LinearExpr operator-(const LinearExpr& o) const;
  LinearExpr operator*(double s) const;
  LinearExpr operator/(double s) const { return *this * (1.0 / s); }
};
inline LinearExpr operator*(double s, const LinearExpr& e) { return e * s; }

struct ClampSpec {
  LinearExpr source;  // over kSample and kModelOutput only
  float range = 1.0f; // kClamped = clamp(source, -range, range)
};

struct SlotWrite {
  enum class Action : uint8_t { kKeep, kSet, kClear };
  Action action = Action::kKeep;
  LinearExpr value;  // for kSet: computed from this call's operands (before the sample is replaced)
};

// What to do with one model output. All expressions are evaluated from the same operands (the sample as it
// was before this call, the model output, the noise drawn for this call, the saved tensors as they were).
struct StepUpdate {
  // Draw one tensor of the sample's shape from the sample's noise source before combining. Drawn whenever
  // diffusers draws (even where its coefficient is 0, e.g. euler_a's last step) so that a shared
  // generator advances exactly as in diffusers.
  bool draws_noise = false;
  std::optional<ClampSpec> clamp;
  LinearExpr next_sample;
  std::array<SlotWrite, kNumSavedSlots> saves;
  // The model's estimate of the clean sample at this call (pred_original_sample / denoised), for previews.
  LinearExpr denoised;
};

// The next model evaluation.
struct ModelCall {
  int index = 0;           // absolute index into timesteps()
  float timestep = 0.0f;   // what the model gets (fractional for Euler-type samplers)
  float input_scale = 1.0f;  // c_in: model input = sample * input_scale (scale_model_input)
  // diffusers divides instead: model input = sample / input_divisor, bit-exact with its float32 rounding
  // (input_scale = 1 / input_divisor; the product differs from the quotient by at most an ulp).
  float input_divisor = 1.0f;
};

// img2img noising at the first planned timestep: noisy = x0 * image + noise * noise_tensor (add_noise).
struct NoiseRule {
  float x0 = 1.0f;
  float noise = 1.0f;
};

// The steps an img2img run of `steps` at `strength` in [0, 1] runs: the last min(int(steps * strength), steps), as
// the img2img pipeline's get_timesteps keeps them (0: none, which Sampler::set_strength refuses).
int img2img_steps(int steps, double strength);

// Draws standard normal noise of the given shape (bound by the pipeline to a torch-compatible generator).
using NoiseSource = std::function<Tensor(const Shape&)>;

class Sampler {
 public:
  virtual ~Sampler() = default;
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  SamplerKind kind() const { return config_.kind; }
  const SchedulerConfig& config() const { return config_; }

  // --- the plan (fixed by the constructor, i.e. diffusers' set_timesteps) ---------------------------
  int num_inference_steps() const { return steps_; }
  // diffusers' scheduler.timesteps: one entry per model call (Heun's list is doubled), as floats.
  const std::vector<float>& timesteps() const { return timesteps_; }
  // diffusers' scheduler.sigmas (one more than timesteps for Euler/DPM-Solver; doubled for Heun); empty for
  // DDIM and LCM, which have none.
  const std::vector<float>& sigmas() const { return sigmas_; }
  float init_noise_sigma() const { return init_noise_sigma_; }
  int order() const { return order_; }  // model calls per step (2 for Heun)
  // The training schedule (betas, alphas_cumprod, sigma table) the plan was built from.
  const TrainSchedule& train_schedule() const { return train_; }

  // img2img: keeps the last min(int(steps * strength), steps) steps, exactly as the img2img pipeline's
  // get_timesteps (begin index t_start * order). Must be called before the first call; strength in [0, 1],
  // and at least one step must remain.
  Status set_strength(double strength);
  int begin_index() const { return begin_index_; }
  // add_noise at timesteps()[begin_index()]: sigma-based samplers x0 + noise * sigma, DPM-Solver
  // alpha_t * x0 + sigma_t * noise, DDIM/LCM sqrt(alpha_bar) * x0 + sqrt(1 - alpha_bar) * noise.
  NoiseRule noise_rule() const;

  // --- progress --------------------------------------------------------------------------------------
  bool done() const { return call_ >= int(timesteps_.size()); }
  int call_index() const { return call_; }
  int calls_remaining() const { return int(timesteps_.size()) - call_; }
  ModelCall next_call() const;
  // The update for the model output of next_call().
  StepUpdate update() const;
  // Records the tensors saved by the applied update and moves to the next call (used by the stepper).
  void advance(const std::array<std::optional<Tensor>, kNumSavedSlots>& saved);
  const Tensor& saved(int slot) const { return saved_.at(size_t(slot)); }

  void set_noise_source(NoiseSource source) { noise_ = std::move(source); }
  const NoiseSource& noise_source() const { return noise_; }

  // Convenience for one sample: applies update() to x and model_output (same shape, any shape; the noise
  // source gets x's shape) and advances. Returns the new sample.
  Tensor step(const Tensor& x, const Tensor& model_output);

 protected:
  explicit Sampler(SchedulerConfig config) : config_(std::move(config)) {}
  virtual ModelCall make_call(int index) const = 0;
  virtual StepUpdate make_update(int index) const = 0;
  virtual NoiseRule make_noise_rule(int index) const = 0;
  virtual void on_advance() {}

  SchedulerConfig config_;
  TrainSchedule train_;
  int steps_ = 0;
  int order_ = 1;
  std::vector<float> timesteps_;
  std::vector<float> sigmas_;
  float init_noise_sigma_ = 1.0f;
  int begin_index_ = 0;
  int call_ = 0;
  std::array<Tensor, kNumSavedSlots> saved_;
  NoiseSource noise_;
};

// More steps than this are refused (diffusers has no limit; a server must not allocate without bound).
inline constexpr int kMaxSteps = 10000;

// Builds the sampler for `spec` with `config` resolved from the model's scheduler config (see
// scheduler_config.h) and plans `steps` steps (diffusers' set_timesteps). steps outside [1, kMaxSteps] is
// an error.
Expected<std::unique_ptr<Sampler>> make_sampler(const SchedulerConfig& config, int steps);
Expected<std::unique_ptr<Sampler>> make_sampler(const nlohmann::json& model_scheduler_config,
                                                SamplerSpec spec, int steps,
                                                const nlohmann::json& overrides = nlohmann::json::object());
// Same, with the sampler given by name (ours or A1111's, see sampler_names.h).
Expected<std::unique_ptr<Sampler>> make_sampler(const nlohmann::json& model_scheduler_config,
                                                std::string_view sampler_name, int steps,
                                                const nlohmann::json& overrides = nlohmann::json::object());

}  // namespace atelier::sampling
