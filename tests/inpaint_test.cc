// Inpainting with sd15-tiny (pipeline/inpaint.h): a white mask is img2img exactly, the unmasked pixels come back
// unchanged, the x0 estimate is held to the init latents where the image is kept (every sampler), "only masked"
// pastes its box back into the full image, the latent fills, and the requests it refuses.
#include <gtest/gtest.h>

#include <filesystem>

#include "backend/ops.h"
#include "core/rng.h"
#include "pipeline/sd_pipeline.h"
#include "test_util.h"

namespace atelier {
namespace {

constexpr int kSide = 128;  // sd15-tiny's fixture runs

std::shared_ptr<SdModel> load_tiny(const std::filesystem::path& dir) {
  SdLoadOptions o;
  o.compute_hash = false;
  auto m = load_sd_model((dir / "model").string(), o);
  EXPECT_TRUE(m.has_value()) << m.status().message();
  return m.has_value() ? *m : nullptr;
}

// The fixture's img2img start image (a real picture) as 8 bits.
Image init_picture() { return image_from_tensor(test::golden("sd15-tiny", "img2img.init"), 0); }

Image gray(int w, int h, uint8_t v) {
  Image m;
  m.width = w;
  m.height = h;
  m.channels = 1;
  m.pixels.assign(size_t(w) * h, v);
  return m;
}

// White (255) where x0 <= x < x1 and y0 <= y < y1.
Image box_mask(int x0, int y0, int x1, int y1) {
  Image m = gray(kSide, kSide, 0);
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) m.pixels[size_t(y) * kSide + x] = 255;
  return m;
}

std::string write_temp_png(const Image& img, const std::string& name) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / name).string();
  EXPECT_TRUE(write_png(path, img).is_ok());
  return path;
}

GenerateRequest base_request(const std::string& init_path) {
  GenerateRequest r;
  r.prompt = "a red circle";
  r.negative_prompt = "blurry";
  r.width = r.height = kSide;
  r.steps = 6;
  r.strength = 0.75f;
  r.seed = 42;
  r.rng = "cpu";
  r.init_image = init_path;
  return r;
}

std::vector<float> vec(const Tensor& t) { return ops::contiguous(t).to_vector(); }

uint8_t at(const Image& img, int x, int y, int c) { return img.pixels[(size_t(y) * img.width + x) * img.channels + c]; }

class Inpaint : public ::testing::Test {
 protected:
  void SetUp() override {
    ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
    model_ = load_tiny(dir);
    ASSERT_TRUE(model_);
    init_ = init_picture();
    init_path_ = write_temp_png(init_, "inpaint_init.png");
  }
  Image run(const GenerateRequest& r) {
    auto res = SdPipeline(model_).generate(r);
    EXPECT_TRUE(res.has_value()) << res.status().message();
    return res.has_value() ? res->images.front().image : Image{};
  }
  std::shared_ptr<SdModel> model_;
  Image init_;
  std::string init_path_;
};

TEST_F(Inpaint, AllWhiteMaskIsImg2ImgExactly) {
  GenerateRequest r = base_request(init_path_);
  const Image img2img = run(r);
  r.mask = write_temp_png(gray(kSide, kSide, 255), "inpaint_white.png");
  r.mask_blur_x = r.mask_blur_y = 0;
  const Image inpainted = run(r);
  ASSERT_EQ(inpainted.width, kSide);
  EXPECT_EQ(inpainted.pixels, img2img.pixels);
}

