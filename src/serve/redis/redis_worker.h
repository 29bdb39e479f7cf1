// `atelier worker --queue redis://...`: a GPU (or CPU) worker process of the Redis queue. It runs the same
// engine path as `atelier serve` — model registry, device pool, scheduler, step-level batching workers —
// fed from Redis instead of HTTP:
//
//   puller thread: XREADGROUP (consumer group `workers`) on the streams of the models it serves, only while
//     its devices have room; XAUTOCLAIM of entries idle longer than the visibility timeout (a dead worker's
//     jobs); each entry is claimed atomically (scripts::kClaim: new epoch, owner = this worker) and submitted
//     to the local scheduler; a malformed entry is moved to atelier:dead with its error and acknowledged.
//   pump thread: every job's local events -> the job's event stream and hash in Redis (only while this
//     worker still holds the job's epoch); the cancel flag -> local cancellation; the pending entry's idle
//     time reset (XCLAIM JUSTID) so a long job is not reclaimed while alive; the outcome (result images in
//     Redis below a size limit, else the --output-dir path) then XACK + XDEL; the worker's heartbeat.
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "serve/serve_request.h"

namespace atelier::serve::redis {

struct RedisWorkerOptions {
  std::string queue;                       // redis://HOST:PORT[/DB]
  std::vector<std::string> models;         // NAME=PATH or PATH (as `atelier serve --model`)
  std::string model_dir;
  std::string tokenizer_dir;
  std::vector<std::string> serve_models;   // names of the models to take jobs for; empty = every model given
  std::string devices = "cpu";
  std::string name;                        // consumer name; empty = HOST-PID
  int max_batch = 8;
  int batch_window_ms = 0;
  int cpu_threads = 0;
  int host_threads = 0;  // 0 = ThreadPool::default_size()
  int probe_interval_ms = 1000;
  size_t max_models_per_device = 2;
  std::string dtype = "auto";              // models' dtype: auto | f32 | bf16 | f16 | fp8 (FLUX / Z-Image blocks; parse_model_dtype)
  bool offload = false;                  // FLUX / Z-Image: text encoders leave the device after each request's prompts
  size_t model_memory_mb = 0;
  std::string output_dir;                  // large results (and, when set, every image) are written here
  size_t max_inline_kb = 1024;             // larger encoded images go to --output-dir when it is set
  int visibility_timeout_ms = 30000;       // a pending entry idle this long is reclaimed by another worker
  int heartbeat_ms = 1000;
  double result_ttl_s = 86400;
};

class RedisWorkerNode {
 public:
  static Expected<std::unique_ptr<RedisWorkerNode>> create(const RedisWorkerOptions& options);
  ~RedisWorkerNode();
  Status start();
  // Stops taking work; jobs held are left pending in Redis (another worker reclaims them).
  void stop();
  const std::string& name() const;

 private:
  struct Impl;
  explicit RedisWorkerNode(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace atelier::serve::redis
