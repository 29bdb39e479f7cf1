// The Redis queue end to end, with real processes: redis-server, `atelier serve --queue` (the gateway) and
// `atelier worker` processes running the tiny model on the CPU. Scenarios of issue 9: 200 jobs complete
// exactly once over two workers; kill -9 of a worker in the middle of a batch hands its jobs to the other
// worker; a gateway restart loses no job or result; Redis restarted with AOF loses no accepted job; a
// malformed message is moved aside, not retried forever. Throughput with 1 and 2 workers is printed.
#include <gtest/gtest.h>
#include <httplib.h>

#include <map>
#include <set>

#include "pipeline/flux_pipeline.h"
#include "redis_test_util.h"
#include "serve_test_util.h"

namespace atelier::serve {
namespace {

using test::Child;
using test::parse;
using test::post_json;
using test::RedisProcess;

constexpr int kVisibilityMs = 1500;

nlohmann::json tiny_job(int64_t seed, int steps = 1, int side = 32) {
  return {{"prompt", "a red circle"}, {"width", side}, {"height", side}, {"steps", steps}, {"seed", seed}, {"sampler", "euler"}};
}

struct Gateway {
  Child proc;
  int port = 0;
  static std::unique_ptr<Gateway> start(const std::string& queue, int max_queue = 256, const std::vector<std::string>& extra = {}) {
    auto g = std::make_unique<Gateway>();
    std::vector<std::string> args = {ATELIER_BINARY, "serve", "--queue", queue, "--model", "tiny=" + test::tiny_model_path(),
                                     "--port", "0", "--host", "127.0.0.1", "--max-queue", std::to_string(max_queue)};
    args.insert(args.end(), extra.begin(), extra.end());
    g->proc = Child::spawn(args);
    const std::string rest = g->proc.line_with("listening on http://127.0.0.1:");
    EXPECT_FALSE(rest.empty()) << "the gateway did not start";
    if (rest.empty()) return nullptr;
    g->port = std::stoi(rest);
    return g;
  }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_read_timeout(60, 0);
    c->set_connection_timeout(5, 0);
    return c;
  }
};

Child start_worker(const std::string& queue, const std::string& name, int max_batch = 4,
                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {ATELIER_BINARY, "worker", "--queue", queue, "--model", "tiny=" + test::tiny_model_path(),
                                   "--name", name, "--devices", "cpu", "--cpu-threads", "1", "--max-batch", std::to_string(max_batch),
                                   "--visibility-timeout-ms", std::to_string(kVisibilityMs), "--heartbeat-ms", "200"};
  args.insert(args.end(), extra.begin(), extra.end());
  Child w = Child::spawn(args);
  EXPECT_EQ(w.line_with("worker "), name + " ready");
  return w;
}

std::vector<std::string> submit(httplib::Client& c, int n, int64_t seed0, int steps = 1, int side = 32) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    int status = 0;
    auto r = post_json(c, "/v1/jobs", tiny_job(seed0 + i, steps, side), &status);
    EXPECT_EQ(status, 202) << r.dump();
    if (status == 202) ids.push_back(r["id"]);
  }
  return ids;
}

// Number of events of `type` in the job's event stream in Redis.
int count_events(redis::RedisClient& c, const std::string& id, const std::string& type) {
  auto r = c.command({"XRANGE", "atelier:events:" + id, "-", "+"});
  int n = 0;
  if (r)
    for (const auto& e : r->elements) n += redis::hash_field(e.at(1), "type") == type;
  return n;
}

double metric(httplib::Client& c, const std::string& series) {
  auto m = c.Get("/metrics");
  return m ? test::prom_value(m->body, series) : -1;
}

// Submits `n` one-step jobs and waits for all; returns jobs per second. Checks each is done once.
double run_batch(httplib::Client& c, redis::RedisClient& rc, int n, int64_t seed0, std::map<std::string, int>* per_worker) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = submit(c, n, seed0);
  for (const auto& id : ids) {
    const auto j = test::wait_job(c, id, 120);
    EXPECT_EQ(j["state"], "done") << j.dump().substr(0, 300);
    if (per_worker) {
      const std::string dev = j.value("device", "");
      ++(*per_worker)[dev.substr(0, dev.find('/'))];
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& id : ids) EXPECT_EQ(count_events(rc, id, "done"), 1) << id;
  return double(ids.size()) / s;
}

