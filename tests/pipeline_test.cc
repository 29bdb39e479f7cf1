// End-to-end goldens of sd15-tiny: the six 6-step txt2img runs (latents after every step and the final
// image) and img2img, through the diffusers folder and through the single-file checkpoint.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "core/rng.h"
#include "pipeline/sd_pipeline.h"
#include "sampling/sampler_names.h"
#include "sampling/scheduler_config.h"
#include "test_util.h"

namespace atelier {
namespace {

constexpr double kStepTol = 2e-5;    // rel L2 of the latents after each step
constexpr double kImageTol = 1e-3;   // max abs on the [0,1] image (fixtures README)

nlohmann::json case_json(const std::filesystem::path& dir) {
  std::ifstream f(dir / "case.json");  // holds Python's -Infinity: parse it the way scheduler configs are
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return sampling::parse_config_json(text).value();
}

std::shared_ptr<SdModel> load(const std::filesystem::path& dir, bool single_file) {
  SdLoadOptions o;
  o.compute_hash = false;
  if (single_file) o.tokenizer_dir = (dir / "model" / "tokenizer").string();
  auto m = load_sd_model(single_file ? (dir / "sd15-tiny.safetensors").string() : (dir / "model").string(), o);
  EXPECT_TRUE(m.has_value()) << m.status().message();
  return m.has_value() ? *m : nullptr;
}

// NCHW [B,3,H,W] -> NHWC values, to compare with the goldens' layout.
std::vector<float> nhwc(const Tensor& nchw) { return ops::contiguous(nchw.permute({0, 2, 3, 1})).to_vector(); }

struct RunCase {
  std::string name;
  bool single_file;
};
void PrintTo(const RunCase& c, std::ostream* os) { *os << c.name << (c.single_file ? " (single file)" : " (diffusers)"); }

class SdRun : public ::testing::TestWithParam<RunCase> {};

TEST_P(SdRun, MatchesDiffusersStepByStep) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const RunCase rc = GetParam();
  const auto cj = case_json(dir);
  const auto& run = cj["runs"][rc.name];
  auto model = load(dir, rc.single_file);
  ASSERT_TRUE(model);
  SdPipeline pipe(model);
  auto cond = pipe.encode_prompt(cj["prompt"], 1, false);
  auto uncond = pipe.encode_prompt(cj["negative_prompt"], 1, false);
  ASSERT_TRUE(cond && uncond);
  auto spec = sampling::parse_sampler(rc.name);
  ASSERT_TRUE(spec) << spec.status().message();
  // The model's own scheduler config + the sampler name, as the CLI does (the run's config is what that resolves to).
  auto sampler = sampling::make_sampler(model->scheduler_config, *spec, run["steps"].get<int>());
  ASSERT_TRUE(sampler) << sampler.status().message();
  TorchCpuGenerator ancestral(777);  // the fixture's scheduler generator
  (*sampler)->set_noise_source([&](const Shape& s) { return randn_tensor(ancestral, s); });
  const Tensor noise = test::golden("sd15-tiny", "noise.cpu.seed1234");
  Tensor x = ops::affine(noise, (*sampler)->init_noise_sigma());
  const Tensor steps = test::golden("sd15-tiny", "run." + rc.name + ".latents_per_step");
  double worst = 0;
  auto check = [&](const StepProgress& p) {
    const auto got = p.latents->to_vector();
    const auto want = steps.select(0, p.call - 1).to_vector();
    const double r = test::rel_l2(got, want);
    worst = std::max(worst, r);
    EXPECT_LE(r, kStepTol) << "step " << p.call;
    return true;
  };
  auto out = pipe.denoise({sampler->get()}, x, *cond, *uncond, run["guidance_scale"].get<float>(), 0, check, nullptr);
  ASSERT_TRUE(out) << out.status().message();
  const auto img = nhwc(pipe.decode(*out));
  const auto want = test::golden("sd15-tiny", "run." + rc.name + ".image").to_vector();
  const double mad = test::max_abs_diff(img, want);
  EXPECT_LE(mad, kImageTol);
  std::printf("[ figures ] %s %s: worst step rel L2 %.2e, image max abs %.2e\n", rc.name.c_str(),
              rc.single_file ? "single-file" : "diffusers", worst, mad);
}

INSTANTIATE_TEST_SUITE_P(
    SdTiny, SdRun,
    ::testing::Values(RunCase{"euler", false}, RunCase{"euler_a", false}, RunCase{"ddim", false},
                      RunCase{"dpmpp_2m", false}, RunCase{"dpmpp_2m_karras", false}, RunCase{"euler_karras", false},
                      RunCase{"euler", true}, RunCase{"euler_a", true}, RunCase{"ddim", true},
                      RunCase{"dpmpp_2m", true}, RunCase{"dpmpp_2m_karras", true}, RunCase{"euler_karras", true}),
    [](const auto& info) { return info.param.name + (info.param.single_file ? "_single_file" : "_diffusers"); });

class SdImg2Img : public ::testing::TestWithParam<bool> {};

TEST_P(SdImg2Img, MatchesDiffusers) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const auto cj = case_json(dir);
  const auto& c = cj["img2img"];
  auto model = load(dir, GetParam());
  ASSERT_TRUE(model);
  SdPipeline pipe(model);
  auto cond = pipe.encode_prompt(cj["prompt"], 1, false);
  auto uncond = pipe.encode_prompt(cj["negative_prompt"], 1, false);
  ASSERT_TRUE(cond && uncond);
  auto sampler = sampling::make_sampler(model->scheduler_config, "ddim", c["steps"].get<int>());
  ASSERT_TRUE(sampler) << sampler.status().message();
  ASSERT_TRUE((*sampler)->set_strength(c["strength"].get<double>()).is_ok());
  TorchCpuGenerator gen(99);
  const Tensor lat = pipe.encode_image(test::golden("sd15-tiny", "img2img.init"), gen);
  const Tensor noise = randn_tensor(gen, lat.shape());
  const auto rule = (*sampler)->noise_rule();
  const Tensor x = ops::lincomb({lat, noise}, {rule.x0, rule.noise});
  auto out = pipe.denoise({sampler->get()}, x, *cond, *uncond, c["guidance_scale"].get<float>(), 0, {}, nullptr);
  ASSERT_TRUE(out) << out.status().message();
  const auto img = nhwc(pipe.decode(*out));
  const double mad = test::max_abs_diff(img, test::golden("sd15-tiny", "img2img.image").to_vector());
  EXPECT_LE(mad, kImageTol);
  std::printf("[ figures ] img2img %s: image max abs %.2e\n", GetParam() ? "single-file" : "diffusers", mad);
}

