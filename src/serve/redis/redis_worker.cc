#include "serve/redis/redis_worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "serve/base64.h"
#include "serve/device_pool.h"
#include "serve/job_store.h"
#include "serve/metrics.h"
#include "serve/model_registry.h"
#include "backend/nvml.h"
#include "serve/redis/keys.h"
#include "serve/redis/redis_client.h"
#include "serve/redis/request_codec.h"
#include "serve/redis/scripts.h"
#include "serve/scheduler.h"
#include "serve/thread_pool.h"

namespace atelier::serve::redis {
namespace {

constexpr int kReadBlockMs = 200;          // XREADGROUP BLOCK: how often the puller looks at its room again
constexpr auto kPumpPeriod = std::chrono::milliseconds(20);
constexpr auto kCancelCheckPeriod = std::chrono::milliseconds(200);
constexpr auto kRetryPause = std::chrono::milliseconds(200);
constexpr int kMaxEventsKept = 300;        // per job stream (MAXLEN ~): step events beyond are trimmed
constexpr size_t kMaxJobIdBytes = 64;
constexpr size_t kLocalQueueFactor = 4;
constexpr int64_t kMaxClaims = 3;          // claims of one job (its workers died) before it fails instead    // local queue capacity, in slots: never the limiting factor

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string default_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "-" + std::to_string(getpid());
}

bool valid_job_id(const std::string& id) {
  return !id.empty() && id.size() <= kMaxJobIdBytes &&
         id.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_") == std::string::npos;
}

nlohmann::json fields_json(const RedisReply& fields) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t i = 0; i + 1 < fields.elements.size(); i += 2) j[fields.elements[i].str] = fields.elements[i + 1].text();
  return j;
}

}  // namespace

// A job this worker holds: the local Job, where it came from, and how far its events were published.
struct InFlight {
  JobPtr job;
  std::string stream, entry;
  std::string epoch;
  uint64_t cursor = 0;
  Clock::time_point last_cancel_check = Clock::now();
  Clock::time_point last_refresh = Clock::now();
  bool terminal_pending = false;  // the outcome could not be stored yet (Redis unavailable): retried
};

enum class FinishResult { kStored, kRetry, kLost };

struct RedisWorkerNode::Impl {
  RedisWorkerOptions o;
  RedisUrl url;
  ModelRegistry registry;
  MetricsRegistry metrics;
  JobStore store{1, 1, 1};  // finished jobs are erased by the pump at once
  std::unique_ptr<Nvml> nvml;
  std::unique_ptr<ThreadPool> host_pool;
  DevicePool pool;
  std::unique_ptr<Scheduler> scheduler;
  std::vector<std::string> streams;
  int slots = 0;  // jobs held at most: devices x max_batch

  std::unique_ptr<RedisClient> pull_client, pump_client;
  std::mutex mu_;
  std::map<std::string, InFlight> inflight;  // by job id
  std::atomic<bool> stopping{false};
  std::thread puller, pump;
  int64_t jobs_done = 0;

  Impl(RedisWorkerOptions options, RedisUrl u, ModelRegistry r) : o(std::move(options)), url(std::move(u)), registry(std::move(r)) {}

  size_t held() {
    std::lock_guard<std::mutex> lock(mu_);
    return inflight.size();
  }
  // --- puller ---
  void pull_loop();
  void reclaim(int room);
  void handle(const std::string& stream, const RedisReply& entry, bool reclaimed);
  void dead_letter(const std::string& stream, const std::string& entry, const RedisReply& fields, const std::string& error);
  void ack(RedisClient& c, const std::string& stream, const std::string& entry);
  // --- pump ---
  void pump_loop();
  void pump_job(InFlight& f, bool* finished);
  FinishResult finish(RedisClient& c, InFlight& f);
  void heartbeat();
};

