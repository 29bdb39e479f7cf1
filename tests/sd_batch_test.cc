// Step-level batching (pipeline/sd_batch.h): samples of different requests — different samplers, step
// counts, guidance scales (guided and unguided), joining the batch at different steps and leaving when
// done — end exactly where each would end when run alone.
#include <gtest/gtest.h>

#include "backend/ops.h"
#include "pipeline/sd_batch.h"
#include "pipeline/sd_pipeline.h"
#include "test_util.h"

namespace atelier {
namespace {

constexpr double kBatchTol = 1e-5;  // rel L2 of final latents, batched vs alone (GEMM blocking may differ per batch size)

struct Req {
  const char* sampler;
  int steps;
  float cfg;
  int64_t seed;
};

struct Running {
  PreparedSample prep;
  DenoiseSample sample;
};

std::unique_ptr<Running> start(const SdPipeline& pipe, const Req& q) {
  GenerateRequest r;
  r.prompt = "a red circle";
  r.negative_prompt = "blurry";
  r.width = r.height = 32;
  r.sampler = q.sampler;
  r.steps = q.steps;
  r.cfg_scale = q.cfg;
  r.seed = q.seed;
  auto plan = pipe.plan(r);
  EXPECT_TRUE(plan) << plan.status().message();
  auto run = std::make_unique<Running>();
  run->prep = std::move(pipe.prepare_sample(*plan, 0).value());
  run->sample.sampler = run->prep.sampler.get();
  run->sample.x = run->prep.latents;
  run->sample.cond = pipe.encode_prompt(r.prompt, 1, false).value();
  if (q.cfg > 1) run->sample.uncond = pipe.encode_prompt(r.negative_prompt, 1, false).value();
  run->sample.cfg_scale = q.cfg;
  return run;
}

std::vector<float> alone(const SdPipeline& pipe, const Req& q) {
  auto run = start(pipe, q);
  DenoiseSample* p = &run->sample;
  while (!p->done()) EXPECT_TRUE(denoise_batch_step(*pipe.model().unet, {&p, 1}, false).has_value());
  return run->sample.x.to_vector();
}

TEST(SdBatch, MixedRequestsJoiningAndLeavingMatchRunsAlone) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  SdLoadOptions lo;
  lo.compute_hash = false;
  auto model = load_sd_model((dir / "model").string(), lo);
  ASSERT_TRUE(model) << model.status().message();
  SdPipeline pipe(*model);
  const std::vector<Req> reqs = {{"euler_a", 4, 7.0f, 11}, {"DPM++ 2M Karras", 3, 1.0f, 12},
                                 {"heun", 2, 5.0f, 13},   {"ddim", 3, 3.0f, 14}};
  const std::vector<int> join_at = {0, 1, 1, 2};  // the batch call before which each request joins

  std::vector<std::unique_ptr<Running>> runs(reqs.size());
  std::vector<int> sizes;
  for (int call = 0;; ++call) {
    for (size_t i = 0; i < reqs.size(); ++i)
      if (join_at[i] == call) runs[i] = start(pipe, reqs[i]);
    std::vector<DenoiseSample*> active;
    for (auto& r : runs)
      if (r && !r->sample.done()) active.push_back(&r->sample);
    if (active.empty()) break;
    sizes.push_back(int(active.size()));
    auto out = denoise_batch_step(*pipe.model().unet, active, true);
    ASSERT_TRUE(out) << out.status().message();
    EXPECT_EQ(out->x.size(0), int64_t(active.size()));
    EXPECT_TRUE(out->denoised.defined());
  }
  EXPECT_GE(*std::max_element(sizes.begin(), sizes.end()), 3) << "the requests did overlap";
  for (size_t i = 0; i < reqs.size(); ++i) {
    const double r = test::rel_l2(runs[i]->sample.x.to_vector(), alone(pipe, reqs[i]));
    EXPECT_LE(r, kBatchTol) << reqs[i].sampler;
    std::printf("[sd_batch] %-16s rel L2 batched vs alone %.3g\n", reqs[i].sampler, r);
  }
}

TEST(SdBatch, RejectsIncompatibleSamples) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  SdLoadOptions lo;
  lo.compute_hash = false;
  auto model = load_sd_model((dir / "model").string(), lo);
  ASSERT_TRUE(model);
  SdPipeline pipe(*model);
  auto a = start(pipe, {"euler", 2, 7.0f, 1});
  GenerateRequest r;
  r.width = 64;
  r.height = 32;
  r.steps = 2;
  r.seed = 2;
  auto plan = pipe.plan(r).value();
  auto prep = pipe.prepare_sample(plan, 0).value();
  DenoiseSample b = a->sample;
  b.sampler = prep.sampler.get();
  b.x = prep.latents;
  std::vector<DenoiseSample*> both = {&a->sample, &b};
  auto out = denoise_batch_step(*pipe.model().unet, both, false);
  ASSERT_FALSE(out);
  EXPECT_NE(out.status().message().find("different latent"), std::string::npos) << out.status().message();
}

}  // namespace
}  // namespace atelier
