// Recorded execution on cuda:0 (backend/graph_runner.h, CUDA graphs): a replayed UNet call equals the eager
// call, a function that cannot be recorded falls back to eager with the reason kept, and 200 generations
// through the pipeline (graphs on) leave the device memory flat. Skips with the reason without a GPU.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/graph_runner.h"
#include "cuda_sd_test_util.h"
#include "cuda_test_util.h"
#include "models/common/weights.h"
#include "models/sd/unet.h"
#include "models/sd/unet_config.h"
#include "ops_test_util.h"
#include "pipeline/sd_model.h"
#include "pipeline/sd_pipeline.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::cuda0;
using test::random_tensor;
using test::to_gpu;

TEST(CudaGraph, RunnerReplaysWithNewInputs) {
  ATELIER_REQUIRE_CUDA();
  GraphRunner runner;
  const auto fn = [](const std::vector<Tensor>& in) { return ops::add(ops::affine(ops::silu(in[0]), 2.0f), in[1]); };
  for (int call = 0; call < 5; ++call) {
    const Tensor x = random_tensor({3, 257}, 100 + call), y = random_tensor({3, 257}, 200 + call);
    // y comes from the host: the runner copies it into the recording's input buffer.
    const Tensor got = runner.run({to_gpu(x), y}, cuda0(), fn);
    const Tensor want = fn({x, y});
    EXPECT_LE(test::rel_l2(got.to_vector(), want.to_vector()), 1e-6) << "call " << call;
  }
  const GraphRunner::Stats s = runner.stats();
  EXPECT_EQ(s.eager_calls, 1);  // the warm-up call
  EXPECT_EQ(s.captures, 1);
  EXPECT_EQ(s.replays, 3);
  EXPECT_GT(s.pool_bytes, 0u);
}

TEST(CudaGraph, UnrecordableFunctionRunsEagerly) {
  ATELIER_REQUIRE_CUDA();
  GraphRunner runner;
  // Reading a device value on the host inside the function cannot be recorded.
  const auto fn = [](const std::vector<Tensor>& in) {
    const float first = ops::contiguous(in[0]).to_vector()[0];
    return ops::affine(in[0], 1.0f, first);
  };
  for (int call = 0; call < 4; ++call) {
    const Tensor x = random_tensor({64}, 300 + call);
    const std::vector<float> got = runner.run({x}, cuda0(), fn).to_vector();
    const std::vector<float> xv = x.to_vector();
    ASSERT_FLOAT_EQ(got[5], xv[5] + xv[0]) << "call " << call;
  }
  const GraphRunner::Stats s = runner.stats();
  EXPECT_EQ(s.captures, 0);
  EXPECT_EQ(s.capture_failures, 1);
  EXPECT_FALSE(s.last_failure.empty());
  std::printf("[ figures  ] recording refused as expected: %s\n", s.last_failure.c_str());
  // The device still works after the refused recording.
  EXPECT_EQ(ops::affine(to_gpu(Tensor::full({4}, 1.0f)), 3.0f).to_vector()[3], 3.0f);
}

// The sd15-tiny fixture's UNet on the GPU in `dtype`.
Expected<UNet> load_tiny_unet(const std::filesystem::path& dir, DType dtype) {
  ATELIER_ASSIGN_OR_RETURN(WeightStore store,
                           WeightStore::open({(dir / "model/unet/diffusion_pytorch_model.safetensors").string()}));
  ATELIER_ASSIGN_OR_RETURN(UNetConfig config, load_unet_config((dir / "model/unet/config.json").string()));
  return UNet::load(store, UNetLayout::kDiffusers, config, cuda0(), dtype);
}

TEST(CudaGraph, UnetReplayEqualsEager) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const Tensor ctx = test::golden("sd15-tiny", "unet.context").to(cuda0());
  for (DType dt : {DType::F32, DType::BF16}) {
    auto graphed = load_tiny_unet(dir, dt);
    ASSERT_TRUE(graphed.has_value()) << graphed.status().message();
    UNet eager = *graphed;  // shares the weights
    eager.set_graph_options({.enabled = false});
    graphed->set_graph_options({.warmup = 1});
    double worst = 0;
    for (int call = 0; call < 5; ++call) {
      const Tensor x = to_gpu(random_tensor({2, 4, 16, 16}, 40 + call));
      const Tensor t = Tensor::from_vector({float(900 - 150 * call), float(10 + 7 * call)}, {2});
      auto a = graphed->forward(x, t, ctx);
      auto b = eager.forward(x, t, ctx);
      ASSERT_TRUE(a.has_value() && b.has_value());
      worst = std::max(worst, test::rel_l2(a->to_vector(), b->to_vector()));
    }
    const GraphRunner::Stats s = graphed->graphs().stats();
    std::printf("[ figures  ] UNet %s: graph vs eager worst rel L2 %.3g over 5 calls; %lld captures, %lld replays, "
                "%.1f MiB pool\n",
                std::string(dtype_name(dt)).c_str(), worst, (long long)s.captures, (long long)s.replays,
                double(s.pool_bytes) / (1 << 20));
    EXPECT_EQ(worst, 0.0) << "the same kernels on the same data must give the same bits";
    EXPECT_EQ(s.captures, 1);
    EXPECT_EQ(s.replays, 3);
    EXPECT_EQ(eager.graphs().stats().captures, 0);
  }
}