Expected<std::unique_ptr<RedisWorkerNode>> RedisWorkerNode::create(const RedisWorkerOptions& o) {
  if (o.max_batch < 1 || o.max_batch > kMaxBatch) return invalid_argument("--max-batch must be from 1 to " + std::to_string(kMaxBatch));
  if (o.visibility_timeout_ms < 100) return invalid_argument("--visibility-timeout-ms must be at least 100");
  if (!o.output_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.output_dir, ec);
    if (ec) return invalid_argument("--output-dir: cannot create '" + o.output_dir + "': " + ec.message());
  }
  ATELIER_ASSIGN_OR_RETURN(RedisUrl url, RedisUrl::parse(o.queue));
  ATELIER_ASSIGN_OR_RETURN(std::vector<Device> devices, parse_devices(o.devices));
  ATELIER_RETURN_IF_ERROR(parse_model_dtype(o.dtype).status());
  ATELIER_ASSIGN_OR_RETURN(ModelRegistry registry, ModelRegistry::create(o.models, o.model_dir));
  auto impl = std::make_unique<Impl>(o, url, std::move(registry));
  Impl& s = *impl;
  if (s.o.name.empty()) s.o.name = default_name();
  for (const std::string& m : o.serve_models.empty() ? std::vector<std::string>{} : o.serve_models)
    if (!s.registry.find(m)) return invalid_argument("--models: unknown model '" + m + "'; available: " + s.registry.names());
  if (o.serve_models.empty())
    for (const ModelEntry& e : s.registry.entries()) s.streams.push_back(jobs_stream(e.name));
  else
    for (const std::string& m : o.serve_models) s.streams.push_back(jobs_stream(s.registry.find(m)->name));

  RedisClientOptions pull_opts;
  pull_opts.command_timeout = std::chrono::milliseconds(kReadBlockMs * 20);
  ATELIER_ASSIGN_OR_RETURN(s.pull_client, RedisClient::connect(url, pull_opts));
  ATELIER_ASSIGN_OR_RETURN(s.pump_client, RedisClient::connect(url));
  for (const std::string& stream : s.streams) {  // the group reads from the start: jobs added before it count
    auto r = s.pull_client->command({"XGROUP", "CREATE", stream, kGroup, "0", "MKSTREAM"});
    if (!r && r.status().message().find("BUSYGROUP") == std::string::npos) return r.status();
  }

  declare_serve_metrics(s.metrics);
  for (const Device& d : devices)
    if (!d.is_cpu()) s.nvml = Nvml::open();
  s.host_pool = std::make_unique<ThreadPool>(o.host_threads);
  s.slots = int(devices.size()) * o.max_batch;
  s.scheduler = std::make_unique<Scheduler>(SchedulerOptions{}, std::make_unique<LocalWorkQueue>(size_t(s.slots) * kLocalQueueFactor),
                                            s.pool, s.store, s.metrics);
  s.pool.add_workers(devices, worker_options_of(o), s.registry, s.metrics, *s.host_pool, s.scheduler->hooks());
  return std::unique_ptr<RedisWorkerNode>(new RedisWorkerNode(std::move(impl)));
}

