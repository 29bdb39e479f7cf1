#include "serve/server_context.h"

#include <cmath>

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

int ServerContext::retry_after_s() const {
  return std::max(1, int(std::ceil(metrics.mean(metric::kLatency))));
}

}  // namespace atelier::serve