INSTANTIATE_TEST_SUITE_P(SdTiny, SdImg2Img, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "single_file" : "diffusers"; });

// The whole request path (validation, seeds, noise from --rng cpu, sampler by name, PNG pixels).
TEST(SdGenerate, RequestReproducesEulerRun) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const auto cj = case_json(dir);
  auto model = load(dir, false);
  ASSERT_TRUE(model);
  SdPipeline pipe(model);
  GenerateRequest r;
  r.prompt = cj["prompt"];
  r.negative_prompt = cj["negative_prompt"];
  r.width = r.height = 128;
  r.steps = 6;
  r.cfg_scale = 7.5f;
  r.sampler = "Euler";
  r.seed = 1234;
  r.rng = "cpu";
  auto res = pipe.generate(r);
  ASSERT_TRUE(res) << res.status().message();
  ASSERT_EQ(res->images.size(), 1u);
  const Image& img = res->images[0].image;
  ASSERT_EQ(img.width, 128);
  const auto want = test::golden("sd15-tiny", "run.euler.image").to_vector();
  int worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const int expect = int(std::nearbyint(want[i] * 255.0f));
    worst = std::max(worst, std::abs(int(img.pixels[i]) - expect));
  }
  EXPECT_LE(worst, 1) << "pixel values differ from round(255 x) of the golden image";
  EXPECT_NE(res->images[0].infotext.find("Sampler: Euler, "), std::string::npos) << res->images[0].infotext;
  EXPECT_NE(res->images[0].infotext.find("Seed: 1234"), std::string::npos);
  // The request's stage times, from its own trace ranges: each stage ran, they fit in the whole, one model call per
  // Euler step (the guided rows in one batch), and each image's info carries them.
  const StageTimes& t = res->times;
  EXPECT_GT(t.text_encode_s, 0);
  EXPECT_GT(t.denoise_s, 0);
  EXPECT_GT(t.vae_s, 0);
  EXPECT_GE(t.total_s, t.text_encode_s + t.denoise_s + t.vae_s + t.image_encode_s);
  EXPECT_EQ(t.call_ms.size(), size_t(r.steps));
  EXPECT_EQ(res->images[0].info["timings"], t.to_json());
}