RedisWorkerNode::RedisWorkerNode(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RedisWorkerNode::~RedisWorkerNode() { stop(); }
const std::string& RedisWorkerNode::name() const { return impl_->o.name; }

Status RedisWorkerNode::start() {
  Impl& s = *impl_;
  s.pool.start();
  s.scheduler->start();
  s.heartbeat();
  s.puller = std::thread([&s] { s.pull_loop(); });
  s.pump = std::thread([&s] { s.pump_loop(); });
  return Status::ok();
}

void RedisWorkerNode::stop() {
  Impl& s = *impl_;
  if (s.stopping.exchange(true)) return;
  if (s.puller.joinable()) s.puller.join();
  if (s.pump.joinable()) s.pump.join();  // from here nothing is published: held jobs stay pending in Redis
  s.scheduler->stop();
  s.pool.stop("the worker is shutting down");
  s.host_pool.reset();
  (void)s.pull_client->command({"HDEL", kWorkersKey, s.o.name});
}

// ---------------------------------------------------------------------------------------------------------
// Puller

void RedisWorkerNode::Impl::pull_loop() {
  auto last_reclaim = Clock::now() - std::chrono::hours(1);
  const auto reclaim_every = std::chrono::milliseconds(std::max(50, o.visibility_timeout_ms / 4));
  while (!stopping.load()) {
    const int room = slots - int(held());
    if (room <= 0) {
      std::this_thread::sleep_for(kPumpPeriod);
      continue;
    }
    if (Clock::now() - last_reclaim >= reclaim_every) {
      last_reclaim = Clock::now();
      reclaim(room);
      continue;
    }
    std::vector<std::string> argv = {"XREADGROUP", "GROUP", kGroup, o.name, "COUNT", std::to_string(room),
                                     "BLOCK", std::to_string(kReadBlockMs), "STREAMS"};
    argv.insert(argv.end(), streams.begin(), streams.end());
    for (size_t i = 0; i < streams.size(); ++i) argv.push_back(">");
    auto r = pull_client->command(argv);
    if (!r) {
      std::fprintf(stderr, "worker %s: %s\n", o.name.c_str(), r.status().message().c_str());
      if (r.status().message().find("NOGROUP") != std::string::npos)  // Redis lost its data: recreate
        for (const std::string& st : streams) (void)pull_client->command({"XGROUP", "CREATE", st, kGroup, "0", "MKSTREAM"});
      std::this_thread::sleep_for(kRetryPause);
      continue;
    }
    for (const RedisReply& stream : r->elements)
      for (const RedisReply& entry : stream.at(1).elements) handle(stream.at(0).str, entry, false);
  }
}

void RedisWorkerNode::Impl::reclaim(int room) {
  for (const std::string& stream : streams) {
    auto r = pull_client->command({"XAUTOCLAIM", stream, kGroup, o.name, std::to_string(o.visibility_timeout_ms),
                                   "0-0", "COUNT", std::to_string(room)});
    if (!r) continue;
    for (const RedisReply& entry : r->at(1).elements) {
      if (entry.at(1).is_nil()) continue;  // deleted while pending (cancelled): XAUTOCLAIM dropped it
      // Our own entries come back too when a job of ours outlived the timeout between refreshes.
      {
        std::lock_guard<std::mutex> lock(mu_);
        bool ours = false;
        for (const auto& [id, f] : inflight) ours |= f.entry == entry.at(0).str;
        if (ours) continue;
      }
      handle(stream, entry, true);
    }
  }
}

void RedisWorkerNode::Impl::ack(RedisClient& c, const std::string& stream, const std::string& entry) {
  (void)c.command({"XACK", stream, kGroup, entry});
  (void)c.command({"XDEL", stream, entry});
}

void RedisWorkerNode::Impl::dead_letter(const std::string& stream, const std::string& entry, const RedisReply& fields,
                                        const std::string& error) {
  std::fprintf(stderr, "worker %s: moved entry %s of %s aside: %s\n", o.name.c_str(), entry.c_str(), stream.c_str(), error.c_str());
  (void)pull_client->command({"XADD", kDeadKey, "*", "stream", stream, "entry", entry, "error", error, "fields",
                              fields_json(fields).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                              "worker", o.name});
  (void)pull_client->command({"HINCRBY", kStatsKey, "dead_letters", "1"});
  ack(*pull_client, stream, entry);
}

void RedisWorkerNode::Impl::handle(const std::string& stream, const RedisReply& e, bool reclaimed) {
  const std::string entry = e.at(0).str;
  const RedisReply& fields = e.at(1);
  const std::string id = hash_field(fields, "id");
  if (!valid_job_id(id)) return dead_letter(stream, entry, fields, "the entry has no valid 'id' field");
  auto claim = pull_client->eval(scripts::kClaim, {job_key(id)}, {o.name, entry});
  if (!claim) {  // Redis trouble: the entry stays pending and is reclaimed after the visibility timeout
    std::fprintf(stderr, "worker %s: claim of %s failed: %s\n", o.name.c_str(), id.c_str(), claim.status().message().c_str());
    return;
  }
  const std::string outcome = claim->at(0).str;
  if (outcome == "missing") return dead_letter(stream, entry, fields, "no job hash " + job_key(id));
  if (outcome != "claimed") return ack(*pull_client, stream, entry);  // already finished: a duplicate
  if (reclaimed) (void)pull_client->command({"HINCRBY", kStatsKey, "reclaimed", "1"});
  InFlight f;
  f.stream = stream;
  f.entry = entry;
  f.epoch = claim->at(1).text();
  if (claim->at(1).as_int() > kMaxClaims) {  // every worker that took it died: do not let it kill more
    ServeRequest unused;
    f.job = std::make_shared<Job>(id, std::move(unused), 0);
    f.job->fail(internal_error("gave up after " + std::to_string(kMaxClaims) +
                               " attempts: every worker that ran the job died or lost it"));
    (void)finish(*pull_client, f);
    return;
  }
  auto request = decode_request(claim->at(2).str);
  Status bad = request.status();
  if (request && !registry.find(request->model)) bad = invalid_argument("this worker does not serve model '" + request->model + "'");
  if (!bad.is_ok()) {  // we hold the job: it fails with the error, and the message is moved aside
    ServeRequest unreadable;  // the job's own request could not be read: an empty one stands in
    f.job = std::make_shared<Job>(id, std::move(unreadable), 0);
    f.job->fail(bad);
    (void)finish(*pull_client, f);
    return dead_letter(stream, entry, fields, bad.message());
  }
  const double timeout_s = request->timeout_s;
  f.job = std::make_shared<Job>(id, std::move(*request), timeout_s);
  if (!claim->at(3).str.empty()) f.job->request_cancel(claim->at(3).str);
  {
    std::lock_guard<std::mutex> lock(mu_);
    inflight[id] = f;
  }
  store.add(f.job);
  if (Status st = scheduler->submit(f.job); !st.is_ok()) f.job->fail(st);
}

// ---------------------------------------------------------------------------------------------------------
// Pump

void RedisWorkerNode::Impl::pump_loop() {
  auto last_beat = Clock::now();
  while (!stopping.load()) {
    std::vector<std::string> ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, f] : inflight) ids.push_back(id);
    }
    for (const std::string& id : ids) {
      InFlight f;
      {
        std::lock_guard<std::mutex> lock(mu_);
        f = inflight.at(id);
      }
      bool finished = false;
      pump_job(f, &finished);
      std::lock_guard<std::mutex> lock(mu_);
      if (finished) {
        inflight.erase(id);
        store.erase(id);
      } else {
        inflight[id] = f;
      }
    }
    if (Clock::now() - last_beat >= std::chrono::milliseconds(o.heartbeat_ms)) {
      last_beat = Clock::now();
      heartbeat();
    }
    std::this_thread::sleep_for(kPumpPeriod);
  }
}

