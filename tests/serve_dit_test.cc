// FLUX and Z-Image through the server's real port: the fixture models' reference images through the native jobs API,
// the A1111 API's FLUX fields (distilled_cfg_scale, no CFG unless cfg_scale is given) against the pipeline run
// directly, the per-step events, cancellation of a running DiT job with the server still serving SD, a device
// failure during a DiT job (re-queued, same image), and the requests these models refuse (400s).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "pipeline/flux_pipeline.h"
#include "pipeline/zimage_pipeline.h"
#include "serve/model_registry.h"
#include "serve_test_util.h"

namespace atelier::serve {
namespace {

using test::decode_b64_image;
using test::parse;
using test::post_json;
using test::RunningServer;

// The fixtures' reference runs (tests/flux_pipeline_test.cc, tests/zimage_pipeline_test.cc).
const char* const kPrompt = "a photo of an astronaut riding a horse on mars";
constexpr int kSide = 128;
constexpr int kSeed = 1234;
constexpr int kFluxSteps = 4, kFluxMaxSeq = 32;
constexpr int kZImageSteps = 5;

std::string fixture_model(const char* name) {
  auto dir = ::atelier::test::fixture(name);
  return dir ? (*dir / "model").string() : std::string();
}

#define REQUIRE_DIT_FIXTURES()                                                                                       \
  if (fixture_model("flux-tiny").empty() || fixture_model("zimage-tiny").empty() || test::tiny_model_path().empty()) \
  GTEST_SKIP() << "fixtures 'flux-tiny', 'zimage-tiny' and 'sd15-tiny' are needed (looked in ../shared/fixtures and $ATELIER_FIXTURES)"

ServeOptions dit_options() {
  ServeOptions o = test::tiny_options();
  o.models = {"tiny=" + test::tiny_model_path(), "flux=" + fixture_model("flux-tiny"), "zimage=" + fixture_model("zimage-tiny")};
  return o;
}

// Largest difference of an image from a golden [1, 3, H, W] tensor in [0, 1], in 8-bit levels.
int levels_from_golden(const Image& img, const char* fixture, const char* key) {
  const std::vector<float> want = ::atelier::test::golden(fixture, key).to_vector();
  if (img.pixels.size() != want.size()) return 256;
  int worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(int(img.pixels[i]) - int(std::lround(want[i] * 255.0f))));
  return worst;
}

nlohmann::json flux_job(int steps = kFluxSteps) {
  return {{"model", "flux"},  {"prompt", kPrompt}, {"width", kSide}, {"height", kSide}, {"steps", steps},
          {"seed", kSeed},    {"rng", "cpu"},      {"max_sequence_length", kFluxMaxSeq}};
}

// What the A1111 tests' requests (64², seed 7, no CFG) ask the pipeline for run directly: A1111's GPU-style noise
// (rng cuda) and T5 at its default length, as the server fills them in.
GenerateRequest a1111_request(int steps) {
  GenerateRequest g;
  g.prompt = kPrompt;
  g.width = g.height = 64;
  g.steps = steps;
  g.seed = 7;
  g.cfg_scale = 1.0f;
  return g;
}

TEST(ServeDit, RegistryKnowsTheFamiliesAndWantsDitFolders) {
  REQUIRE_DIT_FIXTURES();
  EXPECT_EQ(detect_model_family(fixture_model("flux-tiny")), ModelFamily::kFlux);
  EXPECT_EQ(detect_model_family(fixture_model("zimage-tiny")), ModelFamily::kZImage);
  EXPECT_EQ(detect_model_family(test::tiny_model_path()), ModelFamily::kSd);
  const std::string bfl = (*::atelier::test::fixture("flux-tiny") / "flux-tiny-transformer.bfl.safetensors").string();
  auto r = ModelRegistry::create({"f=" + bfl}, "");
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("diffusers folders"), std::string::npos) << r.status().message();
}

