#include "serve/server_context.h"

#include <algorithm>
#include <cmath>

#include "serve/http_util.h"

namespace atelier::serve {

TerminalHook terminal_hook(MetricsRegistry& m) {
  return [&m](JobState state, const Status& error, size_t images, double age_s) {
    if (state == JobState::kDone) {
      m.inc(metric::kJobs, {{"state", "done"}});
      m.inc(metric::kImages, {}, double(images));
      m.observe(metric::kLatency, {}, age_s);
    } else if (state == JobState::kCancelled) {
      m.inc(metric::kJobs, {{"state", "cancelled"}});
    } else {  // failed: a timeout is a failure with kCancelled
      m.inc(metric::kJobs, {{"state", error.code() == ErrorCode::kCancelled ? "timed_out" : "failed"}});
    }
  };
}

Expected<JobPtr> ServerContext::submit(ServeRequest r) {
  if (stopping.load()) return Status(ErrorCode::kResourceExhausted, "the server is shutting down");
  if (r.model.empty()) r.model = registry.default_model()->name;
  const ModelEntry* entry = registry.find(r.model);
  if (!entry) return invalid_argument("model: unknown model '" + r.model + "'; available: " + registry.names());
  r.model = entry->name;
  ATELIER_RETURN_IF_ERROR(validate_request(r, options.limits));
  ATELIER_RETURN_IF_ERROR(validate_for_model(r, entry->family));
  const double timeout = r.timeout_s > 0 ? r.timeout_s : options.default_timeout_s;
  auto job = std::make_shared<Job>(store.new_id(), std::move(r), timeout, terminal_hook(metrics));
  store.add(job);
  if (Status st = scheduler.submit(job); !st.is_ok()) {
    store.erase(job->id());
    return st;
  }
  return job;
}

bool ServerContext::wait(const JobPtr& job) const {
  while (!job->wait_finished(std::chrono::milliseconds(250))) {
    if (stopping.load()) return job->finished();
  }
  return true;
}

std::shared_ptr<void> HeldConnections::try_hold() {
  if (held_.fetch_add(1) >= capacity_) {
    held_.fetch_sub(1);
    return nullptr;
  }
  return std::shared_ptr<void>(this, [](void* self) { static_cast<HeldConnections*>(self)->held_.fetch_sub(1); });  // non-null: a handle tests true
}

int held_connection_slots(int http_threads) { return http_threads - std::max(2, http_threads / 8); }

std::shared_ptr<void> ServerContext::hold_connection(httplib::Response& res) {
  std::shared_ptr<void> slot = held.try_hold();
  if (!slot)
    send_error(res, 503,
               "too many connections waiting on jobs (" + std::to_string(held.capacity()) +
                   " event streams and synchronous calls are open): retry later, or submit with POST /v1/jobs and poll "
                   "GET /v1/jobs/{id}",
               retry_after_s());
  return slot;
}

int ServerContext::retry_after_s() const {
  return std::max(1, int(std::ceil(metrics.mean(metric::kLatency))));
}

}  // namespace atelier::serve
