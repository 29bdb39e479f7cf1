// The server's image-encoding pool: its default size follows the host's cores, every task submitted before
// destruction runs (the server relies on that to finish queued encodings at shutdown), and a task's OpenMP
// team is the pool's threads divided among the tasks that share them.
#include <gtest/gtest.h>
#include <omp.h>

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

TEST(ThreadPool, TeamSizeDividesThePoolAmongItsTasks) {
  EXPECT_EQ(ThreadPool::team_size(8, 1), 8);
  EXPECT_EQ(ThreadPool::team_size(8, 3), 2);
  EXPECT_EQ(ThreadPool::team_size(8, 9), 1);
  EXPECT_EQ(ThreadPool::team_size(8, 0), 8);
}

// A lone task's OpenMP regions may use the whole pool's share of cores; the fourth of four tasks running at
// once gets one thread.
TEST(ThreadPool, ALoneTaskGetsThePoolsThreadsForOpenMP) {
  constexpr int kThreads = 4;
  ThreadPool pool(kThreads);
  std::atomic<int> lone{0};
  pool.submit([&] { lone = omp_get_max_threads(); });
  for (int i = 0; i < 500 && lone.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(lone.load(), kThreads);

  std::atomic<int> started{0}, last_team{0};
  for (int i = 0; i < kThreads; ++i)
    pool.submit([&] {
      const int order = ++started;
      if (order == kThreads) last_team = omp_get_max_threads();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (started.load() < kThreads && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    });
  for (int i = 0; i < 2500 && last_team.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(last_team.load(), 1);
}

}  // namespace
}  // namespace atelier::serve