// The router's unit: a DiT request counts its family's cost per pixel and call (twice with CFG), and the sampler
// that runs (a Heun from an A1111 client is not two calls per step for these models).
TEST(ServeDit, RequestsCountTheirModelsCost) {
  ServeRequest sd;
  sd.gen.width = sd.gen.height = 512;
  sd.gen.steps = 20;
  sd.gen.sampler = "Heun";
  ASSERT_TRUE(validate_for_model(sd, ModelFamily::kSd).is_ok());
  const double sd_euler_work = sd.work() / 2;  // Heun: two calls per step
  ServeRequest flux = sd;
  ASSERT_TRUE(validate_for_model(flux, ModelFamily::kFlux).is_ok());
  EXPECT_EQ(flux.gen.sampler, "euler");
  EXPECT_EQ(flux.gen.cfg_scale, 1.0f);
  EXPECT_DOUBLE_EQ(flux.work() / sd_euler_work, 6.0);
  ServeRequest zimage = sd;
  ASSERT_TRUE(validate_for_model(zimage, ModelFamily::kZImage).is_ok());
  EXPECT_DOUBLE_EQ(zimage.work() / sd_euler_work, 4.5);
  ServeRequest flux_cfg = sd;
  flux_cfg.cfg_given = true;  // cfg_scale 7 from the client: true CFG, two calls per step
  ASSERT_TRUE(validate_for_model(flux_cfg, ModelFamily::kFlux).is_ok());
  EXPECT_DOUBLE_EQ(flux_cfg.work() / sd_euler_work, 12.0);
}

TEST(ServeDit, FluxAndZImageJobsGiveTheReferenceImagesWithStepEvents) {
  REQUIRE_DIT_FIXTURES();
  auto s = RunningServer::start(dit_options());
  ASSERT_TRUE(s);
  auto c = s->client();
  const nlohmann::json models = parse(c->Get("/v1/models")->body);
  std::map<std::string, std::string> families;
  for (const auto& m : models["data"]) families[m["id"]] = m["family"];
  EXPECT_EQ(families, (std::map<std::string, std::string>{{"tiny", "sd"}, {"flux", "flux"}, {"zimage", "zimage"}}));
  int status = 0;
  const std::string flux_id = post_json(*c, "/v1/jobs", flux_job(), &status)["id"];
  ASSERT_EQ(status, 202);
  // Z-Image without cfg_scale: the Turbo setting (0, one call per step), as the golden turbo run.
  const nlohmann::json zimage = {{"model", "zimage"}, {"prompt", kPrompt}, {"width", kSide}, {"height", kSide},
                                 {"steps", kZImageSteps}, {"seed", kSeed}, {"rng", "cpu"}};
  const std::string zimage_id = post_json(*c, "/v1/jobs", zimage, &status)["id"];
  ASSERT_EQ(status, 202);

  for (const auto& [id, fixture, key, steps] : {std::tuple{flux_id, "flux-tiny", "run.flux_euler.image", kFluxSteps},
                                                std::tuple{zimage_id, "zimage-tiny", "run.turbo.image", kZImageSteps}}) {
    const nlohmann::json j = test::wait_job(*c, id);
    ASSERT_EQ(j["state"], "done") << j.dump().substr(0, 300);
    ASSERT_EQ(j["images"].size(), 1u);
    const Image img = decode_b64_image(j["images"][0]["data"]);
    EXPECT_LE(levels_from_golden(img, fixture, key), 1) << fixture;  // 8-bit rounding
    EXPECT_EQ(j["total_steps"], steps);
    // The events: one step event per model call, in order, then done.
    const std::string events = test::read_events(*c, id);
    size_t at = 0;
    for (int step = 1; step <= steps; ++step) {
      at = events.find("\"step\":" + std::to_string(step), at);
      ASSERT_NE(at, std::string::npos) << "step " << step << " of " << fixture << " in:\n" << events.substr(0, 2000);
    }
    EXPECT_NE(events.find("event: done", at), std::string::npos);
  }
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(test::prom_value(m->body, "atelier_steps_total"), kFluxSteps + kZImageSteps);
  EXPECT_EQ(test::prom_value(m->body, "atelier_images_total"), 2);
}

