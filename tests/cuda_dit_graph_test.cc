// Recorded execution of the diffusion transformers on cuda:0: FLUX's and Z-Image's forward replayed as one
// CUDA graph (GraphRunner::dit_options) gives the eager call's bits, with inputs, timesteps and rotary
// position ids that change from call to call (the tables are recording inputs, not frozen constants), in bf16
// and with FP8 blocks. Skips with the reason without a GPU or the fixtures.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "backend/graph_runner.h"
#include "cuda_test_util.h"
#include "models/common/weights.h"
#include "models/flux/flux_transformer.h"
#include "models/zimage/zimage_transformer.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::cuda0;
using test::random_tensor;

constexpr int kCalls = 5;  // one eager warm-up, one recording, three replays

// bf16 blocks; FP8 blocks with 16-bit attention (CUDA's default); FP8 blocks with FP8 attention (cuDNN's FP8
// graph and the quantization passes around it, recorded like the rest).
struct Mode {
  bool fp8_blocks, fp8_attention;
  const char* what;
};
constexpr Mode kModes[] = {{false, false, "bf16"}, {true, false, "fp8 blocks"}, {true, true, "fp8 blocks + fp8 attention"}};

// After kCalls calls of each: the recorded model's stats printed, its worst difference to the eager one zero,
// one recording (the second call) replayed from the third on.
void expect_replay_equals_eager(const char* what, const GraphRunner::Stats& s, double worst) {
  std::printf("[ figures  ] %s: graph vs eager worst rel L2 %.3g over %d calls; %lld captures, %lld replays, "
              "%.1f MiB pool\n",
              what, worst, kCalls, (long long)s.captures, (long long)s.replays, double(s.pool_bytes) / (1 << 20));
  EXPECT_EQ(worst, 0.0) << what << ": the same kernels on the same data must give the same bits";
  EXPECT_EQ(s.captures, 1) << what << ": " << s.last_failure;
  EXPECT_EQ(s.replays, kCalls - 2) << what;
}

// FLUX inputs of call `call`: fresh latents, text and timestep; the image ids shift with the call, so that the
// rotary tables differ between calls of one shape.
FluxInputs flux_inputs(const FluxConfig& cfg, int call) {
  constexpr int64_t kTokens = 16, kText = 8, kSide = 4;
  FluxInputs in;
  in.hidden_states = random_tensor({1, kTokens, cfg.in_channels}, 50 + call).to(cuda0());
  in.encoder_hidden_states = random_tensor({1, kText, cfg.joint_attention_dim}, 60 + call).to(cuda0());
  in.pooled = random_tensor({1, cfg.pooled_projection_dim}, 70 + call).to(cuda0());
  std::vector<float> img_ids, txt_ids(size_t(kText * 3), 0.0f);
  for (int64_t i = 0; i < kTokens; ++i) img_ids.insert(img_ids.end(), {0.0f, float(i / kSide + call), float(i % kSide)});
  in.img_ids = Tensor::from_vector(img_ids, {kTokens, 3});
  in.txt_ids = Tensor::from_vector(txt_ids, {kText, 3});
  in.timestep = {1.0f - 0.15f * float(call)};
  in.guidance = {3.5f};
  return in;
}

TEST(CudaGraph, FluxReplayEqualsEager) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const WeightStore store = WeightStore::open({(dir / "model/transformer/diffusion_pytorch_model.safetensors").string()}).value();
  const FluxConfig cfg = FluxConfig::from_file((dir / "model/transformer/config.json").string()).value();
  for (const Mode& mode : kModes) {
    const bool fp8 = mode.fp8_blocks;
    const test::Fp8AttentionScope fp8_attention(mode.fp8_attention);
    FluxTransformer graphed = FluxTransformer::load(store, FluxLayout::kDiffusers, cfg, cuda0(), DType::BF16).value();
    if (fp8) graphed.quantize_fp8();
    FluxTransformer eager = graphed;  // the same weights
    eager.set_graph_options({.enabled = false});
    double worst = 0;
    for (int call = 0; call < kCalls; ++call) {
      const FluxInputs in = flux_inputs(cfg, call);
      const Tensor a = graphed.forward(in).value(), b = eager.forward(in).value();
      worst = std::max(worst, test::rel_l2(a.to_vector(), b.to_vector()));
    }
    expect_replay_equals_eager((std::string("flux-tiny ") + mode.what).c_str(), graphed.graphs().stats(), worst);
    EXPECT_EQ(eager.graphs().stats().captures, 0);
  }
}

TEST(CudaGraph, ZImageReplayEqualsEager) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  const ZImageConfig cfg = ZImageConfig::from_file((dir / "model/transformer/config.json").string()).value();
  const WeightStore store = WeightStore::open({(dir / "model/transformer/diffusion_pytorch_model.safetensors").string()}).value();
  for (const Mode& mode : kModes) {
    const bool fp8 = mode.fp8_blocks;
    const test::Fp8AttentionScope fp8_attention(mode.fp8_attention);
    ZImageTransformer graphed = ZImageTransformer::load(store, cfg, cuda0(), DType::BF16).value();
    if (fp8) graphed.quantize_fp8();
    ZImageTransformer eager = graphed;
    eager.set_graph_options({.enabled = false});
    double worst = 0;
    for (int call = 0; call < kCalls; ++call) {
      const Tensor latents = random_tensor({cfg.in_channels, 1, 8, 8}, 80 + call).to(cuda0());
      const Tensor caption = random_tensor({5, cfg.cap_feat_dim}, 90 + call).to(cuda0());
      const float t = 0.1f + 0.2f * float(call);
      const Tensor a = graphed.forward(latents, t, caption).value(), b = eager.forward(latents, t, caption).value();
      worst = std::max(worst, test::rel_l2(a.to_vector(), b.to_vector()));
    }
    expect_replay_equals_eager((std::string("zimage-tiny ") + mode.what).c_str(), graphed.graphs().stats(), worst);
  }
}

}  // namespace
}  // namespace atelier
