// The server on cuda:0 with the sd15-tiny model, through its real port. Its worker keeps one model call in flight
// (Worker::run_call): on the CPU the queue marks are no-ops, so only on a GPU is the run-ahead asynchronous, with
// the host composing call n + 1 while the device runs call n. Concurrent jobs of two groups, some with previews,
// each finish once with a valid image, their step events once and in order before `done`, previews in order, and
// the worker's busy spans never overlap; a job cancelled while its call is in flight leaves the worker serving;
// FLUX and Z-Image jobs run between the SD calls.
// Skips with the reason without a GPU or the fixture.
#include <gtest/gtest.h>

#include <thread>

#include "cuda_test_util.h"
#include "serve_test_util.h"

namespace atelier::serve {
namespace {

using test::parse;
using test::post_json;
using test::RunningServer;

ServeOptions gpu_options() {
  ServeOptions o = test::tiny_options();
  o.devices = "0";
  o.max_batch = 8;
  o.batch_window_ms = 0;
  return o;
}

nlohmann::json job(int64_t seed, int steps, int side, bool preview) {
  return {{"prompt", "a red circle"}, {"width", side}, {"height", side}, {"steps", steps}, {"seed", seed}, {"preview", preview}};
}

// The (type, step) of every event of a finished job, replayed from its start.
std::vector<std::pair<std::string, int>> events_of(httplib::Client& c, const std::string& id) {
  const std::string stream = test::read_events(c, id);
  std::vector<std::pair<std::string, int>> out;
  for (size_t at = stream.find("event: "); at != std::string::npos; at = stream.find("event: ", at + 1)) {
    const std::string type = stream.substr(at + 7, stream.find('\n', at) - at - 7);
    const size_t data = stream.find("data: ", at);
    const auto j = parse(stream.substr(data + 6, stream.find('\n', data) - data - 6));
    out.emplace_back(type, j.contains("step") ? j["step"].get<int>() : -1);
  }
  return out;
}

TEST(CudaServe, ConcurrentJobsWithACallInFlightFinishOnceInOrder) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_TINY_MODEL();
  auto s = RunningServer::start(gpu_options());
  ASSERT_TRUE(s);
  auto c = s->client();
  struct Submitted {
    std::string id;
    int steps, side;
    bool preview;
  };
  std::vector<Submitted> jobs;
  for (int i = 0; i < 8; ++i) {  // two groups (32 and 64 px), 3 to 10 steps, every other one with previews
    const Submitted j{"", 3 + i, i % 2 ? 64 : 32, i % 2 == 0};
    int status = 0;
    const auto created = post_json(*c, "/v1/jobs", job(100 + i, j.steps, j.side, j.preview), &status);
    ASSERT_EQ(status, 202) << created.dump();
    jobs.push_back(j);
    jobs.back().id = created["id"];
  }
  for (const Submitted& j : jobs) {
    const auto done = test::wait_job(*c, j.id, 300);
    ASSERT_EQ(done["state"], "done") << done.dump().substr(0, 300);
    ASSERT_EQ(done["images"].size(), 1u);
    const Image img = test::decode_b64_image(done["images"][0]["data"]);
    EXPECT_EQ(img.width, j.side);
    // Steps 0 (admitted) to the last, each once and in order, then done; previews in order, inside the steps.
    std::vector<int> steps, previews;
    std::string last;
    for (const auto& [type, step] : events_of(*c, j.id)) {
      EXPECT_NE(type, "failed");
      if (type == "step") steps.push_back(step);
      if (type == "preview") previews.push_back(step);
      last = type;
    }
    std::vector<int> want(size_t(j.steps + 1));
    for (int k = 0; k <= j.steps; ++k) want[size_t(k)] = k;
    EXPECT_EQ(steps, want) << "job " << j.id;
    EXPECT_EQ(last, "done");
    EXPECT_TRUE(std::is_sorted(previews.begin(), previews.end()) &&
                std::adjacent_find(previews.begin(), previews.end()) == previews.end());
    if (j.preview) EXPECT_FALSE(previews.empty()) << "job " << j.id;
  }
  // The worker's timeline: spans in order, never overlapping; every model call in it once.
  const auto st = parse(c->Get("/v1/stats")->body);
  double last_end = 0, calls = 0;
  for (const auto& span : st["workers"][0]["timeline"]) {
    EXPECT_GE(span[0].get<double>(), last_end - 1e-6) << "spans overlap: " << span.dump();
    last_end = span[1].get<double>();
    calls += span[2] == "model_call";
  }
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(calls, test::prom_value(m->body, "atelier_batch_size_count"));
  EXPECT_EQ(test::prom_value(m->body, "atelier_jobs_total{state=\"done\"}"), 8);
}

TEST(CudaServe, CancellingDuringACallInFlightLeavesTheWorkerServing) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_TINY_MODEL();
  auto s = RunningServer::start(gpu_options());
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  // The largest job the limits allow (150 steps at 1024 px: a 128x128 latent), so that it is still running when the
  // cancellation comes, though the tiny UNet is fast on a GPU.
  const auto created = post_json(*c, "/v1/jobs", job(1, 150, 1024, true), &status);
  ASSERT_EQ(status, 202) << created.dump();
  const std::string id = created["id"];
  test::wait_for_step(*c, id, 3);
  ASSERT_EQ(c->Delete(("/v1/jobs/" + id).c_str())->status, 202) << "the job ended before it could be cancelled";
  const auto cancelled = test::wait_job(*c, id, 60);
  EXPECT_EQ(cancelled["state"], "cancelled");
  EXPECT_LT(cancelled["step"].get<int>(), 150);
  const std::string next = post_json(*c, "/v1/jobs", job(2, 4, 64, false), &status)["id"];
  EXPECT_EQ(test::wait_job(*c, next, 60)["state"], "done");
  EXPECT_EQ(c->Get("/readyz")->status, 200);
}

