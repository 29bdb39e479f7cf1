// img2img (and FLUX inpainting, at the end) on the diffusion transformers. FLUX (FluxImg2ImgPipeline's semantics) on the flux-tiny model: the run takes the last int(steps x strength)
// steps of the txt2img schedule, starting from the init image's VAE sample noised to that step's sigma (the sample
// drawn from the image's generator before the noise); it stays near the image where little strength is asked and
// txt2img of the same seed does not; strengths that leave no step, and batches mixing img2img with txt2img or two
// strengths, are refused. Z-Image (ZImageImg2ImgPipeline's) the same way on zimage-tiny, at the image's size by default.
// No diffusers fixture holds a DiT img2img run: exactness rests on the parts' own goldens (VAE encode through SD's
// img2img golden, the schedules, the denoise loops), composed as these tests compose them.
#include <cmath>
#include <iostream>

#include "backend/ops.h"
#include "core/rng.h"
#include "pipeline/flux_pipeline.h"
#include "pipeline/init_image.h"
#include "pipeline/zimage_pipeline.h"
#include "sampling/sampler.h"
#include "test_util.h"

namespace atelier {
namespace {

constexpr int kSide = 64;
constexpr int kSeed = 77;
constexpr int kMaxSeq = 32;
const char* const kPrompt = "a red circle on a blue background";

// A smooth picture: red across, green down, blue constant.
Image gradient_image(int side) {
  Image img{side, side, 3, std::vector<uint8_t>(size_t(side * side * 3))};
  for (int y = 0; y < side; ++y)
    for (int x = 0; x < side; ++x) {
      uint8_t* p = &img.pixels[size_t((y * side + x) * 3)];
      p[0] = uint8_t(255 * x / (side - 1)), p[1] = uint8_t(255 * y / (side - 1)), p[2] = 96;
    }
  return img;
}

GenerateRequest request(int steps, float strength) {
  GenerateRequest r;
  r.prompt = kPrompt;
  r.width = r.height = kSide;
  r.steps = steps;
  r.strength = strength;
  r.seed = kSeed;
  r.rng = "cpu";
  return r;
}

FluxOptions options() {
  FluxOptions o;
  o.max_sequence_length = kMaxSeq;
  return o;
}

double mean_abs_diff(const Image& a, const Image& b) {
  double sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) sum += std::abs(int(a.pixels[i]) - int(b.pixels[i]));
  return sum / double(a.pixels.size());
}

TEST(FluxImg2Img, RunsTheLastStepsFromTheNoisedImageSample) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const auto model = load_flux_model((dir / "model").string(), FluxLoadOptions{}).value();
  const FluxPipeline pipe(model);
  const Image init = gradient_image(kSide);
  constexpr int kSteps = 10;
  constexpr float kStrength = 0.3f;
  const int run = sampling::img2img_steps(kSteps, kStrength);
  ASSERT_EQ(run, 3);
  int calls = 0;
  const GenerateResult got = pipe.generate(request(kSteps, kStrength), options(), [&](const StepProgress& p) {
    ++calls;
    EXPECT_EQ(p.total_calls, run);
    return true;
  }, &init).value();
  EXPECT_EQ(calls, run);
  ASSERT_EQ(got.images.size(), 1u);
  EXPECT_NE(got.images[0].infotext.find("Denoising strength: 0.3"), std::string::npos) << got.images[0].infotext;

  // The same run from the stages: the image's sample and then the noise from the seed's generator, scale_noise at
  // the first step the strength leaves, the denoise from there.
  const int64_t h = kSide / 8, w = kSide / 8;
  GenerateRequest sized = request(kSteps, kStrength);
  const Tensor image01 = init_image_tensor(init, sized, kFluxSizeMultiple, "init").value();
  auto gen = make_generator(RngKind::kCpu, kSeed);
  const Tensor x0 = vae_encode_sample(*model->vae, image01, *gen, Device::cpu());
  const Tensor noise = randn_tensor(*gen, {1, model->vae->config().latent_channels, h, w});
  auto sched = pipe.make_scheduler(kSteps, h, w).value();
  ASSERT_TRUE(sched.set_begin_index(kSteps - run).is_ok());
  const Tensor start = flux_pack_latents(sched.scale_noise(x0, noise));
  const FluxPrompt p = pipe.encode_prompt(kPrompt, kMaxSeq).value();
  const Tensor x = pipe.denoise(sched, start, p, nullptr, {kFluxDefaultGuidance}, 1.0f, h, w, 0, {}).value();
  const Image staged = image_from_tensor(pipe.decode(x, h, w), 0);
  EXPECT_LE(test::max_pixel_diff(got.images[0].image, staged), 1);
}