// A server's batch sizes come and go: with the UNet's batch buckets, 3 rows run padded in the 4-row
// recording, and the 4-row call after them replays the same recording (one capture for both sizes); the
// padded call's rows equal an eager 3-row call's up to batch-size-dependent rounding.
TEST(CudaGraph, BatchBucketsShareOneRecording) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const Tensor ctx1 = test::golden("sd15-tiny", "unet.context").to(cuda0()).narrow(0, 0, 1);
  auto graphed = load_tiny_unet(dir, DType::F32);
  ASSERT_TRUE(graphed.has_value()) << graphed.status().message();
  UNet eager = *graphed;
  eager.set_graph_options({.enabled = false});
  ASSERT_FALSE(UNet::default_graph_options().batch_buckets.empty());
  double worst = 0;
  for (int call = 0; call < 6; ++call) {
    const int64_t n = call < 3 ? 3 : 4;  // 3 rows: eager warm-up, capture of the 4-row bucket, replay; then 4 rows
    const Tensor x = to_gpu(random_tensor({n, 4, 16, 16}, 60 + call));
    std::vector<float> tv;
    for (int64_t i = 0; i < n; ++i) tv.push_back(float(950 - 120 * i - 31 * call));
    const Tensor t = Tensor::from_vector(tv, {n});
    const Tensor ctx = ops::concat(std::vector<Tensor>(size_t(n), ctx1), 0);
    auto a = graphed->forward(x, t, ctx);
    auto b = eager.forward(x, t, ctx);
    ASSERT_TRUE(a.has_value() && b.has_value());
    ASSERT_EQ(a->shape(), b->shape()) << "the padded rows must not come back";
    worst = std::max(worst, test::rel_l2(a->to_vector(), b->to_vector()));
  }
  const GraphRunner::Stats s = graphed->graphs().stats();
  std::printf("[ figures  ] UNet, 3 rows then 4 rows: %lld captures, %lld replays, %lld eager; worst rel L2 vs eager %.3g\n",
              (long long)s.captures, (long long)s.replays, (long long)s.eager_calls, worst);
  EXPECT_EQ(s.captures, 1) << "3 and 4 rows must share the 4-row recording";
  EXPECT_EQ(s.eager_calls, 1);
  EXPECT_EQ(s.replays, 4);
  EXPECT_LT(worst, 1e-5);
}

TEST(CudaGraph, TwoHundredGenerationsKeepMemoryFlat) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto model = test::load_tiny_sd_on_gpu(dir);
  ASSERT_TRUE(model.has_value()) << model.status().message();
  SdPipeline pipe(*model);
  GenerateRequest r = test::tiny_gpu_request(3);
  constexpr int kGenerations = 200, kSettled = 10;
  size_t settled = 0;
  for (int i = 0; i < kGenerations; ++i) {
    r.seed = 1000 + i;
    auto res = pipe.generate(r);
    ASSERT_TRUE(res.has_value()) << res.status().message();
    ASSERT_EQ(res->images.size(), 1u);
    backend_for(cuda0()).synchronize();
    const size_t reserved = backend_for(cuda0()).bytes_reserved();
    if (i + 1 == kSettled) settled = reserved;
    if (i + 1 > kSettled) ASSERT_EQ(reserved, settled) << "device memory grew at generation " << i + 1;
  }
  const GraphRunner::Stats s = (*model)->unet->graphs().stats();
  std::printf("[ figures  ] %d generations: %.1f MiB reserved throughout after the first %d; UNet: %lld replays, "
              "%lld captures\n",
              kGenerations, double(settled) / (1 << 20), kSettled, (long long)s.replays, (long long)s.captures);
  EXPECT_GT(s.replays, kGenerations);
}

}  // namespace
}  // namespace atelier
