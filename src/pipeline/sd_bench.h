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
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace atelier {

struct BenchOptions {
  std::string model;        // diffusers folder or single-file checkpoint, or
  std::string config;       // a built-in configuration: "sd15" | "sd21" (random weights)
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
  std::string device, backend;
  int host_threads = 0;      // OpenMP threads the CPU backend may use
  int width = 0, height = 0, batch = 0, unet_batch = 0, steps = 0, warmup = 0;
  float cfg_scale = 0;
  std::string sampler;
  double load_s = 0;
  // --- measured (empty when only the ceiling was asked for)
  bool ran = false;
  std::vector<double> unet_ms;          // each timed UNet call
  double unet_ms_mean = 0, unet_ms_min = 0, unet_ms_median = 0;
  std::optional<double> text_encode_s;  // none without a text encoder (built-in configs)
  double denoise_s = 0, vae_decode_s = 0, total_s = 0;
  int model_calls = 0;
  double it_per_s = 0, s_per_image = 0, images_per_min = 0;
  uint64_t unet_flops = 0;              // per UNet call, engine count
  uint64_t vae_decode_flops = 0;        // per decode of the batch
  double unet_tflops = 0, vae_decode_tflops = 0;
  std::optional<GemmCeiling> ceiling;
  std::optional<double> pct_of_ceiling;   // unet_tflops / ceiling
  std::optional<double> gpu_busy_pct;     // needs device times (CUDA); none on the CPU
  double op_time_pct = 0;                 // busy time inside ops / wall, over the denoise loop
  std::optional<double> nvml_util_pct;    // the CUDA backend fills it (NVML), none elsewhere
  size_t peak_bytes_reserved = 0;

  nlohmann::json to_json() const;
  std::string to_text() const;  // the human-readable table the CLI prints
};

// Runs the benchmark; errors (bad options, model not loadable, device missing) are values.
Expected<BenchReport> run_sd_bench(const BenchOptions& options);

}  // namespace atelier
