// TimedChoice with a store of choices kept across processes (cuda_event_timing.h, backend/choice_store.h): the
// first process times its candidates and keeps the answer; a later one (a new TimedChoice on a new store of the same
// file) takes it without running any candidate; a different candidate list is timed afresh. Skips without a GPU.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "backend/choice_store.h"
#include "backend/cuda/cuda_event_timing.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using Key = std::tuple<std::vector<int64_t>, int, bool, std::string>;

constexpr size_t kSlowBytes = size_t(256) << 20;  // a memset that takes ~0.1 ms on any card
constexpr size_t kFastBytes = 256;

TEST(CudaTimedChoice, ALaterProcessTakesTheKeptAnswerWithoutTiming) {
  ATELIER_REQUIRE_CUDA();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, kSlowBytes), cudaSuccess);
  int runs[3] = {0, 0, 0};
  const auto memset_of = [&](int which, size_t bytes) -> std::function<bool()> {
    return [&, which, bytes] {
      ++runs[which];
      return cudaMemsetAsync(buf, which, bytes, stream) == cudaSuccess;
    };
  };
  const std::vector<std::function<bool()>> two = {memset_of(0, kSlowBytes), memset_of(1, kFastBytes)};
  const Key key{{2, 4096, 320}, 7, true, "slow fast"};
  test::TempDir dir;

  ChoiceStore first_store(dir.path.string(), "card; driver; binary");
  cuda::TimedChoice<Key> first;
  first.keep_in(&first_store, "test memset");
  EXPECT_EQ(first.fastest(key, stream, two), 1);
  EXPECT_GT(runs[0], 0);
  EXPECT_GT(runs[1], 0);

  runs[0] = runs[1] = 0;
  ChoiceStore later_store(dir.path.string(), "card; driver; binary");  // what a later process opens
  cuda::TimedChoice<Key> later;
  later.keep_in(&later_store, "test memset");
  EXPECT_EQ(later.fastest(key, stream, two), 1);
  EXPECT_EQ(runs[0] + runs[1], 0) << "a kept answer was timed again";

  // Three candidates are another question: timed, and kept beside the first answer.
  const std::vector<std::function<bool()>> three = {memset_of(0, kSlowBytes), memset_of(1, kSlowBytes / 2),
                                                    memset_of(2, kFastBytes)};
  cuda::TimedChoice<Key> other;
  other.keep_in(&later_store, "test memset");
  EXPECT_EQ(other.fastest(key, stream, three), 2);
  EXPECT_GT(runs[2], 0);
  // Without a store nothing is kept: a new TimedChoice times again.
  runs[0] = runs[1] = 0;
  cuda::TimedChoice<Key> unkept;
  EXPECT_EQ(unkept.fastest(key, stream, two), 1);
  EXPECT_GT(runs[0] + runs[1], 0);

  cudaFree(buf);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace atelier