#define REQUIRE_CLUSTER()        \
  ATELIER_REQUIRE_TINY_MODEL(); \
  ATELIER_REQUIRE_REDIS()

TEST(RedisCluster, TwoHundredJobsCompleteExactlyOnceOnTwoWorkers) {
  REQUIRE_CLUSTER();
  auto redis = RedisProcess::start(false);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url());
  ASSERT_TRUE(g);
  Child a = start_worker(redis->url(), "wa");
  Child b = start_worker(redis->url(), "wb");
  auto c = g->client();
  auto rc = redis->client();
  std::map<std::string, int> per_worker;
  const double rate = run_batch(*c, *rc, 200, 1000, &per_worker);
  std::printf("[ throughput ] 2 workers (1 CPU thread each): %.1f jobs/s (200 one-step 32x32 jobs)\n", rate);
  EXPECT_GT(per_worker["wa"], 0);
  EXPECT_GT(per_worker["wb"], 0);
  EXPECT_EQ(per_worker["wa"] + per_worker["wb"], 200);
  // Every entry acknowledged and deleted; nothing pending; both workers registered.
  EXPECT_EQ(rc->command({"XLEN", "atelier:jobs:tiny"})->as_int(), 0);
  EXPECT_EQ(metric(*c, "atelier_cluster_pending{model=\"tiny\"}"), 0);
  EXPECT_EQ(metric(*c, "atelier_cluster_queue_depth{model=\"tiny\"}"), 0);
  EXPECT_EQ(metric(*c, "atelier_cluster_workers"), 2);
  EXPECT_EQ(metric(*c, "atelier_cluster_device_healthy{device=\"cpu#0\",worker=\"wa\"}"), 1);
  EXPECT_EQ(metric(*c, "atelier_jobs_total{state=\"done\"}"), 200);
  EXPECT_EQ(parse(c->Get("/readyz")->body)["healthy_workers"], 2);
}

TEST(RedisCluster, ThroughputWithOneWorker) {
  REQUIRE_CLUSTER();
  auto redis = RedisProcess::start(false);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url());
  ASSERT_TRUE(g);
  Child a = start_worker(redis->url(), "solo");
  auto c = g->client();
  auto rc = redis->client();
  const double rate = run_batch(*c, *rc, 100, 5000, nullptr);
  std::printf("[ throughput ] 1 worker (1 CPU thread): %.1f jobs/s (100 one-step 32x32 jobs)\n", rate);
}

TEST(RedisCluster, KilledWorkersJobsFinishOnTheOtherWorker) {
  REQUIRE_CLUSTER();
  auto redis = RedisProcess::start(false);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url());
  ASSERT_TRUE(g);
  auto c = g->client();
  auto rc = redis->client();
  Child a = start_worker(redis->url(), "victim");
  const auto ids = submit(*c, 4, 300, 30, 64);  // long enough to be in the middle of the batch when killed
  // Wait until the victim is computing (a step event from it), then kill -9.
  bool running = false;
  for (int i = 0; i < 600 && !running; ++i) {
    auto j = parse(c->Get(("/v1/jobs/" + ids[0]).c_str())->body);
    running = j.value("step", 0) >= 1 && j.value("device", "").rfind("victim/", 0) == 0;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(running) << "the first worker never started the batch";
  // The second worker joins once the victim holds the whole batch (--max-batch 4 = its room), so that
  // every job is the victim's when it dies.
  Child b = start_worker(redis->url(), "survivor");
  a.signal_and_wait(SIGKILL);
  for (const auto& id : ids) {
    const auto j = test::wait_job(*c, id, 120);
    EXPECT_EQ(j["state"], "done") << j.dump().substr(0, 300);
    EXPECT_EQ(j.value("device", "").rfind("survivor/", 0), 0u) << j.dump().substr(0, 300);
    EXPECT_EQ(count_events(*rc, id, "done"), 1);
  }
  EXPECT_GE(parse(c->Get(("/v1/jobs/" + ids[0]).c_str())->body)["attempts"].get<int>(), 2);
  EXPECT_GE(metric(*c, "atelier_cluster_reclaimed_jobs"), 1);
  EXPECT_EQ(metric(*c, "atelier_cluster_pending{model=\"tiny\"}"), 0);
}