// With one step of twenty left the image is mostly kept: the final latents are far nearer the init image's VAE sample than
// txt2img's of the same seed are (a start from pure noise, or a sample scaled, shifted or packed wrongly, is not).
TEST(FluxImg2Img, LittleStrengthKeepsTheImage) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const auto model = load_flux_model((dir / "model").string(), FluxLoadOptions{}).value();
  const FluxPipeline pipe(model);
  const Image init = gradient_image(kSide);
  const auto final_latents = [&](const Image* image) {
    Tensor last;
    const auto r = pipe.generate(request(20, 0.05f), options(), [&](const StepProgress& p) {
      last = ops::clone(*p.latents);
      return true;
    }, image);
    EXPECT_TRUE(r.has_value());
    return flux_unpack_latents(last, kSide / 8, kSide / 8).to_vector();
  };
  const std::vector<float> kept = final_latents(&init), fresh = final_latents(nullptr);  // nullptr: txt2img
  GenerateRequest sized = request(20, 0.05f);
  auto gen = make_generator(RngKind::kCpu, kSeed);
  const Tensor x0 = vae_encode_sample(*model->vae, init_image_tensor(init, sized, kFluxSizeMultiple, "init").value(), *gen,
                                      Device::cpu());
  const double kept_dist = test::rel_l2(kept, x0.to_vector()), fresh_dist = test::rel_l2(fresh, x0.to_vector());
  std::cout << "[flux img2img] rel L2 of the final latents to the image's sample: strength 0.05 " << kept_dist
            << ", txt2img " << fresh_dist << "\n";
  EXPECT_LT(kept_dist, 0.5);
  EXPECT_GT(fresh_dist, 4 * kept_dist);
}

TEST(FluxImg2Img, RefusesStrengthsWithoutStepsAndMixedBatches) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const FluxPipeline pipe(load_flux_model((dir / "model").string(), FluxLoadOptions{}).value());
  const Image init = gradient_image(kSide);
  for (const float strength : {0.0f, 0.05f, 1.5f}) {  // 0.05 x 10 steps leaves none
    const auto r = pipe.generate(request(10, strength), options(), {}, &init);
    ASSERT_FALSE(r.has_value()) << strength;
    EXPECT_NE(r.status().message().find("strength"), std::string::npos) << r.status().message();
  }
  FluxBatchItem a{request(4, 0.5f), options(), &init}, b = a;
  EXPECT_TRUE(pipe.batch_compatible(a, b));
  b.request.strength = 0.75f;
  EXPECT_FALSE(pipe.batch_compatible(a, b));
  b = a;
  b.init_image = nullptr;  // txt2img beside img2img
  EXPECT_FALSE(pipe.batch_compatible(a, b));
  const auto mixed = pipe.generate_batch({a, b});
  ASSERT_FALSE(mixed.has_value());
  EXPECT_NE(mixed.status().message().find("img2img"), std::string::npos) << mixed.status().message();
}

std::shared_ptr<const ZImageModel> load_zimage(const std::filesystem::path& dir) {
  ZImageLoadOptions o;
  o.max_sequence_length = kMaxSeq;
  return load_zimage_model((dir / "model").string(), o).value();
}

