#include "serve/redis/redis_gateway.h"

#include <chrono>
#include <cstdlib>
#include <random>

#include "io/file.h"
#include "serve/base64.h"
#include "serve/redis/keys.h"
#include "serve/redis/request_codec.h"
#include "serve/redis/scripts.h"

namespace atelier::serve::redis {
namespace {

constexpr int kFollowBlockMs = 100;     // XREAD BLOCK: how late a new mirror may start being followed
constexpr int kFollowBatch = 512;       // events per XREAD
constexpr auto kRetryPause = std::chrono::milliseconds(200);
constexpr size_t kMaxResultBytes = 256u << 20;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The job's timeout in seconds (0 = none), as the worker must apply it.
double timeout_of(const Job& job) {
  if (job.deadline() == Clock::time_point::max()) return 0;
  return std::max(0.001, std::chrono::duration<double>(job.deadline() - job.created()).count());
}

}  // namespace

// The scheduler's queue on a gateway: jobs wait in Redis, never here, so the scheduler's local dispatch
// finds nothing to hand out (front/pop are empty) and workers elsewhere take the jobs.
class RedisWorkQueue final : public WorkQueue {
 public:
  explicit RedisWorkQueue(RedisGateway& g) : g_(g) {}

  Status push(JobPtr job) override {
    ServeRequest r = job->request();
    // A reclaimed job must give the same image on another worker: resolve the random seed once, here.
    if (r.gen.seed < 0) r.gen.seed = int64_t(std::random_device{}() & 0xffffffffu);
    r.timeout_s = timeout_of(*job);
    const std::string model = r.model;
    auto entry = g_.cmd_.eval(scripts::kSubmit, {job_key(job->id()), jobs_stream(model), kModelsKey},
                              {job->id(), encode_request(r).dump(), model, std::to_string(now_ms()),
                               std::to_string(g_.options_.capacity)});
    if (!entry) return Status(ErrorCode::kResourceExhausted, "the job queue is unavailable: " + entry.status().message());
    if (entry->str.empty())
      return Status(ErrorCode::kResourceExhausted, "queue full: " + std::to_string(g_.options_.capacity) +
                                                       " jobs are waiting for model '" + model + "'");
    g_.follow(job, "0-0");
    return Status::ok();
  }
  void push_front(JobPtr) override {}  // no local workers hand jobs back on a gateway
  JobPtr front() const override { return nullptr; }
  JobPtr pop() override { return nullptr; }

  // Cancellation (the mirror carries the reason) or expiry in the queue; a running job gets the cancel flag.
  bool remove(const std::string& id) override {
    const JobPtr m = g_.mirror(id);
    const bool cancel = !m || m->cancel_requested();
    const std::string reason = m && cancel ? m->cancel_reason() : cancel ? "cancelled" : "timed out in the queue";
    const std::string state = cancel ? "cancelled" : "failed";
    const nlohmann::json data = cancel ? nlohmann::json{{"state", state}, {"reason", reason}}
                                       : nlohmann::json{{"state", state}, {"error", reason}};
    const std::string model = m ? m->request().model : std::string();
    auto r = g_.cmd_.eval(scripts::kCancel, {job_key(id), events_key(id), jobs_stream(model)},
                          {state, reason, std::to_string(int64_t(g_.options_.result_ttl_s)), data.dump()});
    return r && r->as_int() == 1;
  }
  int position(const std::string& id) const override {
    const JobPtr m = g_.mirror(id);
    if (!m || m->state() != JobState::kQueued) return -1;
    auto entry = g_.cmd_.command({"HGET", job_key(id), "entry"});
    if (!entry || entry->is_nil()) return -1;
    auto ahead = g_.cmd_.command({"XRANGE", jobs_stream(m->request().model), "-", entry->str, "COUNT",
                                  std::to_string(g_.options_.capacity + 1)});
    return ahead && !ahead->elements.empty() ? int(ahead->elements.size()) - 1 : -1;
  }
  size_t depth() const override {
    auto models = g_.cmd_.command({"SMEMBERS", kModelsKey});
    size_t n = 0;
    if (!models) return 0;
    for (const RedisReply& m : models->elements)
      if (auto len = g_.cmd_.command({"XLEN", jobs_stream(m.str)})) n += size_t(len->as_int());
    return n;
  }
  size_t capacity() const override { return g_.options_.capacity; }

