#include "serve/work_queue.h"

namespace atelier::serve {

Status LocalWorkQueue::push(JobPtr job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (jobs_.size() >= capacity_)
    return Status(ErrorCode::kResourceExhausted,
                  "the queue is full (" + std::to_string(capacity_) + " jobs waiting); retry later");
  jobs_.push_back(std::move(job));
  return Status::ok();
}

void LocalWorkQueue::push_front(JobPtr job) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_front(std::move(job));
}

JobPtr LocalWorkQueue::front() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.empty() ? nullptr : jobs_.front();
}

JobPtr LocalWorkQueue::pop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (jobs_.empty()) return nullptr;
  JobPtr j = std::move(jobs_.front());
  jobs_.pop_front();
  return j;
}

bool LocalWorkQueue::remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    if ((*it)->id() == id) {
      jobs_.erase(it);
      return true;
    }
  }
  return false;
}

int LocalWorkQueue::position(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < jobs_.size(); ++i)
    if (jobs_[i]->id() == id) return int(i);
  return -1;
}

size_t LocalWorkQueue::depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

}  // namespace atelier::serve