// Z-Image: the last int(steps x strength) steps from the image's sample noised to that step's sigma, at the image's
// size when none is asked for (rounded down to multiples of 16); the same run composed from the stages.
TEST(ZImageImg2Img, RunsTheLastStepsAtTheImagesSize) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  const auto model = load_zimage(dir);
  const ZImagePipeline pipe(model);
  const Image init = gradient_image(kSide + 8);  // 72x72: runs at 64x64
  GenerateRequest r = request(8, 0.5f);
  r.width = r.height = 0;
  r.cfg_scale = 0.0f;
  int calls = 0;
  const auto got = pipe.generate(r, [&](const StepProgress& p) {
    ++calls;
    EXPECT_EQ(p.total_calls, 4);
    return true;
  }, &init);
  ASSERT_TRUE(got.has_value()) << got.status().message();
  EXPECT_EQ(calls, 4);
  const Image& img = got->images[0].image;
  EXPECT_EQ(img.width, kSide);
  EXPECT_EQ(img.height, kSide);
  EXPECT_NE(got->images[0].infotext.find("Denoising strength: 0.5"), std::string::npos) << got->images[0].infotext;

  GenerateRequest sized = r;
  const Tensor image01 = init_image_tensor(init, sized, 16, "init").value();
  auto gen = make_generator(RngKind::kCpu, kSeed);
  const Tensor x0 = vae_encode_sample(*model->vae, image01, *gen, Device::cpu());
  const Tensor noise = randn_tensor(*gen, x0.shape());
  auto sched = pipe.make_scheduler(8, kSide / 8, kSide / 8).value();
  ASSERT_TRUE(sched.set_begin_index(4).is_ok());
  const Tensor start = sched.scale_noise(x0, noise);
  const Tensor cond = pipe.encode_prompt(kPrompt).value();
  const Tensor x = pipe.denoise(start, cond, Tensor(), 0.0f, 8, nullptr, {}, 4).value();
  EXPECT_LE(test::max_pixel_diff(img, image_from_tensor(pipe.decode(x).value(), 0)), 1);

  r.strength = 0.1f;  // 8 steps x 0.1 leaves none
  EXPECT_FALSE(pipe.generate(r, {}, &init).has_value());
}


// FLUX inpainting (FluxInpaintPipeline's semantics): the latent mask (resized, binarized, nearest), a white mask giving
// img2img exactly, and after every step the kept latents being the image's latents noised to the next sigma with the
// initial noise (the latents themselves after the last), the repainted ones not.
constexpr int kInpaintSteps = 6;
constexpr float kInpaintStrength = 0.7f;

// White (`top`) over the top `rows` rows, `bottom` below.
Image mask(int rows, uint8_t top = 255, uint8_t bottom = 0) {
  Image m{kSide, kSide, 1, std::vector<uint8_t>(size_t(kSide) * kSide, bottom)};
  std::fill(m.pixels.begin(), m.pixels.begin() + rows * kSide, top);
  return m;
}

std::vector<float> rows_of(const Tensor& t, int64_t from, int64_t n) { return ops::contiguous(t.narrow(2, from, n)).to_vector(); }

// after[k]: the unpacked latents [1, C, h, w] after step k of a run whose mask repaints the top half. From `sched` at
// the run's first step: the bottom (kept) rows after each step are the image's latents x0 noised to the next sigma with
// `noise` (x0 itself after the last), the top rows are not.
void expect_kept_rows_follow(const std::vector<Tensor>& after, sampling::FlowMatchEuler sched, const Tensor& x0,
                             const Tensor& noise) {
  const int64_t h = x0.size(2);
  for (size_t k = 0; k < after.size(); ++k) {
    sched.advance();
    const Tensor proper = sched.done() ? x0 : sched.scale_noise(x0, noise);
    EXPECT_LE(test::max_abs_diff(rows_of(after[k], h / 2, h / 2), rows_of(proper, h / 2, h / 2)), 1e-6) << k;
    EXPECT_GT(test::max_abs_diff(rows_of(after[k], 0, h / 2), rows_of(proper, 0, h / 2)), 1e-3) << k;
  }
}

TEST(FluxInpaint, LatentMaskIsResizedBinarizedAndNearest) {
  const Tensor m = binarized_latent_mask(mask(kSide / 2), kSide, kSide, 8, 8, 1);
  ASSERT_EQ(m.shape(), (Shape{1, 1, 8, 8}));
  const std::vector<float> v = m.to_vector();
  for (int y = 0; y < 8; ++y) EXPECT_EQ(v[size_t(y * 8 + 3)], y < 4 ? 1.0f : 0.0f) << y;
  const std::vector<float> two = binarized_latent_mask(mask(kSide / 2), kSide, kSide, 8, 8, 2).to_vector();
  EXPECT_EQ(std::vector<float>(two.begin() + 64, two.end()), v);  // every channel alike
  // Binarized at 0.5: 127 is kept, 128 repainted.
  EXPECT_EQ(binarized_latent_mask(mask(kSide, 127), kSide, kSide, 8, 8, 1).to_vector()[0], 0.0f);
  EXPECT_EQ(binarized_latent_mask(mask(kSide, 128), kSide, kSide, 8, 8, 1).to_vector()[0], 1.0f);
}

