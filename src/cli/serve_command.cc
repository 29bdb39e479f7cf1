// `atelier serve`: flags -> ServeOptions, start the server, print "listening on http://HOST:PORT", run until
// SIGINT/SIGTERM. Everything else lives in src/serve/.
#include <csignal>
#include <cstdio>

#include "cli/commands.h"
#include "pipeline/demo_model.h"
#include "serve/model_registry.h"

namespace atelier::cli {

void add_serve_command(CLI::App& app, serve::ServeOptions& o) {
  CLI::App* c = app.add_subcommand("serve", "Serve the native, AUTOMATIC1111 and OpenAI image APIs over HTTP");
  c->add_option("--model", o.models, "NAME=PATH (or PATH) of a diffusers folder or .safetensors file; repeatable; the first is the default (none and no --model-dir: the bundled demo model, as demo)");
  c->add_option("--model-dir", o.model_dir, "Folder whose model folders / .safetensors files are served by name");
  c->add_option("--tokenizer", o.tokenizer_dir, "CLIP tokenizer folder for single-file checkpoints without one");
  c->add_option("--host", o.host, "Address to listen on")->capture_default_str();
  c->add_option("--port", o.port, "Port (0 = any free port; the chosen one is printed)")->capture_default_str();
  c->add_option("--devices", o.devices, "all, cpu, cpu,cpu (several CPU workers), or CUDA indices 0,1,...")->capture_default_str();
  c->add_option("--max-queue", o.max_queue, "Jobs waiting before new ones get 429")->capture_default_str();
  c->add_option("--max-batch", o.max_batch, "Samples per batched model call, per device")->capture_default_str();
  c->add_option("--batch-window-ms", o.batch_window_ms, "An idle device waits this long to gather a batch")->capture_default_str();
  c->add_option("--api-key", o.api_key, "Require 'Authorization: Bearer KEY' (except /healthz, /readyz)");
  c->add_option("--output-dir", o.output_dir, "Also save every image (PNG + JSON sidecar) here");
  c->add_option("--cors-origin", o.cors_origin, "Allow browsers from this origin (e.g. * or https://app.example)");
  c->add_option_function<size_t>("--max-body-mb", [&o](const size_t& mb) { o.max_body_bytes = mb << 20; },
                                  "Largest request body, MiB (default 32)");
  c->add_option("--max-side", o.limits.max_side, "Largest width/height")->capture_default_str();
  c->add_option("--max-pixels", o.limits.max_pixels, "Largest width x height")->capture_default_str();
  c->add_option("--max-steps", o.limits.max_steps, "Most steps per request")->capture_default_str();
  c->add_option("--max-images", o.limits.max_images, "Most images per request")->capture_default_str();
  c->add_option("--timeout-s", o.default_timeout_s, "Default per-request timeout, seconds (0 = none)")->capture_default_str();
  c->add_option("--http-threads", o.http_threads, "Concurrent HTTP connections")->capture_default_str();
  c->add_option("--host-threads", o.host_threads, "Threads encoding images (0 = half the cores, 2 to 16)")->capture_default_str();
  c->add_option("--cpu-threads", o.cpu_threads, "Threads per CPU worker (default: the cores divided among CPU workers)");
  add_model_load_flags(c, o.dtype, o.offload);
  c->add_option("--max-models", o.max_models_per_device, "Models resident per device (LRU)")->capture_default_str();
  c->add_option("--model-memory-mb", o.model_memory_mb, "Model weight budget per device, MiB (0 = none)")->capture_default_str();
  c->add_option("--keep-results", o.max_finished_jobs, "Finished jobs kept for polling")->capture_default_str();
  c->add_option("--keep-results-mb", o.max_result_mb, "Encoded images kept for polling, MiB (and as much again for images answered by URL)")->capture_default_str();
  c->add_option("--probe-interval-ms", o.probe_interval_ms, "How often a failed device is probed")->capture_default_str();
  c->add_flag("--test-hooks", o.test_hooks, "Enable POST /v1/admin/fail-device (for tests only)");
  c->add_option("--queue", o.queue, "redis://HOST:PORT[/DB]: queue jobs in Redis for `atelier worker` processes (no local workers)");
  c->add_option("--result-ttl-s", o.result_ttl_s, "Redis mode: how long finished jobs and results stay in Redis")->capture_default_str();
}

int run_serve(const serve::ServeOptions& o) {
  // Every thread the server starts inherits this mask, so the signals reach only the sigwait below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Nothing named: the bundled demo model, as `generate` does.
  serve::ServeOptions opts = o;
  opts.models = serve::specs_with_default_model(o.models, o.model_dir, executable_dir());
  if (o.models.empty() && !opts.models.empty()) std::printf("serving the bundled demo model as 'demo' (%s)\n", opts.models[0].c_str() + 5);
  auto server = serve::Server::create(opts);
  if (!server) {
    std::fprintf(stderr, "error: %s\n", server.status().message().c_str());
    if (opts.models.empty() && o.model_dir.empty())
      if (auto demo = find_demo_model(executable_dir()); !demo) std::fprintf(stderr, "(%s)\n", demo.status().message().c_str());
    return 2;
  }
  if (Status st = (*server)->start(); !st.is_ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("listening on %s\n", (*server)->url().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "signal %d: stopping\n", sig);
  (*server)->stop();
  return 0;
}

}  // namespace atelier::cli
