// What the route handlers share: the options, the model registry, the job store, the scheduler, the device
// pool and the metrics, plus the submission path every API family uses.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>

#include "serve/device_pool.h"
#include "serve/job_store.h"
#include "serve/metrics.h"
#include "serve/model_registry.h"
#include "serve/scheduler.h"
#include "serve/server.h"

namespace httplib {
class Server;
}

namespace atelier::serve {

// Counts a job's outcome in the metrics (jobs by state, images, end-to-end latency).
TerminalHook terminal_hook(MetricsRegistry& metrics);

struct ServerContext {
  const ServeOptions& options;
  const ModelRegistry& registry;
  JobStore& store;
  Scheduler& scheduler;
  DevicePool& pool;
  MetricsRegistry& metrics;
  std::atomic<bool>& stopping;
  std::chrono::steady_clock::time_point started;
  // Redis mode: workers with a fresh heartbeat (readiness); empty = the local device pool decides.
  std::function<int()> cluster_workers = {};

  // Resolves the model, validates against the limits, creates and queues the job.
  // Errors: kInvalidArgument (400), kNotFound (unknown model, 400), kResourceExhausted (queue full, 429).
  Expected<JobPtr> submit(ServeRequest request);
  // Waits until the job finishes; false when the server stops first.
  bool wait(const JobPtr& job) const;
  // Seconds a client should wait after a 429: the mean job latency so far, at least 1.
  int retry_after_s() const;
};

// Route registration, one function per API family (routes_*.cc).
void add_native_routes(httplib::Server& http, ServerContext& ctx);
void add_a1111_routes(httplib::Server& http, ServerContext& ctx);
void add_openai_routes(httplib::Server& http, ServerContext& ctx);
void add_ops_routes(httplib::Server& http, ServerContext& ctx);
void add_web_routes(httplib::Server& http, ServerContext& ctx);  // the web UI (routes_web.cc)
bool is_web_ui_path(const std::string& path);                   // `/` and `/ui/...`: public

}  // namespace atelier::serve