TEST(ServeDit, A1111FluxTakesDistilledGuidanceAndRunsNoCfgUnlessAsked) {
  REQUIRE_DIT_FIXTURES();
  auto s = RunningServer::start(dit_options());
  ASSERT_TRUE(s);
  auto c = s->client();
  const float guidance = 2.0f;
  // A1111 clients send a sampler name and, often, no cfg_scale: the sampler is ignored (flow-matching Euler).
  const nlohmann::json body = {{"prompt", kPrompt}, {"width", 64}, {"height", 64}, {"steps", 2}, {"seed", 7},
                               {"sampler_name", "Euler a"}, {"distilled_cfg_scale", guidance},
                               {"override_settings", {{"sd_model_checkpoint", "flux"}}}};
  int status = 0;
  const nlohmann::json res = post_json(*c, "/sdapi/v1/txt2img", body, &status);
  ASSERT_EQ(status, 200) << res.dump().substr(0, 300);
  ASSERT_EQ(res["images"].size(), 1u);
  const Image served = decode_b64_image(res["images"][0]);
  const std::string info = res["info"];
  EXPECT_NE(info.find("Distilled CFG Scale: 2"), std::string::npos) << info;
  EXPECT_NE(info.find("CFG scale: 1,"), std::string::npos) << info;

  // The same request run by the pipeline.
  const GenerateRequest g = a1111_request(2);
  FluxOptions fo;
  fo.guidance = guidance;
  fo.cfg_explicit = true;
  auto model = load_flux_model(fixture_model("flux-tiny"));
  ASSERT_TRUE(model) << model.status().message();
  // On one OpenMP thread, as the server's CPU worker computes here (tiny_options: cpu_threads 1): OpenBLAS's
  // kernels round differently on the row blocks another thread count splits a product into (seen on an AVX-512
  // EPYC, whose OpenBLAS core is Haswell's), so only the same thread count gives the same pixels.
  const auto direct = ::atelier::test::on_one_omp_thread([&] { return FluxPipeline(*model).generate(g, fo); });
  ASSERT_TRUE(direct) << direct.status().message();
  EXPECT_EQ(served.pixels, direct->images[0].image.pixels);

  // cfg_scale given and > 1: true CFG against the negative prompt (a different image).
  nlohmann::json cfg_body = body;
  cfg_body["cfg_scale"] = 4;
  const nlohmann::json cfg = post_json(*c, "/sdapi/v1/txt2img", cfg_body, &status);
  ASSERT_EQ(status, 200) << cfg.dump().substr(0, 300);
  EXPECT_NE(decode_b64_image(cfg["images"][0]).pixels, served.pixels);
  EXPECT_NE(cfg["info"].get<std::string>().find("CFG scale: 4,"), std::string::npos);
}

