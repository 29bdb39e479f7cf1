// The numerical building blocks of diffusers' noise schedules, reproducing torch's float32 and numpy's
// float64 arithmetic step by step so that timesteps and sigmas come out bit-equal (or within an ulp) to
// what diffusers computes. Used by the samplers; exposed for tests.
#pragma once
#include <vector>

#include "core/status.h"
#include "sampling/scheduler_config.h"

namespace atelier::sampling {

// torch.linspace(start, end, n, dtype=float32) on the CPU: float32 step, the two halves computed from
// either end, and the multiply-add fused as torch's FMA-enabled kernels compile it.
std::vector<float> torch_linspace_f32(double start, double end, int n);
// np.linspace(start, end, n[, endpoint]) in float64.
std::vector<double> np_linspace(double start, double end, int n, bool endpoint = true);
// np.arange(start, stop, step) for float64 arguments (length ceil((stop - start) / step)).
std::vector<double> np_arange(double start, double stop, double step);
// np.round: round half to even.
double np_round(double x);
// np.log on a float32 array as numpy computes it on x86-64 (its AVX2/AVX512F kernel: a rational
// approximation that is not correctly rounded; diffusers' log-sigma tables come from it).
float numpy_log_f32(float x);

// The training schedule: betas and alphas_cumprod as diffusers' __init__ builds them (float32), including
// rescale_betas_zero_snr (whose last alphas_cumprod entry becomes 2^-24).
struct TrainSchedule {
  std::vector<float> betas;
  std::vector<float> alphas_cumprod;
  // ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5 in float32, index = training timestep (ascending).
  std::vector<float> sigmas;
  // np.log(sigmas) (float32).
  std::vector<float> log_sigmas;
};
Expected<TrainSchedule> make_train_schedule(const SchedulerConfig& config);

// np.interp(x, arange(n), table): linear interpolation of a table at fractional index x (float64).
double interp_table(double x, const std::vector<float>& table);
// diffusers' _sigma_to_t: the fractional timestep whose log-sigma interpolates to log(sigma).
double sigma_to_t(double sigma, const std::vector<float>& log_sigmas);
// _convert_to_karras (rho 7) and _convert_to_exponential, float64.
std::vector<double> karras_sigmas(double sigma_min, double sigma_max, int n);
std::vector<double> exponential_sigmas(double sigma_min, double sigma_max, int n);

// Float64 timesteps of the three spacings shared by Euler, Euler ancestral and Heun (before the float32
// cast): linspace over [0, T-1], "leading" (integer multiples + steps_offset), "trailing".
Expected<std::vector<double>> spaced_timesteps(const SchedulerConfig& config, int steps);

}  // namespace atelier::sampling
