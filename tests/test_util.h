// Helpers shared by the tests: where the reference fixtures are, golden tensors, and error measures.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "core/trace.h"
#include "io/image.h"

namespace atelier::test {

// ../shared/fixtures beside the checkout, or $ATELIER_FIXTURES; nullopt when the folder is absent.
std::optional<std::filesystem::path> fixtures_root();
// fixtures_root()/name when it exists.
std::optional<std::filesystem::path> fixture(const std::string& name);

// A fresh folder under the system's temporary directory, named after the process and the running test, removed
// (with what the test put there) when it goes out of scope.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = std::filesystem::temp_directory_path() /
           ("atelier_" + std::string(info ? info->name() : "test") + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// The largest difference of two images' 8-bit values (256 when their sizes differ).
inline int max_pixel_diff(const Image& a, const Image& b) {
  if (a.pixels.size() != b.pixels.size()) return 256;
  int worst = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) worst = std::max(worst, std::abs(int(a.pixels[i]) - int(b.pixels[i])));
  return worst;
}

// Golden tensor `key` of fixture `name` (e.g. "sd15-tiny", "unet.out.t999") as a host f32 tensor.
Tensor golden(const std::string& name, const std::string& key);

// While alive, the CPU backend keeps image activations channels-last (CpuBackend::set_channels_last_for_tests):
// the op layer's channels-last paths, which the GPU takes, run where CI can check them.
struct ChannelsLastOnCpu {
  ChannelsLastOnCpu();
  ~ChannelsLastOnCpu();
  ChannelsLastOnCpu(const ChannelsLastOnCpu&) = delete;
  ChannelsLastOnCpu& operator=(const ChannelsLastOnCpu&) = delete;
};

// fn() on a new thread with one OpenMP thread (the setting is per thread: the caller's stays as it is), as the server's
// CPU workers compute in the server tests (--cpu-threads 1), so that reductions add in the same order; its result.
template <typename Fn>
auto on_one_omp_thread(Fn&& fn) -> decltype(fn()) {
  std::optional<decltype(fn())> out;
  std::thread([&] {
    omp_set_num_threads(1);
    out.emplace(fn());
  }).join();
  return std::move(*out);
}

// The top-level op ranges (category kOp, depth 0) that fn records on this thread, in order: what a model's
// forward calls, for tests that count its GEMMs, norms or ropes.
std::vector<trace::Event> top_level_ops(const std::function<void()>& fn);
// Those ranges counted by op name.
std::map<std::string, int> count_by_name(const std::vector<trace::Event>& ops);

// A recorded range as the trace recorder keeps it: host start and duration (ns), device start and duration (us
// since the recorder's origin; -1: not device-timed), op nesting depth.
inline trace::Event trace_event(const char* name, trace::Category c, int64_t start_ns, int64_t dur_ns, double dev_start_us,
                                double dev_dur_us, int depth = 0) {
  trace::Event e;
  e.name = name;
  e.category = c;
  e.start_ns = start_ns;
  e.dur_ns = dur_ns;
  e.depth = depth;
  e.device_start_us = dev_start_us;
  e.device_dur_us = dev_dur_us;
  return e;
}

// ||a - b|| / ||b||
double rel_l2(const std::vector<float>& a, const std::vector<float>& b);
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace atelier::test

// Skips the current test with a printed reason when fixture `name` is absent (never passes silently).
#define ATELIER_REQUIRE_FIXTURE(var, name)                                                            \
  auto var##_opt = ::atelier::test::fixture(name);                                                 \
  if (!var##_opt) GTEST_SKIP() << "fixture '" << name << "' not found (looked in ../shared/fixtures and $ATELIER_FIXTURES)"; \
  const std::filesystem::path var = *var##_opt

#define EXPECT_REL_L2_LE(actual, expected, tol)                                                 \
  do {                                                                                            \
    const auto _a = (actual);                                                                     \
    const auto _b = (expected);                                                                   \
    ASSERT_EQ(_a.size(), _b.size());                                                              \
    const double _r = ::atelier::test::rel_l2(_a, _b);                                            \
    EXPECT_LE(_r, tol) << "rel L2 " << _r << ", max abs " << ::atelier::test::max_abs_diff(_a, _b); \
  } while (0)