// img2img on FLUX (A1111's API) and Z-Image (the native API) models: each served image is the pipeline's img2img of the
// same image, strength and seed (FLUX: the init image resized to the request's size; Z-Image: at the image's), and its
// infotext names the strength.
TEST(ServeDit, DitImg2ImgAndInpaintingAreThePipelines) {
  REQUIRE_DIT_FIXTURES();
  auto s = RunningServer::start(dit_options());
  ASSERT_TRUE(s);
  auto c = s->client();
  Image init{48, 40, 3, std::vector<uint8_t>(48 * 40 * 3)};
  for (size_t i = 0; i < init.pixels.size(); ++i) init.pixels[i] = uint8_t((i * 7) % 251);
  const auto png = encode_png(init);
  ASSERT_TRUE(png);
  const nlohmann::json body = {{"prompt", kPrompt}, {"init_images", {base64_encode(*png)}}, {"denoising_strength", 0.5},
                               {"width", 64}, {"height", 64}, {"steps", 4}, {"seed", 7}, {"cfg_scale", 1},
                               {"override_settings", {{"sd_model_checkpoint", "flux"}}}};
  int status = 0;
  const nlohmann::json res = post_json(*c, "/sdapi/v1/img2img", body, &status);
  ASSERT_EQ(status, 200) << res.dump().substr(0, 300);
  ASSERT_EQ(res["images"].size(), 1u);
  const Image served = decode_b64_image(res["images"][0]);
  EXPECT_NE(res["info"].get<std::string>().find("Denoising strength: 0.5"), std::string::npos) << res["info"];

  GenerateRequest g = a1111_request(4);
  g.strength = 0.5f;
  FluxOptions fo;
  fo.cfg_explicit = true;
  auto model = load_flux_model(fixture_model("flux-tiny"));
  ASSERT_TRUE(model) << model.status().message();
  // (The PNG is lossless: the server decodes the upload to `init` itself.)
  const auto direct = ::atelier::test::on_one_omp_thread([&] { return FluxPipeline(*model).generate(g, fo, {}, &init); });
  ASSERT_TRUE(direct) << direct.status().message();
  EXPECT_EQ(served.pixels, direct->images[0].image.pixels);
  EXPECT_NE(served.pixels, init.pixels);
  // With a mask (its left half white): FLUX inpainting, the pipeline's too.
  Image mask{48, 40, 1, std::vector<uint8_t>(48 * 40, 0)};
  for (int y = 0; y < 40; ++y) std::fill_n(&mask.pixels[size_t(y) * 48], 24, uint8_t(255));
  nlohmann::json masked = body;
  masked["mask"] = base64_encode(encode_png(mask).value());
  const nlohmann::json mres = post_json(*c, "/sdapi/v1/img2img", masked, &status);
  ASSERT_EQ(status, 200) << mres.dump().substr(0, 300);
  const auto mdirect = ::atelier::test::on_one_omp_thread([&] { return FluxPipeline(*model).generate(g, fo, {}, &init, &mask); });
  ASSERT_TRUE(mdirect) << mdirect.status().message();
  EXPECT_EQ(decode_b64_image(mres["images"][0]).pixels, mdirect->images[0].image.pixels);
  EXPECT_NE(mdirect->images[0].image.pixels, direct->images[0].image.pixels);

  // Z-Image through the native API with no size asked for: the init image's, rounded down to multiples of 16 (48x32).
  const nlohmann::json zbody = {{"prompt", kPrompt}, {"init_image", base64_encode(*png)}, {"strength", 0.5},
                                {"steps", 4}, {"seed", 7}, {"cfg_scale", 0}, {"model", "zimage"}};
  const std::string zid = post_json(*c, "/v1/jobs", zbody, &status)["id"];
  ASSERT_EQ(status, 202);
  const nlohmann::json zjob = test::wait_job(*c, zid);
  ASSERT_EQ(zjob["state"], "done") << zjob.dump().substr(0, 300);
  const Image zserved = decode_b64_image(zjob["images"][0]["data"]);
  EXPECT_EQ(zserved.width, 48);
  EXPECT_EQ(zserved.height, 32);
  EXPECT_NE(zjob["images"][0]["infotext"].get<std::string>().find("Denoising strength: 0.5"), std::string::npos);
  // Its progress counts the 2 steps strength 0.5 leaves of 4, from the first event on.
  EXPECT_EQ(zjob["total_steps"], 2);
  const std::string events = test::read_events(*c, zid);
  ASSERT_NE(events.find("\"total_steps\":2"), std::string::npos) << events.substr(0, 600);
  EXPECT_EQ(events.find("\"total_steps\":4"), std::string::npos) << events.substr(0, 600);
  GenerateRequest zg = g;
  zg.width = zg.height = 0;
  zg.cfg_scale = 0.0f;
  auto zmodel = load_zimage_model(fixture_model("zimage-tiny"), ZImageLoadOptions{});
  ASSERT_TRUE(zmodel) << zmodel.status().message();
  const auto zdirect = ::atelier::test::on_one_omp_thread([&] { return ZImagePipeline(*zmodel).generate(zg, {}, &init); });
  ASSERT_TRUE(zdirect) << zdirect.status().message();
  EXPECT_EQ(zserved.pixels, zdirect->images[0].image.pixels);
  // Z-Image inpainting too (FLUX's semantics): the native API's mask, the pipeline's image.
  nlohmann::json zmasked = zbody;
  zmasked["mask"] = base64_encode(encode_png(mask).value());
  const std::string zmid = post_json(*c, "/v1/jobs", zmasked, &status)["id"];
  ASSERT_EQ(status, 202);
  const nlohmann::json zmjob = test::wait_job(*c, zmid);
  ASSERT_EQ(zmjob["state"], "done") << zmjob.dump().substr(0, 300);
  const auto zmdirect =
      ::atelier::test::on_one_omp_thread([&] { return ZImagePipeline(*zmodel).generate(zg, {}, &init, &mask); });
  ASSERT_TRUE(zmdirect) << zmdirect.status().message();
  EXPECT_EQ(decode_b64_image(zmjob["images"][0]["data"]).pixels, zmdirect->images[0].image.pixels);
  EXPECT_NE(zmdirect->images[0].image.pixels, zdirect->images[0].image.pixels);
}

