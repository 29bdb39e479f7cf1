// The GEMM ceiling measurement and the bench report's JSON and text forms.
#include <cstdio>

#include <fmt/printf.h>

#include "backend/ops.h"
#include "core/trace.h"
#include "pipeline/sd_bench.h"

namespace atelier {
namespace {

constexpr int64_t kCpuCeilingSize = 2048;   // 17 GFLOP: ~0.1-1 s on a few cores, large enough to saturate BLAS
constexpr int64_t kCudaCeilingSize = 8192;  // what the anchors measured on the H200 (bf16 8192^3)
constexpr float kCeilingFill = 1.0f / 64;   // harmless values (no overflow, no denormals)
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

nlohmann::json opt(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

}  // namespace

int64_t default_ceiling_size(Device device) { return device.is_cpu() ? kCpuCeilingSize : kCudaCeilingSize; }
DType default_compute_dtype(Device device) { return device.is_cpu() ? DType::F32 : DType::BF16; }

Expected<GemmCeiling> measure_gemm_ceiling(Device device, DType dtype, int64_t size, int reps) {
  if (size <= 0) size = default_ceiling_size(device);
  if (reps < 1) return invalid_argument("the GEMM ceiling needs at least one repetition");
  GemmCeiling c;
  c.device = device.str();
  c.dtype = std::string(dtype_name(dtype));
  c.size = size;
  c.reps = reps;
  Status st = catch_status([&]() -> Status {
    trace::Scope range("gemm_ceiling", trace::Category::kStage);
    Tensor a = Tensor::full({size, size}, kCeilingFill, device);
    if (dtype != a.dtype()) a = ops::cast(a, dtype);
    Backend& be = backend_for(device);
    (void)ops::matmul(a, a);  // untimed: first-touch of the output, library initialisation
    be.synchronize();
    for (int i = 0; i < reps; ++i) {
      const uint64_t f0 = trace::thread_flops();
      const int64_t t0 = trace::now_ns();
      (void)ops::matmul(a, a);
      be.synchronize();
      const double s = double(trace::now_ns() - t0) * 1e-9;
      c.flops = trace::thread_flops() - f0;  // the engine's own count: 2 * size^3
      if (i == 0 || s < c.best_s) c.best_s = s;
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  c.tflops = double(c.flops) / c.best_s / 1e12;
  return c;
}

nlohmann::json GemmCeiling::to_json() const {
  return {{"device", device}, {"dtype", dtype}, {"size", size}, {"reps", reps}, {"best_s", best_s},
          {"flops", flops}, {"tflops_per_s", tflops}};
}

nlohmann::json BenchReport::to_json() const {
  nlohmann::json j = {{"device", device}, {"backend", backend}, {"host_threads", host_threads},
                      {"gemm_ceiling", ceiling ? ceiling->to_json() : nlohmann::json(nullptr)}};
  if (!ran) return j;
  j.update({{"model", model}, {"model_kind", model_kind}, {"model_call", model_call},
            {"conditioning", conditioning.empty() ? nlohmann::json(nullptr) : nlohmann::json(conditioning)}, {"width", width}, {"height", height}, {"batch", batch},
            {"unet_batch", unet_batch}, {"steps", steps}, {"cfg_scale", cfg_scale}, {"sampler", sampler},
            {"warmup", warmup}, {"load_s", load_s}, {"warmup_s", warmup_s},
            {"unet_ms", {{"mean", unet_ms_mean}, {"min", unet_ms_min}, {"median", unet_ms_median}, {"calls", unet_ms.size()},
                         {"each", unet_ms}}},
            {"model_calls", model_calls}, {"it_per_s", it_per_s}, {"s_per_image", s_per_image},
            {"images_per_min", images_per_min},
            {"stages_s", {{"text_encode", opt(text_encode_s)}, {"denoise", denoise_s}, {"vae_decode", vae_decode_s},
                          {"total", total_s}}},
            {"unet_flops_per_call", unet_flops}, {"unet_tflops_per_s", unet_tflops},
            {"vae_decode_flops", vae_decode_flops}, {"vae_decode_tflops_per_s", vae_decode_tflops},
            {"pct_of_ceiling", opt(pct_of_ceiling)}, {"gpu_busy_pct", opt(gpu_busy_pct)}, {"op_time_pct", op_time_pct},
            {"nvml_util_pct", opt(nvml_util_pct)}, {"energy_per_call_j", opt(energy_per_call_j)},
            {"energy_per_image_j", opt(energy_per_image_j)}, {"mean_power_w", opt(mean_power_w)},
            {"mean_sm_clock_mhz", opt(mean_sm_clock_mhz)}, {"peak_bytes_reserved", peak_bytes_reserved}});
  nlohmann::json counters = nlohmann::json::object();
  for (const auto& [name, change] : timed_counters) counters[name] = change;
  j["timed_run_counters"] = counters;
  j["kernels"] = kernels ? kernels->to_json() : nlohmann::json(nullptr);
  return j;
}

std::string BenchReport::to_text() const {
  std::string s;
  auto line = [&s](const std::string& key, const std::string& value) {
    s += key + std::string(key.size() < 18 ? 18 - key.size() : 1, ' ') + value + "\n";
  };
  if (ceiling)
    line("GEMM ceiling", fmt::sprintf("%.3f TFLOP/s", ceiling->tflops) + " (" + ceiling->dtype + " " + std::to_string(ceiling->size) +
                             "^3 on " + ceiling->device + ", best of " + std::to_string(ceiling->reps) + ")");
  if (!ran) return s;
  line("model", model + " (" + model_kind + "), loaded in " + fmt::sprintf("%.2f s", load_s));
  line("run", device + " (" + std::to_string(host_threads) + " host threads), " + std::to_string(width) + "x" + std::to_string(height) + ", batch " + std::to_string(batch) +
                  " (" + model_call + " batch " + std::to_string(unet_batch) + "), " + std::to_string(steps) + " steps " + sampler +
                  ", cfg " + fmt::sprintf("%g", cfg_scale) + ", warmup " + std::to_string(warmup) +
                  (warmup > 0 ? fmt::sprintf(" (%.2f s)", warmup_s) : std::string()));
  if (!conditioning.empty()) line("conditioning", conditioning);
  line(model_call + " call", fmt::sprintf("%.2f ms", unet_ms_mean) + " mean, " + fmt::sprintf("%.2f", unet_ms_min) + " min, " +
                        fmt::sprintf("%.2f", unet_ms_median) + " median over " + std::to_string(unet_ms.size()) + " calls");
  line("it/s", fmt::sprintf("%.3f", it_per_s) + " (model calls per second, sampler included)");
  line("s/image", fmt::sprintf("%.3f", s_per_image) + " (text " + (text_encode_s ? fmt::sprintf("%.3f s", *text_encode_s) : "n/a") +
                      ", denoise " + fmt::sprintf("%.3f s", denoise_s) + ", VAE decode " + fmt::sprintf("%.3f s", vae_decode_s) + ")");
  line("images/min", fmt::sprintf("%.2f", images_per_min));
  line("FLOPs/" + model_call + " call", fmt::sprintf("%.4f TFLOP", double(unet_flops) / 1e12) + " (engine count)");
  line("achieved", fmt::sprintf("%.3f TFLOP/s", unet_tflops) +
                       (pct_of_ceiling ? fmt::sprintf(" (%.1f%% of the GEMM ceiling)", *pct_of_ceiling) : std::string(" (no ceiling: add --ceiling)")));
  line("VAE decode", fmt::sprintf("%.4f TFLOP", double(vae_decode_flops) / 1e12) + ", " + fmt::sprintf("%.3f TFLOP/s", vae_decode_tflops));
  line("busy", (gpu_busy_pct ? fmt::sprintf("%.1f%% GPU (kernel time / wall)", *gpu_busy_pct) : std::string("n/a on this device")) +
                   "; op time / wall " + fmt::sprintf("%.1f%%", op_time_pct) + " of the denoise loop" +
                   (nvml_util_pct ? fmt::sprintf("; NVML %.0f%%", *nvml_util_pct) : std::string()));
  if (!energy_per_call_j && !energy_per_image_j && mean_sm_clock_mhz)
    line("energy", "n/a: " + fmt::sprintf("the run lasted %.2f s", total_s) +
                       "; NVML's energy counter moves in ~100 ms steps, a figure needs 1 s (more --steps)" +
                       fmt::sprintf("; SM clock %.0f MHz (NVML)", *mean_sm_clock_mhz));
  if (energy_per_call_j || energy_per_image_j)
    line("energy", (energy_per_call_j ? fmt::sprintf("%.2f J per ", *energy_per_call_j) + model_call + " call" : std::string("n/a per call")) +
                       (energy_per_image_j ? fmt::sprintf(", %.1f J per image", *energy_per_image_j) : std::string()) +
                       (mean_power_w ? fmt::sprintf("; denoise loop at %.0f W", *mean_power_w) : std::string()) +
                       (mean_sm_clock_mhz ? fmt::sprintf(", SM clock %.0f MHz (NVML)", *mean_sm_clock_mhz) : std::string()));
  line("peak memory", fmt::sprintf("%.2f GiB reserved", double(peak_bytes_reserved) / kGiB));
  std::string changes;
  for (const auto& [name, change] : timed_counters)
    if (name != "bytes_reserved") changes += (changes.empty() ? "" : ", ") + name + " " + fmt::sprintf("%g", change);
  if (!changes.empty()) line("timed run", changes + " (changes of the backend's counters over the timed run)");
  if (kernels) s += kernels->to_text(model_call);
  return s;
}

}  // namespace atelier
