#include "serve/job_store.h"

#include <cstdio>

namespace atelier::serve {

std::string JobStore::new_id() {
  std::lock_guard<std::mutex> lock(mu_);
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng_()),
                static_cast<unsigned long long>(rng_()));
  return buf;
}

void JobStore::add(JobPtr job) {
  std::lock_guard<std::mutex> lock(mu_);
  order_.push_back(job->id());
  jobs_[job->id()] = std::move(job);
  sweep_locked();
}

JobPtr JobStore::get(const std::string& id) const {
  if (JobPtr j = peek(id)) return j;
  return loader_ ? loader_(id) : nullptr;
}

JobPtr JobStore::peek(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

void JobStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.erase(id);  // its entry in order_ is skipped when swept
}

std::vector<JobPtr> JobStore::unfinished() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<JobPtr> out;
  for (const std::string& id : order_) {
    auto it = jobs_.find(id);
    if (it != jobs_.end() && !it->second->finished()) out.push_back(it->second);
  }
  return out;
}

void JobStore::sweep() {
  std::lock_guard<std::mutex> lock(mu_);
  sweep_locked();
}

void JobStore::sweep_locked() {
  size_t finished = 0, bytes = 0;
  for (const auto& [id, job] : jobs_) {
    finished += job->finished();
    bytes += job->result_bytes();
  }
  std::deque<std::string> kept;
  for (const std::string& id : order_) {  // oldest first
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    const auto age = it->second->finished_age_s();
    if (age && (finished > max_finished_ || bytes > max_result_bytes_ || *age > retention_s_)) {
      bytes -= it->second->result_bytes();
      jobs_.erase(it);
      --finished;
      continue;
    }
    kept.push_back(id);
  }
  order_.swap(kept);
}

size_t JobStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

}  // namespace atelier::serve
