// The server under load, through its real port: concurrent clients of all three API families are each
// answered exactly once with a valid image while their samples share model calls (batch sizes > 1 in
// /metrics); a full queue answers 429 with Retry-After; queued and running jobs can be cancelled; 500
// requests leave the resident memory flat.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "serve/metrics.h"
#include "serve_test_util.h"

namespace atelier::serve {
namespace {

using test::decode_b64_image;
using test::parse;
using test::post_json;
using test::RunningServer;

constexpr int kClients = 16;

nlohmann::json job(int64_t seed, int steps, int side) {
  return {{"prompt", "a red circle"}, {"width", side}, {"height", side}, {"steps", steps}, {"seed", seed}};
}

// The seed written in a PNG's infotext, -1 when absent.
int64_t infotext_seed(const std::string& b64) {
  auto bytes = base64_decode(b64, "image", 1 << 24);
  if (!bytes) return -1;
  auto text = read_infotext(*bytes);
  if (!text) return -1;
  const size_t at = text->find("Seed: ");
  return at == std::string::npos ? -1 : std::stoll(text->substr(at + 6));
}

// The tiny model's server batching up to 16 samples, an idle worker gathering arrivals for `window_ms`.
std::unique_ptr<RunningServer> batching_server(int window_ms) {
  ServeOptions o = test::tiny_options();
  o.max_batch = 16;
  o.batch_window_ms = window_ms;
  return RunningServer::start(o);
}

// The model calls and their samples in the workers' timelines (/v1/stats), after checking that each worker's busy
// spans are in order on one clock and never overlap (no time counted twice).
struct TimelineTotals {
  double calls = 0, samples = 0;
};
TimelineTotals check_timelines(const nlohmann::json& st) {
  TimelineTotals t;
  for (const auto& w : st["workers"]) {
    double last_end = 0;
    for (const auto& span : w["timeline"]) {
      const double start = span[0].get<double>(), end = span[1].get<double>();
      EXPECT_LE(start, end);
      EXPECT_GE(start, last_end - 1e-6) << "spans of one worker overlap or are out of order: " << span.dump();
      EXPECT_LE(end, st["clock_s"].get<double>());
      last_end = end;
      if (span[2] == "model_call") {
        ++t.calls;
        t.samples += span[3].get<double>();
      }
    }
  }
  return t;
}

TEST(ServeLoad, SixteenConcurrentClientsAnsweredOnceWithBatching) {
  ATELIER_REQUIRE_TINY_MODEL();
  auto s = batching_server(50);
  ASSERT_TRUE(s);
  std::mutex mu;
  std::vector<int64_t> seeds_seen;
  std::atomic<int> answers{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      auto c = s->client();
      const int64_t seed = 1000 + i;
      int status = 0;
      std::vector<std::string> images;
      if (i % 3 == 0) {  // A1111, synchronous
        auto r = post_json(*c, "/sdapi/v1/txt2img", job(seed, 2, 32), &status);
        EXPECT_EQ(status, 200) << r.dump().substr(0, 200);
        for (const auto& img : r.value("images", nlohmann::json::array())) images.push_back(img);
      } else if (i % 3 == 1) {  // native: submit, then poll
        auto r = post_json(*c, "/v1/jobs", job(seed, 2, 32), &status);
        EXPECT_EQ(status, 202);
        const auto done = test::wait_job(*c, r.value("id", ""));
        EXPECT_EQ(done.value("state", ""), "done");
        for (const auto& img : done.value("images", nlohmann::json::array())) images.push_back(img["data"]);
      } else {  // OpenAI
        auto r = post_json(*c, "/v1/images/generations",
                           {{"prompt", "a red circle"}, {"size", "32x32"}, {"steps", 2}, {"seed", seed}}, &status);
        EXPECT_EQ(status, 200);
        for (const auto& d : r.value("data", nlohmann::json::array())) images.push_back(d["b64_json"]);
      }
      ++answers;
      ASSERT_EQ(images.size(), 1u) << "client " << i;
      const Image img = decode_b64_image(images[0]);
      EXPECT_EQ(img.width, 32);
      std::lock_guard<std::mutex> lock(mu);
      seeds_seen.push_back(infotext_seed(images[0]));
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(answers.load(), kClients);
  std::set<int64_t> unique(seeds_seen.begin(), seeds_seen.end());
  EXPECT_EQ(unique.size(), size_t(kClients));
  for (int i = 0; i < kClients; ++i) EXPECT_TRUE(unique.count(1000 + i)) << "seed " << 1000 + i;

  auto m = s->client()->Get("/metrics");
  ASSERT_TRUE(m);
  const double calls = test::prom_value(m->body, "atelier_batch_size_count");
  const double singles = test::prom_value(m->body, "atelier_batch_size_bucket{le=\"1\"}");
  const double samples = test::prom_value(m->body, "atelier_batch_size_sum");
  std::printf("[serve] %d clients: %.0f model calls for %.0f sample-steps (%.0f calls of one sample), mean batch %.2f\n",
              kClients, calls, samples, singles, samples / calls);
  EXPECT_GT(calls - singles, 0) << "no model call had more than one sample";
  EXPECT_EQ(samples, kClients * 2.0);  // every sample's 2 steps, each counted once
  EXPECT_EQ(test::prom_value(m->body, "atelier_jobs_total{state=\"done\"}"), kClients);
  EXPECT_EQ(test::prom_value(m->body, "atelier_images_total"), kClients);

  // The workers' timelines (/v1/stats): the same model calls and samples, spans in order on one clock.
  const TimelineTotals t = check_timelines(nlohmann::json::parse(s->client()->Get("/v1/stats")->body));
  EXPECT_EQ(t.calls, calls);
  EXPECT_EQ(t.samples, samples);
}

// Jobs reaching the worker together (the batch window gathers them) have their prompts encoded in one
// text-encoder call, once the model is resident; each job still gets its own prompt's image.
TEST(ServeLoad, PromptsOfABurstAreEncodedTogether) {
  ATELIER_REQUIRE_TINY_MODEL();
  auto s = batching_server(300);
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  auto first = post_json(*c, "/v1/jobs", job(1, 2, 32), &status);  // loads the model
  ASSERT_EQ(status, 202);
  ASSERT_EQ(test::wait_job(*c, first.value("id", ""))["state"], "done");
  constexpr int kBurst = 6;
  std::vector<std::string> ids(kBurst);
  std::vector<std::thread> clients;
  for (int i = 0; i < kBurst; ++i)
    clients.emplace_back([&, i] {
      auto ci = s->client();
      int st = 0;
      nlohmann::json body = job(100 + i, 2, 32);
      body["prompt"] = "a red circle, variant " + std::to_string(i);
      ids[size_t(i)] = post_json(*ci, "/v1/jobs", body, &st).value("id", "");
      EXPECT_EQ(st, 202);
    });
  for (auto& t : clients) t.join();
  for (int i = 0; i < kBurst; ++i) {
    const auto done = test::wait_job(*c, ids[size_t(i)]);
    EXPECT_EQ(done.value("state", ""), "done");
    const auto& imgs = done.value("images", nlohmann::json::array());
    ASSERT_EQ(imgs.size(), 1u);
    auto bytes = base64_decode(imgs[0]["data"].get<std::string>(), "image", 1 << 24);
    ASSERT_TRUE(bytes);
    auto text = read_infotext(*bytes);
    ASSERT_TRUE(text);
    EXPECT_NE(text->find("variant " + std::to_string(i)), std::string::npos) << *text;  // its own prompt
  }
  const auto st = nlohmann::json::parse(c->Get("/v1/stats")->body);
  double prefetched = 0, calls = 0, admissions = 0;
  for (const auto& w : st["workers"]) {
    prefetched += w["busy"].value("prompts_prefetched", 0.0);
    calls += w["busy"].value("prefetch_calls", 0.0);
    admissions += w["busy"].value("admissions", 0.0);
  }
  EXPECT_EQ(admissions, kBurst + 1.0) << "jobs admitted, not admission spans (a prefetch is one too)";
  EXPECT_GE(prefetched, 2.0) << st["workers"].dump().substr(0, 400);
  EXPECT_GE(calls, 1.0);
  EXPECT_LE(calls, prefetched / 2.0);  // each call encoded several prompts
}

TEST(ServeLoad, FullQueueAnswers429WithRetryAfter) {
  ATELIER_REQUIRE_TINY_MODEL();
  ServeOptions o = test::tiny_options();
  o.max_batch = 1;
  o.max_queue = 2;
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  std::vector<std::string> accepted;
  int rejected = 0;
  for (int i = 0; i < 8; ++i) {
    auto r = c->Post("/v1/jobs", job(i, 20, 64).dump(), "application/json");
    ASSERT_TRUE(r);
    if (r->status == 202) {
      accepted.push_back(parse(r->body)["id"]);
    } else {
      EXPECT_EQ(r->status, 429) << r->body;
      EXPECT_GE(std::atoi(r->get_header_value("Retry-After").c_str()), 1);
      EXPECT_NE(parse(r->body)["error"]["message"].get<std::string>().find("queue is full"), std::string::npos);
      ++rejected;
    }
  }
  EXPECT_GE(rejected, 4) << "one running + two queued, the rest refused";
  EXPECT_LE(accepted.size(), 4u);
  for (const auto& id : accepted) EXPECT_EQ(test::wait_job(*c, id)["state"], "done");
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(test::prom_value(m->body, "atelier_jobs_total{state=\"rejected\"}"), rejected);
  EXPECT_GE(test::prom_value(m->body, "atelier_http_requests_total{endpoint=\"POST /v1/jobs\",status=\"429\"}"), rejected);
}

// A job whose images take turns in calls (two images, one sample per call): its progress (the fewest calls any
// of its images has had) moves only every other call, and each step is reported once, in order, with the worker's
// call in flight.
TEST(ServeLoad, StepsOfAJobWhoseImagesTakeTurnsAreReportedOnce) {
  ATELIER_REQUIRE_TINY_MODEL();
  ServeOptions o = test::tiny_options();
  o.max_batch = 1;
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  nlohmann::json body = job(7, 3, 32);
  body["batch_size"] = 2;
  int status = 0;
  const auto created = post_json(*c, "/v1/jobs", body, &status);
  ASSERT_EQ(status, 202) << created.dump();
  const std::string stream = test::read_events(*c, created["id"]);
  std::vector<int> steps;
  for (size_t at = stream.find("event: step"); at != std::string::npos; at = stream.find("event: step", at + 1)) {
    const size_t data = stream.find("data: ", at);
    steps.push_back(parse(stream.substr(data + 6, stream.find('\n', data) - data - 6))["step"].get<int>());
  }
  EXPECT_EQ(steps, (std::vector<int>{0, 1, 2, 3})) << stream.substr(0, 2000);  // 0: admitted
  EXPECT_EQ(test::wait_job(*c, created["id"])["images"].size(), 2u);
}

// Jobs admitted while a model call is in flight (the worker keeps one call ahead of the host): the admissions' busy
// spans and the calls' spans never overlap, and every model call is in the timeline once.
TEST(ServeLoad, AdmissionsDuringACallKeepTheTimelineInOrder) {
  ATELIER_REQUIRE_TINY_MODEL();
  auto s = batching_server(0);
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  const std::string first = post_json(*c, "/v1/jobs", job(1, 40, 32), &status)["id"];
  ASSERT_EQ(status, 202);
  test::wait_for_step(*c, first, 2);
  std::vector<std::string> ids = {first};
  for (int i = 0; i < 3; ++i) {  // each admitted between two calls of the first job's
    ids.push_back(post_json(*c, "/v1/jobs", job(2 + i, 4, 32), &status)["id"]);
    ASSERT_EQ(status, 202);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const std::string& id : ids) EXPECT_EQ(test::wait_job(*c, id)["state"], "done");
  const auto st = parse(c->Get("/v1/stats")->body);
  int admissions = 0;
  for (const auto& span : st["workers"][0]["timeline"]) admissions += span[2] == "admit";
  EXPECT_GE(admissions, 4) << "every job's admission is a span";
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  const TimelineTotals t = check_timelines(st);
  EXPECT_EQ(t.calls, test::prom_value(m->body, "atelier_batch_size_count"));
  EXPECT_EQ(t.samples, 40.0 + 3 * 4.0);  // every sample's steps, each counted once
}

// Event streams and synchronous calls hold an HTTP thread each while their job runs; past the held slots (all but an
// eighth of --http-threads) they are answered 503 at once, and the threads left keep health checks and polling
// answered.
TEST(ServeLoad, WaitingConnectionsLeaveThreadsForShortRequests) {
  ATELIER_REQUIRE_TINY_MODEL();
  ServeOptions o = test::tiny_options();
  o.http_threads = 8;  // 6 held slots, 2 threads kept free
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  const std::string id = post_json(*c, "/v1/jobs", job(1, 150, 64), &status)["id"];
  ASSERT_EQ(status, 202);
  const std::string events = "/v1/jobs/" + id + "/events";
  std::vector<std::thread> streams;
  for (int i = 0; i < 6; ++i)
    streams.emplace_back([&] { s->client()->Get(events.c_str(), [](const char*, size_t) { return true; }); });
  const auto held = [&] { return parse(c->Get("/v1/stats")->body)["held_connections"]; };
  for (int i = 0; i < 500 && held()["open"] != 6; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(held()["open"], 6);
  EXPECT_EQ(held()["capacity"], 6);
  // A seventh stream and a synchronous call: 503 at once, with Retry-After, and no job submitted for the call.
  auto more = c->Get(events.c_str());
  ASSERT_TRUE(more);
  EXPECT_EQ(more->status, 503);
  EXPECT_TRUE(more->has_header("Retry-After"));
  EXPECT_NE(more->body.find("too many connections waiting on jobs"), std::string::npos) << more->body;
  post_json(*c, "/sdapi/v1/txt2img", job(2, 1, 32), &status);
  EXPECT_EQ(status, 503);
  EXPECT_EQ(parse(c->Get("/v1/stats")->body)["jobs_stored"], 1);
  // Short requests are still answered promptly.
  const auto t0 = std::chrono::steady_clock::now();
  auto health = c->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(parse(c->Get(("/v1/jobs/" + id).c_str())->body)["state"], "running");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  // The job ends, the streams end, and their slots are free again.
  ASSERT_EQ(c->Delete(("/v1/jobs/" + id).c_str())->status, 202);
  for (auto& t : streams) t.join();
  for (int i = 0; i < 500 && held()["open"] != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(held()["open"], 0);
  post_json(*c, "/sdapi/v1/txt2img", job(3, 1, 32), &status);
  EXPECT_EQ(status, 200);
}

TEST(ServeLoad, CancelsQueuedAndRunningJobs) {
  ATELIER_REQUIRE_TINY_MODEL();
  ServeOptions o = test::tiny_options();
  o.max_batch = 1;
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  const std::string running = post_json(*c, "/v1/jobs", job(1, 150, 64), &status)["id"];
  ASSERT_EQ(status, 202);
  const std::string queued = post_json(*c, "/v1/jobs", job(2, 150, 64), &status)["id"];
  ASSERT_EQ(status, 202);
  // The queued one: cancelled at once, never started.
  auto q = parse(c->Get(("/v1/jobs/" + queued).c_str())->body);
  EXPECT_EQ(q["state"], "queued");
  EXPECT_EQ(q["queue_position"], 0);
  auto del = c->Delete(("/v1/jobs/" + queued).c_str());
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 202);
  EXPECT_EQ(parse(del->body)["state"], "cancelled");
  // The running one: leaves its batch at the next step boundary.
  test::wait_for_step(*c, running, 2);
  del = c->Delete(("/v1/jobs/" + running).c_str());
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 202);
  const auto r = test::wait_job(*c, running, 10);
  EXPECT_EQ(r["state"], "cancelled");
  EXPECT_LT(r["step"].get<int>(), 150);
  std::string events;
  c->Get(("/v1/jobs/" + running + "/events").c_str(), [&](const char* d, size_t n) {
    events.append(d, n);
    return true;
  });
  EXPECT_NE(events.find("event: cancelled"), std::string::npos);
  EXPECT_EQ(parse(c->Get(("/v1/jobs/" + queued).c_str())->body)["attempts"], 0);
  // The worker is free again.
  const std::string next = post_json(*c, "/v1/jobs", job(3, 1, 32), &status)["id"];
  EXPECT_EQ(test::wait_job(*c, next, 10)["state"], "done");
  auto m = c->Get("/metrics");
  EXPECT_EQ(test::prom_value(m->body, "atelier_jobs_total{state=\"cancelled\"}"), 2);
}

TEST(ServeLoad, A1111InterruptStopsTheRunningJob) {
  ATELIER_REQUIRE_TINY_MODEL();
  auto s = RunningServer::start(test::tiny_options());
  ASSERT_TRUE(s);
  nlohmann::json answer;
  int status = 0;
  std::thread client([&] {
    auto c = s->client();
    answer = post_json(*c, "/sdapi/v1/txt2img", job(5, 150, 64), &status);
  });
  auto c = s->client();
  nlohmann::json p;
  for (int i = 0; i < 500; ++i) {
    p = parse(c->Get("/sdapi/v1/progress")->body);
    if (p["state"]["sampling_step"].get<int>() >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(p["progress"].get<double>(), 0.0);
  EXPECT_EQ(p["state"]["sampling_steps"], 150);
  auto r = c->Post("/sdapi/v1/interrupt", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(parse(r->body)["interrupted"], 1);
  client.join();
  EXPECT_EQ(status, 200);
  EXPECT_TRUE(answer["images"].empty());
  EXPECT_EQ(parse(answer["info"].get<std::string>())["interrupted"], true);
}

// Resident memory at a quiet moment (every request answered), less the CPU backend's cache of freed tensor
// blocks, with the live tensors counted apart. That cache keeps freed blocks by size class for reuse and is
// bounded by the shapes served, not by the number of requests: under load, a batch of a size not seen before
// (more requests happening to share a model call) adds its blocks, which read as 14-30 MiB of growth when
// the test compared raw resident memory (CI failed on it). A leak of jobs, images or strings still shows in
// the rest, a leak of tensors in the live tensor bytes.
struct QuietMemory {
  double resident_less_cache = 0, live_tensors = 0, cache = 0;
};
QuietMemory quiet_memory() {
  auto& cpu = dynamic_cast<CpuBackend&>(backend_for(Device::cpu()));
  const double live = double(cpu.bytes_in_use()), cache = double(cpu.bytes_reserved()) - live;
  return {resident_bytes() - cache, live, cache};
}

TEST(ServeLoad, FiveHundredRequestsKeepResidentMemoryFlat) {
  ATELIER_REQUIRE_TINY_MODEL();
  constexpr int kRequests = 500, kWarmup = 100, kThreads = 8;
  constexpr double kMaxGrowthMiB = 16;
  constexpr double kMaxTensorGrowthMiB = 1;  // one 32² job holds well under 1 MiB of tensors
  ServeOptions o = test::tiny_options();
  o.max_finished_jobs = 32;  // native results are kept for polling; bounded
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  std::atomic<int> ok{0};
  // Requests [first, last) from kThreads clients at once; returns when every one is answered.
  auto run_requests = [&](int first, int last) {
    std::atomic<int> next{first};
    auto run = [&] {
      auto c = s->client();
      for (int i; (i = next++) < last;) {
        int status = 0;
        if (i % 2) {
          auto r = post_json(*c, "/sdapi/v1/txt2img", job(i, 1, 32), &status);
          ok += status == 200 && r["images"].size() == 1;
        } else {
          auto r = post_json(*c, "/v1/jobs", job(i, 1, 32), &status);
          ok += status == 202 && test::wait_job(*c, r["id"])["state"] == "done";
        }
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back(run);
    for (auto& t : threads) t.join();
  };
  run_requests(0, kWarmup);
  const QuietMemory warm = quiet_memory();
  run_requests(kWarmup, kRequests);
  const QuietMemory end = quiet_memory();
  EXPECT_EQ(ok.load(), kRequests);
  constexpr double kMiB = 1 << 20;
  const double growth = (end.resident_less_cache - warm.resident_less_cache) / kMiB;
  const double tensor_growth = (end.live_tensors - warm.live_tensors) / kMiB;
  std::printf("[serve] resident memory less the tensor block cache after %d requests %.1f MiB, after %d %.1f MiB "
              "(growth %.2f MiB); live tensors %.1f -> %.1f MiB; block cache %.1f -> %.1f MiB\n",
              kWarmup, warm.resident_less_cache / kMiB, kRequests, end.resident_less_cache / kMiB, growth,
              warm.live_tensors / kMiB, end.live_tensors / kMiB, warm.cache / kMiB, end.cache / kMiB);
  EXPECT_LT(growth, kMaxGrowthMiB);
  EXPECT_LT(tensor_growth, kMaxTensorGrowthMiB);
  auto st = parse(s->client()->Get("/v1/stats")->body);
  EXPECT_LE(st["jobs_stored"].get<int>(), 32 + kThreads);
}

}  // namespace
}  // namespace atelier::serve