void RedisWorkerNode::Impl::pump_job(InFlight& f, bool* finished) {
  RedisClient& c = *pump_client;
  const std::string id = f.job->id();
  if (f.terminal_pending) {
    *finished = finish(c, f) != FinishResult::kRetry;
    return;
  }
  bool terminal = false;
  for (const JobEvent& e : f.job->events_after(f.cursor, std::chrono::milliseconds(0), &terminal)) {
    f.cursor = e.seq;
    if (e.type == "queued") continue;  // the gateway's business
    if (e.type == "done" || e.type == "failed" || e.type == "cancelled") {
      f.terminal_pending = true;
      *finished = finish(c, f) != FinishResult::kRetry;
      return;
    }
    nlohmann::json data = e.data;
    std::vector<std::string> args = {o.name, f.epoch, e.type, "", std::to_string(kMaxEventsKept)};
    if (e.type == "started") {
      data["device"] = o.name + "/" + data.value("device", std::string("?"));
      args.insert(args.end(), {"device", data["device"].get<std::string>()});
    } else if (e.type == "step") {
      args.insert(args.end(), {"step", std::to_string(data.value("step", 0)), "total_steps", std::to_string(data.value("total_steps", 0))});
    }
    args[3] = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    auto r = c.eval(scripts::kPublish, {job_key(id), events_key(id)}, args);
    if (r && r->as_int() == 0) f.job->request_cancel("the job was taken over by another worker");
  }
  const auto now = Clock::now();
  if (now - f.last_cancel_check >= kCancelCheckPeriod) {
    f.last_cancel_check = now;
    auto r = c.command({"HGET", job_key(id), "cancel"});
    if (r && !r->is_nil() && !r->str.empty()) scheduler->cancel(f.job, r->str);
  }
  if (now - f.last_refresh >= std::chrono::milliseconds(o.visibility_timeout_ms / 3)) {
    f.last_refresh = now;  // resets the entry's idle time: a live job is never reclaimed
    (void)c.command({"XCLAIM", f.stream, kGroup, o.name, "0", f.entry, "JUSTID"});
  }
}

