// Z-Image pipeline: the fixture's two full runs (turbo: guidance 0; cfg: guidance 4 with a negative prompt)
// through the diffusers folder and through the original single-file transformer + the folder's other parts.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "pipeline/zimage_pipeline.h"
#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;
constexpr double kLatentTol = 1e-5;    // rel L2 per step
constexpr double kImageMaxAbs = 1e-3;  // final image, [0, 1] scale
constexpr int kMaxSequenceLength = 64;
constexpr uint64_t kSeed = 1234;

nlohmann::json read_case(const fs::path& dir) {
  std::ifstream f(dir / "case.json");
  return nlohmann::json::parse(f);
}

std::shared_ptr<const ZImageModel> load(const fs::path& dir, bool single_file, bool offload = false) {
  ZImageLoadOptions o;
  o.offload = offload;
  o.max_sequence_length = kMaxSequenceLength;
  std::string path = (dir / "model").string();
  if (single_file) {
    o.components_dir = path;
    path = (dir / "zimage-tiny-transformer.original.safetensors").string();
  }
  EXPECT_TRUE(is_zimage_model(path));
  auto m = load_zimage_model(path, o);
  EXPECT_TRUE(m) << m.status().message();
  return m ? *m : nullptr;
}

void check_run(const fs::path& dir, const ZImagePipeline& pipe, const std::string& run, const std::string& label) {
  const nlohmann::json c = read_case(dir);
  const nlohmann::json& settings = c.at("runs").at(run);
  const float guidance = settings.at("guidance_scale").get<float>();
  const int steps = settings.at("steps").get<int>();
  auto cond = pipe.encode_prompt(c.at("prompt").get<std::string>());
  ASSERT_TRUE(cond) << cond.status().message();
  Tensor uncond;
  if (guidance > 1.0f) {
    auto u = pipe.encode_prompt(settings.at("negative_prompt").get<std::string>());
    ASSERT_TRUE(u) << u.status().message();
    uncond = *u;
  }
  const Tensor noise = test::golden("zimage-tiny", "noise.cpu.seed1234");
  ZImageRunTrace trace;
  auto latents = pipe.denoise(noise, *cond, uncond, guidance, steps, &trace);
  ASSERT_TRUE(latents) << latents.status().message();
  EXPECT_EQ(trace.sigmas, test::golden("zimage-tiny", "run." + run + ".sigmas").to_vector());
  EXPECT_EQ(trace.timesteps, test::golden("zimage-tiny", "run." + run + ".timesteps").to_vector());
  const Tensor per_step = test::golden("zimage-tiny", "run." + run + ".latents_per_step");
  ASSERT_EQ(trace.latents_per_step.size(), size_t(per_step.size(0)));
  for (size_t i = 0; i < trace.latents_per_step.size(); ++i) {
    const auto ours = trace.latents_per_step[i].to_vector(), ref = per_step.select(0, int64_t(i)).to_vector();
    EXPECT_REL_L2_LE(ours, ref, kLatentTol);
    std::printf("[zimage] run.%s (%s) step %zu latents rel L2 %.3g\n", run.c_str(), label.c_str(), i, test::rel_l2(ours, ref));
  }
  auto image = pipe.decode(*latents);
  ASSERT_TRUE(image) << image.status().message();
  const Tensor ref = test::golden("zimage-tiny", "run." + run + ".image");  // NHWC
  const auto ours = ops::contiguous(image->permute({0, 2, 3, 1})).to_vector();
  const double max_abs = test::max_abs_diff(ours, ref.to_vector());
  EXPECT_LE(max_abs, kImageMaxAbs);
  std::printf("[zimage] run.%s (%s) image max abs %.3g, rel L2 %.3g\n", run.c_str(), label.c_str(), max_abs,
              test::rel_l2(ours, ref.to_vector()));
}

TEST(ZImagePipeline, CpuNoiseMatchesTorch) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  TorchCpuGenerator gen(kSeed);
  const Tensor noise = randn_tensor(gen, {1, 16, 16, 16});
  EXPECT_EQ(noise.to_vector(), test::golden("zimage-tiny", "noise.cpu.seed1234").to_vector());
}

