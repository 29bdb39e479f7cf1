// `atelier bench` as a library call: one Stable Diffusion generation (text encode, the denoise loop on the
// CFG batch, VAE decode) of a loaded model or a built-in configuration with random weights, reported as the
// figures people compare engines by. Every time and FLOP count comes from the trace ranges (core/trace.h)
// that the pipeline and the op front end open anyway; nothing is timed twice.
//
//   UNet ms/call     host wall time of each UNet forward on the CFG batch (device synchronized per call)
//   it/s             model calls per second over the denoise loop (sampler update included)
//   s/image          the whole timed generation / images in the batch; images/min = 60 / that
//   FLOPs/call       counted by the op front end (2 per multiply-add; see core/trace.h for the rules)
//   TFLOP/s          FLOPs/call / UNet time; % of ceiling against measure_gemm_ceiling() on the same device
//   busy %           device time inside ops / wall time of the denoise loop, when the device timer resolved
//                    every op (CUDA); on the CPU "op time %" (host time inside ops / wall) is reported instead
//   peak memory      largest Backend::bytes_reserved() seen after each stage and model call
//   energy           NVML's energy counter (CUDA): joules per model call over the denoise loop's device span,
//                    per image over the timed run, the loop's mean power and SM clock. A DiT step holds an
//                    H200 at its power limit, where joules per step, not the clock, decide the step time.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/kernel_tracer.h"
#include "backend/nvml.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/trace.h"
#include "pipeline/bench_kernels.h"

namespace atelier {

struct BenchOptions {
  std::string model;        // diffusers folder or single-file checkpoint, or
  std::string config;       // a built-in configuration: "sd15" | "sd21" | "flux" | "zimage" (random weights)
  std::string tokenizer;    // CLIP tokenizer folder, for single files without one
  int width = 0;            // 0 = the model's default size
  int height = 0;
  int batch = 1;            // images per batch; the UNet runs 2 * batch rows when CFG is on
  int steps = 20;
  float cfg_scale = 7.0f;   // <= 1 disables CFG (UNet batch = batch)
  std::string sampler = "euler";
  int warmup = 1;           // untimed UNet calls (and one VAE decode when > 0) before the timed run
  std::string device = "cpu";
  bool ceiling = false;     // measure the GEMM ceiling first (alone when no model/config is given)
  uint64_t seed = 0;        // random weights and noise
  std::string prompt = "a photograph of an astronaut riding a horse";
  // Diffusion transformers (flux, zimage; dit_bench.h): FLUX's distilled guidance, and the conditioning
  // rows fed instead of a text encoder's output (0 = the configuration's: 512 T5 tokens, 128 Qwen3 tokens).
  float guidance = 3.5f;
  int text_tokens = 0;
  bool fp8 = false;  // FLUX / Z-Image: the transformer's block projections in FP8 (--dtype fp8)
  // Z-Image: also build its Qwen3-4B text encoder (random weights, f32 as the pipeline runs it) and encode a
  // text_tokens-long prompt inside the timed run, whose features condition the transformer: end to end.
  bool text_encoder = false;
  // Trace every kernel (CUPTI, CUDA only) from the warm-up on and report what the timed calls' kernels did
  // (bench_kernels.h). CUPTI's timestamps add a little device time per kernel: the run's other figures include it.
  bool kernels = false;

  Status validate() const;
};

struct GemmCeiling {
  std::string device;
  std::string dtype;
  int64_t size = 0;          // M = N = K
  int reps = 0;
  double best_s = 0;         // fastest single GEMM
  uint64_t flops = 0;        // per GEMM: 2 * size^3
  double tflops = 0;         // flops / best_s / 1e12
  nlohmann::json to_json() const;
};

// Times size^3 GEMMs (ops::matmul) on `device` in `dtype`, best of `reps` after one untimed run: the
// achievable dense peak the bench compares against. size <= 0 picks default_ceiling_size(device).
Expected<GemmCeiling> measure_gemm_ceiling(Device device, DType dtype, int64_t size = 0, int reps = 3);
int64_t default_ceiling_size(Device device);  // CPU 2048 (~17 GFLOP), CUDA 8192 (as the anchors measure)
DType default_compute_dtype(Device device);   // CPU f32, CUDA bf16

struct BenchReport {
  // --- setup
  std::string model;         // path, or "builtin:sd15"
  std::string model_kind;    // "checkpoint" | "random weights"
  std::string model_call = "UNet";  // what one timed call is: "UNet" | "transformer" (the unet_* fields hold its figures)
  std::string conditioning;  // how the denoiser was conditioned when no text encoder ran (built-in configs)
  std::string device, backend;
  int host_threads = 0;      // OpenMP threads the CPU backend may use
  int width = 0, height = 0, batch = 0, unet_batch = 0, steps = 0, warmup = 0;
  float cfg_scale = 0;
  std::string sampler;
  double load_s = 0;
  // The untimed warm-up's wall time (0 without one): on a GPU mostly each shape's planning at its first call
  // (candidates built and timed; much shorter where an earlier process's choices are kept, backend/choice_store.h).
  double warmup_s = 0;
  // --- measured (empty when only the ceiling was asked for)
  bool ran = false;
  std::vector<double> unet_ms;          // each timed UNet call
  double unet_ms_mean = 0, unet_ms_min = 0, unet_ms_median = 0;
  std::optional<double> text_encode_s;  // none without a text encoder (built-in configs)
  double denoise_s = 0, vae_decode_s = 0, total_s = 0;
  int model_calls = 0;
  double it_per_s = 0, s_per_image = 0, images_per_min = 0;
  uint64_t unet_flops = 0;              // per UNet call, engine count
  std::vector<uint64_t> call_flops;     // each timed call's count (equal when the loop does the same work each step)
  uint64_t vae_decode_flops = 0;        // per decode of the batch
  double unet_tflops = 0, vae_decode_tflops = 0;
  std::optional<GemmCeiling> ceiling;
  std::optional<double> pct_of_ceiling;   // unet_tflops / ceiling
  std::optional<double> gpu_busy_pct;     // needs device times (CUDA); none on the CPU
  double op_time_pct = 0;                 // busy time inside ops / wall, over the denoise loop
  std::optional<double> nvml_util_pct;    // NVML utilization over the timed run (CUDA; none on the CPU or without a driver)
  // From NVML's energy counter and SM clock (CUDA, a driver that reports energy; none elsewhere):
  std::optional<double> energy_per_call_j;   // over the denoise loop's span (start to the end of its device work)
  std::optional<double> energy_per_image_j;  // the whole timed run / images
  std::optional<double> mean_power_w;        // the denoise loop's energy / its span
  std::optional<double> mean_sm_clock_mhz;   // NVML's SM clock over the denoise loop
  std::vector<NvmlSample> nvml_samples;      // the timed run's samples (not reported; summarize_bench reads them)
  size_t peak_bytes_reserved = 0;
  // The backend's counters over the timed run, as changes (Backend::counters(): on CUDA cuda_mallocs and
  // cuda_malloc_seconds, on the CPU host_allocations): activation-sized growth here means the warm-up missed a shape.
  std::vector<std::pair<std::string, double>> timed_counters;
  std::optional<KernelFigures> kernels;  // --kernels

