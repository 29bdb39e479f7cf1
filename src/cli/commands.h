// Sub-commands of the `atelier` binary. Each returns the process exit code (0 ok, 1 failure, 2 bad usage).
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "core/trace.h"
#include "pipeline/request.h"
#include "pipeline/sd_pipeline.h"
#include "pipeline/sd_bench.h"
#include "serve/redis/redis_worker.h"
#include "serve/server.h"

namespace atelier::cli {

struct GenerateOptions {
  std::string model;
  std::string tokenizer;
  std::string output = "atelier.png";
  std::string trace;  // Chrome/Perfetto trace JSON of the run, when set
  // Model compute dtype: auto (f32 on the CPU, bf16 on CUDA), f32, bf16, f16; or fp8: FLUX / Z-Image block
  // projections in FP8 e4m3 (per-row scales) with the rest in the device's default dtype.
  std::string dtype = "auto";
  GenerateRequest request;
  // FLUX (see pipeline/flux_pipeline.h): the parts beside a BFL transformer file, and its settings.
  std::string vae, clip_l, t5, t5_tokenizer;
  bool offload = false;  // FLUX / Z-Image: the text encoders leave the device after each prompt's encoding
  float guidance = 3.5f;
  int max_sequence_length = 512;
  bool cfg_given = false;  // --cfg-scale was on the command line (FLUX runs true CFG only then)
  bool sampler_given = false;  // --sampler was on the command line (the demo model has its own default)
  std::string components;  // Z-Image: the diffusers folder with the parts a single-file transformer lacks

  // --dtype as model load options (CLI11 admits only kModelDtypeNames): none for "auto" (the device's default).
  bool fp8() const { return dtype == "fp8"; }
  std::optional<DType> load_dtype() const {
    const auto d = parse_model_dtype(dtype);
    return d ? d->dtype : std::nullopt;
  }
};
void add_generate_command(CLI::App& app, GenerateOptions& o);

// CLI11's check of a --dtype value: one of kModelDtypeNames.
inline CLI::IsMember model_dtype_check() {
  return CLI::IsMember(std::vector<std::string>(std::begin(kModelDtypeNames), std::end(kModelDtypeNames)));
}
// `--dtype` and `--offload` for the models a server process loads (`atelier serve`, `atelier worker`).
inline void add_model_load_flags(CLI::App* c, std::string& dtype, bool& offload) {
  c->add_option("--dtype", dtype, "Model compute dtype: auto (CPU f32, CUDA bf16), f32, bf16, f16; fp8: FLUX and Z-Image "
                                  "block projections in FP8 e4m3 (SD models keep the device's default)")
      ->check(model_dtype_check())
      ->capture_default_str();
  c->add_flag("--offload", offload, "FLUX / Z-Image: the text encoders leave the device after each request's prompts");
}
int run_generate(const GenerateOptions& o);
// FLUX models (is_flux_model): load, generate, write (generate_flux.cc).
int run_generate_flux(const GenerateOptions& o, Device device);
// Writes each image as PNG with its infotext, plus a JSON sidecar; prints the paths and timings. Exit code.
int write_generate_outputs(const GenerateOptions& o, const GenerateResult& res);
// Z-Image models (is_zimage_model): load, generate, write (generate_zimage.cc).
int run_generate_zimage(const GenerateOptions& o, Device device);

struct InfoOptions {
  std::string model;
  std::string tokenizer;
  bool json = false;
};
void add_info_command(CLI::App& app, InfoOptions& o);
int run_info(const InfoOptions& o);

struct BenchCliOptions {
  BenchOptions bench;
  bool json = false;
  std::string trace;
};
void add_bench_command(CLI::App& app, BenchCliOptions& o);
int run_bench(const BenchCliOptions& o);

// Records every trace range of the process while alive and writes them as Chrome trace JSON to `path`
// (nothing when empty). write() reports where it went or why not.
class TraceFile {
 public:
  explicit TraceFile(std::string path);
  ~TraceFile();
  // When a file is wanted: installs `dev`'s device timer (CUDA events) so that the trace gets a device track,
  // and on a GPU opens a kernel tracer (CUPTI) so that every kernel gets its own span there, graph replays
  // included (without CUPTI the file has the timed ranges only, and a note on stderr says why).
  void time_device(Device dev);
  // Synchronizes `dev`, resolves device times and writes the file; returns false (message printed) on error.
  bool write(Device dev);

 private:
  std::string path_;
  std::unique_ptr<trace::Recorder> recorder_;
  std::unique_ptr<trace::GlobalAttach> attach_;
  std::unique_ptr<trace::DeviceTimer> timer_;
  std::unique_ptr<KernelTracer> kernels_;
};

// What every generate command (SD, FLUX, Z-Image) shows and does at its end:
// a progress line on stderr where stderr is a terminal ("batch 1: step 3/20"; `unit` names what p.batch_index
// counts), and the result's error, or its images written (write_generate_outputs) and the trace file; exit code.
ProgressCallback terminal_progress(const char* unit);
int finish_generate(const GenerateOptions& o, const Expected<GenerateResult>& res, TraceFile& trace_file, Device device);
void add_serve_command(CLI::App& app, serve::ServeOptions& o);
int run_serve(const serve::ServeOptions& o);
void add_worker_command(CLI::App& app, serve::redis::RedisWorkerOptions& o);
int run_worker(const serve::redis::RedisWorkerOptions& o);

}  // namespace atelier::cli
