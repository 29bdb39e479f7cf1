// Kernel tracing without a GPU: the short names kernels are reported by, `bench --kernels`' per-call figures
// from kernel events (idle time inside a call, busy share of a window, the kernels that take the time), the
// trace file's kernel tracks, and the errors where no kernel can be traced (CUPTI itself runs in
// cuda_kernel_tracer_test.cc, on the GPU).
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/kernel_tracer.h"
#include "pipeline/bench_kernels.h"
#include "pipeline/sd_bench.h"
#include "test_util.h"

namespace atelier {
namespace {

using trace::Category;

TEST(KernelTrace, ShortNamesDropReturnTypeParametersAndQualifiers) {
  EXPECT_EQ(short_kernel_name("_ZN7atelier4cuda12_GLOBAL__N_111gemm_kernelILNS_2OpE2ELi64ELb1EEEvNS0_6ParamsE"),
            "gemm_kernel<(Op)2, 64, true>");
  EXPECT_EQ(short_kernel_name("_ZN7atelier4cuda11norm_kernelIfEEvPKT_i"), "norm_kernel<float>");
  EXPECT_EQ(short_kernel_name("_ZN7atelier4cuda12plain_kernelEPfi"), "plain_kernel");
  EXPECT_EQ(short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"),
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas");  // extern "C": as it is
}

trace::Event kernel(const char* name, int64_t start_ns, int64_t dur_ns) {
  trace::Event e = test::trace_event(name, Category::kKernel, start_ns, dur_ns, -1, -1);
  e.thread = 7;
  return e;
}

// Two UNet calls whose device spans (CUDA events, us since the origin) hold three kernels each: the first with a
// 0.05 ms gap between its first two, the second without; one kernel between the calls and one running past
// the window's end count for the busy share only.
std::vector<trace::Event> two_calls(int64_t origin) {
  return {test::trace_event("unet", Category::kCall, origin + 90'000, 700'000, 100, 600),
          kernel("a", origin + 150'000, 200'000), kernel("b", origin + 400'000, 100'000), kernel("a", origin + 500'000, 150'000),
          test::trace_event("unet", Category::kCall, origin + 990'000, 700'000, 1000, 600),
          kernel("a", origin + 1'050'000, 200'000), kernel("b", origin + 1'250'000, 100'000), kernel("a", origin + 1'350'000, 150'000),
          kernel("c", origin + 1'800'000, 100'000), kernel("c", origin + 1'950'000, 100'000)};
}

TEST(KernelTrace, BenchFiguresPerCallAndOverTheWindow) {
  constexpr int64_t kOrigin = 1'000'000'000;
  const std::optional<KernelFigures> f = summarize_kernels(two_calls(kOrigin), kOrigin, "unet", kOrigin, kOrigin + 2'000'000);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->calls, 2);
  EXPECT_DOUBLE_EQ(f->kernels_per_call, 3);
  EXPECT_NEAR(f->kernel_ms_per_call, 0.45, 1e-9);
  EXPECT_NEAR(f->span_ms_per_call, (0.5 + 0.45) / 2, 1e-9);  // medians of two calls: their means
  EXPECT_NEAR(f->idle_ms_per_call, (0.05 + 0.0) / 2, 1e-9);
  // Kernels 0.45 + 0.45 + 0.1 + 0.05 (the last one clipped at the window's end) over 2 ms.
  ASSERT_TRUE(f->busy_pct.has_value());
  EXPECT_NEAR(*f->busy_pct, 100.0 * 1.05 / 2.0, 1e-9);
  ASSERT_EQ(f->top.size(), 2u);  // "c" ran in no call
  EXPECT_EQ(f->top[0].name, "a");
  EXPECT_DOUBLE_EQ(f->top[0].count_per_call, 2);
  EXPECT_NEAR(f->top[0].ms_per_call, 0.35, 1e-9);
  EXPECT_NEAR(f->top[0].mean_us, 175, 1e-9);
  EXPECT_NEAR(f->top[0].share_pct, 100.0 * 0.35 / 0.45, 1e-9);
  EXPECT_EQ(f->top[1].name, "b");
  EXPECT_NEAR(f->top[1].share_pct, 100.0 * 0.1 / 0.45, 1e-9);
  const std::string text = f->to_text("UNet");
  EXPECT_NE(text.find("3 per UNet call, 0.450 ms of kernel time"), std::string::npos) << text;
  EXPECT_NE(text.find("busy 52.5%"), std::string::npos) << text;
  // From the second call's first kernel (1.05 ms) to the window's end: 0.45 + 0.1 + 0.05 over 0.95 ms.
  ASSERT_TRUE(f->steady_busy_pct.has_value());
  EXPECT_NEAR(*f->steady_busy_pct, 100.0 * 0.6 / 0.95, 1e-9);
  EXPECT_NE(text.find("63.2% from its second call on"), std::string::npos) << text;
  const nlohmann::json j = f->to_json();
  EXPECT_EQ(j["top"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["busy_pct"].get<double>(), *f->busy_pct);
  EXPECT_DOUBLE_EQ(j["steady_busy_pct"].get<double>(), *f->steady_busy_pct);
}

// A loop whose first call waits 0.8 ms for the host's first launch before its kernels: the loop's busy share counts
// that wait, the steady share (from the second call's first kernel) does not. Three calls of 1 ms of kernels each,
// 1.1 ms apart from the second on; one call alone has no steady share.
TEST(KernelTrace, SteadyBusyLeavesOutTheFirstCallsWait) {
  constexpr int64_t kOrigin = 1'000'000'000;
  std::vector<trace::Event> ev;
  const int64_t starts[] = {800'000, 1'900'000, 3'000'000};  // first kernel of each call, from the loop's start
  for (int c = 0; c < 3; ++c) {
    ev.push_back(test::trace_event("unet", Category::kCall, kOrigin + starts[c] - 50'000, 1'100'000, (starts[c] - 50'000) / 1e3, 1100));
    ev.push_back(kernel("k", kOrigin + starts[c], 1'000'000));
  }
  const int64_t end = kOrigin + 4'000'000;
  const std::optional<KernelFigures> f = summarize_kernels(ev, kOrigin, "unet", kOrigin, end);
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(*f->busy_pct, 100.0 * 3.0 / 4.0, 1e-9);
  ASSERT_TRUE(f->steady_busy_pct.has_value());
  EXPECT_NEAR(*f->steady_busy_pct, 100.0 * 2.0 / 2.1, 1e-9);
  const std::vector<trace::Event> one(ev.begin(), ev.begin() + 2);
  EXPECT_FALSE(summarize_kernels(one, kOrigin, "unet", kOrigin, end)->steady_busy_pct.has_value());
}

// Kernels that overlap (other streams): the union counts their common time once, so a call of three overlapping
// kernels has no idle time although their summed time passes its span; the busy share never passes 100%.
TEST(KernelTrace, OverlappingKernelsCountOnceInTheUnion) {
  constexpr int64_t kOrigin = 1'000'000'000;
  const std::vector<trace::Event> ev{test::trace_event("unet", Category::kCall, kOrigin, 200'000, 0, 200),
                                     kernel("a", kOrigin, 100'000), kernel("b", kOrigin + 50'000, 100'000),
                                     kernel("c", kOrigin + 60'000, 10'000)};  // inside both
  const std::optional<KernelFigures> f = summarize_kernels(ev, kOrigin, "unet", kOrigin, kOrigin + 200'000);
  ASSERT_TRUE(f.has_value());
  EXPECT_NEAR(f->kernel_ms_per_call, 0.21, 1e-9);
  EXPECT_NEAR(f->span_ms_per_call, 0.15, 1e-9);
  EXPECT_NEAR(f->idle_ms_per_call, 0.0, 1e-9);
  ASSERT_TRUE(f->busy_pct.has_value());
  EXPECT_NEAR(*f->busy_pct, 100.0 * 0.15 / 0.2, 1e-9);
}

// Each per-call figure is the median over the calls on its own, so span - idle need not be the union's median: calls
// A (one 1 ms kernel), B (two 0.5 ms kernels 2.5 ms apart: span 3, idle 2) and C (one 3 ms kernel) have median span
// 3, idle 0 and summed time 1, while the union's median is 1, at most the summed time as in every call.
TEST(KernelTrace, UnionIsTheMedianOfEachCallsUnion) {
  constexpr int64_t kOrigin = 1'000'000'000, kCall = 10'000'000;
  std::vector<trace::Event> ev;
  for (int c = 0; c < 3; ++c) ev.push_back(test::trace_event("unet", Category::kCall, kOrigin + c * kCall, 4'000'000, c * 1e4, 4000));
  ev.push_back(kernel("a", kOrigin + 100'000, 1'000'000));
  ev.push_back(kernel("b", kOrigin + kCall + 100'000, 500'000));
  ev.push_back(kernel("b", kOrigin + kCall + 2'600'000, 500'000));
  ev.push_back(kernel("c", kOrigin + 2 * kCall + 100'000, 3'000'000));
  const std::optional<KernelFigures> f = summarize_kernels(ev, kOrigin, "unet", kOrigin, kOrigin + 3 * kCall);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->calls, 3);
  EXPECT_NEAR(f->span_ms_per_call, 3.0, 1e-9);
  EXPECT_NEAR(f->idle_ms_per_call, 0.0, 1e-9);
  EXPECT_NEAR(f->kernel_ms_per_call, 1.0, 1e-9);
  EXPECT_NEAR(f->union_ms_per_call, 1.0, 1e-9);
  EXPECT_GT(f->span_ms_per_call - f->idle_ms_per_call, f->kernel_ms_per_call);  // why union_ms_per_call exists
  EXPECT_NEAR(f->to_json()["union_ms_per_call"].get<double>(), 1.0, 1e-9);
}

// The queue's copies and memsets (bracketed names) are counted apart: not kernels, not in the idle or busy figures.
TEST(KernelTrace, CopiesAreCountedApartFromKernels) {
  constexpr int64_t kOrigin = 1'000'000'000;
  std::vector<trace::Event> ev = two_calls(kOrigin);
  ev.push_back(kernel("[memcpy DtoD]", kOrigin + 100'000, 40'000));  // first call, before its first kernel
  ev.push_back(kernel("[memcpy DtoD]", kOrigin + 1'000'000, 20'000));  // second call
  ev.push_back(kernel(kMemsetName, kOrigin + 1'020'000, 10'000));       // second call
  ev.push_back(kernel("[memcpy HtoD]", kOrigin + 900'000, 30'000));    // between the calls
  const std::optional<KernelFigures> f = summarize_kernels(ev, kOrigin, "unet", kOrigin, kOrigin + 2'000'000);
  ASSERT_TRUE(f.has_value());
  EXPECT_DOUBLE_EQ(f->kernels_per_call, 3);
  EXPECT_NEAR(f->idle_ms_per_call, (0.05 + 0.0) / 2, 1e-9);
  EXPECT_NEAR(*f->busy_pct, 100.0 * 1.05 / 2.0, 1e-9);
  EXPECT_DOUBLE_EQ(f->copies_per_call, 1.5);                 // the median of 1 and 2
  EXPECT_NEAR(f->copy_ms_per_call, (0.04 + 0.03) / 2, 1e-9);
  EXPECT_EQ(f->window_copies, 4);
  EXPECT_NEAR(f->window_copy_ms, 0.1, 1e-9);
  for (const KernelGroup& g : f->top) EXPECT_FALSE(g.name.starts_with("[")) << g.name;
  EXPECT_NE(f->to_text("UNet").find("2 per UNet call (0.035 ms); 4 in the denoise loop (0.100 ms)"), std::string::npos)
      << f->to_text("UNet");
  EXPECT_EQ(summarize_kernels(two_calls(kOrigin), kOrigin, "unet", kOrigin, kOrigin + 2'000'000)->to_text("UNet").find("copies"),
            std::string::npos);
}

TEST(KernelTrace, NoFiguresWithoutKernelsInACall) {
  constexpr int64_t kOrigin = 1'000'000'000;
  std::vector<trace::Event> ev = two_calls(kOrigin);
  EXPECT_FALSE(summarize_kernels(ev, kOrigin, "transformer", kOrigin, kOrigin + 1).has_value());
  ev.erase(std::remove_if(ev.begin(), ev.end(), [](const trace::Event& e) { return e.category == Category::kKernel; }), ev.end());
  EXPECT_FALSE(summarize_kernels(ev, kOrigin, "unet", kOrigin, kOrigin + 1).has_value());
  // The CPU's bench has no kernel events: its report has no kernel figures.
  BenchReport r;
  r.device = "cpu";
  r.batch = 1;
  summarize_bench(ev, kOrigin, "unet", false, r);
  EXPECT_FALSE(r.kernels.has_value());
}

TEST(KernelTrace, ChromeJsonPutsKernelsOnTheDevicesStreamTracks) {
  trace::Recorder rec;
  trace::Event k = kernel("gemm<64>", rec.origin_ns() + 5'000, 2'000);
  k.index = 3;  // its graph
  k.detail = "grid 132,1,1 block 384,1,1";
  rec.add(k);
  const nlohmann::json j = rec.chrome_json();
  int kernels = 0, tracks = 0;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e["name"] == "gemm<64>") {
      ++kernels;
      EXPECT_EQ(e["pid"], 2);       // the device's process
      EXPECT_EQ(e["tid"], 2 + 7);   // the kernel track of stream 7
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 5.0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2.0);
      EXPECT_EQ(e["args"]["graph"], 3);
      EXPECT_EQ(e["args"]["detail"], "grid 132,1,1 block 384,1,1");
    }
    if (e["name"] == "thread_name" && e["args"]["name"] == "kernels, stream 7") ++tracks;
  }
  EXPECT_EQ(kernels, 1) << "a kernel is a device span only, not also a host range";
  EXPECT_EQ(tracks, 1);
}

TEST(KernelTrace, NoTracerWhereNoGpuAndTheBenchSaysWhy) {
  BenchOptions o;
  o.config = "sd15";
  o.kernels = true;
  EXPECT_NE(o.validate().message().find("--kernels needs a CUDA device"), std::string::npos) << o.validate().message();
  if (backend_available(*Device::parse("cuda")))
    GTEST_SKIP() << "a GPU is present: the tracer runs there (CudaKernelTracer.*)";
  const auto t = open_kernel_tracer();
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.status().message().find("CUDA"), std::string::npos) << t.status().message();
}

}  // namespace
}  // namespace atelier
