#include "serve/server.h"

#include <httplib.h>

#include <condition_variable>
#include <sys/socket.h>

#include <csignal>
#include <filesystem>

#include "serve/http_util.h"
#include "backend/nvml.h"
#include "serve/redis/redis_gateway.h"
#include "serve/server_context.h"

namespace atelier::serve {
namespace {

constexpr int kKeepAliveTimeoutS = 5;
constexpr int kReadTimeoutS = 30;
// Pending connections the kernel keeps for the accept loop. httplib listens with 5 (CPPHTTPLIB_LISTEN_BACKLOG,
// compiled into Debian's library): a burst of clients connecting at once overflowed it, and some connections
// were reset after their request was sent ("no response (Read)" for 16 concurrent test clients on a loaded
// machine). start() raises it on the bound socket.
constexpr int kListenBacklog = 1024;
constexpr int kWriteTimeoutS = 60;
constexpr auto kStartTimeout = std::chrono::seconds(10);

bool constant_time_equal(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The image files answered by URL are public, as OpenAI's signed URLs are: their names are unguessable tokens.
bool is_public_path(const std::string& path) {
  return path == "/healthz" || path == "/readyz" || is_web_ui_path(path) || path.rfind(kImageFilesPath, 0) == 0;
}

}  // namespace

struct Server::Impl {
  ServeOptions options;
  ModelRegistry registry;
  MetricsRegistry metrics;
  JobStore store;
  std::unique_ptr<Nvml> nvml;
  std::unique_ptr<ThreadPool> host_pool;
  DevicePool pool;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<redis::RedisGateway> gateway;  // Redis mode only
  std::mutex load_mu;                            // Redis mode: one load into the store at a time
  std::atomic<bool> stopping{false};
  std::unique_ptr<ServerContext> ctx;
  httplib::Server http;
  std::thread http_thread;
  int port = 0;
  socket_t listen_socket = INVALID_SOCKET;  // captured by configure_http's socket options
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool started = false, stopped = false, done = false;

  Impl(ServeOptions o, ModelRegistry r)
      : options(std::move(o)), registry(std::move(r)), store(options.max_finished_jobs, options.job_retention_s, options.max_result_mb << 20) {}

  void configure_http();
  void add_collectors();
};

void Server::Impl::configure_http() {
  const int threads = std::max(4, options.http_threads);
  ctx->held.set_capacity(held_connection_slots(threads));
  http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http.set_payload_max_length(options.max_body_bytes);
  http.set_keep_alive_timeout(kKeepAliveTimeoutS);
  http.set_read_timeout(kReadTimeoutS, 0);
  http.set_socket_options([this](socket_t sock) {  // called for the listening socket only
    httplib::default_socket_options(sock);
    listen_socket = sock;
  });
  http.set_write_timeout(kWriteTimeoutS, 0);
  if (!options.cors_origin.empty())
    http.set_default_headers({{"Access-Control-Allow-Origin", options.cors_origin}, {"Vary", "Origin"}});

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") {  // CORS preflight; without --cors-origin browsers get no permission
      res.status = 204;
      if (!options.cors_origin.empty()) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, Last-Event-ID");
        res.set_header("Access-Control-Max-Age", "600");
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    // Compressed bodies are refused before they are read: the body limit counts the bytes on the wire, and a small
    // gzip body can inflate to gigabytes.
    if (const std::string enc = req.get_header_value("Content-Encoding"); !enc.empty() && enc != "identity") {
      send_error(res, 415, "request bodies are accepted uncompressed only (Content-Encoding: " + enc.substr(0, 32) + ")");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options.api_key.empty() || is_public_path(req.path)) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) != 0 || !constant_time_equal(auth.substr(prefix.size()), options.api_key)) {
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, 401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // httplib calls this for every response >= 400; only bodies it produced itself (404, 413, 400 on a
  // malformed request line) are empty and get the JSON error shape.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string message = res.status == 404   ? "no endpoint " + req.method + " " + req.path.substr(0, 128)
                                : res.status == 413 ? "the request body is larger than this server accepts"
                                                    : std::string("HTTP error ") + std::to_string(res.status);
    send_error(res, res.status, message);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    send_error(res, 500, what);
  });
  // Counted before the response is written (httplib's logger runs after it): a client that reads /metrics
  // right after a response must find that request counted, whichever server thread took which connection.
  http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    metrics.inc(metric::kHttpRequests, {{"endpoint", endpoint_label(req.method, req.path)}, {"status", std::to_string(res.status)}});
  });
  add_ops_routes(http, *ctx);
  add_native_routes(http, *ctx);
  add_a1111_routes(http, *ctx);
  add_openai_routes(http, *ctx);
  add_web_routes(http, *ctx);
}

