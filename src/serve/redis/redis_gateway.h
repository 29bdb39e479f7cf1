// The gateway side of the Redis queue (`atelier serve --queue redis://...`): accepted jobs go to a Redis
// stream instead of the in-process queue, and every job the HTTP layer shows is a *mirror*: a local Job
// driven by the job's event stream in Redis (started, step, preview, requeued, done | failed | cancelled),
// so the routes, the event streams and the synchronous APIs work unchanged. A job this gateway does not
// hold (another replica accepted it, or this process restarted) is loaded from Redis on first access and
// its events replayed, so any replica answers for any job.
//
//   RedisWorkQueue (the WorkQueue of the scheduler): push = XADD, remove = cancel through Redis
//   follower thread: XREAD over the event streams of unfinished mirrors -> Job transitions
//   collect(): cluster gauges (workers and their devices, queue depth per model, pending, reclaimed)
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "serve/job.h"
#include "serve/metrics.h"
#include "serve/redis/redis_client.h"
#include "serve/work_queue.h"

namespace atelier::serve::redis {

struct RedisGatewayOptions {
  std::string url;                 // redis://HOST:PORT[/DB]
  size_t capacity = 64;            // entries a model's stream may hold before 429
  double result_ttl_s = 86400;     // how long finished jobs and their results stay in Redis
  double worker_stale_s = 5;       // a worker whose heartbeat is older is not counted
};

// Names of the cluster gauges (declared by declare_cluster_metrics).
namespace metric {
inline constexpr const char* kWorkers = "atelier_cluster_workers";
inline constexpr const char* kWorkerDevices = "atelier_cluster_device_healthy";          // {worker, device}
inline constexpr const char* kWorkerActive = "atelier_cluster_device_active_samples";   // {worker, device}
inline constexpr const char* kWorkerGpuMem = "atelier_cluster_gpu_memory_used_bytes";   // {worker, device}
inline constexpr const char* kWorkerGpuUtil = "atelier_cluster_gpu_utilization_ratio";  // {worker, device}
inline constexpr const char* kQueueDepth = "atelier_cluster_queue_depth";              // {model}
inline constexpr const char* kPending = "atelier_cluster_pending";                     // {model}
inline constexpr const char* kReclaimed = "atelier_cluster_reclaimed_jobs";
inline constexpr const char* kDeadLetters = "atelier_cluster_dead_letters";
}  // namespace metric
void declare_cluster_metrics(MetricsRegistry& m);

class RedisGateway {
 public:
  // Connects (the error says where and why); `hook` counts the outcomes of mirrored jobs.
  static Expected<std::unique_ptr<RedisGateway>> create(const RedisGatewayOptions& options, TerminalHook hook);
  ~RedisGateway();

  // The scheduler's queue; it refers to this gateway, which must outlive it.
  std::unique_ptr<WorkQueue> make_queue();
  // A job by id from Redis (a mirror with its events replayed, now followed); nullptr when Redis has none.
  JobPtr load(const std::string& id);
  void collect(MetricsRegistry& m);
  int live_workers();

  void start();
  void stop();

 private:
  friend class RedisWorkQueue;
  explicit RedisGateway(RedisGatewayOptions options, std::unique_ptr<RedisClient> cmd,
                        std::unique_ptr<RedisClient> follow, TerminalHook hook);
  struct Mirror {
    JobPtr job;
    std::string last_event = "0-0";
  };
  void follow(const JobPtr& job, const std::string& after);
  JobPtr mirror(const std::string& id);
  void follow_loop();
  // Applies one event from Redis to a mirror. `client` is the caller's connection (results are read).
  void apply(RedisClient& client, Job& job, const std::string& type, const std::string& data);

  const RedisGatewayOptions options_;
  LockedRedis cmd_;                        // HTTP threads, the scheduler, metrics
  std::unique_ptr<RedisClient> follow_;    // the follower thread's own connection
  const TerminalHook hook_;
  std::mutex mu_;
  std::map<std::string, Mirror> mirrors_;  // unfinished mirrors, by job id
  std::mutex load_mu_;
  std::atomic<bool> stopping_{false};
  std::thread follower_;
};

// The job's result images read back from Redis (binary keys) or the shared --output-dir path.
Expected<std::vector<JobImage>> read_results(RedisClient& client, const std::string& result_json);

}  // namespace atelier::serve::redis
