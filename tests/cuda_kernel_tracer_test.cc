// The kernel tracer on cuda:0 (backend/kernel_tracer.h, CUPTI): eager kernels and the kernels of a replayed
// CUDA graph come back with their names, streams, graphs and device spans on the host clock, inside the host
// ranges that launched them; two tracers open at once each see their own window; `bench --kernels` reports
// per-call figures from them. Skips with the reason without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/graph_runner.h"
#include "backend/kernel_tracer.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "pipeline/dit_bench.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::cuda0;
using test::random_tensor;
using test::to_gpu;

std::unique_ptr<KernelTracer> open_or_fail() {
  auto t = open_kernel_tracer();
  EXPECT_TRUE(t.has_value()) << t.status().message();
  return t.has_value() ? std::move(*t) : nullptr;
}

TEST(CudaKernelTracer, SeesEagerKernelsAndTheKernelsOfAReplayedGraph) {
  ATELIER_REQUIRE_CUDA();
  const auto fn = [](const std::vector<Tensor>& in) { return ops::add(ops::affine(ops::silu(in[0]), 2.0f), in[1]); };
  const Tensor x = to_gpu(random_tensor({64, 1000}, 1)), y = to_gpu(random_tensor({64, 1000}, 2));
  GraphRunner runner;
  for (int i = 0; i < 2; ++i) (void)runner.run({x, y}, cuda0(), fn);  // eager warm-up, then the capture
  backend_for(cuda0()).synchronize();
  std::unique_ptr<KernelTracer> tracer = open_or_fail();
  ASSERT_TRUE(tracer);
  const int64_t eager_from = trace::now_ns();
  (void)fn({x, y});
  backend_for(cuda0()).synchronize();
  const int64_t replay_from = trace::now_ns();
  (void)runner.run({x, y}, cuda0(), fn);
  backend_for(cuda0()).synchronize();
  const int64_t replay_to = trace::now_ns();
  ASSERT_EQ(runner.stats().replays, 1);
  auto kernels = tracer->collect();
  ASSERT_TRUE(kernels.has_value()) << kernels.status().message();
  // The replay also copies its inputs in and its output out (GraphRunner::run_recorded): copy kernels outside the
  // graph, or the driver's copies with ATELIER_DRIVER_COPIES=1. They are counted apart from the graph's kernels.
  int eager = 0, replayed = 0, replay_copies = 0;
  for (const trace::Event& k : *kernels) {
    EXPECT_GT(k.dur_ns, 0) << k.name;
    EXPECT_FALSE(std::string(k.name).empty());
    EXPECT_GE(k.start_ns, eager_from) << k.name << ": before the tracer's window";
    EXPECT_LE(k.start_ns + k.dur_ns, replay_to) << k.name << ": after the synchronize that waited for it";
    const bool copy_kernel = std::string(k.name).find("copy_segments_kernel") != std::string::npos;
    if (is_copy_activity(k) || copy_kernel) {
      EXPECT_GE(k.start_ns, replay_from) << k.name << ": the eager call copies nothing";
      EXPECT_EQ(k.index, -1) << k.name << ": the replay's copies are not part of its graph";
      ++replay_copies;
      continue;
    }
    EXPECT_EQ(k.category, trace::Category::kKernel);
    EXPECT_EQ(k.detail.rfind("cuda:0 grid ", 0), 0u) << k.detail;  // its device, then its launch shape
    if (k.start_ns < replay_from) {
      ++eager;
      EXPECT_EQ(k.index, -1) << k.name << ": an eager kernel has no graph";
    } else {
      ++replayed;
      EXPECT_GE(k.index, 0) << k.name << ": a replayed kernel names its graph";
    }
  }
  EXPECT_GE(eager, 1);  // silu, affine and add: fused or not, at least one kernel each way
  EXPECT_EQ(replayed, eager) << "the replay runs the kernels the eager call ran";
  EXPECT_GE(replay_copies, 2) << "the inputs' copy and the output's";
}

TEST(CudaKernelTracer, TwoTracersSeeTheirOwnWindows) {
  ATELIER_REQUIRE_CUDA();
  const Tensor x = to_gpu(random_tensor({4096}, 3));
  backend_for(cuda0()).synchronize();  // the upload's copy is over before either window opens
  std::unique_ptr<KernelTracer> outer = open_or_fail();
  ASSERT_TRUE(outer);
  (void)ops::silu(x);
  backend_for(cuda0()).synchronize();
  std::unique_ptr<KernelTracer> inner = open_or_fail();
  ASSERT_TRUE(inner);
  (void)ops::silu(x);
  backend_for(cuda0()).synchronize();
  auto a = outer->collect(), b = inner->collect();
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->size(), 2 * b->size());
  EXPECT_GE(b->size(), 1u);
  inner.reset();  // the outer one keeps recording
  (void)ops::silu(x);
  backend_for(cuda0()).synchronize();
  auto c = outer->collect();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->size(), 3 * b->size());
}

