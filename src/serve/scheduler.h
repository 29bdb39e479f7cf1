// The scheduler: the queue in front of the device pool. Accepts jobs (429 when the queue is full), hands
// them out in FIFO order to the worker the pool picks whenever a worker has room, cancels queued jobs at
// once and running ones at their next step boundary, expires jobs past their deadline, and re-queues (at
// the front) the jobs of a worker whose device failed; a job whose device failed kMaxAttempts times fails
// instead, so a request that breaks devices cannot take the whole pool down.
#pragma once
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "serve/device_pool.h"
#include "serve/job_store.h"
#include "serve/metrics.h"
#include "serve/work_queue.h"

namespace atelier::serve {

struct SchedulerOptions {
  int max_attempts = 3;           // starts on a device before a job whose devices keep failing fails
  int housekeeping_ms = 100;      // deadline checks, job store sweeps
};

class Scheduler {
 public:
  Scheduler(SchedulerOptions options, std::unique_ptr<WorkQueue> queue, DevicePool& pool, JobStore& store,
            MetricsRegistry& metrics);
  ~Scheduler();

  void start();
  void stop();

  // Accepts a job (state queued); kResourceExhausted when the queue is full.
  Status submit(const JobPtr& job);
  // Cancels a job: a queued one at once, a running one at its next step boundary. False when finished.
  bool cancel(const JobPtr& job, const std::string& reason);
  int queue_position(const std::string& id) const { return queue_->position(id); }
  size_t queue_depth() const { return queue_->depth(); }
  size_t queue_capacity() const { return queue_->capacity(); }

  // Worker hooks.
  void dispatch();
  void requeue(int worker, std::vector<JobPtr> jobs, const Status& why);

  WorkerHooks hooks();

 private:
  void housekeeping();

  const SchedulerOptions options_;
  std::unique_ptr<WorkQueue> queue_;
  DevicePool& pool_;
  JobStore& store_;
  MetricsRegistry& metrics_;

  std::mutex dispatch_mu_;  // one dispatcher at a time; also orders pop against push_front
  std::mutex hk_mu_;
  std::condition_variable hk_cv_;
  bool stopping_ = false;
  std::thread hk_thread_;
};

}  // namespace atelier::serve
