// FLUX inpainting (FluxInpaintPipeline's semantics) on the flux-tiny model: the latent mask (resized, binarized,
// nearest), a white mask giving img2img exactly, and after every step the kept latents being the image's latents
// noised to the next sigma with the initial noise (the latents themselves after the last), the repainted ones not.
#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/rng.h"
#include "pipeline/flux_pipeline.h"
#include "pipeline/init_image.h"
#include "sampling/sampler.h"
#include "test_util.h"

namespace atelier {
namespace {

constexpr int kSide = 64;
constexpr int kSeed = 5;
constexpr int kSteps = 6;
constexpr float kStrength = 0.7f;

Image picture() {
  Image img{kSide, kSide, 3, std::vector<uint8_t>(size_t(kSide) * kSide * 3)};
  for (int y = 0; y < kSide; ++y)
    for (int x = 0; x < kSide; ++x) {
      uint8_t* p = &img.pixels[(size_t(y) * kSide + x) * 3];
      p[0] = uint8_t(4 * x), p[1] = uint8_t(4 * y), p[2] = 90;
    }
  return img;
}

// White (`top`) over the top `rows` rows, `bottom` below.
Image mask(int rows, uint8_t top = 255, uint8_t bottom = 0) {
  Image m{kSide, kSide, 1, std::vector<uint8_t>(size_t(kSide) * kSide, bottom)};
  std::fill(m.pixels.begin(), m.pixels.begin() + rows * kSide, top);
  return m;
}

GenerateRequest request() {
  GenerateRequest r;
  r.prompt = "a red circle";
  r.width = r.height = kSide;
  r.steps = kSteps;
  r.strength = kStrength;
  r.seed = kSeed;
  r.rng = "cpu";
  return r;
}

FluxOptions options() {
  FluxOptions o;
  o.max_sequence_length = 32;
  return o;
}

std::vector<float> rows_of(const Tensor& t, int64_t from, int64_t n) { return ops::contiguous(t.narrow(2, from, n)).to_vector(); }

TEST(FluxInpaint, LatentMaskIsResizedBinarizedAndNearest) {
  const Tensor m = flux_latent_mask(mask(kSide / 2), kSide, kSide, 8, 8);
  ASSERT_EQ(m.shape(), (Shape{1, 1, 8, 8}));
  const std::vector<float> v = m.to_vector();
  for (int y = 0; y < 8; ++y) EXPECT_EQ(v[size_t(y * 8 + 3)], y < 4 ? 1.0f : 0.0f) << y;
  // Binarized at 0.5: 127 is kept, 128 repainted.
  EXPECT_EQ(flux_latent_mask(mask(kSide, 127), kSide, kSide, 8, 8).to_vector()[0], 0.0f);
  EXPECT_EQ(flux_latent_mask(mask(kSide, 128), kSide, kSide, 8, 8).to_vector()[0], 1.0f);
}

TEST(FluxInpaint, WhiteMaskIsImg2ImgExactly) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const FluxPipeline pipe(load_flux_model((dir / "model").string(), FluxLoadOptions{}).value());
  const Image init = picture(), white = mask(kSide);
  const auto img2img = pipe.generate(request(), options(), {}, &init).value();
  const auto inpainted = pipe.generate(request(), options(), {}, &init, &white).value();
  EXPECT_EQ(inpainted.images[0].image.pixels, img2img.images[0].image.pixels);
  EXPECT_EQ(inpainted.images[0].info["inpainting"], "FluxInpaintPipeline");
}

TEST(FluxInpaint, KeptLatentsFollowTheNoisedImage) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const auto model = load_flux_model((dir / "model").string(), FluxLoadOptions{}).value();
  const FluxPipeline pipe(model);
  const Image init = picture(), top = mask(kSide / 2);  // the top half repainted: latent rows 0-3 of 8
  const int64_t h = kSide / 8, w = kSide / 8;
  std::vector<Tensor> after;  // the unpacked latents after each step
  ASSERT_TRUE(pipe.generate(request(), options(), [&](const StepProgress& p) {
    after.push_back(flux_unpack_latents(ops::clone(*p.latents), h, w));
    return true;
  }, &init, &top).has_value());
  const int run = sampling::img2img_steps(kSteps, kStrength);
  ASSERT_EQ(int(after.size()), run);
  // The image's latents and the noise as the pipeline draws them (img2img's order), and the sigmas the steps reach.
  GenerateRequest sized = request();
  auto gen = make_generator(RngKind::kCpu, kSeed);
  const Tensor x0 = vae_encode_sample(*model->vae, init_image_tensor(init, sized, kFluxSizeMultiple, "init").value(), *gen,
                                      Device::cpu());
  const Tensor noise = randn_tensor(*gen, x0.shape());
  auto sched = pipe.make_scheduler(kSteps, h, w).value();
  ASSERT_TRUE(sched.set_begin_index(kSteps - run).is_ok());
  for (int k = 0; k < run; ++k) {
    sched.advance();
    const Tensor proper = sched.done() ? x0 : sched.scale_noise(x0, noise);
    EXPECT_LE(test::max_abs_diff(rows_of(after[size_t(k)], h / 2, h / 2), rows_of(proper, h / 2, h / 2)), 1e-6) << k;
    EXPECT_GT(test::max_abs_diff(rows_of(after[size_t(k)], 0, h / 2), rows_of(proper, 0, h / 2)), 1e-3) << k;
  }
}

}  // namespace
}  // namespace atelier