  nlohmann::json to_json() const;
  std::string to_text() const;  // the human-readable table the CLI prints
};

// Runs the benchmark; errors (bad options, model not loadable, device missing) are values.
Expected<BenchReport> run_sd_bench(const BenchOptions& options);

// --- shared with the diffusion-transformer bench (dit_bench.cc) ----------------------------------------
inline constexpr const char* kBenchLoadRange = "load_model";
inline constexpr const char* kBenchWarmupRange = "warmup";
inline constexpr const char* kBenchRunRange = "bench_run";  // the timed generation, conditioning to decoded pixels

// Untimed warm-up VAE decodes through `decode` until one makes no cudaMalloc (Backend::counters()' cuda_mallocs; on a
// backend without that counter, one decode), at most kMaxWarmupDecodes: the first decode also plans its convolutions,
// and the blocks it leaves cached are not always those a steady decode takes (docs/performance.md, session 23: after
// one warm-up decode every timed 512² run still made 6 cudaMallocs of 2-6 MiB, costing 0.3-4.8 ms).
inline constexpr int kMaxWarmupDecodes = 3;
Status warm_up_decodes(Device dev, const std::function<Status()>& decode);

// The setup fields every bench fills the same way (device, backend, host threads, the GEMM ceiling when
// asked for); errors when the device is missing.
Expected<BenchReport> start_bench_report(const BenchOptions& options, Device* device);
// Runs `body` with a recorder of every trace category attached and, where the device has one, a device timer
// installed (removed after `body`); ops' exceptions come back as a Status.
Status run_traced(Device device, const std::function<Status(trace::Recorder&)>& body);
// NVML's readings of a CUDA `device`, sampled from now until stop() (the report's nvml_util_pct, and its samples
// for the energy figures); null on the CPU. The benchmarks start it where their timed run starts.
std::unique_ptr<NvmlSampler> start_nvml_sampler(Device device);
// Stops `sampler` (may be null) and keeps what it read in `r`: nvml_util_pct and nvml_samples.
void finish_nvml_sampler(NvmlSampler* sampler, BenchReport& r);
// --kernels: a tracer opened before the warm-up, so that the graphs it records are traced from their first
// replay; null when the option is off. Errors when it is on and the device cannot be traced.
Expected<std::unique_ptr<KernelTracer>> open_bench_tracer(const BenchOptions& options);
// Adds the kernels `tracer` saw start inside the timed run (the kBenchRunRange range in `rec`) to `rec` (a no-op
// for a null tracer); call after the run's range has closed and the device has synchronized.
Status add_traced_kernels(KernelTracer* tracer, trace::Recorder& rec);
double bench_median(std::vector<double> v);  // 0 for none
// Each counter of `after` minus its value in `before` (a counter absent from `before` counts from zero).
std::vector<std::pair<std::string, double>> counter_changes(const std::vector<std::pair<std::string, double>>& before,
                                                            const std::vector<std::pair<std::string, double>>& after);
// Fills the measured figures of `r` from the timed run's events: per-call times and FLOPs from the ranges
// named `call_range` (stage::kUnet for SD, stage::kModelCall for the transformers), stage times, it/s,
// s/image, TFLOP/s, % of ceiling, busy %, and the energy figures from r.nvml_samples. `origin_ns` is the
// recorder's origin (device times count from it).
void summarize_bench(const std::vector<trace::Event>& events, int64_t origin_ns, const char* call_range, bool has_text_encoder,
                     BenchReport& r);

}  // namespace atelier