TEST(ZImagePipeline, VaeDecodeMatchesGolden) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto model = load(dir, false);
  ASSERT_TRUE(model);
  const Tensor out = model->vae->decode(test::golden("zimage-tiny", "vae.decode.in"));
  const Tensor ref = test::golden("zimage-tiny", "vae.decode.out");
  ASSERT_EQ(out.shape(), ref.shape());
  EXPECT_REL_L2_LE(out.to_vector(), ref.to_vector(), kLatentTol);
  std::printf("[zimage] vae.decode rel L2 %.3g, max abs %.3g\n", test::rel_l2(out.to_vector(), ref.to_vector()),
              test::max_abs_diff(out.to_vector(), ref.to_vector()));
}

TEST(ZImagePipeline, RunsMatchGoldensThroughBothLayouts) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  for (bool single_file : {false, true}) {
    auto model = load(dir, single_file);
    ASSERT_TRUE(model);
    const ZImagePipeline pipe(model);
    for (const std::string run : {"turbo", "cfg"}) check_run(dir, pipe, run, single_file ? "original" : "diffusers");
  }
}

TEST(ZImagePipeline, GenerateWritesInfotext) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto model = load(dir, false);
  ASSERT_TRUE(model);
  GenerateRequest r;
  r.prompt = "a photo of an astronaut riding a horse on mars";
  r.width = r.height = 128;
  r.steps = 5;
  r.cfg_scale = 0.0f;
  r.seed = int64_t(kSeed);
  r.rng = "cpu";
  auto res = ZImagePipeline(model).generate(r);
  ASSERT_TRUE(res) << res.status().message();
  ASSERT_EQ(res->images.size(), 1u);
  EXPECT_EQ(res->images[0].image.width, 128);
  EXPECT_NE(res->images[0].infotext.find("Steps: 5, Sampler: Euler"), std::string::npos) << res->images[0].infotext;
  EXPECT_NE(res->images[0].infotext.find("Seed: 1234"), std::string::npos);
  // The same request as the golden turbo run: the CPU generator's noise for seed 1234 gives its image.
  const Tensor ref = test::golden("zimage-tiny", "run.turbo.image");
  const std::vector<float> golden = ref.to_vector();
  const Image& img = res->images[0].image;
  double worst = 0;
  for (size_t i = 0; i < golden.size(); ++i) worst = std::max(worst, std::abs(double(img.pixels[i]) / 255.0 - golden[i]));
  EXPECT_LE(worst, 1.0 / 255.0 + 1e-6);  // 8-bit rounding
  const StageTimes& t = res->times;  // from the request's own trace ranges
  EXPECT_GT(t.denoise_s, 0);
  EXPECT_GE(t.total_s, t.text_encode_s + t.denoise_s + t.vae_s + t.image_encode_s);
  EXPECT_EQ(t.call_ms.size(), size_t(r.steps));
  EXPECT_EQ(res->images[0].info["timings"], t.to_json());
  r.width = 120;
  EXPECT_FALSE(ZImagePipeline(model).generate(r));  // not a multiple of 16
}

TEST(ZImagePipeline, OffloadDropsTheTextEncoderAndReloadsItForTheNextRequest) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto model = load(dir, false, /*offload=*/true);
  ASSERT_TRUE(model);
  EXPECT_TRUE(model->text_encoder->resident());  // loaded up front: errors show at load time
  GenerateRequest r;
  r.prompt = "a photo of an astronaut riding a horse on mars";
  r.negative_prompt = "blurry";
  r.width = r.height = 64;
  r.steps = 2;
  r.cfg_scale = 3.0f;  // two prompts: one load and drop of the encoder for both
  r.seed = int64_t(kSeed);
  r.rng = "cpu";
  const ZImagePipeline pipe(model);
  auto first = pipe.generate(r);
  ASSERT_TRUE(first) << first.status().message();
  EXPECT_FALSE(model->text_encoder->resident());
  auto second = pipe.generate(r);  // loaded again from the same files
  ASSERT_TRUE(second) << second.status().message();
  EXPECT_FALSE(model->text_encoder->resident());
  EXPECT_EQ(first->images[0].image.pixels, second->images[0].image.pixels);
  auto resident = ZImagePipeline(load(dir, false)).generate(r);
  ASSERT_TRUE(resident) << resident.status().message();
  EXPECT_EQ(resident->images[0].image.pixels, first->images[0].image.pixels);
}

}  // namespace
}  // namespace atelier