TEST(FluxInpaint, WhiteMaskIsImg2ImgExactly) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const FluxPipeline pipe(load_flux_model((dir / "model").string(), FluxLoadOptions{}).value());
  const Image init = gradient_image(kSide), white = mask(kSide);
  const auto img2img = pipe.generate(request(kInpaintSteps, kInpaintStrength), options(), {}, &init).value();
  const auto inpainted = pipe.generate(request(kInpaintSteps, kInpaintStrength), options(), {}, &init, &white).value();
  EXPECT_EQ(inpainted.images[0].image.pixels, img2img.images[0].image.pixels);
  EXPECT_EQ(inpainted.images[0].info["inpainting"], "FluxInpaintPipeline");
}

TEST(FluxInpaint, KeptLatentsFollowTheNoisedImage) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const auto model = load_flux_model((dir / "model").string(), FluxLoadOptions{}).value();
  const FluxPipeline pipe(model);
  const Image init = gradient_image(kSide), top = mask(kSide / 2);  // the top half repainted: latent rows 0-3 of 8
  const int64_t h = kSide / 8, w = kSide / 8;
  std::vector<Tensor> after;  // the unpacked latents after each step
  ASSERT_TRUE(pipe.generate(request(kInpaintSteps, kInpaintStrength), options(), [&](const StepProgress& p) {
    after.push_back(flux_unpack_latents(ops::clone(*p.latents), h, w));
    return true;
  }, &init, &top).has_value());
  const int run = sampling::img2img_steps(kInpaintSteps, kInpaintStrength);
  ASSERT_EQ(int(after.size()), run);
  // The image's latents and the noise as the pipeline draws them (img2img's order), and the sigmas the steps reach.
  GenerateRequest sized = request(kInpaintSteps, kInpaintStrength);
  auto gen = make_generator(RngKind::kCpu, kSeed);
  const Tensor x0 = vae_encode_sample(*model->vae, init_image_tensor(init, sized, kFluxSizeMultiple, "init").value(), *gen,
                                      Device::cpu());
  const Tensor noise = randn_tensor(*gen, x0.shape());
  auto sched = pipe.make_scheduler(kInpaintSteps, h, w).value();
  ASSERT_TRUE(sched.set_begin_index(kInpaintSteps - run).is_ok());
  expect_kept_rows_follow(after, sched, x0, noise);
}

// Z-Image inpainting, with FLUX's semantics: the kept latents after every step are the image's latents noised to the
// next sigma with the initial noise (its own latents after the last); a white mask is img2img exactly.
TEST(ZImageInpaint, KeptLatentsFollowTheNoisedImage) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  const auto model = load_zimage(dir);
  const ZImagePipeline pipe(model);
  const Image init = gradient_image(kSide), top = mask(kSide / 2), white = mask(kSide);
  GenerateRequest r = request(kInpaintSteps, kInpaintStrength);
  r.cfg_scale = 0.0f;
  const int64_t h = kSide / 8;
  std::vector<Tensor> after;
  ASSERT_TRUE(pipe.generate(r, [&](const StepProgress& p) {
    after.push_back(ops::clone(*p.latents));
    return true;
  }, &init, &top).has_value());
  const int run = sampling::img2img_steps(kInpaintSteps, kInpaintStrength);
  ASSERT_EQ(int(after.size()), run);
  GenerateRequest sized = r;
  auto gen = make_generator(RngKind::kCpu, kSeed);
  const Tensor x0 = vae_encode_sample(*model->vae, init_image_tensor(init, sized, 16, "init").value(), *gen, Device::cpu());
  const Tensor noise = randn_tensor(*gen, x0.shape());
  auto sched = pipe.make_scheduler(kInpaintSteps, h, h).value();
  ASSERT_TRUE(sched.set_begin_index(kInpaintSteps - run).is_ok());
  expect_kept_rows_follow(after, sched, x0, noise);
  const auto img2img = pipe.generate(r, {}, &init).value(), whole = pipe.generate(r, {}, &init, &white).value();
  EXPECT_EQ(whole.images[0].image.pixels, img2img.images[0].image.pixels);
}

}  // namespace
}  // namespace atelier
