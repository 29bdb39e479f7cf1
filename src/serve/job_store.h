// Every job the server knows by id: unfinished ones, and finished ones kept for polling until they expire
// (older than the retention time, or beyond the retained count or result bytes, oldest first), so memory
// stays bounded however many requests pass through.
#pragma once
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "serve/job.h"

namespace atelier::serve {

class JobStore {
 public:
  JobStore(size_t max_finished, double retention_s, size_t max_result_bytes)
      : max_finished_(max_finished), retention_s_(retention_s), max_result_bytes_(max_result_bytes) {}

  std::string new_id();  // 32 random hex digits
  void add(JobPtr job);
  JobPtr get(const std::string& id) const;  // nullptr when unknown or expired (after asking the loader)
  JobPtr peek(const std::string& id) const;  // without the loader
  // Asked for jobs this store does not hold (Redis mode: jobs of other gateways, or from before a restart);
  // it adds what it finds. Set before the server starts.
  void set_loader(std::function<JobPtr(const std::string&)> loader) { loader_ = std::move(loader); }
  void erase(const std::string& id);
  std::vector<JobPtr> unfinished() const;
  // Drops expired finished jobs; called by the scheduler's housekeeping and on every add.
  void sweep();
  size_t size() const;

 private:
  void sweep_locked();

  const size_t max_finished_;
  const double retention_s_;
  const size_t max_result_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, JobPtr> jobs_;
  std::deque<std::string> order_;  // ids in submission order, for sweeping
  std::mt19937_64 rng_{std::random_device{}()};
  std::function<JobPtr(const std::string&)> loader_;
};

}  // namespace atelier::serve