TEST(CudaKernelTracer, BenchReportsTheCallsKernels) {
  ATELIER_REQUIRE_CUDA();
  BenchOptions o;
  o.config = "sd15";
  o.device = "cuda";
  o.width = o.height = 256;
  o.steps = 3;
  o.warmup = 1;
  o.kernels = true;
  auto r = run_bench(o);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  ASSERT_TRUE(r->kernels.has_value());
  const KernelFigures& k = *r->kernels;
  EXPECT_EQ(k.calls, 3);
  EXPECT_GT(k.kernels_per_call, 100);  // a UNet call: hundreds of kernels
  EXPECT_GT(k.kernel_ms_per_call, 0);
  EXPECT_GE(k.idle_ms_per_call, 0);
  EXPECT_LE(k.idle_ms_per_call, k.span_ms_per_call);
  // The kernels' union is at most their summed time and their span (each call's are; so are the medians of the
  // three calls), and they lie inside the call's device span (CUDA events; CUPTI's clock is interpolated onto the
  // host's, hence the small allowance). Not span - idle against the summed time: those are medians of different
  // calls (session 47: 3.04424 against 3.04158 ms once the idle time inside a call had shrunk to ~3 us).
  EXPECT_LE(k.union_ms_per_call, k.kernel_ms_per_call + 1e-9);
  EXPECT_LE(k.union_ms_per_call, k.span_ms_per_call + 1e-9);
  EXPECT_LE(k.span_ms_per_call, r->unet_ms_median * 1.02 + 0.02);
  ASSERT_TRUE(k.busy_pct.has_value());
  EXPECT_GT(*k.busy_pct, 0);
  EXPECT_LE(*k.busy_pct, 100.0 + 1e-9);
  ASSERT_TRUE(k.steady_busy_pct.has_value());  // three calls: from the second one's first kernel on
  EXPECT_GT(*k.steady_busy_pct, 0);
  EXPECT_LE(*k.steady_busy_pct, 100.0 + 1e-9);
  ASSERT_FALSE(k.top.empty());
  double shares = 0;
  for (const KernelGroup& g : k.top) shares += g.share_pct;
  EXPECT_LE(shares, 100.0 + 1e-6);
  std::printf("[ kernels  ] %s", k.to_text("UNet").c_str());
}

// The queue's copies and memsets come back too, named in brackets with their bytes: a device-to-device copy through
// the driver (ATELIER_DRIVER_COPIES=1), a zero fill (cudaMemsetAsync) and an upload past the inline size.
TEST(CudaKernelTracer, SeesTheQueuesCopiesAndMemsets) {
  ATELIER_REQUIRE_CUDA();
  struct Restore {
    ~Restore() { cuda::set_driver_copies(false); }
  } restore;
  const Tensor x = to_gpu(random_tensor({1000}, 3));
  const Tensor host = random_tensor({4096}, 4);  // 16 KB: through the pinned staging buffers
  backend_for(cuda0()).synchronize();
  std::unique_ptr<KernelTracer> tracer = open_or_fail();
  ASSERT_TRUE(tracer);
  cuda::set_driver_copies(true);
  (void)ops::clone(x);
  cuda::set_driver_copies(false);
  (void)Tensor::zeros({1000}, DType::F32, cuda0());
  (void)host.to(cuda0());
  backend_for(cuda0()).synchronize();
  auto events = tracer->collect();
  ASSERT_TRUE(events.has_value()) << events.status().message();
  int dtod = 0, memset = 0, htod = 0;
  for (const trace::Event& e : *events) {
    if (!is_copy_activity(e)) continue;
    EXPECT_GT(e.dur_ns, 0) << e.name;
    const std::string name = e.name;
    if (name == "[memcpy DtoD]" && e.detail == "cuda:0 4000 bytes") ++dtod;
    if (name == kMemsetName && e.detail == "cuda:0 4000 bytes") ++memset;
    if (name == "[memcpy HtoD]" && e.detail == "cuda:0 16384 bytes") ++htod;
  }
  EXPECT_EQ(dtod, 1);
  EXPECT_EQ(memset, 1);
  EXPECT_EQ(htod, 1);
}

}  // namespace
}  // namespace atelier
