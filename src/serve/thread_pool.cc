#include "serve/thread_pool.h"

#include <omp.h>

#include <algorithm>

namespace atelier::serve {

namespace {
constexpr int kMinDefaultThreads = 2;
constexpr int kMaxDefaultThreads = 16;
}  // namespace

int ThreadPool::default_size() {
  const int cores = int(std::thread::hardware_concurrency());
  return std::clamp(cores / 2, kMinDefaultThreads, kMaxDefaultThreads);
}

ThreadPool::ThreadPool(int threads) {
  const int n = threads > 0 ? threads : default_size();
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

size_t ThreadPool::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.size();
}

void ThreadPool::run() {
  for (;;) {
    std::function<void()> task;
    int team = 1;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
      team = team_size(int(threads_.size()), running_ + int(tasks_.size()));
    }
    // Each task is one image's work, whose PNG encoding runs OpenMP regions (io/png_deflate.h). The pool's
    // threads share the pool's cores: a lone image is encoded by all of them (a 512² PNG in 8 ms instead of
    // 31-36 on one thread, 16-core host, docs/performance.md "Session 63"), a burst gives each image one
    // thread, so the teams never take the cores the device workers need to keep their GPUs fed. Tasks still
    // queued count as sharers: the first of a burst takes one thread.
    omp_set_num_threads(team);
    task();  // tasks catch their own errors (they report into a job)
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
  }
}

int ThreadPool::team_size(int pool_threads, int sharers) { return std::max(1, pool_threads / std::max(1, sharers)); }

}  // namespace atelier::serve