// `atelier serve --dtype fp8 --offload`: the served FLUX image is the one the pipeline draws with FP8 blocks (the
// encoders' offload changes no number), not the f32 one; an unknown dtype stops the server from starting.
TEST(ServeDit, DtypeAndOffloadReachTheDitModels) {
  REQUIRE_DIT_FIXTURES();
  ServeOptions o = dit_options();
  o.dtype = "fp8";
  o.offload = true;
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  const std::string id = post_json(*c, "/v1/jobs", flux_job(2), &status)["id"];
  ASSERT_EQ(status, 202);
  const nlohmann::json j = test::wait_job(*c, id);
  ASSERT_EQ(j["state"], "done") << j.dump().substr(0, 300);
  const Image served = decode_b64_image(j["images"][0]["data"]);

  GenerateRequest g;
  g.prompt = kPrompt;
  g.width = g.height = kSide;
  g.steps = 2;
  g.seed = kSeed;
  g.rng = "cpu";
  g.cfg_scale = 1.0f;
  FluxOptions fo;
  fo.max_sequence_length = kFluxMaxSeq;
  fo.cfg_explicit = true;
  FluxLoadOptions lo;
  lo.fp8 = true;
  auto fp8 = load_flux_model(fixture_model("flux-tiny"), lo);
  ASSERT_TRUE(fp8) << fp8.status().message();
  const auto max_diff = [&](const Image& other) { return ::atelier::test::max_pixel_diff(served, other); };
  // The pipeline on one OpenMP thread, as the server's CPU worker computes here (tiny_options: cpu_threads 1).
  const auto pipeline_image = [&](const std::shared_ptr<FluxModel>& m) {
    return ::atelier::test::on_one_omp_thread([&] { return FluxPipeline(m).generate(g, fo); }).value().images[0].image;
  };
  const int to_fp8 = max_diff(pipeline_image(*fp8));
  auto f32 = load_flux_model(fixture_model("flux-tiny"));
  ASSERT_TRUE(f32);
  const int to_f32 = max_diff(pipeline_image(*f32));
  std::printf("served fp8 image: max |diff| %d to the pipeline's fp8 image, %d to its f32 image\n", to_fp8, to_f32);
  EXPECT_EQ(to_fp8, 0);
  EXPECT_GT(to_f32, 0);

  o.dtype = "fp4";
  auto bad = Server::create(o);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("--dtype"), std::string::npos) << bad.status().message();
}