TEST(RedisCluster, GatewayRestartLosesNoJobOrResult) {
  REQUIRE_CLUSTER();
  auto redis = RedisProcess::start(false);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url());
  ASSERT_TRUE(g);
  std::vector<std::string> ids = submit(*g->client(), 12, 700);
  g->proc.signal_and_wait(SIGKILL);  // the gateway dies with every job accepted and none run
  Child w = start_worker(redis->url(), "w1");
  auto g2 = Gateway::start(redis->url());
  ASSERT_TRUE(g2);
  auto c = g2->client();
  for (const auto& id : ids) {
    const auto j = test::wait_job(*c, id, 120);
    EXPECT_EQ(j["state"], "done") << j.dump().substr(0, 300);
    ASSERT_EQ(j["images"].size(), 1u);
    EXPECT_EQ(test::decode_b64_image(j["images"][0]["data"]).width, 32);
  }
  // Results survive another restart too, and the event stream replays from the start.
  g2->proc.signal_and_wait(SIGTERM);
  auto g3 = Gateway::start(redis->url());
  ASSERT_TRUE(g3);
  auto c3 = g3->client();
  auto j = test::wait_job(*c3, ids.back(), 10);
  EXPECT_EQ(j["state"], "done");
  auto ev = c3->Get(("/v1/jobs/" + ids.back() + "/events").c_str());
  ASSERT_TRUE(ev);
  EXPECT_NE(ev->body.find("event: started"), std::string::npos);
  EXPECT_NE(ev->body.find("event: done"), std::string::npos);
  auto missing = c3->Get("/v1/jobs/00000000000000000000000000000000");
  EXPECT_EQ(missing->status, 404);
}

TEST(RedisCluster, RedisRestartWithAofLosesNoAcceptedJob) {
  REQUIRE_CLUSTER();
  auto redis = RedisProcess::start(true);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url());
  ASSERT_TRUE(g);
  auto c = g->client();
  const auto ids = submit(*c, 10, 900);  // accepted (202) while no worker runs
  ASSERT_TRUE(redis->restart());          // kill -9 and start again from the append-only file
  Child w = start_worker(redis->url(), "w1");
  for (const auto& id : ids) {
    const auto j = test::wait_job(*c, id, 120);
    EXPECT_EQ(j["state"], "done") << j.dump().substr(0, 300);
  }
  // The gateway keeps accepting after the restart.
  const auto more = submit(*c, 1, 990);
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(test::wait_job(*c, more[0], 60)["state"], "done");
}

TEST(RedisCluster, MalformedMessagesAreMovedAsideNotRetried) {
  REQUIRE_CLUSTER();
  auto redis = RedisProcess::start(false);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url());
  ASSERT_TRUE(g);
  auto rc = redis->client();
  Child w = start_worker(redis->url(), "w1");
  ASSERT_TRUE(rc->command({"XADD", "atelier:jobs:tiny", "*", "garbage", "1"}));
  ASSERT_TRUE(rc->command({"XADD", "atelier:jobs:tiny", "*", "id", "nosuchjob"}));
  ASSERT_TRUE(rc->command({"HSET", "atelier:job:badrequest", "state", "queued", "request", "{not json"}));
  ASSERT_TRUE(rc->command({"XADD", "atelier:jobs:tiny", "*", "id", "badrequest"}));
  auto c = g->client();
  const auto ids = submit(*c, 1, 42);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(test::wait_job(*c, ids[0], 60)["state"], "done") << "the worker goes on after bad messages";
  auto dead = rc->command({"XRANGE", "atelier:dead", "-", "+"});
  ASSERT_TRUE(dead);
  ASSERT_EQ(dead->elements.size(), 3u);
  EXPECT_NE(redis::hash_field(dead->at(0).at(1), "error").find("no valid 'id'"), std::string::npos);
  EXPECT_NE(redis::hash_field(dead->at(1).at(1), "error").find("no job hash"), std::string::npos);
  EXPECT_NE(redis::hash_field(dead->at(2).at(1), "error").find("not a JSON object"), std::string::npos);
  // The job with the broken request failed with the error instead of being retried.
  auto bad = parse(c->Get("/v1/jobs/badrequest")->body);
  EXPECT_EQ(bad["state"], "failed") << bad.dump();
  // Nothing pending, nothing left: after more than a visibility timeout nobody picks them up again.
  std::this_thread::sleep_for(std::chrono::milliseconds(kVisibilityMs + 500));
  EXPECT_EQ(rc->command({"XLEN", "atelier:jobs:tiny"})->as_int(), 0);
  EXPECT_EQ(rc->command({"XLEN", "atelier:dead"})->as_int(), 3);
  EXPECT_EQ(metric(*c, "atelier_cluster_dead_letters"), 3);
}

