// Helpers for the server tests: an in-process server on a free port with the sd15-tiny model, an HTTP
// client, JSON and image checks.
#pragma once
#include <cstdio>
#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "io/image.h"
#include "serve/base64.h"
#include "serve/server.h"
#include "test_util.h"

namespace atelier::serve::test {

inline std::string tiny_model_path() {
  auto dir = ::atelier::test::fixture("sd15-tiny");
  return dir ? (*dir / "model").string() : std::string();
}

inline ServeOptions tiny_options() {
  ServeOptions o;
  o.models = {"tiny=" + tiny_model_path()};
  o.port = 0;
  o.devices = "cpu";
  o.http_threads = 48;
  o.host_threads = 2;
  o.cpu_threads = 1;  // the test machine's 2 cores are shared: one thread per worker keeps timings steady
  return o;
}

// Skips the test (with a reason) when the tiny model is absent.
#define ATELIER_REQUIRE_TINY_MODEL()                                                  \
  if (::atelier::serve::test::tiny_model_path().empty())                              \
  GTEST_SKIP() << "fixture 'sd15-tiny' not found (looked in ../shared/fixtures and $ATELIER_FIXTURES)"

struct RunningServer {
  std::unique_ptr<Server> server;
  int port = 0;

  static std::unique_ptr<RunningServer> start(const ServeOptions& o) {
    auto s = Server::create(o);
    EXPECT_TRUE(s.has_value()) << s.status().message();
    if (!s) return nullptr;
    auto rs = std::make_unique<RunningServer>();
    rs->server = std::move(*s);
    const Status st = rs->server->start();
    EXPECT_TRUE(st.is_ok()) << st.message();
    if (!st.is_ok()) return nullptr;
    rs->port = rs->server->port();
    return rs;
  }
  std::unique_ptr<httplib::Client> client(int timeout_s = 120) const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_read_timeout(timeout_s, 0);
    c->set_connection_timeout(5, 0);
    return c;
  }
};

// One server for every test of a suite, started once (loading the model is the slow part) on Suite::options():
// `class MySuite : public test::SharedServerSuite<MySuite> { static ServeOptions options(); };`. Each test skips
// with the reason without the tiny model, and gets its own client.
template <class Suite>
class SharedServerSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (tiny_model_path().empty()) return;
    server_ = RunningServer::start(Suite::options()).release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ATELIER_REQUIRE_TINY_MODEL();
    ASSERT_NE(server_, nullptr);
    client_ = server_->client();
  }
  static inline RunningServer* server_ = nullptr;
  std::unique_ptr<httplib::Client> client_;
};

inline nlohmann::json parse(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << body.substr(0, 200);
  return j;
}

inline nlohmann::json post_json(httplib::Client& c, const std::string& path, const nlohmann::json& body, int* status) {
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  *status = r ? r->status : -1;
  if (!r) std::fprintf(stderr, "POST %s: no response (%s)\n", path.c_str(), httplib::to_string(r.error()).c_str());
  return r ? parse(r->body) : nlohmann::json();
}

// Decodes a base64 image; fails the test when it is not a valid image.
inline Image decode_b64_image(const std::string& b64) {
  auto bytes = base64_decode(b64, "image", 64 << 20);
  EXPECT_TRUE(bytes.has_value()) << bytes.status().message();
  if (!bytes) return {};
  auto img = decode_image(*bytes);
  EXPECT_TRUE(img.has_value()) << img.status().message();
  return img ? *img : Image{};
}

// Polls GET /v1/jobs/{id} until the job is finished; returns its document.
inline nlohmann::json wait_job(httplib::Client& c, const std::string& id, double timeout_s = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  nlohmann::json j;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = c.Get(("/v1/jobs/" + id).c_str());
    if (!r) return {};
    j = parse(r->body);
    const std::string st = j.value("state", "");
    if (st == "done" || st == "failed" || st == "cancelled") return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "job " << id << " did not finish in " << timeout_s << " s: " << j.dump().substr(0, 300);
  return j;
}

// A job's event stream from the start (it replays what happened before we connected) to its end.
inline std::string read_events(httplib::Client& c, const std::string& id, std::string* content_type = nullptr) {
  std::string stream;
  auto r = c.Get(("/v1/jobs/" + id + "/events").c_str(), [&](const char* data, size_t n) {
    stream.append(data, n);
    return true;
  });
  EXPECT_TRUE(r);
  if (r && content_type) *content_type = r->get_header_value("Content-Type");
  return stream;
}

// Polls GET /v1/jobs/{id} until the job has done `step` calls (up to `timeout_s`): a running job to act on.
inline void wait_for_step(httplib::Client& c, const std::string& id, int step, double timeout_s = 30) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline && parse(c.Get(("/v1/jobs/" + id).c_str())->body)["step"] < step)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// Value of one Prometheus sample line "name{labels} value" (exact name+labels text), -1 when absent.
inline double prom_value(const std::string& text, const std::string& series) {
  const std::string key = series + " ";
  size_t at = 0;
  while ((at = text.find(key, at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + key.size()));
    at += key.size();
  }
  return -1;
}

}  // namespace atelier::serve::test