// Previews of DiT jobs are VAE decodes, so few: three for a job that asks for per-step previews, partial_images for an
// OpenAI stream; each a JPEG of the image's size (up to 256 px), before the job's result.
TEST(ServeDit, PreviewsAreAFewDecodedImages) {
  REQUIRE_DIT_FIXTURES();
  auto s = RunningServer::start(dit_options());
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  nlohmann::json body = flux_job(8);
  body["preview"] = true;
  const std::string id = post_json(*c, "/v1/jobs", body, &status)["id"];
  ASSERT_EQ(status, 202);
  ASSERT_EQ(test::wait_job(*c, id)["state"], "done");
  const std::string events = test::read_events(*c, id);
  int previews = 0;
  for (size_t at = events.find("event: preview"); at != std::string::npos; at = events.find("event: preview", at + 1)) {
    ++previews;
    const size_t data = events.find("data: ", at);
    const auto j = parse(events.substr(data + 6, events.find('\n', data) - data - 6));
    EXPECT_EQ(j["step"].get<int>() % 2, 0) << "8 steps, 3 previews: every 2nd step";
    EXPECT_LT(events.find("event: preview", at), events.find("event: done"));
  }
  EXPECT_EQ(previews, 3) << events.substr(0, 1500);

  auto r = c->Post("/v1/images/generations",
                   nlohmann::json({{"model", "zimage"}, {"prompt", "a cat"}, {"size", "64x64"}, {"steps", 6}, {"stream", true},
                                   {"partial_images", 2}}).dump(),
                   "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  int partial = 0;
  for (size_t at = r->body.find("event: image_generation.partial_image"); at != std::string::npos;
       at = r->body.find("event: image_generation.partial_image", at + 1)) {
    ++partial;
    const size_t data = r->body.find("data: ", at);
    const auto j = parse(r->body.substr(data + 6, r->body.find('\n', data) - data - 6));
    const Image img = decode_b64_image(j["b64_json"]);
    EXPECT_EQ(img.width, 64);
  }
  EXPECT_EQ(partial, 2);
  EXPECT_NE(r->body.find("event: image_generation.completed"), std::string::npos);
}

// FLUX requests that arrive together share model calls: three jobs (four images: different prompts, seeds, guidance
// and image counts) run as one batch of 4 rows, each job with the images the pipeline gives it alone, its own step
// events, and a cancel that ends one job of the batch without ending the others.
TEST(ServeDit, ConcurrentFluxRequestsShareModelCalls) {
  REQUIRE_DIT_FIXTURES();
  ServeOptions o = dit_options();
  o.max_batch = 4;
  o.batch_window_ms = 5000;  // the idle worker waits for its 4 images (ends as soon as they are there)
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  constexpr int kSteps = 3;
  std::vector<nlohmann::json> bodies;
  for (int i = 0; i < 3; ++i) {
    nlohmann::json b = flux_job(kSteps);
    b["width"] = 64, b["height"] = 48;
    b["seed"] = kSeed + i;
    b["guidance"] = 2.0 + i;
    if (i == 1) b["prompt"] = "a red circle on a blue background";
    if (i == 2) b["batch_size"] = 2;
    bodies.push_back(b);
  }
  std::vector<std::string> ids;
  for (const auto& b : bodies) {
    int status = 0;
    ids.push_back(post_json(*c, "/v1/jobs", b, &status)["id"]);
    ASSERT_EQ(status, 202);
  }
  auto model = load_flux_model(fixture_model("flux-tiny"));
  ASSERT_TRUE(model) << model.status().message();
  (*model)->name = "flux";  // the server's name for it (infotext "Model: flux")
  for (size_t i = 0; i < ids.size(); ++i) {
    const nlohmann::json j = test::wait_job(*c, ids[i]);
    ASSERT_EQ(j["state"], "done") << j.dump().substr(0, 300);
    GenerateRequest g;
    g.prompt = bodies[i]["prompt"];
    g.width = 64, g.height = 48;
    g.steps = kSteps;
    g.seed = bodies[i]["seed"];
    g.rng = "cpu";
    g.cfg_scale = 1.0f;
    g.batch_size = i == 2 ? 2 : 1;
    FluxOptions fo;
    fo.guidance = bodies[i]["guidance"];
    fo.max_sequence_length = kFluxMaxSeq;
    fo.cfg_explicit = true;
    const GenerateResult alone =
        ::atelier::test::on_one_omp_thread([&] { return FluxPipeline(*model).generate(g, fo); }).value();
    ASSERT_EQ(j["images"].size(), alone.images.size());
    for (size_t k = 0; k < alone.images.size(); ++k) {  // 8-bit rounding: the BLAS sees another M in a batch
      const Image got = decode_b64_image(j["images"][k]["data"]);
      ASSERT_EQ(got.pixels.size(), alone.images[k].image.pixels.size());
      EXPECT_LE(::atelier::test::max_pixel_diff(got, alone.images[k].image), 1) << "job " << i << " image " << k;
      EXPECT_EQ(j["images"][k]["infotext"], alone.images[k].infotext);
    }
    const std::string events = test::read_events(*c, ids[i]);
    EXPECT_NE(events.find("\"step\":" + std::to_string(kSteps)), std::string::npos) << events.substr(0, 1500);
  }
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(test::prom_value(m->body, "atelier_batch_size_count"), kSteps) << "one model call per step for all three";
  EXPECT_EQ(test::prom_value(m->body, "atelier_batch_size_sum"), 4 * kSteps);
  EXPECT_EQ(test::prom_value(m->body, "atelier_steps_total"), 4 * kSteps);

  // A cancel inside a batch: that job ends at once, its batch-mate finishes with its image.
  ids.clear();
  for (int i = 0; i < 2; ++i) {
    nlohmann::json b = bodies[0];
    b["steps"] = 60;
    b["batch_size"] = 2;
    int status = 0;
    ids.push_back(post_json(*c, "/v1/jobs", b, &status)["id"]);
    ASSERT_EQ(status, 202);
  }
  test::wait_for_step(*c, ids[0], 1);
  auto del = c->Delete(("/v1/jobs/" + ids[0]).c_str());
  ASSERT_TRUE(del);
  const nlohmann::json cancelled = test::wait_job(*c, ids[0]);
  EXPECT_EQ(cancelled["state"], "cancelled");
  const nlohmann::json kept = test::wait_job(*c, ids[1]);
  ASSERT_EQ(kept["state"], "done") << kept.dump().substr(0, 300);
  EXPECT_EQ(kept["images"].size(), 2u);
  EXPECT_LT(cancelled["step"].get<int>(), 60);
}

TEST(ServeDit, RequestsTheseModelsCannotRunAreRefused) {
  REQUIRE_DIT_FIXTURES();
  auto s = RunningServer::start(dit_options());
  ASSERT_TRUE(s);
  auto c = s->client();
  const auto expect_400 = [&](const std::string& path, const nlohmann::json& body, const std::string& words) {
    int status = 0;
    const nlohmann::json res = post_json(*c, path, body, &status);
    EXPECT_EQ(status, 400) << body.dump();
    EXPECT_NE(res.dump().find(words), std::string::npos) << res.dump();
  };
  nlohmann::json j = flux_job();
  j["width"] = 72;
  expect_400("/v1/jobs", j, "multiples of 16");
  j = flux_job();
  j["max_sequence_length"] = 0;
  expect_400("/v1/jobs", j, "max_sequence_length");
  j = flux_job();
  j["guidance"] = -1;
  expect_400("/v1/jobs", j, "guidance");
  const auto png = encode_png(Image{32, 32, 3, std::vector<uint8_t>(32 * 32 * 3, 200)});
  ASSERT_TRUE(png);
  expect_400("/sdapi/v1/img2img",  // 4 steps at strength 0.2 leave none
             {{"prompt", "x"}, {"init_images", {base64_encode(*png)}}, {"steps", 4}, {"denoising_strength", 0.2},
              {"override_settings", {{"sd_model_checkpoint", "zimage"}}}},
             "denoising_strength");
  Image small_mask{8, 8, 1, std::vector<uint8_t>(64, 255)};
  expect_400("/sdapi/v1/img2img",  // a mask of another size than the image
             {{"prompt", "x"}, {"init_images", {base64_encode(*png)}}, {"mask", base64_encode(encode_png(small_mask).value())},
              {"override_settings", {{"sd_model_checkpoint", "zimage"}}}},
             "mask: 8x8 but the init image is 32x32");
  // Still serving.
  int status = 0;
  post_json(*c, "/v1/jobs", flux_job(1), &status);
  EXPECT_EQ(status, 202);
}

TEST(ServeDit, CancellingARunningDitJobLeavesTheServerServing) {
  REQUIRE_DIT_FIXTURES();
  auto s = RunningServer::start(dit_options());
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  const std::string id = post_json(*c, "/v1/jobs", flux_job(100), &status)["id"];
  ASSERT_EQ(status, 202);
  test::wait_for_step(*c, id, 1);
  auto del = c->Delete(("/v1/jobs/" + id).c_str());
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 202) << del->body;  // running: it leaves at its next step
  const nlohmann::json j = test::wait_job(*c, id);
  EXPECT_EQ(j["state"], "cancelled");
  EXPECT_LT(j["step"].get<int>(), 100) << "left at a step boundary";
  // An SD job and a Z-Image job after it both finish.
  const std::string sd = post_json(*c, "/v1/jobs", {{"model", "tiny"}, {"prompt", "a red circle"}, {"width", 32},
                                                   {"height", 32}, {"steps", 2}}, &status)["id"];
  const std::string zi = post_json(*c, "/v1/jobs", {{"model", "zimage"}, {"prompt", "a cat"}, {"width", 32}, {"height", 32},
                                                   {"steps", 2}}, &status)["id"];
  EXPECT_EQ(test::wait_job(*c, sd)["state"], "done");
  EXPECT_EQ(test::wait_job(*c, zi)["state"], "done");
}