FinishResult RedisWorkerNode::Impl::finish(RedisClient& c, InFlight& f) {
  const Job& job = *f.job;
  const std::string id = job.id();
  const JobState state = job.state();
  const std::string ttl = std::to_string(int64_t(o.result_ttl_s));
  std::vector<std::string> fields = {"finished_ms", std::to_string(now_ms())};
  nlohmann::json data = {{"state", job_state_name(state)}};
  if (state == JobState::kDone) {
    nlohmann::json meta = nlohmann::json::array();
    nlohmann::json seeds = nlohmann::json::array();
    const auto images = job.images();
    for (size_t i = 0; i < images.size(); ++i) {
      const JobImage& im = images[i];
      nlohmann::json m = {{"seed", im.seed}, {"width", im.width}, {"height", im.height}, {"format", im.format},
                          {"infotext", im.infotext}};
      if (!im.path.empty()) m["path"] = im.path;
      auto bytes = base64_decode(im.data_b64, "image", size_t(1) << 31);
      if (!bytes) return FinishResult::kLost;  // cannot happen: we encoded it
      if (im.path.empty() || bytes->size() <= o.max_inline_kb * 1024) {
        const std::string key = result_key(id, std::stoll(f.epoch), i);
        if (!c.command({"SET", key, *bytes, "EX", ttl})) return FinishResult::kRetry;
        m["key"] = key;
      }
      meta.push_back(m);
      seeds.push_back(im.seed);
    }
    fields.insert(fields.end(), {"result", meta.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)});
    data["images"] = images.size();
    data["seeds"] = seeds;
  } else {
    const Status err = job.error();
    fields.insert(fields.end(), {"error", err.message()});
    if (state == JobState::kCancelled) data["reason"] = err.message();
    else data["error"] = err.message();
    if (state == JobState::kFailed && err.code() == ErrorCode::kCancelled) data["timed_out"] = true;
  }
  std::vector<std::string> args = {o.name, f.epoch, job_state_name(state),
                                   data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), ttl,
                                   kGroup, f.entry};
  args.insert(args.end(), fields.begin(), fields.end());
  auto r = c.eval(scripts::kFinish, {job_key(id), events_key(id), f.stream}, args);
  if (!r) {
    std::fprintf(stderr, "worker %s: storing the outcome of %s failed: %s\n", o.name.c_str(), id.c_str(), r.status().message().c_str());
    return FinishResult::kRetry;
  }
  if (r->as_int() == 0) return FinishResult::kLost;  // another worker holds the job now: the entry is theirs
  ++jobs_done;  // the script acknowledged and deleted the stream entry with the outcome
  return FinishResult::kStored;
}

void RedisWorkerNode::Impl::heartbeat() {
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& w : pool.workers()) {
    nlohmann::json d = {{"device", w->label()}, {"healthy", w->healthy()}, {"load", w->load()}};
    if (nvml && !w->device().is_cpu())
      if (auto r = nvml->read(w->device().index)) {
        d["gpu_memory_used"] = r->memory_used;
        d["gpu_memory_total"] = r->memory_total;
        d["gpu_utilization"] = r->utilization;
      }
    devices.push_back(d);
  }
  nlohmann::json models = nlohmann::json::array();
  for (const std::string& s : streams) models.push_back(s.substr(std::string("atelier:jobs:").size()));
  const nlohmann::json beat = {{"name", o.name}, {"ts_ms", now_ms()}, {"devices", devices}, {"models", models},
                               {"slots", slots}, {"held", held()}, {"jobs_done", jobs_done}};
  (void)pump_client->command({"HSET", kWorkersKey, o.name, beat.dump()});
}

}  // namespace atelier::serve::redis
