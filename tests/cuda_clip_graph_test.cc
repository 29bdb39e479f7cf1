// The CLIP text encoder's recorded calls on cuda:0 (ClipTextModel::graphs, backend/graph_runner.h): a replayed
// encoding equals the eager one bit for bit at each clip skip (one recording per layer depth: a depth replaying
// another's recording would give the wrong layer's output), and prompts batched into a larger bucket give the
// rows an eager call of their own count gives, up to the products' batch-size-dependent rounding. Skips with the
// reason without a GPU or the sd15-tiny fixture.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "backend/graph_runner.h"
#include "cuda_test_util.h"
#include "models/clip/clip_text_model.h"
#include "models/common/weights.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::cuda0;

constexpr int kVocabTokens = 1000;  // ids drawn below the fixture's vocabulary size

// The sd15-tiny text encoder on the GPU in `dtype`.
Expected<ClipTextModel> load_tiny_clip(const std::filesystem::path& dir, DType dtype) {
  ATELIER_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open({(dir / "model/text_encoder/model.safetensors").string()}));
  ATELIER_ASSIGN_OR_RETURN(ClipTextConfig cfg, ClipTextConfig::from_file((dir / "model/text_encoder/config.json").string()));
  return ClipTextModel::load(store, ClipLayout::kTransformers, cfg, cuda0(), dtype);
}

// The model with its recordings, and a copy sharing its weights with recording off (the eager reference).
struct GraphedAndEager {
  ClipTextModel graphed, eager;
};
Expected<GraphedAndEager> graphed_and_eager(const std::filesystem::path& dir, DType dtype) {
  ATELIER_ASSIGN_OR_RETURN(ClipTextModel graphed, load_tiny_clip(dir, dtype));
  ClipTextModel eager = graphed;
  eager.set_graph_options({.enabled = false});
  return GraphedAndEager{std::move(graphed), std::move(eager)};
}

// [rows, 77] i32 on the host: the fixture's prompt with a few ids changed per row and call.
Tensor prompt_ids(int64_t rows, int salt) {
  const std::vector<float> base = test::golden("sd15-tiny", "tokens.0").to_vector();
  Tensor ids = Tensor::empty({rows, int64_t(base.size())}, DType::I32);
  for (int64_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < base.size(); ++i) {
      const bool changed = i >= 1 && i <= 4;  // after BOS: the prompt's first words
      ids.data<int32_t>()[r * int64_t(base.size()) + int64_t(i)] =
          changed ? int32_t((37 * (salt + 1) + 11 * r + int64_t(i)) % kVocabTokens) : int32_t(base[i]);
    }
  return ids;
}

TEST(CudaGraph, ClipTextReplayEqualsEagerAtEachClipSkip) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  for (DType dt : {DType::F32, DType::BF16}) {
    auto models = graphed_and_eager(dir, dt);
    ASSERT_TRUE(models.has_value()) << models.status().message();
    ClipTextModel& graphed = models->graphed;
    ClipTextModel& eager = models->eager;
    double worst = 0;
    for (int call = 0; call < 5; ++call)
      for (int skip : {1, 2}) {
        const Tensor ids = prompt_ids(1, call).to(cuda0());
        auto a = graphed.forward(ids, skip);
        auto b = eager.forward(ids, skip);
        ASSERT_TRUE(a.has_value() && b.has_value());
        worst = std::max(worst, test::rel_l2(a->to_vector(), b->to_vector()));
      }
    const GraphRunner::Stats last = graphed.graphs(1).stats(), penultimate = graphed.graphs(2).stats();
    std::printf("[ figures  ] CLIP %s: replay vs eager worst rel L2 %.3g over 5 calls at clip skip 1 and 2; "
                "%lld + %lld captures, %lld + %lld replays\n",
                std::string(dtype_name(dt)).c_str(), worst, (long long)last.captures, (long long)penultimate.captures,
                (long long)last.replays, (long long)penultimate.replays);
    EXPECT_EQ(worst, 0.0) << "the same kernels on the same data must give the same bits";
    for (const GraphRunner::Stats& s : {last, penultimate}) {
      EXPECT_EQ(s.captures, 1);
      EXPECT_EQ(s.replays, 3);
      EXPECT_EQ(s.capture_failures, 0) << s.last_failure;
    }
    EXPECT_EQ(eager.graphs(1).stats().captures, 0);
  }
}

// Three prompts run in the 4-row recording (the ids padded with copies of the last row), then four prompts
// replay that same recording.
TEST(CudaGraph, ClipTextBucketsShareOneRecording) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  for (DType dt : {DType::F32, DType::BF16}) {
    auto models = graphed_and_eager(dir, dt);
    ASSERT_TRUE(models.has_value()) << models.status().message();
    ClipTextModel& graphed = models->graphed;
    ClipTextModel& eager = models->eager;
    const double tol = dt == DType::F32 ? 1e-5 : 1e-2;  // rows of a 4-row call against a 3-row call's
    for (int call = 0; call < 3; ++call) {
      const Tensor ids = prompt_ids(3, call);  // host ids: the runner copies them to the device
      auto a = graphed.forward(ids);
      auto b = eager.forward(ids);
      ASSERT_TRUE(a.has_value() && b.has_value());
      ASSERT_EQ(a->shape(), b->shape());
      SCOPED_TRACE("call " + std::to_string(call));
      EXPECT_REL_L2_LE(a->to_vector(), b->to_vector(), tol);
    }
    const Tensor four = prompt_ids(4, 9);
    auto a = graphed.forward(four), b = eager.forward(four);
    ASSERT_TRUE(a.has_value() && b.has_value());
    EXPECT_EQ(a->to_vector(), b->to_vector()) << "a 4-row replay of the 4-row recording";
    const GraphRunner::Stats s = graphed.graphs().stats();
    EXPECT_EQ(s.captures, 1);
    EXPECT_EQ(s.replays, 2);
    EXPECT_EQ(s.capture_failures, 0) << s.last_failure;
  }
}

}  // namespace
}  // namespace atelier
