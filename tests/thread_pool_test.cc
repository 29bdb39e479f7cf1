// The server's image-encoding pool: its default size follows the host's cores, and every task submitted
// before destruction runs (the server relies on that to finish queued encodings at shutdown).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "serve/thread_pool.h"

namespace atelier::serve {
namespace {

TEST(ThreadPool, DefaultSizeIsHalfTheCoresWithinBounds) {
  const int cores = int(std::thread::hardware_concurrency());
  const int expected = std::clamp(cores / 2, 2, 16);
  EXPECT_EQ(ThreadPool::default_size(), expected);
  ThreadPool by_default(0);
  EXPECT_EQ(by_default.size(), size_t(expected));
  ThreadPool three(3);
  EXPECT_EQ(three.size(), 3u);
}

TEST(ThreadPool, RunsTasksConcurrentlyAndFinishesQueuedOnes) {
  constexpr int kTasks = 12;
  std::atomic<int> done{0};
  std::mutex mu;
  std::set<std::thread::id> ids;
  {
    ThreadPool pool(4);
    for (int i = 0; i < kTasks; ++i)
      pool.submit([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
        ++done;
      });
  }  // the destructor waits for every queued task
  EXPECT_EQ(done.load(), kTasks);
  EXPECT_GT(ids.size(), 1u) << "tasks ran on one thread only";
}

}  // namespace
}  // namespace atelier::serve
