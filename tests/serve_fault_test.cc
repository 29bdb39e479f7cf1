// Fault tolerance and the real binary: a device failure injected through the test-only switch hands the
// worker's jobs to the other worker with nothing lost (every job finishes once, with the image its seed
// gives), the failed worker is probed back into service; `atelier serve --port 0` prints its port, serves,
// and stops cleanly on SIGTERM.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "serve_test_util.h"

namespace atelier::serve {
namespace {

using test::decode_b64_image;
using test::parse;
using test::post_json;
using test::RunningServer;

constexpr int kJobs = 8;

nlohmann::json job(int64_t seed) {
  return {{"prompt", "a red circle"}, {"width", 32}, {"height", 32}, {"steps", 4}, {"seed", seed}, {"sampler", "euler"}};
}

// Worker 0 of two fails at `at` ("call": its next model call; "decode": its next decode of finished jobs, whose
// steps are all done): every job still finishes once, the re-queued ones on worker 1, with the images their seeds
// give, and worker 0 is probed back into service.
void expect_failure_loses_nothing(const std::string& at) {
  ServeOptions o = test::tiny_options();
  o.devices = "cpu,cpu";
  o.test_hooks = true;
  o.probe_interval_ms = 100;
  o.batch_window_ms = 20;
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  auto armed = post_json(*c, "/v1/admin/fail-device", {{"worker", 0}, {"failing_probes", 3}, {"at", at}}, &status);
  ASSERT_EQ(status, 200) << armed.dump();

  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i) {
    ids.push_back(post_json(*c, "/v1/jobs", job(500 + i), &status)["id"]);
    ASSERT_EQ(status, 202);
  }
  std::vector<nlohmann::json> done;
  int restarted = 0;
  for (const auto& id : ids) {
    done.push_back(test::wait_job(*c, id));
    EXPECT_EQ(done.back()["state"], "done") << done.back().dump().substr(0, 300);
    ASSERT_EQ(done.back()["images"].size(), 1u);
    if (done.back()["attempts"].get<int>() > 1) {
      ++restarted;
      EXPECT_EQ(done.back()["device"], "cpu#1") << "a re-queued job runs on the healthy worker";
    }
  }
  EXPECT_GE(restarted, 1) << "worker 0 held work when it failed at its " << at;
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(test::prom_value(m->body, "atelier_device_failures_total{device=\"cpu\",worker=\"0\"}"), 1);
  EXPECT_EQ(test::prom_value(m->body, "atelier_jobs_requeued_total"), restarted);
  EXPECT_EQ(test::prom_value(m->body, "atelier_jobs_total{state=\"done\"}"), kJobs);
  EXPECT_EQ(test::prom_value(m->body, "atelier_images_total"), kJobs);

  // Probed back into service (3 failing probes at 100 ms, then a good one).
  int healthy = 0;
  for (int i = 0; i < 100 && healthy < 2; ++i) {
    healthy = parse(c->Get("/readyz")->body)["healthy_workers"];
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(healthy, 2);
  // Nothing lost: a re-run of every seed, now on the recovered pool, gives the same images.
  for (int i = 0; i < kJobs; ++i) {
    const auto again = test::wait_job(*c, post_json(*c, "/v1/jobs", job(500 + i), &status)["id"]);
    ASSERT_EQ(again["state"], "done");
    EXPECT_LE(::atelier::test::max_pixel_diff(decode_b64_image(again["images"][0]["data"]), decode_b64_image(done[size_t(i)]["images"][0]["data"])), 1)
        << "seed " << 500 + i;
  }
  const auto stats = parse(c->Get("/v1/stats")->body);
  EXPECT_GT(stats["workers"][0]["busy_seconds"].get<double>(), 0.0);
  EXPECT_EQ(stats["workers"][0]["failures"], 1);
}

TEST(ServeFault, DeviceFailureRequeuesWorkElsewhereNothingLost) {
  ATELIER_REQUIRE_TINY_MODEL();
  expect_failure_loses_nothing("call");
}

// A fault that surfaces while finished jobs are decoded (on a GPU: the decode's wait is the first after the next
// call was enqueued) re-queues those jobs too; none is left running.
TEST(ServeFault, DeviceFailureAtADecodeRequeuesTheFinishedJobs) {
  ATELIER_REQUIRE_TINY_MODEL();
  expect_failure_loses_nothing("decode");
}

TEST(ServeFault, AdminSwitchNamesWhereItCanFail) {
  ATELIER_REQUIRE_TINY_MODEL();
  ServeOptions o = test::tiny_options();
  o.test_hooks = true;
  auto s = RunningServer::start(o);
  ASSERT_TRUE(s);
  auto c = s->client();
  int status = 0;
  const auto r = post_json(*c, "/v1/admin/fail-device", {{"worker", 0}, {"at", "upload"}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(r.dump().find("call, decode"), std::string::npos) << r.dump();
  const auto typo = post_json(*c, "/v1/admin/fail-device", {{"worker", 0}, {"failing_probe", 3}}, &status);
  EXPECT_EQ(status, 400) << "a misspelt field arms nothing";
  EXPECT_NE(typo.dump().find("failing_probe"), std::string::npos) << typo.dump();
}

TEST(ServeFault, AdminSwitchExistsOnlyWithTestHooks) {
  ATELIER_REQUIRE_TINY_MODEL();
  auto s = RunningServer::start(test::tiny_options());
  ASSERT_TRUE(s);
  auto r = s->client()->Post("/v1/admin/fail-device", R"({"worker": 0})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
}

// Runs the binary with `args`, returns its pid and a FILE* on its stdout.
pid_t spawn(const std::vector<std::string>& args, FILE** out) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  *out = fdopen(fds[0], "r");
  return pid;
}

TEST(ServeFault, BinaryPrintsPortServesAndStopsOnSigterm) {
  ATELIER_REQUIRE_TINY_MODEL();
  FILE* out = nullptr;
  const pid_t pid = spawn({ATELIER_BINARY, "serve", "--model", "tiny=" + test::tiny_model_path(), "--port", "0",
                           "--host", "127.0.0.1", "--devices", "cpu", "--max-batch", "4"},
                          &out);
  ASSERT_GT(pid, 0);
  char line[256] = {};
  ASSERT_NE(fgets(line, sizeof line, out), nullptr) << "no output from the server";
  const std::string text = line;
  const std::string prefix = "listening on http://127.0.0.1:";
  ASSERT_EQ(text.rfind(prefix, 0), 0u) << text;
  const int port = std::stoi(text.substr(prefix.size()));
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto h = c.Get("/healthz");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto r = c.Post("/sdapi/v1/txt2img", R"({"prompt": "x", "width": 32, "height": 32, "steps": 1, "seed": 1})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(decode_b64_image(parse(r->body)["images"][0]).width, 32);
  kill(pid, SIGTERM);
  int wstatus = 0;
  pid_t waited = 0;
  for (int i = 0; i < 200 && waited == 0; ++i) {
    waited = waitpid(pid, &wstatus, WNOHANG);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (waited == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &wstatus, 0);
    FAIL() << "the server did not stop within 10 s of SIGTERM";
  }
  EXPECT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0);
  fclose(out);
}

}  // namespace
}  // namespace atelier::serve
