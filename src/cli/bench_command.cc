// `atelier bench`: speed figures of a model or a built-in configuration with random weights (see
// pipeline/sd_bench.h for what each figure means), as a table or JSON.
#include <cmath>
#include <cstdio>
#include <limits>

#include "cli/commands.h"
#include "pipeline/dit_bench.h"

namespace atelier::cli {

namespace {
// --steps and --cfg-scale default per model (SD 20 / 7, flux 28 / off, zimage 8 / off): "not given" markers.
constexpr int kStepsUnset = 0;
constexpr float kCfgUnset = std::numeric_limits<float>::quiet_NaN();
}  // namespace

void add_bench_command(CLI::App& app, BenchCliOptions& o) {
  CLI::App* c = app.add_subcommand("bench", "Measure UNet ms/call, it/s, s/image, FLOPs and TFLOP/s of one generation");
  BenchOptions& b = o.bench;
  b.steps = kStepsUnset;
  b.cfg_scale = kCfgUnset;
  c->add_option("--model", b.model, "Diffusers folder or single-file .safetensors checkpoint");
  c->add_option("--config", b.config, "Built-in full-size configuration with random weights: sd15, sd21, flux (FLUX.1-dev, 1024², 28 steps) "
                "or zimage (Z-Image-Turbo, 1024², 8 steps); no download");
  c->add_option("--tokenizer", b.tokenizer, "CLIP tokenizer folder, for single files without one");
  c->add_option("--width", b.width, "Image width, a multiple of 8 (default: the model's size)");
  c->add_option("--height", b.height, "Image height, a multiple of 8 (default: the model's size)");
  c->add_option("--batch", b.batch, "Images per batch (the UNet runs twice as many rows with CFG)")->capture_default_str();
  c->add_option("--steps", b.steps, "Sampling steps (default 20; flux 28, zimage 8)");
  c->add_option("--cfg-scale", b.cfg_scale, "Classifier-free guidance scale (<= 1: no CFG batch; default 7, flux/zimage off)");
  c->add_option("--guidance", b.guidance, "flux: distilled guidance (a model input, no second pass)")->capture_default_str();
  c->add_option("--text-tokens", b.text_tokens, "flux/zimage: conditioning tokens fed instead of a text encoder's output (default 512 / 128)");
  c->add_option("--sampler", b.sampler, "Sampler (as for generate)")->capture_default_str();
  c->add_option("--warmup", b.warmup, "Untimed UNet calls (plus one VAE decode) before the timed run")->capture_default_str();
  c->add_option("--device", b.device, "cpu, cuda, cuda:N")->capture_default_str();
  c->add_option("--seed", b.seed, "Seed of the random weights and noise")->capture_default_str();
  c->add_flag("--text-encoder", b.text_encoder, "zimage: build the Qwen3-4B text encoder (random weights) and time the prompt's encoding too");
  c->add_flag("--fp8", b.fp8, "flux/zimage: the transformer blocks' projections in FP8 e4m3 (as generate --dtype fp8)");
  c->add_flag("--ceiling", b.ceiling, "Measure the device's GEMM ceiling (alone, or to give % of it)");
  c->add_flag("--kernels", b.kernels, "Trace every kernel (CUPTI; CUDA only) and report the timed calls' kernels: count, time, "
              "idle gaps inside a call, busy %, the kernels that take the time");
  c->add_flag("--json", o.json, "Print JSON (for scripts)");
  c->add_option("--trace", o.trace, "Write a Chrome/Perfetto trace (JSON) of the whole run to this file");
}

int run_bench(const BenchCliOptions& cli) {
  BenchCliOptions o = cli;
  const bool steps_given = o.bench.steps != kStepsUnset, cfg_given = !std::isnan(o.bench.cfg_scale);
  if (is_dit_bench(o.bench)) {
    o.bench = with_dit_defaults(o.bench, steps_given, cfg_given);
  } else {
    if (!steps_given) o.bench.steps = BenchOptions{}.steps;
    if (!cfg_given) o.bench.cfg_scale = BenchOptions{}.cfg_scale;
  }
  if (Status st = o.bench.validate(); !st.is_ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return 2;
  }
  auto dev = Device::parse(o.bench.device);
  if (!dev) {
    std::fprintf(stderr, "error: %s\n", dev.status().message().c_str());
    return 2;
  }
  TraceFile trace_file(o.trace);
  trace_file.time_device(*dev);
  auto report = atelier::run_bench(o.bench);
  if (!report) {
    std::fprintf(stderr, "error: %s\n", report.status().message().c_str());
    return 1;
  }
  if (!trace_file.write(*dev)) return 1;
  if (o.json)
    std::printf("%s\n", report->to_json().dump(2).c_str());
  else
    std::printf("%s", report->to_text().c_str());
  return 0;
}

}  // namespace atelier::cli