void Server::Impl::add_collectors() {
  const auto t0 = std::chrono::steady_clock::now();
  metrics.add_collector([this, t0](MetricsRegistry& m) {
    m.set(metric::kQueueDepth, {}, double(scheduler->queue_depth()));
    m.set(metric::kQueueCapacity, {}, double(scheduler->queue_capacity()));
    m.set(metric::kJobsStored, {}, double(store.size()));
    m.set(metric::kResident, {}, resident_bytes());
    m.set(metric::kUptime, {}, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (const auto& w : pool.workers()) w->collect(m);
    if (!nvml) return;
    for (const auto& w : pool.workers()) {
      if (w->device().is_cpu()) continue;
      const auto r = nvml->read(w->device().index);
      if (!r) continue;
      const Labels l = {{"device", w->device().str()}};
      m.set(metric::kGpuUtil, l, r->utilization);
      m.set(metric::kGpuMemUsed, l, r->memory_used);
      m.set(metric::kGpuMemTotal, l, r->memory_total);
      m.set(metric::kGpuTemp, l, r->temperature_c);
      m.set(metric::kGpuPower, l, r->power_w);
      m.set(metric::kGpuSmClock, l, r->sm_clock_hz);
      if (r->energy_j) m.set(metric::kGpuEnergy, l, *r->energy_j);
    }
  });
}

Expected<std::unique_ptr<Server>> Server::create(const ServeOptions& o) {
  if (o.max_queue < 1) return invalid_argument("--max-queue must be at least 1");
  if (o.max_batch < 1 || o.max_batch > kMaxBatch) return invalid_argument("--max-batch must be from 1 to " + std::to_string(kMaxBatch));
  if (o.batch_window_ms < 0 || o.batch_window_ms > 10000) return invalid_argument("--batch-window-ms must be from 0 to 10000");
  if (!o.output_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.output_dir, ec);
    if (ec) return invalid_argument("--output-dir: cannot create '" + o.output_dir + "': " + ec.message());
  }
  ATELIER_ASSIGN_OR_RETURN(std::vector<Device> devices, parse_devices(o.devices));
  ATELIER_RETURN_IF_ERROR(parse_model_dtype(o.dtype).status());
  ATELIER_ASSIGN_OR_RETURN(ModelRegistry registry, ModelRegistry::create(o.models, o.model_dir));
  auto impl = std::make_unique<Impl>(o, std::move(registry));
  Impl& s = *impl;
  declare_serve_metrics(s.metrics);
  for (const Device& d : devices)
    if (!d.is_cpu()) s.nvml = Nvml::open();
  s.host_pool = std::make_unique<ThreadPool>(o.host_threads);
  std::unique_ptr<WorkQueue> queue = std::make_unique<LocalWorkQueue>(o.max_queue);
  if (!o.queue.empty()) {  // Redis mode: no local workers; jobs and their state live in Redis
    ATELIER_ASSIGN_OR_RETURN(s.gateway, redis::RedisGateway::create({o.queue, o.max_queue, o.result_ttl_s}, terminal_hook(s.metrics)));
    redis::declare_cluster_metrics(s.metrics);
    queue = s.gateway->make_queue();
    devices.clear();
    s.store.set_loader([&s](const std::string& id) -> JobPtr {
      std::lock_guard<std::mutex> lock(s.load_mu);
      if (JobPtr j = s.store.peek(id)) return j;
      JobPtr j = s.gateway->load(id);
      if (j) s.store.add(j);
      return j;
    });
  }
  s.scheduler = std::make_unique<Scheduler>(SchedulerOptions{}, std::move(queue), s.pool, s.store, s.metrics);
  s.pool.add_workers(devices, worker_options_of(o), s.registry, s.metrics, *s.host_pool, s.scheduler->hooks());
  s.ctx.reset(new ServerContext{s.options, s.registry, s.store, *s.scheduler, s.pool, s.metrics, s.stopping,
                                std::chrono::steady_clock::now()});
  s.ctx->image_files = std::make_unique<ImageFiles>(o.max_result_mb << 20);
  if (s.gateway) {
    s.ctx->cluster_workers = [&s] { return s.gateway->live_workers(); };
    s.metrics.add_collector([&s](MetricsRegistry& m) { s.gateway->collect(m); });
  }
  s.configure_http();
  s.add_collectors();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { stop(); }

Status Server::start() {
  Impl& s = *impl_;
  if (s.started) return internal_error("the server is already started");
  // httplib writes to sockets without MSG_NOSIGNAL: a client that disconnects mid-response would raise
  // SIGPIPE and kill the process. The write then fails with EPIPE instead, which httplib handles.
  std::signal(SIGPIPE, SIG_IGN);
  if (s.options.port == 0) {
    s.port = s.http.bind_to_any_port(s.options.host);
  } else {
    s.port = s.http.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1;
  }
  if (s.port <= 0)
    return invalid_argument("cannot listen on " + s.options.host + ":" + std::to_string(s.options.port) +
                            " (address in use, or not an address of this machine)");
  // listen() again on a listening socket only changes its backlog (see kListenBacklog).
  if (s.listen_socket != INVALID_SOCKET) ::listen(s.listen_socket, kListenBacklog);
  s.started = true;
  s.pool.start();
  s.scheduler->start();
  if (s.gateway) s.gateway->start();
  s.http_thread = std::thread([&s] { s.http.listen_after_bind(); });
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while (!s.http.is_running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!s.http.is_running()) return internal_error("the HTTP server did not start");
  return Status::ok();
}

int Server::port() const { return impl_->port; }

std::string Server::url() const { return "http://" + impl_->options.host + ":" + std::to_string(impl_->port); }

void Server::stop() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.stop_mu);
    if (s.stopped) return;
    s.stopped = true;
  }
  s.stopping = true;
  s.scheduler->stop();                          // queued jobs fail: waiting HTTP threads wake up
  s.pool.stop("the server is shutting down");   // running jobs fail
  if (s.gateway) s.gateway->stop();             // Redis mode: the jobs go on in Redis
  s.http.stop();
  if (s.http_thread.joinable()) s.http_thread.join();
  s.host_pool.reset();                          // finishes queued encodings
  {
    std::lock_guard<std::mutex> lock(s.stop_mu);
    s.done = true;
  }
  s.stop_cv.notify_all();
}

void Server::wait() {
  Impl& s = *impl_;
  std::unique_lock<std::mutex> lock(s.stop_mu);
  s.stop_cv.wait(lock, [&] { return s.done; });
}

}  // namespace atelier::serve