// FLUX and Z-Image jobs on the GPU worker between SD jobs (worker_dit.cc): the SD call in flight finishes before a
// DiT request runs whole; every job finishes once with its step events 0..steps once and in order.
TEST(CudaServe, DitJobsRunBetweenSdCallsOnTheGpu) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_TINY_MODEL();
  const auto flux = ::atelier::test::fixture("flux-tiny"), zimage = ::atelier::test::fixture("zimage-tiny");
  if (!flux || !zimage) GTEST_SKIP() << "fixtures 'flux-tiny' and 'zimage-tiny' not found";
  ServeOptions o = gpu_options();
  o.models.push_back("flux=" + (*flux / "model").string());
  o.models.push_back("zimage=" + (*zimage / "model").string());
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  struct Submitted {
    std::string id, model;
    int steps;
  };
  std::vector<Submitted> jobs;
  int status = 0;
  for (int i = 0; i < 6; ++i) {
    const std::string model = i % 3 == 0 ? "tiny" : i % 3 == 1 ? "flux" : "zimage";
    const int steps = 3 + i;
    nlohmann::json body = job(100 + i, steps, model == "tiny" ? 32 : 64, false);
    body["model"] = model;
    jobs.push_back({post_json(*c, "/v1/jobs", body, &status)["id"], model, steps});
    ASSERT_EQ(status, 202);
  }
  for (const Submitted& j : jobs) {
    const nlohmann::json done = test::wait_job(*c, j.id, 120);
    ASSERT_EQ(done["state"], "done") << j.model << ": " << done.dump().substr(0, 300);
    EXPECT_EQ(done["images"].size(), 1u);
    std::vector<int> steps;
    for (const auto& [type, step] : events_of(*c, j.id))
      if (type == "step") steps.push_back(step);
    std::vector<int> want(j.steps + 1);  // step 0 (started), then one per model call
    for (int k = 0; k <= j.steps; ++k) want[k] = k;
    EXPECT_EQ(steps, want) << j.model;
  }
  EXPECT_EQ(c->Get("/readyz")->status, 200);
}

// Queued FLUX jobs sharing model calls on the GPU (FluxPipeline::generate_batch: per-row prompts and guidance
// stacked on the device): three jobs of different seeds, guidance and prompts in one batch of 3 rows (one model call
// per step for all three), each done once with its step events in order and an image of its own.
TEST(CudaServe, FluxJobsShareModelCallsOnTheGpu) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_TINY_MODEL();
  const auto flux = ::atelier::test::fixture("flux-tiny");
  if (!flux) GTEST_SKIP() << "fixture 'flux-tiny' not found";
  ServeOptions o = gpu_options();
  o.models.push_back("flux=" + (*flux / "model").string());
  o.max_batch = 3;
  o.batch_window_ms = 5000;  // the idle worker waits for its 3 images (ends as soon as they are there)
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  constexpr int kSteps = 4;
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    nlohmann::json body = job(200 + i, kSteps, 64, false);
    body["model"] = "flux";
    body["guidance"] = 2.0 + i;
    body["max_sequence_length"] = 32;
    if (i == 1) body["prompt"] = "a blue square";
    int status = 0;
    ids.push_back(post_json(*c, "/v1/jobs", body, &status)["id"]);
    ASSERT_EQ(status, 202);
  }
  std::vector<std::string> images;
  for (const std::string& id : ids) {
    const nlohmann::json done = test::wait_job(*c, id, 120);
    ASSERT_EQ(done["state"], "done") << done.dump().substr(0, 300);
    ASSERT_EQ(done["images"].size(), 1u);
    images.push_back(done["images"][0]["data"]);
    std::vector<int> steps;
    for (const auto& [type, step] : events_of(*c, id))
      if (type == "step") steps.push_back(step);
    std::vector<int> want(kSteps + 1);
    for (int k = 0; k <= kSteps; ++k) want[k] = k;
    EXPECT_EQ(steps, want);
  }
  EXPECT_NE(images[0], images[1]);
  EXPECT_NE(images[0], images[2]);
  const std::string metrics = c->Get("/metrics")->body;
  EXPECT_EQ(test::prom_value(metrics, "atelier_batch_size_count"), kSteps) << "one model call per step for all three";
  EXPECT_EQ(test::prom_value(metrics, "atelier_batch_size_sum"), 3 * kSteps);
}

}  // namespace
}  // namespace atelier::serve
