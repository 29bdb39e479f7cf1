// The FLUX pipeline against the flux-tiny run (4 steps, 128x128, guidance 3.5, T5 length 32, noise from a
// CPU generator seeded 1234): prompt encoding, 2x2 packing, sigmas, the latents after every step and the final
// image, through the diffusers folder and through the original single files (BFL transformer, ae.safetensors,
// text encoders given as folders); plus model detection and the end-to-end generate().
#include <algorithm>
#include <cmath>
#include <iostream>

#include "core/rng.h"
#include "pipeline/flux_pipeline.h"
#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

constexpr double kComponentTol = 1e-5;
constexpr double kImageMaxAbs = 1e-3;
constexpr int kSteps = 4;
constexpr int kSide = 128;
constexpr int kMaxSeq = 32;
constexpr int kSeed = 1234;
constexpr float kGuidance = 3.5f;
const char* const kPrompt = "a photo of an astronaut riding a horse on mars";

double report(const std::string& what, const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.numel(), want.numel()) << what;
  const auto a = got.to_vector(), b = want.to_vector();
  const double r = test::rel_l2(a, b);
  std::cout << "[flux] " << what << ": rel L2 " << r << ", max abs " << test::max_abs_diff(a, b) << "\n";
  return r;
}

std::shared_ptr<FluxModel> load_folder(const fs::path& dir) {
  FluxLoadOptions o;
  return load_flux_model((dir / "model").string(), o).value();
}

std::shared_ptr<FluxModel> load_single_files(const fs::path& dir) {
  FluxLoadOptions o;
  o.vae = (dir / "flux-tiny-ae.safetensors").string();
  o.clip_l = (dir / "model/text_encoder").string();
  o.t5 = (dir / "model/text_encoder_2").string();
  return load_flux_model((dir / "flux-tiny-transformer.bfl.safetensors").string(), o).value();
}

// Every stage of the run against its golden.
void check_run(const std::shared_ptr<FluxModel>& model, const std::string& label) {
  const FluxPipeline pipe(model);
  const FluxPrompt p = pipe.encode_prompt(kPrompt, kMaxSeq).value();
  EXPECT_LE(report(label + " T5 states", p.t5, test::golden("flux-tiny", "text.t5")), kComponentTol);
  EXPECT_LE(report(label + " CLIP pooled", p.pooled, test::golden("flux-tiny", "text.clip_pooled")), kComponentTol);

  const int64_t h = kSide / 8, w = kSide / 8;
  const Tensor noise = test::golden("flux-tiny", "noise.cpu.seed1234");
  auto gen = make_generator(RngKind::kCpu, kSeed);
  EXPECT_EQ(randn_tensor(*gen, noise.shape()).to_vector(), noise.to_vector());
  const Tensor x0 = flux_pack_latents(noise);
  EXPECT_EQ(flux_unpack_latents(x0, h, w).to_vector(), noise.to_vector());

  auto sched = pipe.make_scheduler(kSteps, h, w).value();
  EXPECT_EQ(sched.sigmas(), test::golden("flux-tiny", "run.flux_euler.sigmas").to_vector());
  std::vector<Tensor> per_step;
  auto capture = [&](const StepProgress& sp) {
    per_step.push_back(ops::clone(*sp.latents));
    return true;
  };
  const Tensor x = pipe.denoise(sched, x0, p, nullptr, {kGuidance}, 1.0f, h, w, 0, capture).value();
  const Tensor want_steps = test::golden("flux-tiny", "run.flux_euler.latents_per_step");
  ASSERT_EQ(int(per_step.size()), kSteps);
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_LE(report(label + " latents after step " + std::to_string(i + 1), per_step[size_t(i)], want_steps.select(0, i)),
              kComponentTol);
  }
  const Tensor img = ops::contiguous(pipe.decode(x, h, w).permute({0, 2, 3, 1}));  // NHWC as the golden
  const Tensor want_img = test::golden("flux-tiny", "run.flux_euler.image");
  EXPECT_LE(report(label + " final image", img, want_img), kComponentTol);
  EXPECT_LE(test::max_abs_diff(img.to_vector(), want_img.to_vector()), kImageMaxAbs);
}