 private:
  RedisGateway& g_;
};

void declare_cluster_metrics(MetricsRegistry& m) {
  m.declare(metric::kWorkers, MetricType::kGauge, "Workers with a fresh heartbeat in Redis");
  m.declare(metric::kWorkerDevices, MetricType::kGauge, "Per worker device: 1 when healthy");
  m.declare(metric::kWorkerActive, MetricType::kGauge, "Per worker device: images held");
  m.declare(metric::kWorkerGpuMem, MetricType::kGauge, "Per worker GPU: memory used (NVML), bytes");
  m.declare(metric::kWorkerGpuUtil, MetricType::kGauge, "Per worker GPU: utilization (NVML), 0..1");
  m.declare(metric::kQueueDepth, MetricType::kGauge, "Jobs waiting in the model's stream (not yet delivered)");
  m.declare(metric::kPending, MetricType::kGauge, "Jobs delivered to a worker and not yet acknowledged");
  m.declare(metric::kReclaimed, MetricType::kGauge, "Jobs reclaimed from dead workers (XAUTOCLAIM), since Redis started");
  m.declare(metric::kDeadLetters, MetricType::kGauge, "Malformed messages moved to atelier:dead");
}

RedisGateway::RedisGateway(RedisGatewayOptions options, std::unique_ptr<RedisClient> cmd,
                           std::unique_ptr<RedisClient> follow, TerminalHook hook)
    : options_(std::move(options)), cmd_(std::move(cmd)), follow_(std::move(follow)), hook_(std::move(hook)) {}

Expected<std::unique_ptr<RedisGateway>> RedisGateway::create(const RedisGatewayOptions& o, TerminalHook hook) {
  ATELIER_ASSIGN_OR_RETURN(RedisUrl url, RedisUrl::parse(o.url));
  ATELIER_ASSIGN_OR_RETURN(auto cmd, RedisClient::connect(url));
  RedisClientOptions fo;
  fo.command_timeout = std::chrono::milliseconds(kFollowBlockMs * 20);
  ATELIER_ASSIGN_OR_RETURN(auto follow, RedisClient::connect(url, fo));
  ATELIER_RETURN_IF_ERROR(cmd->command({"PING"}).status());
  return std::unique_ptr<RedisGateway>(new RedisGateway(o, std::move(cmd), std::move(follow), std::move(hook)));
}

RedisGateway::~RedisGateway() { stop(); }

std::unique_ptr<WorkQueue> RedisGateway::make_queue() { return std::make_unique<RedisWorkQueue>(*this); }

void RedisGateway::start() { follower_ = std::thread([this] { follow_loop(); }); }

void RedisGateway::stop() {
  stopping_ = true;
  if (follower_.joinable()) follower_.join();
}

void RedisGateway::follow(const JobPtr& job, const std::string& after) {
  std::lock_guard<std::mutex> lock(mu_);
  mirrors_.emplace(job->id(), Mirror{job, after});
}

JobPtr RedisGateway::mirror(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mirrors_.find(id);
  return it == mirrors_.end() ? nullptr : it->second.job;
}

JobPtr RedisGateway::load(const std::string& id) {
  if (id.empty() || id.size() > 64) return nullptr;
  std::lock_guard<std::mutex> lock(load_mu_);  // one load at a time: a job is never mirrored twice
  if (JobPtr m = mirror(id)) return m;
  auto h = cmd_.command({"HGETALL", job_key(id)});
  if (!h || h->elements.empty()) return nullptr;
  // A job whose stored request is broken still shows its outcome (the worker failed it with the error).
  auto request = decode_request(hash_field(*h, "request"));
  ServeRequest r;
  if (request) r = std::move(*request);
  const double timeout = r.timeout_s;
  auto job = std::make_shared<Job>(id, std::move(r), timeout, hook_);
  job->mark_queued();
  auto events = cmd_.command({"XRANGE", events_key(id), "-", "+"});
  std::string last = "0-0";
  if (events) {
    // apply() reads results with a client of its own: a short-lived connection for this replay, so the
    // shared one is not held for the whole of it.
    auto client = RedisClient::connect(*RedisUrl::parse(options_.url));
    for (const RedisReply& e : events->elements) {
      last = e.at(0).str;
      const RedisReply& f = e.at(1);
      if (client) apply(**client, *job, hash_field(f, "type"), hash_field(f, "data"));
    }
  }
  if (!job->finished()) follow(job, last);
  return job;
}

void RedisGateway::apply(RedisClient& client, Job& job, const std::string& type, const std::string& data_text) {
  const nlohmann::json d = nlohmann::json::parse(data_text, nullptr, false);
  if (d.is_discarded() || !d.is_object()) return;
  if (type == "started") {
    job.mark_running(d.value("device", std::string("?")));
  } else if (type == "step") {
    job.set_progress(d.value("step", 0), d.value("total_steps", 0));
  } else if (type == "preview") {
    job.set_preview(d.value("step", 0), d.value("image", std::string()));
  } else if (type == "requeued") {
    job.mark_requeued(d.value("reason", std::string()));
  } else if (type == "done") {
    auto result = client.command({"HGET", job_key(job.id()), "result"});
    auto images = result ? read_results(client, result->text()) : Expected<std::vector<JobImage>>(result.status());
    if (images) job.finish(std::move(*images));
    else job.fail(images.status());
  } else if (type == "failed") {
    const bool timed_out = d.value("timed_out", false);
    job.fail(Status(timed_out ? ErrorCode::kCancelled : ErrorCode::kInternal, d.value("error", std::string("failed"))));
  } else if (type == "cancelled") {
    job.cancel(d.value("reason", std::string("cancelled")));
  }
}

Expected<std::vector<JobImage>> read_results(RedisClient& client, const std::string& result_json) {
  const nlohmann::json meta = nlohmann::json::parse(result_json, nullptr, false);
  if (!meta.is_array()) return internal_error("the job's result record in Redis is missing or malformed");
  std::vector<JobImage> out;
  for (const nlohmann::json& m : meta) {
    JobImage im;
    im.format = m.value("format", std::string("png"));
    im.infotext = m.value("infotext", std::string());
    im.seed = m.value("seed", int64_t(0));
    im.width = m.value("width", 0);
    im.height = m.value("height", 0);
    im.path = m.value("path", std::string());
    std::string bytes;
    if (m.contains("key")) {
      ATELIER_ASSIGN_OR_RETURN(RedisReply r, client.command({"GET", m["key"].get<std::string>()}));
      if (r.is_nil()) return internal_error("the job's result image expired from Redis");
      bytes = std::move(r.str);
    } else if (!im.path.empty()) {
      auto read = read_file(im.path, "result image", kMaxResultBytes);  // the shared --output-dir
      if (!read) return internal_error(read.status().message() + " (is --output-dir shared?)");
      bytes = std::move(*read);
    }
    if (bytes.size() > kMaxResultBytes) return internal_error("result image too large");
    im.data_b64 = base64_encode(bytes);
    out.push_back(std::move(im));
  }
  return out;
}

void RedisGateway::follow_loop() {
  while (!stopping_.load()) {
    std::vector<std::string> ids, cursors;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = mirrors_.begin(); it != mirrors_.end();) {
        if (it->second.job->finished()) {
          it = mirrors_.erase(it);
          continue;
        }
        ids.push_back(it->first);
        cursors.push_back(it->second.last_event);
        ++it;
      }
    }
    if (ids.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kFollowBlockMs / 2));
      continue;
    }
    std::vector<std::string> argv = {"XREAD", "COUNT", std::to_string(kFollowBatch), "BLOCK", std::to_string(kFollowBlockMs), "STREAMS"};
    for (const auto& id : ids) argv.push_back(events_key(id));
    argv.insert(argv.end(), cursors.begin(), cursors.end());
    auto r = follow_->command(argv);
    if (!r) {
      std::this_thread::sleep_for(kRetryPause);  // Redis restarting: the client reconnects on the next call
      continue;
    }
    for (const RedisReply& stream : r->elements) {
      const std::string id = stream.at(0).str.substr(std::string("atelier:events:").size());
      const JobPtr job = mirror(id);
      if (!job) continue;
      std::string last;
      for (const RedisReply& e : stream.at(1).elements) {
        last = e.at(0).str;
        apply(*follow_, *job, hash_field(e.at(1), "type"), hash_field(e.at(1), "data"));
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = mirrors_.find(id); it != mirrors_.end() && !last.empty()) it->second.last_event = last;
    }
  }
}