TEST_F(Inpaint, UnmaskedPixelsComeBackUnchanged) {
  GenerateRequest r = base_request(init_path_);
  r.mask = write_temp_png(box_mask(0, 0, kSide / 2, kSide), "inpaint_left.png");  // the left half
  auto res = SdPipeline(model_).generate(r);
  ASSERT_TRUE(res.has_value()) << res.status().message();
  const Image& out = res->images.front().image;
  ASSERT_EQ(out.width, kSide);
  // Blur 4: a 21-tap kernel, so from column 64 + 10 on the mask is 0 and the pixels are the original's.
  int changed_left = 0;
  for (int y = 0; y < kSide; ++y)
    for (int c = 0; c < 3; ++c) {
      for (int x = kSide / 2 + 10; x < kSide; ++x) ASSERT_EQ(at(out, x, y, c), at(init_, x, y, c)) << x << "," << y;
      for (int x = 0; x < kSide / 2 - 10; ++x) changed_left += at(out, x, y, c) != at(init_, x, y, c);
    }
  EXPECT_GT(changed_left, kSide * (kSide / 2 - 10));  // most of the masked side was generated anew
  const std::string& info = res->images.front().infotext;
  EXPECT_NE(info.find("Denoising strength: 0.75, Mask blur: 4"), std::string::npos) << info;
  EXPECT_EQ(res->images.front().info["settings"]["inpaint_fill"], "original");
  // Inverted, the same mask keeps the left half instead.
  r.mask_invert = true;
  const Image inv = run(r);
  for (int y = 0; y < kSide; ++y)
    for (int x = 0; x < kSide / 2 - 10; ++x) ASSERT_EQ(at(inv, x, y, 0), at(init_, x, y, 0)) << x << "," << y;
}

// Every sampler: at every model call the x0 estimate equals the init latents where the image is kept, and differs
// where it is inpainted; the returned latents are the init latents there exactly.
TEST_F(Inpaint, X0EstimateIsHeldToTheInitLatentsWhereKept) {
  for (const char* sampler : {"euler", "euler_a", "heun", "ddim", "dpmpp_2m", "dpmpp_2m_sde", "lcm"}) {
    SCOPED_TRACE(sampler);
    GenerateRequest r = base_request("");
    r.sampler = sampler;
    r.mask_blur_x = r.mask_blur_y = 0;
    const Image mask = box_mask(0, 0, kSide, kSide / 2);  // the top half: latent rows 0-7 inpainted
    SdPipeline pipe(model_);
    auto plan = pipe.plan(r, &init_, &mask);
    ASSERT_TRUE(plan.has_value()) << plan.status().message();
    auto s = pipe.prepare_sample(*plan, 0);
    ASSERT_TRUE(s.has_value()) << s.status().message();
    ASSERT_TRUE(s->kept.defined());
    const Tensor z = s->kept.latents;
    const int64_t h = z.size(2);
    auto cond = pipe.encode_prompt(r.prompt, 1, false);
    auto uncond = pipe.encode_prompt(r.negative_prompt, 1, false);
    ASSERT_TRUE(cond && uncond);
    int calls = 0;
    double worst_kept = 0, least_inpainted = 1e9;
    const ProgressCallback progress = [&](const StepProgress& p) {
      ++calls;
      const Tensor d = *p.denoised;
      worst_kept = std::max(worst_kept, test::max_abs_diff(vec(d.narrow(2, h / 2, h / 2)), vec(z.narrow(2, h / 2, h / 2))));
      least_inpainted =
          std::min(least_inpainted, test::max_abs_diff(vec(d.narrow(2, 0, h / 2)), vec(z.narrow(2, 0, h / 2))));
      return true;
    };
    auto out = pipe.denoise({s->sampler.get()}, s->latents, *cond, *uncond, r.cfg_scale, 0, progress, nullptr, {s->kept});
    ASSERT_TRUE(out.has_value()) << out.status().message();
    EXPECT_GT(calls, 0);
    EXPECT_LT(worst_kept, 1e-4);
    EXPECT_GT(least_inpainted, 1e-2);
    EXPECT_EQ(vec(out->narrow(2, h / 2, h / 2)), vec(z.narrow(2, h / 2, h / 2)));
  }
}

