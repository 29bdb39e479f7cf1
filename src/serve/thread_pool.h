// A fixed pool of host threads for work that must not hold up a device worker: PNG/JPEG encoding, previews.
// Tasks run in submission order on whichever thread is free; the destructor finishes queued tasks. A task's
// OpenMP regions get the pool's threads divided among the tasks running with it (team_size).
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace atelier::serve {

class ThreadPool {
 public:
  // threads <= 0: default_size().
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void submit(std::function<void()> task);
  size_t pending() const;
  size_t size() const { return threads_.size(); }

  // Half the host's cores, 2 to 16: when a batch finishes, each of its images is encoded at once (a 512x512
  // PNG takes 15-45 ms); two threads left a two-GPU server idle for half a second at the end of every burst.
  static int default_size();
  // OpenMP threads a task may use while `sharers` tasks (itself, the others running, the queued) share a pool
  // of `pool_threads`.
  static int team_size(int pool_threads, int sharers);

 private:
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  int running_ = 0;  // tasks started and not yet finished
  std::vector<std::thread> threads_;
};

}  // namespace atelier::serve