int RedisGateway::live_workers() {
  auto w = cmd_.command({"HGETALL", kWorkersKey});
  if (!w) return 0;
  int live = 0;
  const int64_t now = now_ms();
  for (size_t i = 0; i + 1 < w->elements.size(); i += 2) {
    const nlohmann::json j = nlohmann::json::parse(w->elements[i + 1].str, nullptr, false);
    if (j.is_object() && now - j.value("ts_ms", int64_t(0)) <= int64_t(options_.worker_stale_s * 1000)) ++live;
  }
  return live;
}

void RedisGateway::collect(MetricsRegistry& m) {
  for (const char* g : {metric::kWorkerDevices, metric::kWorkerActive, metric::kWorkerGpuMem, metric::kWorkerGpuUtil,
                        metric::kQueueDepth, metric::kPending})
    m.clear(g);
  const int64_t now = now_ms();
  int live = 0;
  if (auto w = cmd_.command({"HGETALL", kWorkersKey})) {
    for (size_t i = 0; i + 1 < w->elements.size(); i += 2) {
      const nlohmann::json j = nlohmann::json::parse(w->elements[i + 1].str, nullptr, false);
      if (!j.is_object() || now - j.value("ts_ms", int64_t(0)) > int64_t(options_.worker_stale_s * 1000)) continue;
      ++live;
      const std::string name = w->elements[i].str;
      for (const nlohmann::json& d : j.value("devices", nlohmann::json::array())) {
        const Labels l = {{"worker", name}, {"device", d.value("device", std::string("?"))}};
        m.set(metric::kWorkerDevices, l, d.value("healthy", false) ? 1 : 0);
        m.set(metric::kWorkerActive, l, d.value("load", 0));
        if (d.contains("gpu_memory_used")) m.set(metric::kWorkerGpuMem, l, d["gpu_memory_used"].get<double>());
        if (d.contains("gpu_utilization")) m.set(metric::kWorkerGpuUtil, l, d["gpu_utilization"].get<double>());
      }
    }
  }
  m.set(metric::kWorkers, {}, live);
  if (auto models = cmd_.command({"SMEMBERS", kModelsKey})) {
    for (const RedisReply& model : models->elements) {
      const std::string stream = jobs_stream(model.str);
      auto xlen = cmd_.command({"XLEN", stream});
      const int64_t len = xlen ? xlen->as_int() : 0;
      auto p = cmd_.command({"XPENDING", stream, kGroup});
      const int64_t pending = p ? p->at(0).as_int() : 0;
      m.set(metric::kQueueDepth, {{"model", model.str}}, double(std::max<int64_t>(0, len - pending)));
      m.set(metric::kPending, {{"model", model.str}}, double(pending));
    }
  }
  if (auto s = cmd_.command({"HGETALL", kStatsKey})) {
    m.set(metric::kReclaimed, {}, std::atof(hash_field(*s, "reclaimed").c_str()));
    m.set(metric::kDeadLetters, {}, std::atof(hash_field(*s, "dead_letters").c_str()));
  }
}

}  // namespace atelier::serve::redis
