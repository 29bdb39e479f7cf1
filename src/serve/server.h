// `atelier serve`: the HTTP server (cpp-httplib) in front of the scheduler and the device pool.
//
//   Server::create(options) -> start() (binds; port 0 picks a free port) -> ... -> stop()
//
// HTTP threads only validate, enqueue and wait (or stream events); device workers compute; a host pool
// encodes images. The API families (native jobs, A1111, OpenAI, operations) each live in a routes_*.cc file;
// docs/serve.md describes every endpoint and metric.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "serve/serve_request.h"

namespace atelier::serve {

struct ServeOptions {
  std::vector<std::string> models;       // NAME=PATH or PATH
  std::string model_dir;
  std::string tokenizer_dir;             // for single-file checkpoints without a tokenizer
  std::string host = "127.0.0.1";
  int port = 7860;                       // 0 = any free port
  std::string devices = "cpu";           // all | cpu | cpu,cpu | 0,1 | cuda:0,...
  size_t max_queue = 64;                 // waiting jobs before 429
  int max_batch = 8;                     // samples per model call (and images assigned per worker)
  int batch_window_ms = 0;
  std::string api_key;                   // Bearer token; empty = no authentication
  std::string output_dir;                // save every image here when set
  std::string cors_origin;               // Access-Control-Allow-Origin; empty = no CORS headers
  size_t max_body_bytes = 32u << 20;
  ServeLimits limits;
  double default_timeout_s = 600;        // per job unless the request gives one (0 = none)
  int http_threads = 128;                // concurrent connections (each SSE stream or waiting call holds one; an eighth stay free for short requests)
  int host_threads = 0;                  // image encoding pool; 0 = ThreadPool::default_size()
  int cpu_threads = 0;                   // OpenMP threads per CPU worker; 0 = the cores divided among CPU workers
  size_t max_models_per_device = 2;
  std::string dtype = "auto";              // models' dtype: auto | f32 | bf16 | f16 | fp8 (FLUX / Z-Image blocks; parse_model_dtype)
  bool offload = false;                  // FLUX / Z-Image: text encoders leave the device after each request's prompts
  size_t model_memory_mb = 0;            // per device; 0 = no budget
  size_t max_finished_jobs = 1000;       // results kept for polling
  size_t max_result_mb = 256;            // ... and at most this many MiB of encoded images
  double job_retention_s = 3600;
  int probe_interval_ms = 1000;
  bool test_hooks = false;               // enables POST /v1/admin/fail-device (tests only)
  // redis://HOST:PORT[/DB]: accepted jobs go to Redis streams for `atelier worker` processes; this server
  // then starts no local workers and reads job state back from Redis (docs/serve.md, "Redis mode").
  std::string queue;
  double result_ttl_s = 86400;           // Redis mode: finished jobs and results kept in Redis this long
};

class Server {
 public:
  static Expected<std::unique_ptr<Server>> create(const ServeOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the socket and starts the workers and the HTTP threads; returns once the port accepts connections.
  Status start();
  int port() const;
  std::string url() const;  // http://HOST:PORT
  // Stops accepting, fails queued and running jobs ("the server is shutting down"), joins every thread.
  void stop();
  // Blocks until stop() (from another thread or a signal handler's thread).
  void wait();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atelier::serve