TEST(RedisCluster, CancelAndQueueFullGoThroughRedis) {
  REQUIRE_CLUSTER();
  auto redis = RedisProcess::start(false);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url(), 3);
  ASSERT_TRUE(g);
  auto c = g->client();
  const auto ids = submit(*c, 3, 1);
  int status = 0;
  post_json(*c, "/v1/jobs", tiny_job(4), &status);
  EXPECT_EQ(status, 429) << "the stream holds --max-queue entries";
  auto del = c->Delete(("/v1/jobs/" + ids[0]).c_str());
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 202);
  EXPECT_EQ(test::wait_job(*c, ids[0], 10)["state"], "cancelled");
  EXPECT_EQ(parse(c->Get(("/v1/jobs/" + ids[1]).c_str())->body)["queue_position"], 0);
  Child w = start_worker(redis->url(), "w1");
  EXPECT_EQ(test::wait_job(*c, ids[1], 60)["state"], "done");
  EXPECT_EQ(test::wait_job(*c, ids[2], 60)["state"], "done");
}

}  // namespace
}  // namespace atelier::serve

namespace atelier::serve {
namespace {

// A job that runs longer than the visibility timeout on a live worker is not reclaimed (the worker
// refreshes its entry), and a running job is cancelled through the flag in Redis at its next step.
TEST(RedisCluster, LongJobKeepsItsLeaseAndRunningJobCancels) {
  REQUIRE_CLUSTER();
  auto redis = RedisProcess::start(false);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url());
  ASSERT_TRUE(g);
  auto c = g->client();
  Child a = start_worker(redis->url(), "wa", 1);
  Child b = start_worker(redis->url(), "wb", 1);
  const auto long_job = submit(*c, 1, 11, 150, 128);
  const auto doomed = submit(*c, 1, 12, 150, 128);
  ASSERT_EQ(long_job.size() + doomed.size(), 2u);
  // Cancel the second once it runs.
  for (int i = 0; i < 400; ++i) {
    if (parse(c->Get(("/v1/jobs/" + doomed[0]).c_str())->body).value("step", 0) >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  auto del = c->Delete(("/v1/jobs/" + doomed[0]).c_str());
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 202);
  const auto cancelled = test::wait_job(*c, doomed[0], 60);
  EXPECT_EQ(cancelled["state"], "cancelled") << cancelled.dump().substr(0, 300);
  EXPECT_LT(cancelled.value("step", 0), 150);
  const auto j = test::wait_job(*c, long_job[0], 120);
  EXPECT_EQ(j["state"], "done") << j.dump().substr(0, 300);
  const double elapsed = j.value("elapsed_s", 0.0);
  if (elapsed * 1000 < 2 * kVisibilityMs) GTEST_SKIP() << "the job ran " << elapsed << " s: too fast to outlive the visibility timeout";
  EXPECT_EQ(j["attempts"], 1) << "a live worker's job was reclaimed";
  EXPECT_EQ(metric(*c, "atelier_cluster_reclaimed_jobs"), 0);
}

}  // namespace
}  // namespace atelier::serve

namespace atelier::serve {
namespace {

// A job whose workers keep dying (claimed kMaxClaims = 3 times already) fails instead of taking down more.
TEST(RedisCluster, JobWhoseWorkersKeepDyingFails) {
  REQUIRE_CLUSTER();
  auto redis = RedisProcess::start(false);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url());
  ASSERT_TRUE(g);
  auto c = g->client();
  auto rc = redis->client();
  Child w = start_worker(redis->url(), "w1");  // creates the group
  w.signal_and_wait(SIGTERM);
  // A job that a third worker took and then died with: pending on consumer "ghost", epoch 3.
  const auto ids = submit(*c, 1, 5);
  ASSERT_EQ(ids.size(), 1u);
  ASSERT_TRUE(rc->command({"XREADGROUP", "GROUP", "workers", "ghost", "COUNT", "1", "STREAMS", "atelier:jobs:tiny", ">"}));
  ASSERT_TRUE(rc->command({"HSET", "atelier:job:" + ids[0], "state", "running", "owner", "ghost", "epoch", "3"}));
  Child w2 = start_worker(redis->url(), "w2");
  const auto j = test::wait_job(*c, ids[0], 30);
  EXPECT_EQ(j["state"], "failed") << j.dump().substr(0, 300);
  EXPECT_NE(j.value("error", "").find("gave up after 3 attempts"), std::string::npos) << j.dump().substr(0, 300);
  EXPECT_EQ(rc->command({"XLEN", "atelier:jobs:tiny"})->as_int(), 0);
}

}  // namespace
}  // namespace atelier::serve

