// What the route handlers share: the options, the model registry, the job store, the scheduler, the device
// pool and the metrics, plus the submission path every API family uses.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>

#include "serve/a1111_settings.h"
#include "serve/device_pool.h"
#include "serve/image_files.h"
#include "serve/job_store.h"
#include "serve/metrics.h"
#include "serve/model_registry.h"
#include "serve/scheduler.h"
#include "serve/server.h"

namespace httplib {
class Server;
struct Response;
}

namespace atelier::serve {

// Connections held for as long as a job runs (event streams, synchronous generation calls) each take one of a fixed
// number of slots. The HTTP threads beyond the slots stay free for short requests, so health checks, polling and
// submissions are answered however many clients wait on jobs (each held connection holds an HTTP thread).
class HeldConnections {
 public:
  void set_capacity(int slots) { capacity_ = slots; }
  // A slot, given back when the last copy of the handle is gone; null when every slot is taken.
  std::shared_ptr<void> try_hold();
  int capacity() const { return capacity_; }
  int held() const { return held_.load(); }

 private:
  int capacity_ = 0;
  std::atomic<int> held_{0};
};

// The held slots of a server with `http_threads` threads: all but an eighth of them (at least 2 kept free).
int held_connection_slots(int http_threads);

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
  HeldConnections held = {};  // its capacity is set with the HTTP threads (Server::Impl::configure_http)
  A1111Settings a1111 = {};   // GET/POST /sdapi/v1/options: the A1111 requests' defaults
  std::unique_ptr<ImageFiles> image_files = {};  // OpenAI's response_format "url" (set up with the server)

  // Resolves the model, validates against the limits, creates and queues the job.
  // Errors: kInvalidArgument (400), kNotFound (unknown model, 400), kResourceExhausted (queue full, 429).
  Expected<JobPtr> submit(ServeRequest request);
  // Waits until the job finishes; false when the server stops first.
  bool wait(const JobPtr& job) const;
  // Seconds a client should wait after a 429: the mean job latency so far, at least 1.
  int retry_after_s() const;
  // A held slot for a request that will wait on a job (take it before submitting), or null with a 503 sent.
  std::shared_ptr<void> hold_connection(httplib::Response& res);
};

// Route registration, one function per API family (routes_*.cc).
void add_native_routes(httplib::Server& http, ServerContext& ctx);
void add_a1111_routes(httplib::Server& http, ServerContext& ctx);
void add_openai_routes(httplib::Server& http, ServerContext& ctx);
void add_ops_routes(httplib::Server& http, ServerContext& ctx);
void add_web_routes(httplib::Server& http, ServerContext& ctx);  // the web UI (routes_web.cc)
bool is_web_ui_path(const std::string& path);                   // `/` and `/ui/...`: public

}  // namespace atelier::serve