TEST(SdGenerate, RejectsBadRequests) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto model = load(dir, false);
  ASSERT_TRUE(model);
  SdPipeline pipe(model);
  auto expect_error = [&](GenerateRequest r, const std::string& needle) {
    auto res = pipe.generate(r);
    ASSERT_FALSE(res.has_value()) << needle;
    EXPECT_NE(res.status().message().find(needle), std::string::npos) << res.status().message();
  };
  GenerateRequest ok;
  ok.width = ok.height = 64;
  ok.steps = 1;
  GenerateRequest r = ok;
  r.width = 100;
  expect_error(r, "multiple of 8");
  r = ok;
  r.steps = -3;
  expect_error(r, "steps");
  r = ok;
  r.sampler = "warp_drive";
  expect_error(r, "euler");
  r = ok;
  r.clip_skip = 9;
  expect_error(r, "clip skip");
  r = ok;
  r.steps = 4;  // int(4 x 0.75) = 3 steps of img2img at the default strength (1 step would leave none)
  r.init_image = "/nonexistent/image.png";
  expect_error(r, "/nonexistent/image.png");
  r.strength = 0.2;  // int(4 x 0.2) = 0 steps: refused before the image is even read
  expect_error(r, "leaves no step to run");
}

TEST(SdGenerate, SingleFileWithoutTokenizerSaysWhatToPass) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  SdLoadOptions o;
  o.compute_hash = false;
  auto m = load_sd_model((dir / "sd15-tiny.safetensors").string(), o);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.status().message().find("--tokenizer"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace atelier

namespace atelier {
namespace {

// A1111 emphasis is opt-in: without brackets it changes nothing; "(word:1.5)" changes the conditioning,
// and with emphasis off the brackets are literal text (different tokens again).
TEST(SdGenerate, EmphasisIsOptInAndChangesOnlyWeightedPrompts) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto model = load(dir, false);
  ASSERT_TRUE(model);
  SdPipeline pipe(model);
  auto plain = pipe.encode_prompt("a red circle", 1, false);
  auto plain_emph = pipe.encode_prompt("a red circle", 1, true);
  ASSERT_TRUE(plain && plain_emph);
  EXPECT_LE(test::rel_l2(plain_emph->to_vector(), plain->to_vector()), 1e-7);
  auto weighted = pipe.encode_prompt("a (red:1.5) circle", 1, true);
  auto literal = pipe.encode_prompt("a (red:1.5) circle", 1, false);
  ASSERT_TRUE(weighted && literal);
  EXPECT_GT(test::rel_l2(weighted->to_vector(), plain->to_vector()), 1e-3);
  EXPECT_GT(test::rel_l2(literal->to_vector(), weighted->to_vector()), 1e-3);
}

// The server's batched admission: several prompts in one text-encoder call give each prompt what encoding it
// alone gives (weighted and plain, the empty prompt, a repeated one), in the order asked.
TEST(SdGenerate, PromptsEncodedTogetherMatchOneAtATime) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto model = load(dir, false);
  ASSERT_TRUE(model);
  SdPipeline pipe(model);
  const std::vector<std::string> texts = {"a red circle", "a (red:1.5) circle", "", "blurry, low quality", "a red circle"};
  for (bool emphasis : {false, true}) {
    auto together = pipe.encode_prompts(texts, 1, emphasis);
    ASSERT_TRUE(together) << together.status().message();
    ASSERT_EQ(together->size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      auto alone = pipe.encode_prompt(texts[i], 1, emphasis);
      ASSERT_TRUE(alone);
      EXPECT_EQ((*together)[i].shape(), alone->shape()) << texts[i];
      EXPECT_LE(test::rel_l2((*together)[i].to_vector(), alone->to_vector()), 1e-6) << "'" << texts[i] << "' emphasis " << emphasis;
    }
    // Each row is its own text's (not a neighbour's): the second prompt differs from the first.
    const double d = test::rel_l2((*together)[1].to_vector(), (*together)[0].to_vector());
    EXPECT_GT(d, 1e-3);
  }
  EXPECT_FALSE(pipe.encode_prompts({"a (red:1.5", "ok"}, 9, true).has_value());  // clip skip 9: a clear error
}

}  // namespace
}  // namespace atelier