TEST(FluxPipelineGolden, DiffusersFolder) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  check_run(load_folder(dir), "diffusers");
}

TEST(FluxPipelineGolden, OriginalSingleFiles) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  check_run(load_single_files(dir), "single files");
}

TEST(FluxPipeline, PackingLayout) {
  // [1, 1, 2, 4]: two 2x2 patches side by side; each packed row lists its patch row-major.
  const Tensor x = Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7}, {1, 1, 2, 4});
  const Tensor p = flux_pack_latents(x);
  EXPECT_EQ(p.shape(), (Shape{1, 2, 4}));
  EXPECT_EQ(p.to_vector(), (std::vector<float>{0, 1, 4, 5, 2, 3, 6, 7}));
  EXPECT_EQ(flux_image_ids(4, 4).to_vector(),
            (std::vector<float>{0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 1, 1}));
}

TEST(FluxPipeline, DetectsModels) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  EXPECT_TRUE(is_flux_model((dir / "model").string()));
  EXPECT_TRUE(is_flux_model((dir / "flux-tiny-transformer.bfl.safetensors").string()));
  EXPECT_FALSE(is_flux_model((dir / "flux-tiny-ae.safetensors").string()));
  EXPECT_FALSE(is_flux_model((dir / "missing").string()));
  if (auto sd = test::fixture("sd15-tiny")) EXPECT_FALSE(is_flux_model((*sd / "model").string()));
  // A BFL file alone names what else it needs.
  auto m = load_flux_model((dir / "flux-tiny-transformer.bfl.safetensors").string());
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.status().message().find("--vae"), std::string::npos) << m.status().message();
}

TEST(FluxPipeline, OffloadDropsTheTextEncodersAndReloadsThemForTheNextPrompt) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  FluxLoadOptions lo;
  lo.offload = true;
  auto model = load_flux_model((dir / "model").string(), lo).value();
  ASSERT_TRUE(model->t5 && model->clip);  // loaded up front: errors show at load time
  const FluxPipeline pipe(model);
  GenerateRequest r;
  r.prompt = kPrompt;
  r.width = r.height = kSide;
  r.steps = 1;
  r.seed = kSeed;
  r.rng = "cpu";
  FluxOptions o;
  o.max_sequence_length = kMaxSeq;
  const GenerateResult first = pipe.generate(r, o).value();
  EXPECT_FALSE(model->t5.has_value());  // gone after encoding
  EXPECT_FALSE(model->clip.has_value());
  const GenerateResult second = pipe.generate(r, o).value();  // reloaded from the same files
  EXPECT_FALSE(model->t5.has_value());
  EXPECT_EQ(first.images[0].image.pixels, second.images[0].image.pixels);
  // The same image as a model that keeps its encoders.
  const FluxPipeline resident(load_folder(dir));
  EXPECT_EQ(resident.generate(r, o).value().images[0].image.pixels, first.images[0].image.pixels);
}

TEST(FluxPipeline, GenerateEndToEnd) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const FluxPipeline pipe(load_folder(dir));
  GenerateRequest r;
  r.prompt = kPrompt;
  r.width = r.height = kSide;
  r.steps = kSteps;
  r.seed = kSeed;
  r.rng = "cpu";
  FluxOptions o;
  o.max_sequence_length = kMaxSeq;
  const GenerateResult res = pipe.generate(r, o).value();
  ASSERT_EQ(res.images.size(), 1u);
  const Image& img = res.images[0].image;
  ASSERT_EQ(img.width, kSide);
  const auto want = test::golden("flux-tiny", "run.flux_euler.image").to_vector();
  int worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(int(img.pixels[i]) - int(std::lround(want[i] * 255.0f))));
  }
  EXPECT_LE(worst, 1);
  EXPECT_NE(res.images[0].infotext.find("Distilled CFG Scale: 3.5"), std::string::npos) << res.images[0].infotext;
  EXPECT_GT(res.times.denoise_s, 0);  // from the request's own trace ranges
  EXPECT_GE(res.times.total_s, res.times.text_encode_s + res.times.denoise_s + res.times.vae_s);
  EXPECT_EQ(res.times.call_ms.size(), size_t(r.steps));
  EXPECT_EQ(res.images[0].info["timings"], res.times.to_json());
  r.width = 120;
  EXPECT_FALSE(pipe.generate(r, o).has_value());  // not a multiple of 16
}

