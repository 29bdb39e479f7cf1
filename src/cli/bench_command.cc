// `atelier bench`: speed figures of a model or a built-in configuration with random weights (see
// pipeline/sd_bench.h for what each figure means), as a table or JSON.
#include <cstdio>

#include "cli/commands.h"
#include "pipeline/sd_bench.h"

namespace atelier::cli {

void add_bench_command(CLI::App& app, BenchCliOptions& o) {
  CLI::App* c = app.add_subcommand("bench", "Measure UNet ms/call, it/s, s/image, FLOPs and TFLOP/s of one generation");
  BenchOptions& b = o.bench;
  c->add_option("--model", b.model, "Diffusers folder or single-file .safetensors checkpoint");
  c->add_option("--config", b.config, "Built-in full-size configuration with random weights: sd15 or sd21 (no download)");
  c->add_option("--tokenizer", b.tokenizer, "CLIP tokenizer folder, for single files without one");
  c->add_option("--width", b.width, "Image width, a multiple of 8 (default: the model's size)");
  c->add_option("--height", b.height, "Image height, a multiple of 8 (default: the model's size)");
  c->add_option("--batch", b.batch, "Images per batch (the UNet runs twice as many rows with CFG)")->capture_default_str();
  c->add_option("--steps", b.steps, "Sampling steps")->capture_default_str();
  c->add_option("--cfg-scale", b.cfg_scale, "Classifier-free guidance scale (<= 1: no CFG batch)")->capture_default_str();
  c->add_option("--sampler", b.sampler, "Sampler (as for generate)")->capture_default_str();
  c->add_option("--warmup", b.warmup, "Untimed UNet calls (plus one VAE decode) before the timed run")->capture_default_str();
  c->add_option("--device", b.device, "cpu, cuda, cuda:N")->capture_default_str();
  c->add_option("--seed", b.seed, "Seed of the random weights and noise")->capture_default_str();
  c->add_flag("--ceiling", b.ceiling, "Measure the device's GEMM ceiling (alone, or to give % of it)");
  c->add_flag("--json", o.json, "Print JSON (for scripts)");
  c->add_option("--trace", o.trace, "Write a Chrome/Perfetto trace (JSON) of the whole run to this file");
}

int run_bench(const BenchCliOptions& o) {
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
  auto report = run_sd_bench(o.bench);
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
