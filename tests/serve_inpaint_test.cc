// Inpainting through the server's real port: A1111's img2img with a mask (its API's defaults, and the fields set),
// the native jobs API's mask, the server's image against the pipeline's, and the malformed masks answered with a 400.
#include <gtest/gtest.h>

#include <filesystem>

#include "pipeline/sd_pipeline.h"
#include "serve/base64.h"
#include "serve_test_util.h"

namespace atelier::serve {
namespace {

using test::decode_b64_image;
using test::parse;
using test::post_json;

constexpr int kSide = 64;

// A picture with some structure (gradients and a square), RGB.
Image picture() {
  Image img{kSide, kSide, 3, std::vector<uint8_t>(size_t(kSide) * kSide * 3)};
  for (int y = 0; y < kSide; ++y)
    for (int x = 0; x < kSide; ++x) {
      uint8_t* p = &img.pixels[(size_t(y) * kSide + x) * 3];
      const bool square = x >= 20 && x < 44 && y >= 20 && y < 44;
      p[0] = uint8_t(x * 4);
      p[1] = uint8_t(y * 4);
      p[2] = square ? 230 : 40;
    }
  return img;
}

// White inside [x0, x1) x [y0, y1), one channel.
Image box_mask(int x0, int y0, int x1, int y1) {
  Image m{kSide, kSide, 1, std::vector<uint8_t>(size_t(kSide) * kSide, 0)};
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) m.pixels[size_t(y) * kSide + x] = 255;
  return m;
}

std::string b64_png(const Image& img) { return base64_encode(encode_png(img).value()); }

uint8_t at(const Image& img, int x, int y, int c) { return img.pixels[(size_t(y) * img.width + x) * img.channels + c]; }

class ServeInpaint : public test::SharedServerSuite<ServeInpaint> {
 public:
  static ServeOptions options() { return test::tiny_options(); }
};

// A whole-picture inpainting through A1111's API is the pipeline's, pixel for pixel, and keeps the unmasked pixels.
TEST_F(ServeInpaint, A1111MaskedImg2ImgIsThePipelinesInpainting) {
  const Image init = picture(), mask = box_mask(16, 8, 48, 32);
  int status = 0;
  const nlohmann::json body = {{"prompt", "a red circle"}, {"init_images", {b64_png(init)}}, {"mask", b64_png(mask)},
                               {"mask_blur", 2}, {"inpainting_fill", 1}, {"inpaint_full_res", false},
                               {"denoising_strength", 0.75}, {"width", kSide}, {"height", kSide}, {"steps", 4},
                               {"seed", 5}};
  const auto res = post_json(*client_, "/sdapi/v1/img2img", body, &status);
  ASSERT_EQ(status, 200) << res.dump().substr(0, 300);
  const Image out = decode_b64_image(res["images"][0]);
  ASSERT_EQ(out.width, kSide);
  EXPECT_TRUE(res["parameters"]["mask"].is_null()) << "uploads are not echoed back";
  const std::string infotext = parse(res["info"].get<std::string>())["infotexts"][0];
  EXPECT_NE(infotext.find("Denoising strength: 0.75, Mask blur: 2"), std::string::npos) << infotext;
  // Blur 2: 11 taps, so 5 pixels around the box may blend; beyond, the original pixels.
  for (int y = 0; y < kSide; ++y)
    for (int x = 0; x < kSide; ++x)
      if (x < 11 || x >= 53 || y >= 37)
        for (int c = 0; c < 3; ++c) ASSERT_EQ(at(out, x, y, c), at(init, x, y, c)) << x << "," << y;

  // The same request through the pipeline (A1111's defaults: Euler a, CFG 7, the GPU generator, emphasis on).
  const std::filesystem::path dir = ::testing::TempDir();
  ASSERT_TRUE(write_png((dir / "serve_inpaint_init.png").string(), init).is_ok());
  ASSERT_TRUE(write_png((dir / "serve_inpaint_mask.png").string(), mask).is_ok());
  GenerateRequest r;
  r.prompt = "a red circle";
  r.init_image = (dir / "serve_inpaint_init.png").string();
  r.mask = (dir / "serve_inpaint_mask.png").string();
  r.mask_blur_x = r.mask_blur_y = 2;
  r.width = r.height = kSide;
  r.steps = 4;
  r.seed = 5;
  r.sampler = "Euler a";
  r.emphasis = true;
  SdLoadOptions o;
  o.compute_hash = false;
  auto model = load_sd_model(test::tiny_model_path(), o);
  ASSERT_TRUE(model.has_value()) << model.status().message();
  // One OpenMP thread, as the server's CPU worker: the same sums in the same order, up to one unit of rounding.
  const auto want = ::atelier::test::on_one_omp_thread([&] { return SdPipeline(*model).generate(r); });
  ASSERT_TRUE(want.has_value()) << want.status().message();
  ASSERT_EQ(out.pixels.size(), want->images.front().image.pixels.size());
  EXPECT_LE(::atelier::test::max_pixel_diff(out, want->images.front().image), 1);
}

// A1111's API defaults for a mask: "only masked" (the image's size comes back), "fill" content, blur 4, no padding.
TEST_F(ServeInpaint, A1111DefaultsInpaintOnlyTheMaskedArea) {
  const Image init = picture();
  int status = 0;
  const auto res = post_json(*client_, "/sdapi/v1/img2img",
                             {{"prompt", "x"}, {"init_images", {b64_png(init)}}, {"mask", b64_png(box_mask(24, 24, 40, 32))},
                              {"width", 32}, {"height", 32}, {"steps", 2}, {"seed", 1}},
                             &status);
  ASSERT_EQ(status, 200) << res.dump().substr(0, 300);
  const Image out = decode_b64_image(res["images"][0]);
  EXPECT_EQ(out.width, kSide);  // the picture's size: the 32x32 run was the box around the mask
  const std::string infotext = parse(res["info"].get<std::string>())["infotexts"][0];
  EXPECT_NE(infotext.find("Mask blur: 4, Inpaint area: Only masked, Masked area padding: 0, Masked content: fill"),
            std::string::npos)
      << infotext;
  EXPECT_EQ(at(out, 2, 2, 0), at(init, 2, 2, 0));
}

TEST_F(ServeInpaint, NativeJobTakesAMask) {
  int status = 0;
  const auto job = post_json(*client_, "/v1/jobs",
                             {{"prompt", "x"}, {"init_image", b64_png(picture())}, {"mask", b64_png(box_mask(0, 0, 32, 64))},
                              {"mask_blur", 0}, {"inpaint_fill", "latent_nothing"}, {"steps", 2}, {"seed", 3}},
                             &status);
  ASSERT_EQ(status, 202) << job.dump();
  const auto done = test::wait_job(*client_, job["id"]);
  ASSERT_EQ(done["state"], "done") << done.dump().substr(0, 400);
  const Image out = decode_b64_image(done["images"][0]["data"]);
  EXPECT_EQ(at(out, 50, 10, 1), at(picture(), 50, 10, 1));
  const std::string infotext = done["images"][0]["infotext"];
  EXPECT_NE(infotext.find("Masked content: latent nothing"), std::string::npos) << infotext;
}

// OpenAI's images edit: a multipart form; the mask's fully transparent pixels are repainted, the rest kept.
TEST_F(ServeInpaint, OpenAIEditRepaintsTheTransparentArea) {
  const Image init = picture();
  Image mask{kSide, kSide, 4, std::vector<uint8_t>(size_t(kSide) * kSide * 4, 255)};
  for (int y = 0; y < kSide / 2; ++y)
    for (int x = 0; x < kSide; ++x) mask.pixels[(size_t(y) * kSide + x) * 4 + 3] = 0;  // the top half: edit
  const httplib::MultipartFormDataItems form = {
      {"prompt", "a red circle", "", ""},
      {"image", encode_png(init).value(), "image.png", "image/png"},
      {"mask", encode_png(mask).value(), "mask.png", "image/png"},
      {"size", "64x64", "", ""},
      {"n", "2", "", ""},
      {"steps", "3", "", ""},
      {"seed", "11", "", ""},
  };
  auto res = client_->Post("/v1/images/edits", form);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body.substr(0, 300);
  const auto j = parse(res->body);
  ASSERT_EQ(j["data"].size(), 2u);
  for (const auto& item : j["data"]) {
    const Image out = decode_b64_image(item["b64_json"]);
    ASSERT_EQ(out.width, kSide);
    int changed_top = 0;
    for (int y = 0; y < kSide; ++y)
      for (int x = 0; x < kSide; ++x)
        for (int c = 0; c < 3; ++c) {
          if (y >= kSide / 2 + 10) ASSERT_EQ(at(out, x, y, c), at(init, x, y, c)) << x << "," << y;  // blur 4: 10 rows
          if (y < kSide / 2 - 10) changed_top += at(out, x, y, c) != at(init, x, y, c);
        }
    EXPECT_GT(changed_top, kSide * (kSide / 2 - 10));  // strength 1: the masked area drawn anew
  }
  // Refusals: a JSON body, no image, a mask without alpha, a text where a number goes.
  auto json = client_->Post("/v1/images/edits", R"({"prompt": "x"})", "application/json");
  ASSERT_TRUE(json);
  EXPECT_EQ(json->status, 400);
  EXPECT_NE(json->body.find("multipart/form-data"), std::string::npos) << json->body;
  const auto refused = [&](const httplib::MultipartFormDataItems& items, const std::string& words) {
    auto r = client_->Post("/v1/images/edits", items);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(r->body.find(words), std::string::npos) << r->body;
  };
  refused({{"prompt", "x", "", ""}}, "image: required");
  refused({{"prompt", "x", "", ""}, {"image", encode_png(init).value(), "i.png", "image/png"},
           {"mask", encode_png(init).value(), "m.png", "image/png"}},
          "mask: needs an alpha channel");
  refused({{"prompt", "x", "", ""}, {"image", encode_png(init).value(), "i.png", "image/png"}, {"n", "two", "", ""}}, "n");
}

TEST_F(ServeInpaint, MalformedMasksAre400AndHarmless) {
  const std::string init = b64_png(picture());
  struct Case {
    std::string path;
    nlohmann::json body;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"/sdapi/v1/img2img", {{"init_images", {init}}, {"mask", 3}}, "mask: expected a base64 image"},
      {"/sdapi/v1/img2img", {{"init_images", {init}}, {"mask", "!!"}}, "mask"},
      {"/sdapi/v1/img2img", {{"init_images", {init}}, {"mask", b64_png(Image{8, 8, 1, std::vector<uint8_t>(64, 255)})}},
       "mask: 8x8 but the init image is 64x64"},
      {"/sdapi/v1/img2img", {{"init_images", {init}}, {"mask", b64_png(box_mask(0, 0, 0, 0))}}, "no pixel is masked"},
      {"/sdapi/v1/img2img", {{"init_images", {init}}, {"inpainting_fill", 7}}, "inpainting_fill"},
      {"/sdapi/v1/img2img", {{"init_images", {init}}, {"resize_mode", 3}}, "latent upscale"},
      {"/sdapi/v1/img2img", {{"init_images", {init}}, {"inpaint_full_res", "yes"}}, "inpaint_full_res"},
      {"/sdapi/v1/img2img", {{"init_images", {init}}, {"mask_blur", 65}}, "mask_blur"},
      {"/v1/jobs", {{"prompt", "x"}, {"mask", init}}, "mask: inpainting needs the image to inpaint"},
      {"/v1/jobs", {{"prompt", "x"}, {"init_image", init}, {"inpaint_fill", "smear"}}, "inpaint_fill"},
  };
  for (const Case& c : cases) {
    int status = 0;
    const auto res = post_json(*client_, c.path, c.body, &status);
    // (A blank mask is found once the job's plan is made: the synchronous API answers its failure with the 400.)
    EXPECT_EQ(status, 400) << c.body.dump().substr(0, 100) << " -> " << res.dump();
    EXPECT_NE(res.dump().find(c.expect), std::string::npos) << c.body.dump().substr(0, 100) << " -> " << res.dump();
  }
  int status = 0;
  post_json(*client_, "/sdapi/v1/txt2img", {{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}}, &status);
  EXPECT_EQ(status, 200) << "still serving";
}

}  // namespace
}  // namespace atelier::serve