// Requests denoised as one batch (the server's FLUX batching): each gets the image generate() gives it alone, though
// its batch-mates differ in prompt, seed, guidance and image count, with its own infotext; requests that cannot share
// model calls are refused.
TEST(FluxPipeline, BatchOfRequestsGivesEachItsOwnImages) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const FluxPipeline pipe(load_folder(dir));
  std::vector<FluxBatchItem> items(3);
  const char* prompts[] = {kPrompt, "a red circle on a blue background", kPrompt};
  for (int i = 0; i < 3; ++i) {
    GenerateRequest& r = items[i].request;
    r.prompt = prompts[i];
    r.width = 64, r.height = 48;
    r.steps = 2;
    r.seed = kSeed + 10 * i;
    r.rng = i == 1 ? "cpu" : "cuda";
    r.batch_size = i == 2 ? 2 : 1;
    items[i].options.max_sequence_length = kMaxSeq;
    items[i].options.guidance = 1.5f + float(i);
  }
  int calls = 0;
  const auto batched = pipe.generate_batch(items, [&](const StepProgress& p) {
    ++calls;
    EXPECT_EQ(p.latents->size(0), 4);  // 1 + 1 + 2 rows in every call
    return true;
  });
  ASSERT_TRUE(batched) << batched.status().message();
  EXPECT_EQ(calls, 2);
  ASSERT_EQ(batched->size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const GenerateResult alone = pipe.generate(items[i].request, items[i].options).value();
    const GenerateResult& got = (*batched)[i];
    ASSERT_EQ(got.images.size(), alone.images.size()) << i;
    for (size_t k = 0; k < alone.images.size(); ++k) {
      ASSERT_EQ(got.images[k].image.pixels.size(), alone.images[k].image.pixels.size());
      // 8-bit rounding at most: the BLAS sees another M in a batch
      EXPECT_LE(test::max_pixel_diff(got.images[k].image, alone.images[k].image), 1) << "request " << i << " image " << k;
      EXPECT_EQ(got.images[k].seed, alone.images[k].seed);
      EXPECT_EQ(got.images[k].infotext, alone.images[k].infotext);
    }
  }
  EXPECT_NE((*batched)[0].images[0].image.pixels, (*batched)[2].images[0].image.pixels);  // guidance and noise differ
  for (const GenerateResult& got : *batched) {  // one batch, one set of stage times, in every image's info
    EXPECT_EQ(got.times.call_ms.size(), 2u);
    for (const GeneratedImage& g : got.images) EXPECT_EQ(g.info["timings"], (*batched)[0].times.to_json());
  }

  std::vector<FluxBatchItem> mixed = {items[0], items[1]};
  mixed[1].request.steps = 3;
  EXPECT_FALSE(pipe.batch_compatible(mixed[0], mixed[1]));
  const auto refused = pipe.generate_batch(mixed);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("steps"), std::string::npos) << refused.status().message();
  mixed[1] = items[1];
  mixed[1].request.cfg_scale = 4.0f;
  mixed[1].options.cfg_explicit = true;  // true CFG for one and not the other
  EXPECT_FALSE(pipe.batch_compatible(mixed[0], mixed[1]));
  mixed[1] = items[1];
  mixed[1].request.batch_count = 2;
  EXPECT_FALSE(pipe.batch_compatible(mixed[0], mixed[1]));
  mixed[1] = items[1];
  mixed[1].request.width = 0;  // the model's default size (not 64)
  EXPECT_FALSE(pipe.batch_compatible(mixed[0], mixed[1]));
}

}  // namespace
}  // namespace atelier
