// `atelier worker --queue redis://...`: flags -> RedisWorkerOptions, start the worker node, print
// "worker NAME ready", run until SIGINT/SIGTERM. Everything else lives in src/serve/redis/.
#include <csignal>
#include <cstdio>

#include "cli/commands.h"

namespace atelier::cli {

void add_worker_command(CLI::App& app, serve::redis::RedisWorkerOptions& o) {
  CLI::App* c = app.add_subcommand("worker", "Run jobs from a Redis queue fed by `atelier serve --queue`");
  c->add_option("--queue", o.queue, "redis://HOST:PORT[/DB] of the queue")->required();
  c->add_option("--model", o.models, "NAME=PATH (or PATH) of a diffusers folder or .safetensors file; repeatable");
  c->add_option("--model-dir", o.model_dir, "Folder whose model folders / .safetensors files are known by name");
  c->add_option("--models", o.serve_models, "Names of the models to take jobs for (default: every model given)")->delimiter(',');
  c->add_option("--tokenizer", o.tokenizer_dir, "CLIP tokenizer folder for single-file checkpoints without one");
  c->add_option("--devices", o.devices, "all, cpu, cpu,cpu, or CUDA indices 0,1,...")->capture_default_str();
  c->add_option("--name", o.name, "Consumer name in the group (default HOST-PID); must be unique per live worker");
  c->add_option("--max-batch", o.max_batch, "Samples per batched model call, per device")->capture_default_str();
  c->add_option("--batch-window-ms", o.batch_window_ms, "An idle device waits this long to gather a batch")->capture_default_str();
  c->add_option("--cpu-threads", o.cpu_threads, "Threads per CPU worker (default: the cores divided among CPU workers)");
  c->add_option("--host-threads", o.host_threads, "Threads encoding images (0 = half the cores, 2 to 16)")->capture_default_str();
  add_model_load_flags(c, o.dtype, o.offload);
  c->add_option("--max-models", o.max_models_per_device, "Models resident per device (LRU)")->capture_default_str();
  c->add_option("--model-memory-mb", o.model_memory_mb, "Model weight budget per device, MiB (0 = none)")->capture_default_str();
  c->add_option("--output-dir", o.output_dir, "Save images here (a path shared with the gateways); larger ones are only referenced");
  c->add_option("--max-inline-kb", o.max_inline_kb, "Images up to this size are stored in Redis (larger: --output-dir)")->capture_default_str();
  c->add_option("--visibility-timeout-ms", o.visibility_timeout_ms, "Pending jobs idle this long are reclaimed from dead workers")->capture_default_str();
  c->add_option("--heartbeat-ms", o.heartbeat_ms, "How often the worker registers itself")->capture_default_str();
  c->add_option("--result-ttl-s", o.result_ttl_s, "How long finished jobs and results stay in Redis")->capture_default_str();
  c->add_option("--probe-interval-ms", o.probe_interval_ms, "How often a failed device is probed")->capture_default_str();
}

int run_worker(const serve::redis::RedisWorkerOptions& o) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto node = serve::redis::RedisWorkerNode::create(o);
  if (!node) {
    std::fprintf(stderr, "error: %s\n", node.status().message().c_str());
    return 2;
  }
  if (Status st = (*node)->start(); !st.is_ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("worker %s ready\n", (*node)->name().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "signal %d: stopping (jobs held stay pending for other workers)\n", sig);
  (*node)->stop();
  return 0;
}

}  // namespace atelier::cli
