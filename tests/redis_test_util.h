// Helpers for the Redis queue tests: a real redis-server (Debian's /usr/bin/redis-server) on a free port in
// a temporary folder, and child processes of the real `atelier` binary (gateway, workers).
#pragma once
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "serve/redis/redis_client.h"

namespace atelier::serve::test {

inline constexpr const char* kRedisServer = "/usr/bin/redis-server";

#define ATELIER_REQUIRE_REDIS()                                              \
  if (!std::filesystem::exists(::atelier::serve::test::kRedisServer))       \
  GTEST_SKIP() << "redis-server not found at /usr/bin/redis-server (Debian package redis-server)"

// A port nobody listens on right now (bound to 0 by the kernel, then released).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A child process with its stdout on a pipe.
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;

  static Child spawn(const std::vector<std::string>& args) {
    Child c;
    int fds[2];
    if (pipe(fds) != 0) return c;
    c.pid = fork();
    if (c.pid == 0) {
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
    c.out = fdopen(fds[0], "r");
    return c;
  }
  // The first line of stdout that starts with `prefix` (the rest of it), or "" at end of output.
  std::string line_with(const std::string& prefix) {
    char buf[512];
    while (out && fgets(buf, sizeof buf, out)) {
      std::string s = buf;
      if (s.rfind(prefix, 0) == 0) {
        while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
        return s.substr(prefix.size());
      }
    }
    return "";
  }
  // Sends `sig` and reaps the process (SIGKILL after 10 s); closes its output.
  void signal_and_wait(int sig) {
    if (pid > 0) {
      kill(pid, sig);
      int st = 0;
      bool reaped = false;
      for (int i = 0; i < 200 && !reaped; ++i) {
        reaped = waitpid(pid, &st, WNOHANG) == pid;
        if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!reaped) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
      }
      pid = -1;
    }
    if (out) fclose(out);
    out = nullptr;
  }
  ~Child() { signal_and_wait(SIGKILL); }
  Child() = default;
  Child(Child&& o) noexcept : pid(o.pid), out(o.out) { o.pid = -1; o.out = nullptr; }
  Child& operator=(Child&& o) noexcept {
    signal_and_wait(SIGKILL);
    pid = o.pid;
    out = o.out;
    o.pid = -1;
    o.out = nullptr;
    return *this;
  }
};

// redis-server in a temporary folder; `aof` turns on the append-only file (fsync always).
struct RedisProcess {
  std::filesystem::path dir;
  int port = 0;
  bool aof = false;
  Child child;

  static std::unique_ptr<RedisProcess> start(bool aof) {
    auto r = std::make_unique<RedisProcess>();
    r->aof = aof;
    r->dir = std::filesystem::temp_directory_path() / ("atelier-redis-" + std::to_string(getpid()) + "-" + std::to_string(free_port()));
    std::filesystem::create_directories(r->dir);
    // A port picked by free_port() can be taken by a concurrent test (ctest -j) before redis binds it.
    for (int attempt = 0; attempt < 3; ++attempt) {
      r->port = free_port();
      if (r->launch()) return r;
    }
    ADD_FAILURE() << "redis-server did not start (3 ports tried)";
    return nullptr;
  }
  // Starts redis-server on `port`; false when it exits or does not answer within 5 s.
  bool launch() {
    child = Child::spawn({kRedisServer, "--port", std::to_string(port), "--bind", "127.0.0.1", "--dir", dir.string(),
                          "--save", "", "--appendonly", aof ? "yes" : "no", "--appendfsync", "always",
                          "--daemonize", "no", "--loglevel", "warning"});
    for (int i = 0; i < 100; ++i) {  // up to 5 s for the port to answer
      if (auto c = redis::RedisClient::connect(*redis::RedisUrl::parse(url()))) {
        if ((*c)->command({"PING"})) return true;
      }
      int st = 0;
      if (waitpid(child.pid, &st, WNOHANG) == child.pid) {  // exited: e.g. the port was taken
        child.pid = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  // kill -9 and start again on the same port and folder.
  bool restart() {
    child.signal_and_wait(SIGKILL);
    const bool ok = launch();
    EXPECT_TRUE(ok) << "redis-server did not start again on port " << port;
    return ok;
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port); }
  std::unique_ptr<redis::RedisClient> client() const {
    auto c = redis::RedisClient::connect(*redis::RedisUrl::parse(url()));
    return c ? std::move(*c) : nullptr;
  }
  ~RedisProcess() {
    child.signal_and_wait(SIGKILL);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace atelier::serve::test