TEST(ServeDit, ADeviceFailureDuringADitJobRequeuesItWithTheSameImage) {
  REQUIRE_DIT_FIXTURES();
  ServeOptions o = dit_options();
  o.devices = "cpu,cpu";
  o.test_hooks = true;
  o.probe_interval_ms = 100;
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  post_json(*c, "/v1/admin/fail-device", {{"worker", 0}, {"failing_probes", 3}}, &status);
  ASSERT_EQ(status, 200);
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {  // one lands on each idle worker
    ids.push_back(post_json(*c, "/v1/jobs", flux_job(), &status)["id"]);
    ASSERT_EQ(status, 202);
  }
  int restarted = 0;
  for (const std::string& id : ids) {
    const nlohmann::json j = test::wait_job(*c, id);
    ASSERT_EQ(j["state"], "done") << j.dump().substr(0, 300);
    EXPECT_LE(levels_from_golden(decode_b64_image(j["images"][0]["data"]), "flux-tiny", "run.flux_euler.image"), 1);
    restarted += j["attempts"].get<int>() > 1;
  }
  EXPECT_EQ(restarted, 1);
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(test::prom_value(m->body, "atelier_device_failures_total{device=\"cpu\",worker=\"0\"}"), 1);
}

}  // namespace
}  // namespace atelier::serve