TEST_F(Inpaint, OnlyMaskedGeneratesTheBoxAndPastesItBack) {
  GenerateRequest r = base_request(init_path_);
  r.width = r.height = 64;  // the box is generated at 64x64, then scaled back into the 128x128 picture
  r.mask = write_temp_png(box_mask(40, 48, 72, 64), "inpaint_box.png");
  r.mask_blur_x = r.mask_blur_y = 0;
  r.inpaint_only_masked = true;
  r.inpaint_padding = 8;
  auto res = SdPipeline(model_).generate(r);
  ASSERT_TRUE(res.has_value()) << res.status().message();
  const Image& out = res->images.front().image;
  ASSERT_EQ(out.width, kSide);  // the picture's size, not the request's
  ASSERT_EQ(out.height, kSide);
  int changed_inside = 0;
  for (int y = 0; y < kSide; ++y)
    for (int x = 0; x < kSide; ++x)
      for (int c = 0; c < 3; ++c) {
        const bool masked = x >= 40 && x < 72 && y >= 48 && y < 64;
        if (!masked) ASSERT_EQ(at(out, x, y, c), at(init_, x, y, c)) << x << "," << y;
        else changed_inside += at(out, x, y, c) != at(init_, x, y, c);
      }
  EXPECT_GT(changed_inside, 32 * 16);
  const std::string& info = res->images.front().infotext;
  EXPECT_NE(info.find("Inpaint area: Only masked, Masked area padding: 8"), std::string::npos) << info;
}

TEST_F(Inpaint, LatentFillsReplaceTheMaskedLatents) {
  GenerateRequest r = base_request("");
  const Image mask = box_mask(0, 0, kSide, kSide / 2);
  SdPipeline pipe(model_);
  const auto kept_latents = [&](const char* fill) {
    r.inpaint_fill = fill;
    auto plan = pipe.plan(r, &init_, &mask);
    EXPECT_TRUE(plan.has_value()) << plan.status().message();
    auto s = pipe.prepare_sample(*plan, 0);
    EXPECT_TRUE(s.has_value()) << s.status().message();
    return s->kept.latents;
  };
  const Tensor original = kept_latents("original"), nothing = kept_latents("latent_nothing"),
               noise = kept_latents("latent_noise");
  const int64_t h = original.size(2);
  const auto top = [&](const Tensor& t) { return vec(t.narrow(2, 0, h / 2)); };
  const auto bottom = [&](const Tensor& t) { return vec(t.narrow(2, h / 2, h / 2)); };
  // Both encode the "fill"ed picture (A1111 fills the masked pixels first for every content but "original"), so their
  // kept latents agree with each other; "original" encodes the picture as it is.
  EXPECT_EQ(bottom(nothing), bottom(noise));
  EXPECT_NE(bottom(nothing), bottom(original));
  EXPECT_EQ(top(nothing), std::vector<float>(top(original).size(), 0.0f));
  // "latent noise": the seed's first draw (A1111's create_random_tensors), not the generator the sampler goes on with.
  const auto gen = make_generator(RngKind::kCpu, uint64_t(r.seed));
  EXPECT_EQ(top(noise), top(randn_tensor(*gen, original.shape())));
}

TEST_F(Inpaint, RefusesWhatItCannotInpaint) {
  GenerateRequest r = base_request("");
  SdPipeline pipe(model_);
  const Image mask = box_mask(0, 0, 8, 8);
  auto no_image = pipe.plan(r, nullptr, &mask);
  ASSERT_FALSE(no_image.has_value());
  EXPECT_NE(no_image.status().message().find("needs an init image"), std::string::npos);
  const Image small = gray(64, 64, 255);
  auto sized = pipe.plan(r, &init_, &small);
  ASSERT_FALSE(sized.has_value());
  EXPECT_NE(sized.status().message().find("mask: 64x64 but the init image is 128x128"), std::string::npos)
      << sized.status().message();
  const Image black = gray(kSide, kSide, 0);
  auto blank = pipe.plan(r, &init_, &black);
  ASSERT_FALSE(blank.has_value());
  EXPECT_NE(blank.status().message().find("no pixel is masked"), std::string::npos);
  r.inpaint_fill = "smear";
  auto fill = pipe.plan(r, &init_, &mask);
  ASSERT_FALSE(fill.has_value());
  EXPECT_NE(fill.status().message().find("supported are fill"), std::string::npos);
}

}  // namespace
}  // namespace atelier