namespace atelier::serve {
namespace {

// Images above --max-inline-kb are not stored in Redis: the gateway reads them from the shared --output-dir.
TEST(RedisCluster, LargeResultsGoThroughTheSharedOutputDir) {
  REQUIRE_CLUSTER();
  auto redis = RedisProcess::start(false);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url());
  ASSERT_TRUE(g);
  const std::filesystem::path out = redis->dir / "results";
  Child w = start_worker(redis->url(), "w1", 4, {"--output-dir", out.string(), "--max-inline-kb", "0"});
  auto c = g->client();
  auto rc = redis->client();
  const auto ids = submit(*c, 1, 77, 1, 64);
  ASSERT_EQ(ids.size(), 1u);
  const auto j = test::wait_job(*c, ids[0], 60);
  ASSERT_EQ(j["state"], "done") << j.dump().substr(0, 300);
  const std::string path = j["images"][0].value("path", "");
  EXPECT_EQ(std::filesystem::path(path).parent_path(), out);
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(test::decode_b64_image(j["images"][0]["data"]).width, 64) << "read back from the shared path";
  const std::string result = rc->command({"HGET", "atelier:job:" + ids[0], "result"})->str;
  EXPECT_EQ(result.find("\"key\""), std::string::npos) << "no copy in Redis: " << result;
}

// A FLUX job through Redis: the gateway validates it against the model's family, the codec carries FLUX's guidance and
// T5 length, and the worker process runs it whole: the image is the pipeline's for those settings, bit for bit.
TEST(RedisCluster, FluxJobsKeepTheirSettingsThroughRedis) {
  REQUIRE_CLUSTER();
  const auto flux = ::atelier::test::fixture("flux-tiny");
  if (!flux) GTEST_SKIP() << "fixture 'flux-tiny' not found";
  const std::string flux_model = "flux=" + (*flux / "model").string();
  auto redis = RedisProcess::start(false);
  ASSERT_TRUE(redis);
  auto g = Gateway::start(redis->url(), 256, {"--model", flux_model});
  ASSERT_TRUE(g);
  Child w = start_worker(redis->url(), "w1", 4, {"--model", flux_model});
  auto c = g->client();
  int status = 0;
  const nlohmann::json body = {{"model", "flux"}, {"prompt", "a fox"}, {"width", 64}, {"height", 64}, {"steps", 2},
                               {"seed", 11}, {"rng", "cpu"}, {"guidance", 2.5}, {"max_sequence_length", 16}};
  const std::string id = post_json(*c, "/v1/jobs", body, &status)["id"];
  ASSERT_EQ(status, 202);
  const auto j = test::wait_job(*c, id, 120);
  ASSERT_EQ(j["state"], "done") << j.dump().substr(0, 300);
  EXPECT_NE(j["images"][0]["infotext"].get<std::string>().find("Distilled CFG Scale: 2.5"), std::string::npos)
      << j["images"][0]["infotext"];

  GenerateRequest gen;
  gen.prompt = "a fox";
  gen.width = gen.height = 64;
  gen.steps = 2;
  gen.seed = 11;
  gen.rng = "cpu";
  gen.cfg_scale = 1.0f;
  FluxOptions fo;
  fo.guidance = 2.5f;
  fo.max_sequence_length = 16;
  fo.cfg_explicit = true;
  auto model = load_flux_model((*flux / "model").string());
  ASSERT_TRUE(model) << model.status().message();
  // As the worker computes (--cpu-threads 1).
  const auto direct = ::atelier::test::on_one_omp_thread([&] { return FluxPipeline(*model).generate(gen, fo); });
  ASSERT_TRUE(direct) << direct.status().message();
  EXPECT_EQ(test::decode_b64_image(j["images"][0]["data"]).pixels, direct->images[0].image.pixels);
  // The gateway refuses what FLUX cannot run before it reaches Redis.
  nlohmann::json wide = body;
  wide["width"] = 72;
  post_json(*c, "/v1/jobs", wide, &status);
  EXPECT_EQ(status, 400);
}

}  // namespace
}  // namespace atelier::serve
