#include "serve/scheduler.h"

namespace atelier::serve {

Scheduler::Scheduler(SchedulerOptions options, std::unique_ptr<WorkQueue> queue, DevicePool& pool, JobStore& store,
                     MetricsRegistry& metrics)
    : options_(options), queue_(std::move(queue)), pool_(pool), store_(store), metrics_(metrics) {}

Scheduler::~Scheduler() { stop(); }

WorkerHooks Scheduler::hooks() {
  WorkerHooks h;
  h.capacity_freed = [this] { dispatch(); };
  h.device_failed = [this](int worker, std::vector<JobPtr> jobs, const Status& why) { requeue(worker, std::move(jobs), why); };
  return h;
}

void Scheduler::start() {
  hk_thread_ = std::thread([this] { housekeeping(); });
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(hk_mu_);
    stopping_ = true;
  }
  hk_cv_.notify_all();
  if (hk_thread_.joinable()) hk_thread_.join();
  // Jobs still waiting will not run.
  while (JobPtr j = queue_->pop()) j->fail(internal_error("the server is shutting down"));
}

Status Scheduler::submit(const JobPtr& job) {
  Status st = queue_->push(job);
  if (!st.is_ok()) {
    metrics_.inc(metric::kJobs, {{"state", "rejected"}});
    return st;
  }
  metrics_.inc(metric::kJobs, {{"state", "submitted"}});
  job->mark_queued();
  dispatch();
  return Status::ok();
}

bool Scheduler::cancel(const JobPtr& job, const std::string& reason) {
  if (job->finished()) return false;
  job->request_cancel(reason);
  if (queue_->remove(job->id())) {
    job->cancel(reason);
  }
  // Otherwise it is on a worker (inbox or running), which drops it at the next step boundary.
  return true;
}

void Scheduler::dispatch() {
  std::lock_guard<std::mutex> lock(dispatch_mu_);
  for (;;) {
    const JobPtr head = queue_->front();
    if (!head) return;
    if (head->finished() || head->cancel_requested()) {  // cancelled or expired while waiting (or re-queued)
      queue_->remove(head->id());
      head->cancel(head->cancel_reason());
      continue;
    }
    Worker* w = pool_.pick();
    if (!w) return;  // every worker is full or unhealthy: the job keeps its place at the front
    if (!queue_->remove(head->id())) continue;  // taken out concurrently (cancel): look again
    w->assign(head);
  }
}

void Scheduler::requeue(int worker, std::vector<JobPtr> jobs, const Status& why) {
  {
    std::lock_guard<std::mutex> lock(dispatch_mu_);
    // Back to the front in reverse, so they keep their order ahead of everything that came later.
    for (auto it = jobs.rbegin(); it != jobs.rend(); ++it) {
      const JobPtr& j = *it;
      if (j->finished()) continue;
      if (j->attempts() >= options_.max_attempts) {
        j->fail(internal_error("gave up after " + std::to_string(j->attempts()) + " device failures; last: " + why.message()));
        continue;
      }
      j->mark_requeued(why.message());
      queue_->push_front(j);
      metrics_.inc(metric::kRequeued);
    }
  }
  dispatch();
}

void Scheduler::housekeeping() {
  std::unique_lock<std::mutex> lock(hk_mu_);
  while (!stopping_) {
    hk_cv_.wait_for(lock, std::chrono::milliseconds(options_.housekeeping_ms), [&] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    const auto now = Clock::now();
    for (const JobPtr& j : store_.unfinished()) {
      if (now <= j->deadline() || j->state() != JobState::kQueued) continue;  // running jobs: their worker checks
      if (queue_->remove(j->id()))
        j->fail(Status(ErrorCode::kCancelled, "timed out after " + std::to_string(int(j->age_s())) + " s in the queue"));
    }
    store_.sweep();
    dispatch();  // a worker that came back from a probe, or capacity freed without a hook
    lock.lock();
  }
}

}  // namespace atelier::serve
