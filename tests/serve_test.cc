// `atelier serve` through its real port: every endpoint of the native, A1111, OpenAI and operations APIs,
// the server's images against the pipeline's, and bad input of every kind answered with a 400 that names
// the field while the server keeps serving.
#include <gtest/gtest.h>

#include <algorithm>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "pipeline/sd_pipeline.h"
#include "serve_test_util.h"

namespace atelier::serve {
namespace {

using test::decode_b64_image;
using test::parse;
using test::post_json;
using test::read_events;
using test::RunningServer;

nlohmann::json small_job(int64_t seed, int steps = 1, int side = 32) {
  return {{"prompt", "a red circle"}, {"width", side}, {"height", side}, {"steps", steps}, {"seed", seed}};
}

// One server for the API tests in this file, with two CPU workers.
class ServeApi : public test::SharedServerSuite<ServeApi> {
 public:
  static ServeOptions options() {
    ServeOptions o = test::tiny_options();
    o.devices = "cpu,cpu";
    return o;
  }
};

TEST_F(ServeApi, HealthReadinessMetricsStats) {
  auto h = client_->Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto r = client_->Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(parse(r->body)["healthy_workers"], 2);
  auto m = client_->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  for (const char* name : {"atelier_queue_depth", "atelier_queue_capacity", "atelier_device_healthy", "atelier_device_busy_ratio",
                           "atelier_process_resident_bytes", "atelier_http_requests_total"})
    EXPECT_NE(m->body.find(std::string("\n") + name), std::string::npos) << name;
  auto s = client_->Get("/v1/stats");
  ASSERT_TRUE(s);
  const auto j = parse(s->body);
  EXPECT_EQ(j["workers"].size(), 2u);
  EXPECT_EQ(j["queue"]["capacity"], 64);
  EXPECT_TRUE(j["metrics"].contains("atelier_queue_depth"));
  EXPECT_EQ(j["models"][0], "tiny");
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(parse(models->body)["data"][0]["id"], "tiny");
}

// A native job with previews: its id (empty when the post failed, with the failure recorded).
std::string post_preview_job(httplib::Client& c, int64_t seed, int steps, int side) {
  int status = 0;
  auto body = small_job(seed, steps, side);
  body["preview"] = true;
  const auto created = post_json(c, "/v1/jobs", body, &status);
  EXPECT_EQ(status, 202) << created.dump();
  return status == 202 ? created["id"].get<std::string>() : std::string();
}

TEST_F(ServeApi, NativeJobLifecycleWithEvents) {
  const std::string id = post_preview_job(*client_, 5, 3, 64);
  ASSERT_FALSE(id.empty());
  std::string content_type;
  const std::string stream = read_events(*client_, id, &content_type);
  EXPECT_EQ(content_type, "text/event-stream");
  size_t last = 0;
  for (const char* ev : {"event: queued", "event: started", "event: step", "event: preview", "event: done"}) {
    const size_t at = stream.find(ev, last);
    EXPECT_NE(at, std::string::npos) << ev << " missing or out of order in:\n" << stream.substr(0, 2000);
    if (at != std::string::npos) last = at;
  }
  const auto job = test::wait_job(*client_, id);
  EXPECT_EQ(job["state"], "done");
  EXPECT_EQ(job["progress"], 1.0);
  ASSERT_EQ(job["images"].size(), 1u);
  const Image img = decode_b64_image(job["images"][0]["data"]);
  EXPECT_EQ(img.width, 64);
  EXPECT_EQ(img.height, 64);
  EXPECT_NE(job["images"][0]["infotext"].get<std::string>().find("Seed: 5, Size: 64x64"), std::string::npos);
  // Resuming with Last-Event-ID gives only the later events.
  std::string tail;
  client_->Get(("/v1/jobs/" + id + "/events").c_str(), httplib::Headers{{"Last-Event-ID", "2"}},
               [&](const char* data, size_t n) {
                 tail.append(data, n);
                 return true;
               });
  EXPECT_EQ(tail.find("event: queued"), std::string::npos);
  EXPECT_NE(tail.find("event: done"), std::string::npos);
  // Finished: DELETE says so; unknown ids are 404.
  auto del = client_->Delete(("/v1/jobs/" + id).c_str());
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 409);
  auto missing = client_->Get("/v1/jobs/0123456789abcdef0123456789abcdef");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

// A worker keeps one model call in flight: progress still comes once per step, in order, through the last step,
// before the job is done; its previews come in step order.
TEST_F(ServeApi, StepsAndPreviewsArriveInOrderOncePerStep) {
  const std::string id = post_preview_job(*client_, 6, 4, 32);
  ASSERT_FALSE(id.empty());
  const std::string stream = read_events(*client_, id);
  std::vector<int> steps, previews;
  bool done_after_last_step = false;
  for (size_t at = stream.find("event: "); at != std::string::npos; at = stream.find("event: ", at + 1)) {
    const std::string type = stream.substr(at + 7, stream.find('\n', at) - at - 7);
    const size_t data = stream.find("data: ", at);
    const auto j = parse(stream.substr(data + 6, stream.find('\n', data) - data - 6));
    if (type == "step") steps.push_back(j["step"].get<int>());
    if (type == "preview") previews.push_back(j["step"].get<int>());
    if (type == "done") done_after_last_step = !steps.empty() && steps.back() == 4;
  }
  EXPECT_EQ(steps, (std::vector<int>{0, 1, 2, 3, 4})) << stream.substr(0, 2000);  // 0: admitted
  EXPECT_TRUE(done_after_last_step) << stream.substr(0, 2000);
  EXPECT_FALSE(previews.empty());
  EXPECT_TRUE(std::is_sorted(previews.begin(), previews.end()) && std::adjacent_find(previews.begin(), previews.end()) == previews.end());
  for (int p : previews) EXPECT_TRUE(p >= 1 && p <= 4) << p;
}

TEST_F(ServeApi, ImagesEqualThePipelines) {
  SdLoadOptions lo;
  auto model = load_sd_model(test::tiny_model_path(), lo);
  ASSERT_TRUE(model);
  (*model)->name = "tiny";  // the server's name for it (infotext "Model: tiny")
  SdPipeline pipe(*model);
  GenerateRequest r;
  r.prompt = "a red circle";
  r.width = r.height = 64;
  r.steps = 3;
  r.seed = 77;
  r.batch_size = 2;
  r.sampler = "dpmpp_2m";
  const Expected<GenerateResult> want = ::atelier::test::on_one_omp_thread([&] { return pipe.generate(r); });
  ASSERT_TRUE(want) << want.status().message();
  int status = 0;
  auto body = small_job(77, 3, 64);
  body["batch_size"] = 2;
  body["sampler"] = "dpmpp_2m";
  const auto created = post_json(*client_, "/v1/jobs", body, &status);
  ASSERT_EQ(status, 202);
  const auto job = test::wait_job(*client_, created["id"]);
  ASSERT_EQ(job["images"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const Image got = decode_b64_image(job["images"][i]["data"]);
    const Image& ref = want->images[size_t(i)].image;
    ASSERT_EQ(got.pixels.size(), ref.pixels.size());
    EXPECT_LE(::atelier::test::max_pixel_diff(got, ref), 1) << "image " << i;
    EXPECT_EQ(job["images"][i]["infotext"], want->images[size_t(i)].infotext);
  }
}

TEST_F(ServeApi, A1111Txt2ImgAndImg2Img) {
  int status = 0;
  auto t2i = post_json(*client_, "/sdapi/v1/txt2img",
                       {{"prompt", "a cat"}, {"negative_prompt", "dog"}, {"width", 32}, {"height", 48}, {"steps", 2},
                        {"seed", 9}, {"batch_size", 2}, {"sampler_name", "DPM++ 2M"}, {"scheduler", "Karras"},
                        {"override_settings", {{"CLIP_stop_at_last_layers", 2}}}, {"unknown_client_field", 1}},
                       &status);
  ASSERT_EQ(status, 200) << t2i.dump().substr(0, 300);
  ASSERT_EQ(t2i["images"].size(), 2u);
  const Image first = decode_b64_image(t2i["images"][0]);
  EXPECT_EQ(first.width, 32);
  EXPECT_EQ(first.height, 48);
  const auto info = parse(t2i["info"].get<std::string>());
  EXPECT_EQ(info["all_seeds"], nlohmann::json::array({9, 10}));
  EXPECT_EQ(info["sd_model_name"], "tiny");
  const std::string infotext = info["infotexts"][1];
  EXPECT_NE(infotext.find("Negative prompt: dog\nSteps: 2, Sampler: DPM++ 2M, Schedule type: Karras"), std::string::npos) << infotext;
  EXPECT_NE(infotext.find("Clip skip: 2"), std::string::npos) << infotext;
  EXPECT_EQ(t2i["parameters"]["prompt"], "a cat");

  auto i2i = post_json(*client_, "/sdapi/v1/img2img",
                       {{"prompt", "a cat"}, {"init_images", {t2i["images"][0]}}, {"denoising_strength", 0.5},
                        {"width", 32}, {"height", 32}, {"steps", 4}, {"seed", 3}},
                       &status);
  ASSERT_EQ(status, 200) << i2i.dump().substr(0, 300);
  const Image out = decode_b64_image(i2i["images"][0]);
  EXPECT_EQ(out.width, 32);
  EXPECT_NE(parse(i2i["info"].get<std::string>())["infotexts"][0].get<std::string>().find("Denoising strength: 0.5"),
            std::string::npos);
  // A strength that leaves no step of the 4 (int(4 x 0.2) = 0) is a 400 before anything is queued.
  const auto none = post_json(*client_, "/sdapi/v1/img2img",
                              {{"prompt", "a cat"}, {"init_images", {t2i["images"][0]}}, {"denoising_strength", 0.2},
                               {"width", 32}, {"height", 32}, {"steps", 4}},
                              &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(none.dump().find("denoising_strength: 0.2"), std::string::npos) << none.dump();
  EXPECT_NE(none.dump().find("leaves no step to run"), std::string::npos) << none.dump();
}

// A1111's API reads (word:1.2) emphasis by default, as A1111 does; override_settings.emphasis "None" reads brackets
// literally ("No norm" is not implemented: a 400).
TEST_F(ServeApi, A1111ReadsEmphasisByDefault) {
  const auto image_of = [&](const nlohmann::json& overrides) {
    nlohmann::json body = small_job(21, 2);
    body["prompt"] = "a (red:1.8) circle";
    if (!overrides.is_null()) body["override_settings"] = overrides;
    int status = 0;
    const auto r = post_json(*client_, "/sdapi/v1/txt2img", body, &status);
    EXPECT_EQ(status, 200) << r.dump().substr(0, 300);
    return status == 200 ? decode_b64_image(r["images"][0]).pixels : std::vector<uint8_t>();
  };
  const auto by_default = image_of(nullptr), original = image_of({{"emphasis", "Original"}}),
             literal = image_of({{"emphasis", "None"}});
  ASSERT_FALSE(by_default.empty());
  EXPECT_EQ(by_default, original);
  EXPECT_NE(by_default, literal) << "the weight changed nothing";
  int status = 0;
  const auto r = post_json(*client_, "/sdapi/v1/txt2img", {{"prompt", "x"}, {"override_settings", {{"emphasis", "No norm"}}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(r.dump().find("emphasis"), std::string::npos) << r.dump();
}

TEST_F(ServeApi, A1111InfoEndpoints) {
  auto get = [&](const char* path) {
    auto r = client_->Get(path);
    EXPECT_TRUE(r) << path;
    if (!r) return nlohmann::json();
    EXPECT_EQ(r->status, 200) << path << ": " << r->body;
    return parse(r->body);
  };
  const auto models = get("/sdapi/v1/sd-models");
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0]["model_name"], "tiny");
  EXPECT_EQ(models[0]["hash"].get<std::string>().size(), 10u);
  bool euler_a = false;
  for (const auto& s : get("/sdapi/v1/samplers")) euler_a |= s["name"] == "Euler a";
  EXPECT_TRUE(euler_a);
  EXPECT_EQ(get("/sdapi/v1/schedulers")[1]["label"], "Karras");
  EXPECT_EQ(get("/sdapi/v1/options")["sd_model_checkpoint"], models[0]["title"]);
  const auto progress = get("/sdapi/v1/progress");
  EXPECT_TRUE(progress.contains("progress"));
  EXPECT_TRUE(progress["state"].contains("sampling_steps"));
  EXPECT_TRUE(get("/sdapi/v1/memory").contains("ram"));
  auto intr = client_->Post("/sdapi/v1/interrupt", "", "application/json");
  ASSERT_TRUE(intr);
  EXPECT_EQ(intr->status, 200);
}

TEST_F(ServeApi, OpenAIGenerationsPlainAndStreamed) {
  int status = 0;
  auto plain = post_json(*client_, "/v1/images/generations",
                         {{"prompt", "a cat"}, {"size", "32x32"}, {"n", 2}, {"steps", 1}, {"response_format", "b64_json"},
                          {"quality", "high"}},
                         &status);
  ASSERT_EQ(status, 200) << plain.dump().substr(0, 300);
  ASSERT_EQ(plain["data"].size(), 2u);
  EXPECT_EQ(decode_b64_image(plain["data"][1]["b64_json"]).width, 32);
  EXPECT_EQ(plain["size"], "32x32");

  std::string stream;
  auto r = client_->Post("/v1/images/generations",
                         nlohmann::json({{"prompt", "a cat"}, {"size", "32x32"}, {"steps", 3}, {"stream", true},
                                         {"partial_images", 2}, {"output_format", "jpeg"}})
                             .dump(),
                         "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  stream = r->body;
  const size_t partial = stream.find("event: image_generation.partial_image");
  const size_t done = stream.find("event: image_generation.completed");
  EXPECT_NE(partial, std::string::npos) << stream.substr(0, 500);
  ASSERT_NE(done, std::string::npos) << stream.substr(0, 500);
  EXPECT_LT(partial, done);
  const size_t data = stream.find("data: ", done);
  const auto completed = parse(stream.substr(data + 6, stream.find('\n', data) - data - 6));
  const Image img = decode_b64_image(completed["b64_json"]);
  EXPECT_EQ(img.width, 32);
  EXPECT_EQ(completed["output_format"], "jpeg");
}

// response_format "url" (OpenAI's default for its DALL-E models): each image at a URL of this server, the same bytes as
// b64_json gives for the same seed; the file route is public (a client fetches the URL without the key, as it would
// OpenAI's signed URL) and knows only the names it gave out.
TEST(ServeAuth, OpenAIImagesByUrlArePublicUnguessableFiles) {
  ATELIER_REQUIRE_TINY_MODEL();
  ServeOptions o = test::tiny_options();
  o.api_key = "s3cret";
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  c->set_bearer_token_auth("s3cret");
  const nlohmann::json req = {{"prompt", "a cat"}, {"size", "32x32"}, {"n", 2}, {"steps", 1}, {"seed", 9}};
  int status = 0;
  nlohmann::json by_url = req;
  by_url["response_format"] = "url";
  const auto urls = post_json(*c, "/v1/images/generations", by_url, &status);
  ASSERT_EQ(status, 200) << urls.dump().substr(0, 300);
  const auto inline_ = post_json(*c, "/v1/images/generations", req, &status);
  ASSERT_EQ(status, 200);
  ASSERT_EQ(urls["data"].size(), 2u);
  auto anon = s->client();  // no key
  const std::string base = "http://127.0.0.1:" + std::to_string(s->port);
  for (int i = 0; i < 2; ++i) {
    const std::string url = urls["data"][i]["url"];
    EXPECT_FALSE(urls["data"][i].contains("b64_json"));
    ASSERT_EQ(url.rfind(base + "/v1/images/files/", 0), 0u) << url;
    EXPECT_EQ(url.size(), base.size() + std::string("/v1/images/files/").size() + 32 + 4) << url;
    auto got = anon->Get(url.substr(base.size()).c_str());
    ASSERT_TRUE(got);
    ASSERT_EQ(got->status, 200) << got->body;
    EXPECT_EQ(got->get_header_value("Content-Type"), "image/png");
    EXPECT_EQ(base64_encode(got->body), inline_["data"][i]["b64_json"].get<std::string>()) << "image " << i;
  }
  EXPECT_NE(urls["data"][0]["url"], urls["data"][1]["url"]);
  auto unknown = anon->Get("/v1/images/files/0123456789abcdef0123456789abcdef.png");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  auto elsewhere = anon->Get("/v1/images/files/../../v1/models");
  ASSERT_TRUE(elsewhere);
  EXPECT_NE(elsewhere->status, 200);
  EXPECT_EQ(anon->Get("/v1/models")->status, 401);  // the rest still wants the key
}

// Every kind of bad input: a 400 whose message names the field, and the server still answers the next request.
TEST_F(ServeApi, MalformedRequestsAre400AndHarmless) {
  const std::string deep(100000, '[');
  // A PNG header announcing 100000 x 100000 pixels: refused before any pixel memory is allocated.
  const char kHugePng[] = "\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\x01\x86\xa0\0\x01\x86\xa0\x08\x02\0\0\0";
  const std::string fake_png(kHugePng, sizeof(kHugePng) - 1);
  const std::string huge_png = base64_encode(fake_png);
  // A real 1100x1000 upload with no size asked for: img2img runs at the image's size, past the server's pixel limit.
  const auto large = encode_png(Image{1100, 1000, 3, std::vector<uint8_t>(size_t(1100) * 1000 * 3, 90)});
  ASSERT_TRUE(large);
  const std::string big_png = base64_encode(*large);
  struct Case {
    std::string path, body, expect;
  };
  const std::vector<Case> cases = {
      {"/v1/jobs", "not json", "not valid JSON"},
      {"/v1/jobs", "", "empty"},
      {"/v1/jobs", "[1,2]", "JSON object"},
      {"/v1/jobs", deep, "nests deeper"},
      {"/v1/jobs", "{\"prompt\": \"\xff\xfe\"}", "not valid JSON"},
      {"/v1/jobs", R"({"steps": "abc"})", "steps"},
      {"/v1/jobs", R"({"steps": 1e308})", "steps"},
      {"/v1/jobs", R"({"steps": 1e999})", "JSON numbers cannot represent"},  // past a double: not a parse error to nlohmann
      {"/v1/images/generations", R"({"prompt": "x", "seed": -1e999})", "JSON numbers cannot represent"},
      {"/v1/jobs", R"({"steps": 2.5})", "steps"},
      {"/v1/jobs", R"({"width": 33, "height": 32})", "width"},
      {"/v1/jobs", R"({"width": 100000})", "width"},
      {"/v1/jobs", R"({"width": 2048, "height": 2048})", "width x height"},
      {"/v1/jobs", R"({"prompt": 5})", "prompt"},
      {"/v1/jobs", R"({"prompt": ["a"]})", "prompt"},
      {"/v1/jobs", R"({"cfg_scale": -1})", "cfg_scale"},
      {"/v1/jobs", R"({"seed": -5})", "seed"},
      {"/v1/jobs", R"({"seed": 18446744073709551615})", "seed"},
      {"/v1/jobs", R"({"batch_size": 1000})", "batch_size"},
      {"/v1/jobs", R"({"batch_size": 8, "batch_count": 8})", "images per request"},
      {"/v1/jobs", R"({"sampler": "nope"})", "sampler"},
      {"/v1/jobs", R"({"sampler": "ddim", "schedule": "karras"})", "sampler"},
      {"/v1/jobs", R"({"schedule": "weird"})", "schedule"},
      {"/v1/jobs", R"({"model": "missing"})", "model"},
      {"/v1/jobs", R"({"bogus": 1})", "bogus"},
      {"/v1/jobs", R"({"output_format": "gif"})", "output_format"},
      {"/v1/jobs", R"({"init_image": "@@@@"})", "init_image"},
      {"/v1/jobs", R"({"init_image": 12})", "init_image"},
      {"/v1/jobs", R"({"init_image": "aGVsbG8gd29ybGQ="})", "init_image"},
      {"/v1/jobs", "{\"init_image\": \"" + huge_png + "\"}", "init_image"},
      {"/v1/jobs", R"({"init_image": "data:image/png,xyz"})", "init_image"},
      {"/v1/jobs", "{\"init_image\": \"" + big_png + "\"}", "width x height"},
      {"/v1/jobs", R"({"timeout_s": -1})", "timeout_s"},
      {"/v1/jobs", R"({"guidance": "high"})", "guidance"},
      {"/v1/jobs", R"({"guidance": 1000})", "guidance"},
      {"/v1/jobs", R"({"max_sequence_length": 513})", "max_sequence_length"},
      {"/sdapi/v1/txt2img", R"({"distilled_cfg_scale": -1})", "distilled_cfg_scale"},
      {"/sdapi/v1/txt2img", R"({"override_settings": {"samples_format": "gif"}})", "samples_format"},
      {"/sdapi/v1/options", R"({"samples_format": "gif"})", "samples_format"},
      {"/sdapi/v1/options", R"({"randn_source": 3})", "randn_source"},
      {"/sdapi/v1/options", R"({"sd_model_checkpoint": ["tiny"]})", "sd_model_checkpoint"},
      {"/sdapi/v1/options", R"("tiny")", "JSON object"},
      {"/v1/images/generations", R"({"prompt": "x", "guidance": []})", "guidance"},
      {"/v1/jobs", R"x({"prompt": "(cat:1.2.3)", "emphasis": true})x", "prompt: prompt emphasis weight"},
      {"/v1/jobs", R"x({"negative_prompt": "(cat:100000)", "emphasis": true})x", "negative_prompt: prompt emphasis weight 100000 is out of range"},
      {"/sdapi/v1/txt2img", R"({"sampler_name": 3})", "sampler_name"},
      {"/sdapi/v1/txt2img", R"({"sampler_name": "Warp Drive"})", "sampler_name: "},
      {"/sdapi/v1/txt2img", R"({"sampler_index": "Warp Drive"})", "sampler_index: "},
      {"/sdapi/v1/txt2img", R"({"scheduler": "Beta"})", "scheduler"},
      {"/sdapi/v1/txt2img", R"({"override_settings": []})", "override_settings"},
      {"/sdapi/v1/txt2img", R"({"override_settings": {"CLIP_stop_at_last_layers": 99}})", "CLIP_stop_at_last_layers"},
      {"/sdapi/v1/img2img", R"({"prompt": "x"})", "init_images"},
      {"/sdapi/v1/img2img", R"({"init_images": "abc"})", "init_images"},
      {"/sdapi/v1/img2img", R"({"init_images": ["abc"], "mask": "x"})", "mask"},
      {"/v1/images/generations", R"({"size": "32x32"})", "prompt"},
      {"/v1/images/generations", R"({"prompt": "x", "size": "big"})", "size"},
      {"/v1/images/generations", R"({"prompt": "x", "size": "1x1"})", "size: \"1x1\" is not supported: each side from 8 to 2048"},
      {"/v1/images/generations", R"({"prompt": "x", "size": "4096x8"})", "size: \"4096x8\" is not supported"},
      {"/v1/images/generations", R"({"prompt": "x", "response_format": "svg"})", "response_format: \"svg\" is not supported"},
      {"/v1/images/generations", R"({"prompt": "x", "n": 0})", "n"},
      {"/v1/images/generations", R"({"prompt": "x", "partial_images": 9})", "partial_images"},
  };
  for (const Case& c : cases) {
    auto r = client_->Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(r) << "no answer to " << c.path << " " << c.body.substr(0, 80);
    EXPECT_EQ(r->status, 400) << c.path << " " << c.body.substr(0, 80) << " -> " << r->body.substr(0, 300);
    const auto j = parse(r->body);
    const std::string msg = j.contains("error") ? j["error"].value("message", "") : "";
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.body.substr(0, 80) << " -> " << msg;
  }
  // Too large a body: 413 from the HTTP layer. Unknown endpoints: 404 in the same JSON shape.
  ServeOptions o;
  auto big = client_->Post("/v1/jobs", std::string(o.max_body_bytes + 1, ' '), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  // A compressed body is refused before it is read (a small gzip body can inflate to gigabytes past the limit).
  auto gz = client_->Post("/v1/jobs", httplib::Headers{{"Content-Encoding", "gzip"}}, std::string("\x1f\x8b not gzip", 12),
                          "application/json");
  ASSERT_TRUE(gz);
  EXPECT_EQ(gz->status, 415);
  EXPECT_NE(gz->body.find("uncompressed only"), std::string::npos) << gz->body;
  auto none = client_->Get("/nope");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 404);
  EXPECT_TRUE(parse(none->body).contains("error"));
  // Still serving.
  int status = 0;
  const auto ok = post_json(*client_, "/sdapi/v1/txt2img", small_job(1), &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(ok["images"].size(), 1u);
}

TEST_F(ServeApi, RequestTimeoutFailsTheJob) {
  int status = 0;
  auto body = small_job(3, 150, 64);
  body["timeout_s"] = 0.05;
  const auto created = post_json(*client_, "/v1/jobs", body, &status);
  ASSERT_EQ(status, 202);
  const auto job = test::wait_job(*client_, created["id"]);
  EXPECT_EQ(job["state"], "failed");
  EXPECT_NE(job.value("error", "").find("timed out"), std::string::npos) << job.dump();
}

TEST(ServeAuth, ApiKeyAndCors) {
  ATELIER_REQUIRE_TINY_MODEL();
  ServeOptions o = test::tiny_options();
  o.api_key = "s3cret";
  o.cors_origin = "https://app.example";
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  auto anon = c->Get("/v1/models");
  ASSERT_TRUE(anon);
  EXPECT_EQ(anon->status, 401);
  EXPECT_EQ(anon->get_header_value("WWW-Authenticate"), "Bearer");
  auto wrong = c->Get("/v1/models", httplib::Headers{{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto ok = c->Get("/v1/models", httplib::Headers{{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  auto health = c->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto pre = c->Options("/v1/jobs");
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
}

TEST(ServeAuth, StartupErrorsAreValues) {
  ATELIER_REQUIRE_TINY_MODEL();
  ServeOptions o = test::tiny_options();
  o.models = {"x=/no/such/model"};
  auto a = Server::create(o);
  ASSERT_FALSE(a);
  EXPECT_NE(a.status().message().find("/no/such/model"), std::string::npos);
  o = test::tiny_options();
  o.devices = "cuda:7";
  auto b = Server::create(o);
  ASSERT_FALSE(b);
  EXPECT_NE(b.status().message().find("cuda:7"), std::string::npos);
  o = test::tiny_options();
  o.max_batch = 0;
  EXPECT_FALSE(Server::create(o));
}

}  // namespace
}  // namespace atelier::serve

namespace atelier::serve {
namespace {

// --model-dir serves every model folder in it by name; models load on first use and the least recently
// used one is evicted when a device may hold only one.
TEST(ServeModels, ModelDirLoadsOnDemandAndEvictsLeastRecentlyUsed) {
  ATELIER_REQUIRE_TINY_MODEL();
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("atelier_serve_models_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_directory_symlink(test::tiny_model_path(), dir / "alpha");
  fs::create_directory_symlink(test::tiny_model_path(), dir / "beta");
  ServeOptions o = test::tiny_options();
  o.models.clear();
  o.model_dir = dir.string();
  o.max_models_per_device = 1;
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  auto loads = [&] {
    return test::prom_value(c->Get("/metrics")->body, "atelier_stage_seconds_count{stage=\"model_load\"}");
  };
  EXPECT_EQ(loads(), -1) << "nothing is loaded before a request needs it";
  int status = 0;
  for (const char* model : {"alpha", "alpha", "beta", "alpha"}) {
    auto r = post_json(*c, "/sdapi/v1/txt2img",
                       {{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}, {"seed", 1},
                        {"override_settings", {{"sd_model_checkpoint", model}}}},
                       &status);
    ASSERT_EQ(status, 200) << r.dump().substr(0, 200);
    EXPECT_NE(parse(r["info"].get<std::string>())["infotexts"][0].get<std::string>().find(std::string("Model: ") + model),
              std::string::npos);
  }
  EXPECT_EQ(loads(), 3) << "alpha, beta (evicting alpha), alpha again";
  const std::string metrics = c->Get("/metrics")->body;
  EXPECT_EQ(test::prom_value(metrics, "atelier_models_loaded{device=\"cpu\",worker=\"0\"}"), 1);
  const auto models = parse(c->Get("/sdapi/v1/sd-models")->body);
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0]["model_name"], "alpha");
  auto bad = post_json(*c, "/v1/jobs", {{"model", "gamma"}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("alpha, beta"), std::string::npos);
  s.reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace atelier::serve

namespace atelier::serve {
namespace {

// POST /sdapi/v1/options, as A1111 clients switch models: the checkpoint, clip skip, noise source and image format
// of later A1111 requests, checked as a whole (a bad value changes nothing), override_settings still winning.
TEST(ServeA1111Options, PostSetsTheDefaultsOfLaterRequests) {
  ATELIER_REQUIRE_TINY_MODEL();
  ServeOptions o = test::tiny_options();
  o.models = {"tiny=" + test::tiny_model_path(), "other=" + test::tiny_model_path()};
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  auto options = [&] { return parse(c->Get("/sdapi/v1/options")->body); };
  EXPECT_EQ(options()["sd_model_checkpoint"].get<std::string>().rfind("tiny", 0), 0u);
  int status = 0;
  const auto applied = post_json(*c, "/sdapi/v1/options",
                                 {{"sd_model_checkpoint", "other"}, {"CLIP_stop_at_last_layers", 2}, {"samples_format", "jpg"},
                                  {"randn_source", "CPU"}, {"sd_vae", "Automatic"}}, &status);
  ASSERT_EQ(status, 200) << applied.dump();
  EXPECT_EQ(applied["applied"].size(), 4u);
  EXPECT_EQ(applied["ignored"], nlohmann::json::array({"sd_vae"}));
  auto now = options();
  EXPECT_EQ(now["sd_model_checkpoint"].get<std::string>().rfind("other [", 0), 0u) << now.dump();
  EXPECT_EQ(now["CLIP_stop_at_last_layers"], 2);
  EXPECT_EQ(now["samples_format"], "jpg");
  EXPECT_EQ(now["randn_source"], "CPU");

  const nlohmann::json req = {{"prompt", "a red circle"}, {"width", 32}, {"height", 32}, {"steps", 2}, {"seed", 5}};
  auto res = post_json(*c, "/sdapi/v1/txt2img", req, &status);
  ASSERT_EQ(status, 200) << res.dump().substr(0, 300);
  auto info = parse(res["info"].get<std::string>());
  EXPECT_EQ(info["sd_model_name"], "other");
  EXPECT_EQ(info["clip_skip"], 2);
  EXPECT_NE(info["infotexts"][0].get<std::string>().find("RNG: CPU"), std::string::npos) << info["infotexts"][0];
  auto bytes = base64_decode(res["images"][0].get<std::string>(), "image", 1 << 20);
  ASSERT_TRUE(bytes);
  EXPECT_EQ(bytes->substr(0, 2), std::string("\xff\xd8")) << "samples_format jpg: a JPEG";

  nlohmann::json overridden = req;
  overridden["override_settings"] = {{"sd_model_checkpoint", "tiny"}, {"samples_format", "png"}};
  res = post_json(*c, "/sdapi/v1/txt2img", overridden, &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(parse(res["info"].get<std::string>())["sd_model_name"], "tiny");
  bytes = base64_decode(res["images"][0].get<std::string>(), "image", 1 << 20);
  ASSERT_TRUE(bytes);
  EXPECT_EQ(bytes->substr(1, 3), "PNG");

  // Bad values: a 400 that names the option, and nothing applied (not even the good keys beside it).
  post_json(*c, "/sdapi/v1/options", {{"sd_model_checkpoint", "nope"}}, &status);
  EXPECT_EQ(status, 400);
  const auto bad = post_json(*c, "/sdapi/v1/options", {{"sd_model_checkpoint", "tiny"}, {"CLIP_stop_at_last_layers", 99}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(bad.dump().find("CLIP_stop_at_last_layers"), std::string::npos) << bad.dump();
  EXPECT_EQ(options()["sd_model_checkpoint"].get<std::string>().rfind("other [", 0), 0u);
  post_json(*c, "/sdapi/v1/options", nlohmann::json::array({1}), &status);
  EXPECT_EQ(status, 400);
}

TEST(ServeOutput, OutputDirKeepsEveryImageWithItsSidecar) {
  ATELIER_REQUIRE_TINY_MODEL();
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("atelier_serve_out_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ServeOptions o = test::tiny_options();
  o.output_dir = (dir / "images").string();  // created by the server
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  const auto created = post_json(*c, "/v1/jobs",
                                 {{"prompt", "x"}, {"width", 32}, {"height", 32}, {"steps", 1}, {"seed", 4},
                                  {"batch_size", 2}, {"output_format", "webp"}},
                                 &status);
  ASSERT_EQ(status, 202);
  const auto job = test::wait_job(*c, created["id"]);
  ASSERT_EQ(job["images"].size(), 2u);
  for (const auto& img : job["images"]) {
    const fs::path path = img["path"].get<std::string>();
    EXPECT_EQ(path.parent_path(), dir / "images");
    EXPECT_EQ(path.extension(), ".webp");
    EXPECT_TRUE(fs::exists(path));
    std::ifstream side(fs::path(path).replace_extension(".json"));
    ASSERT_TRUE(side.good());
    const auto info = nlohmann::json::parse(side);
    EXPECT_EQ(info["infotext"], img["infotext"]);
    EXPECT_EQ(info["settings"]["seed"], img["seed"]);
    EXPECT_EQ(img["format"], "webp");
    EXPECT_EQ(decode_b64_image(img["data"]).width, 32);
  }
  s.reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace atelier::serve
