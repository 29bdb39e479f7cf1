// Queue marks on cuda:0 (Backend::mark_queue / wait_for_mark, what the denoise loop's one-call run-ahead waits
// on): the wait returns once the work enqueued before the mark is done, while work enqueued after it may still
// run; a mark older than the ring of events is waited for by draining the stream. The kernels' device spans
// come from the kernel tracer (CUPTI). Skips with the reason without a GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/kernel_tracer.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::cuda0;
using test::random_tensor;
using test::to_gpu;

constexpr int kProducts = 8;         // f32 2048^3 products: ~0.3 ms each, so the work after a mark outlasts the wait
constexpr int64_t kClockSlackNs = 20'000;  // CUPTI's device times are interpolated onto the host clock

// kProducts chained products of `a` (values stay bounded: a is scaled by 1/sqrt(n)).
Tensor chain(const Tensor& a) {
  Tensor y = a;
  for (int i = 0; i < kProducts; ++i) y = ops::matmul(y, a);
  return y;
}

TEST(CudaQueueMarks, WaitReturnsWhenTheWorkBeforeTheMarkIsDone) {
  ATELIER_REQUIRE_CUDA();
  Backend& be = backend_for(cuda0());
  const Tensor a = to_gpu(random_tensor({2048, 2048}, 5, 1.0f / 45.0f));
  (void)chain(a);  // plans and workspaces made before the timed part
  be.synchronize();
  auto tracer = open_kernel_tracer();
  ASSERT_TRUE(tracer.has_value()) << tracer.status().message();
  (void)chain(a);
  const uint64_t mark = be.mark_queue();
  (void)chain(a);
  be.wait_for_mark(mark);
  const int64_t waited = trace::now_ns();
  be.synchronize();
  auto kernels = (*tracer)->collect();
  ASSERT_TRUE(kernels.has_value()) << kernels.status().message();
  ASSERT_EQ(kernels->size() % 2, 0u) << "the two chains run the same kernels";
  const size_t half = kernels->size() / 2;
  ASSERT_GE(half, size_t(kProducts));
  for (size_t i = 0; i < half; ++i) {
    const trace::Event& k = (*kernels)[i];
    EXPECT_LE(k.start_ns + k.dur_ns, waited + kClockSlackNs) << "kernel " << i << " (" << k.name << ") before the mark ran on";
  }
  const trace::Event& last = kernels->back();
  EXPECT_GT(last.start_ns + last.dur_ns, waited) << "the wait drained the work after the mark too";
}

TEST(CudaQueueMarks, AMarkOlderThanTheRingIsWaitedForByDrainingTheStream) {
  ATELIER_REQUIRE_CUDA();
  Backend& be = backend_for(cuda0());
  const Tensor a = to_gpu(random_tensor({2048, 2048}, 6, 1.0f / 45.0f));
  (void)chain(a);
  be.synchronize();
  auto tracer = open_kernel_tracer();
  ASSERT_TRUE(tracer.has_value()) << tracer.status().message();
  const uint64_t old = be.mark_queue();
  (void)chain(a);
  for (int i = 0; i < 16; ++i) (void)be.mark_queue();  // the ring's events recorded again since
  be.wait_for_mark(old);
  const int64_t waited = trace::now_ns();
  be.synchronize();
  auto kernels = (*tracer)->collect();
  ASSERT_TRUE(kernels.has_value()) << kernels.status().message();
  ASSERT_FALSE(kernels->empty());
  for (const trace::Event& k : *kernels) EXPECT_LE(k.start_ns + k.dur_ns, waited + kClockSlackNs) << k.name;
  EXPECT_EQ(be.mark_queue() > old, true);
}

}  // namespace
}  // namespace atelier
