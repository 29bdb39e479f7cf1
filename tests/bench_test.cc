// `atelier bench` and `--trace`: the JSON report's fields on the sd15-tiny fixture, the GEMM ceiling, the
// built-in configurations, and the trace of a generation (every stage present, StageTimes equal to it).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "backend/nvml.h"
#include "pipeline/builtin_models.h"
#include "pipeline/sd_bench.h"
#include "pipeline/sd_pipeline.h"
#include "test_util.h"

namespace atelier {
namespace {
namespace fs = std::filesystem;

struct CliRun {
  int exit_code = -1;
  std::string out;  // stdout only
  std::string err;  // stderr
};

CliRun run_cli(const std::string& args) {
  const fs::path err = fs::temp_directory_path() / ("atelier_bench_test_err_" + std::to_string(::getpid()));
  const std::string cmd = std::string(ATELIER_BINARY) + " " + args + " 2>'" + err.string() + "'";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(err);
  r.err.assign(std::istreambuf_iterator<char>(f), {});
  fs::remove(err);
  return r;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("atelier_bench_test_" + std::to_string(::getpid()) + "_" + name);
}

// GPU busy % is kernel time over the span from the denoise loop's start to the end of its device work: the
// device still runs the last enqueued ops after the host's range closes (a loop need not synchronize), and
// dividing by the host's span alone gave more than 100% (Z-Image on the H200: 103%).
TEST(Bench, GpuBusyCountsTheDeviceTailAfterTheLoop) {
  using trace::Category;
  constexpr int64_t kOrigin = 1'000'000'000;  // the recorder's origin (host ns); device times count from it
  const auto busy_pct = [](const std::vector<trace::Event>& ev) {
    BenchReport r;
    r.device = "cuda:0";
    r.batch = 1;
    summarize_bench(ev, kOrigin, "unet", false, r);
    return r.gpu_busy_pct.value_or(-1.0);
  };
  // The host enqueues two ops in 0.2 ms and closes the loop's range at 1 ms; the device runs them from 0.1 to
  // 1.3 ms after the origin with a 0.1 ms gap between them: 1.1 ms of kernels over a 1.3 ms span.
  std::vector<trace::Event> ev{test::trace_event("denoise", Category::kStage, kOrigin, 1'000'000, -1, -1),
                               test::trace_event("linear", Category::kOp, kOrigin + 10'000, 50'000, 100, 500),
                               test::trace_event("linear", Category::kOp, kOrigin + 100'000, 50'000, 700, 600)};
  EXPECT_NEAR(busy_pct(ev), 100.0 * 1.1 / 1.3, 1e-6);
  // Device work that ends inside the host's range: the host's span is the denominator.
  ev[2].device_dur_us = 200;  // 0.7 .. 0.9 ms
  EXPECT_NEAR(busy_pct(ev), 100.0 * 0.7 / 1.0, 1e-6);
}

// NVML's energy counter is cumulative and moves in steps (~100 ms apart on an H200): a span's energy is the
// counter at its two ends, known where it changed and linear between (and beyond) those points.
TEST(Nvml, EnergyBetweenFollowsTheCountersSteps) {
  constexpr int64_t kMs = 1'000'000;
  std::vector<NvmlSample> s;
  const double energy[] = {1000.0, 1010.0, 1030.0, 1060.0};
  for (int i = 0; i < 4; ++i) s.push_back(NvmlSample{i * 100 * kMs, 0.5, (1500.0 + 100.0 * i) * 1e6, energy[i]});
  // The first reading anchors nothing (its value was reached earlier); changes at 100, 200 and 300 ms.
  EXPECT_NEAR(*energy_between(s, 100 * kMs, 200 * kMs), 20.0, 1e-9);
  EXPECT_NEAR(*energy_between(s, 50 * kMs, 250 * kMs), (1030.0 + 15.0) - (1010.0 - 10.0), 1e-9);
  EXPECT_NEAR(*energy_between(s, 0, 300 * kMs), 1060.0 - 990.0, 1e-9);  // 0..100 ms at the next step's slope
  EXPECT_FALSE(energy_between(s, -1, 100 * kMs).has_value());          // before the first reading
  EXPECT_FALSE(energy_between(s, 0, 301 * kMs).has_value());           // after the last
  EXPECT_FALSE(energy_between(s, 200 * kMs, 100 * kMs).has_value());
  EXPECT_NEAR(*mean_sm_clock_mhz(s, 50 * kMs, 250 * kMs), 1650.0, 1e-9);  // the readings at 100 and 200 ms
  EXPECT_NEAR(*mean_sm_clock_mhz(s, 10 * kMs, 20 * kMs), 1500.0, 1e-9);   // none inside: the nearest
  // A steady 500 W read every 10 ms by a counter that moves every 100 ms: the span's energy is exact, where
  // interpolating between the readings themselves would lag at each end by up to one step.
  std::vector<NvmlSample> stairs;
  for (int t = 0; t <= 1000; t += 10) stairs.push_back(NvmlSample{t * kMs, 1.0, 1.5e9, 500.0 * (t / 100) * 0.1});
  EXPECT_NEAR(*energy_between(stairs, 150 * kMs, 870 * kMs), 500.0 * 0.72, 1e-6);
  EXPECT_NEAR(*energy_between(stairs, 333 * kMs, 999 * kMs), 500.0 * 0.666, 1e-6);
  for (NvmlSample& x : s) x.energy_j.reset();  // a GPU without the counter
  EXPECT_FALSE(energy_between(s, 50 * kMs, 250 * kMs).has_value());
  EXPECT_FALSE(mean_sm_clock_mhz({}, 0, 1).has_value());
}

// The bench's energy figures: per model call over the denoise loop, per image over the timed run, the loop's
// mean power and SM clock, from the samples the run's NVML sampler kept.
TEST(Bench, EnergyFiguresComeFromTheSamplesOverTheLoop) {
  using trace::Category;
  constexpr int64_t kOrigin = 1'000'000'000, kMs = 1'000'000;
  constexpr double kWatts = 500.0;
  BenchReport r;
  r.device = "cuda:0";
  r.batch = 2;
  // A GPU drawing 500 W from the origin on: the counter reads 500 J per second; the clock 1500 MHz, then 1400.
  for (int i = 0; i <= 30; ++i)
    r.nvml_samples.push_back(NvmlSample{kOrigin + i * 100 * kMs, 1.0, (i < 15 ? 1500.0 : 1400.0) * 1e6, kWatts * i * 0.1});
  // The timed run 0..2.5 s, its denoise loop 0.5..1.5 s with four model calls, each with a device-timed op.
  std::vector<trace::Event> ev{test::trace_event("bench_run", Category::kStage, kOrigin, 2500 * kMs, -1, -1),
                               test::trace_event("denoise", Category::kStage, kOrigin + 500 * kMs, 1000 * kMs, -1, -1)};
  for (int c = 0; c < 4; ++c) {
    const int64_t at = kOrigin + (500 + 250 * c) * kMs;
    ev.push_back(test::trace_event("model_call", Category::kCall, at, 250 * kMs, -1, -1));
    ev.push_back(test::trace_event("linear", Category::kOp, at, 1 * kMs, (500 + 250 * c) * 1e3, 200e3));
  }
  summarize_bench(ev, kOrigin, "model_call", false, r);
  ASSERT_EQ(r.model_calls, 4);
  ASSERT_TRUE(r.energy_per_call_j && r.energy_per_image_j && r.mean_power_w && r.mean_sm_clock_mhz);
  EXPECT_NEAR(*r.energy_per_call_j, kWatts * 1.0 / 4, 1e-6);   // 500 J over the 1 s loop, 4 calls
  EXPECT_NEAR(*r.energy_per_image_j, kWatts * 2.5 / 2, 1e-6);  // 1250 J over the 2.5 s run, 2 images
  EXPECT_NEAR(*r.mean_power_w, kWatts, 1e-6);
  EXPECT_NEAR(*r.mean_sm_clock_mhz, (10 * 1500.0 + 1 * 1400.0) / 11, 1e-6);  // samples at 0.5 .. 1.5 s
  const nlohmann::json j = r.to_json();
  EXPECT_FALSE(j.contains("nvml_samples"));
  // A loop under a second (SD's 20 steps take 0.13 s): NVML's counter is too coarse for it; the clock stays.
  BenchReport short_loop;
  short_loop.device = "cuda:0";
  short_loop.batch = 2;
  short_loop.nvml_samples = r.nvml_samples;
  std::vector<trace::Event> short_ev = ev;
  short_ev[1].dur_ns = 900 * kMs;
  short_ev[0].dur_ns = 950 * kMs;
  summarize_bench(short_ev, kOrigin, "model_call", false, short_loop);
  EXPECT_FALSE(short_loop.energy_per_call_j || short_loop.energy_per_image_j || short_loop.mean_power_w);
  EXPECT_TRUE(short_loop.mean_sm_clock_mhz.has_value());
  BenchReport none;  // no samples (CPU, no driver): no figures
  none.device = "cuda:0";
  none.batch = 1;
  summarize_bench(ev, kOrigin, "model_call", false, none);
  EXPECT_FALSE(none.energy_per_call_j || none.energy_per_image_j || none.mean_power_w || none.mean_sm_clock_mhz);
}

TEST(Bench, JsonOnTinyFixtureHasEveryField) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const auto r = run_cli("bench --model " + q(dir / "model") + " --width 64 --height 64 --steps 3 --warmup 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"model", "device", "backend", "width", "height", "batch", "unet_batch", "steps", "warmup_s", "unet_ms",
                        "it_per_s", "s_per_image", "images_per_min", "stages_s", "unet_flops_per_call",
                        "unet_tflops_per_s", "vae_decode_flops", "gemm_ceiling", "pct_of_ceiling", "gpu_busy_pct",
                        "op_time_pct", "nvml_util_pct", "energy_per_call_j", "energy_per_image_j", "mean_power_w",
                        "mean_sm_clock_mhz", "peak_bytes_reserved"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["unet_batch"], 2);  // CFG doubles the batch
  EXPECT_EQ(j["model_calls"], 3);
  EXPECT_EQ(j["unet_ms"]["calls"], 3);
  // The warm-up (one UNet call and a VAE decode) took at least one call's time, and is not the timed run's.
  EXPECT_GE(j["warmup_s"].get<double>(), j["unet_ms"]["min"].get<double>() / 1e3);
  EXPECT_LT(j["warmup_s"].get<double>(), 60.0);
  EXPECT_GT(j["unet_ms"]["mean"].get<double>(), 0.0);
  EXPECT_LE(j["unet_ms"]["min"].get<double>(), j["unet_ms"]["mean"].get<double>());
  EXPECT_GT(j["it_per_s"].get<double>(), 0.0);
  const double s_per_image = j["s_per_image"].get<double>();
  EXPECT_NEAR(j["images_per_min"].get<double>(), 60.0 / s_per_image, 1e-9);
  EXPECT_GE(s_per_image, j["stages_s"]["denoise"].get<double>() + j["stages_s"]["vae_decode"].get<double>());
  EXPECT_TRUE(j["stages_s"]["text_encode"].is_number());  // the fixture has a text encoder
  EXPECT_GT(j["unet_flops_per_call"].get<uint64_t>(), 0u);
  EXPECT_GT(j["vae_decode_flops"].get<uint64_t>(), 0u);
  EXPECT_TRUE(j["gpu_busy_pct"].is_null());  // no device timer on the CPU
  EXPECT_TRUE(j["nvml_util_pct"].is_null());  // NVML is sampled for CUDA devices only
  for (const char* k : {"energy_per_call_j", "energy_per_image_j", "mean_power_w", "mean_sm_clock_mhz"}) EXPECT_TRUE(j[k].is_null()) << k;
  EXPECT_TRUE(j["pct_of_ceiling"].is_null());  // not asked for
  const double op_pct = j["op_time_pct"].get<double>();
  EXPECT_GT(op_pct, 0.0);
  EXPECT_LE(op_pct, 100.0 + 1e-6);
  EXPECT_GT(j["peak_bytes_reserved"].get<uint64_t>(), 0u);
  // The backend's counters over the timed run: after the warm-up (UNet calls, a VAE decode, the conditioning
  // before them) the timed generation's activations come from the allocator's cache. (A few 2 KB blocks may be
  // new: the CPU attention's per-thread scratch, as many as the threads that happen to overlap.)
  const auto& counters = j["timed_run_counters"];
  ASSERT_TRUE(counters.is_object() && counters.contains("host_allocations") && counters.contains("bytes_reserved"))
      << j.dump();
  EXPECT_GE(counters["host_allocations"].get<double>(), 0.0);
  EXPECT_LT(counters["bytes_reserved"].get<double>(), 0.01 * j["peak_bytes_reserved"].get<double>()) << counters.dump();
}

// CUDA_VISIBLE_DEVICES renumbers CUDA's devices; NVML must read the GPU CUDA means (a bench on "1" read
// GPU 0's utilization before this).
TEST(Nvml, FollowsCudaVisibleDevices) {
  auto sel = [](const char* v, int i) { return nvml_selector(v, i); };
  ASSERT_TRUE(sel(nullptr, 1).has_value());
  EXPECT_EQ(sel(nullptr, 1)->index, 1u);
  EXPECT_EQ(sel("", 0)->index, 0u);
  EXPECT_EQ(sel("1", 0)->index, 1u);
  EXPECT_EQ(sel("3, 1", 1)->index, 1u);
  EXPECT_EQ(sel("3,1", 0)->index, 3u);
  EXPECT_FALSE(sel("1", 1).has_value());           // CUDA sees one device
  EXPECT_EQ(sel("GPU-abc,2", 0)->uuid, "GPU-abc");
  EXPECT_EQ(sel("GPU-abc,2", 1)->index, 2u);
  EXPECT_FALSE(sel("0,x,1", 2).has_value());       // CUDA stops at the invalid entry
  EXPECT_FALSE(sel("0", -1).has_value());
}

TEST(Bench, NvmlSamplerReadsAPercentageOrNothing) {
  // With a driver (the GPU machine) a percentage of device 0 over ~0.2 s; without one, nothing, at once.
  const bool have_nvml = Nvml::open() != nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  NvmlSampler sampler(0, std::chrono::milliseconds(20));
  if (have_nvml) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::optional<double> pct = sampler.stop();
  EXPECT_FALSE(sampler.stop().has_value() != pct.has_value());  // idempotent
  if (!have_nvml) {
    std::printf("no NVML on this machine: the sampler reads nothing\n");
    EXPECT_FALSE(pct.has_value());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    return;
  }
  ASSERT_TRUE(pct.has_value());
  EXPECT_GE(*pct, 0.0);
  EXPECT_LE(*pct, 100.0);
}

TEST(Bench, FlopsPerCallAreTheSumOfTheUnetsOps) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  SdLoadOptions lo;
  lo.compute_hash = false;
  auto model = load_sd_model((dir / "model").string(), lo);
  ASSERT_TRUE(model) << model.status().message();
  SdPipeline pipe(*model);
  GenerateRequest req;
  req.prompt = "a cube";
  req.width = req.height = 64;
  req.steps = 2;
  req.seed = 1;
  trace::Recorder rec;
  Expected<GenerateResult> res = Status(ErrorCode::kInternal, "not run");
  {
    trace::GlobalAttach g(rec);
    res = pipe.generate(req);
  }
  ASSERT_TRUE(res) << res.status().message();
  const auto ev = rec.events();
  const auto unet = trace::named(ev, stage::kUnet);
  ASSERT_EQ(unet.size(), 2u);
  EXPECT_GT(unet[0]->flops, 0u);
  EXPECT_EQ(unet[0]->flops, unet[1]->flops);
  uint64_t op_flops = 0;  // depth-0 ops inside the first UNet range
  for (const trace::Event& e : ev)
    if (e.category == trace::Category::kOp && e.depth == 0 && e.start_ns >= unet[0]->start_ns &&
        e.start_ns + e.dur_ns <= unet[0]->start_ns + unet[0]->dur_ns)
      op_flops += e.flops;
  EXPECT_EQ(op_flops, unet[0]->flops);
  // StageTimes are the same numbers as the trace's ranges, not a second measurement.
  const auto calls = trace::named(ev, stage::kModelCall);
  ASSERT_EQ(res->times.call_ms.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_DOUBLE_EQ(res->times.call_ms[i], calls[i]->seconds() * 1e3);
  EXPECT_DOUBLE_EQ(res->times.total_s, trace::total_seconds(ev, stage::kGenerate));
  EXPECT_DOUBLE_EQ(res->times.vae_s, trace::total_seconds(ev, stage::kVaeDecode));
  EXPECT_GT(res->times.text_encode_s, 0.0);
}

TEST(Bench, CeilingIsTheEngineCountOfABigGemm) {
  auto c = measure_gemm_ceiling(Device::cpu(), DType::F32, 256, 2);
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(c->flops, 2ull * 256 * 256 * 256);
  EXPECT_GT(c->tflops, 0.0);
  EXPECT_NEAR(c->tflops, double(c->flops) / c->best_s / 1e12, 1e-12);
  EXPECT_EQ(default_ceiling_size(Device::cpu()), 2048);
  EXPECT_EQ(default_ceiling_size(Device::cuda(0)), 8192);
}

TEST(Bench, CeilingAloneFromTheCli) {
  const auto r = run_cli("bench --ceiling --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["gemm_ceiling"].is_object());
  EXPECT_EQ(j["gemm_ceiling"]["flops"].get<uint64_t>(), 2ull * 2048 * 2048 * 2048);
  EXPECT_GT(j["gemm_ceiling"]["tflops_per_s"].get<double>(), 0.0);
  EXPECT_FALSE(j.contains("unet_ms"));
}

TEST(Bench, RejectsBadOptionsWithAMessage) {
  BenchOptions o;
  EXPECT_NE(run_sd_bench(o).status().message().find("--config sd15|sd21"), std::string::npos);
  o.model = "x";
  o.config = "sd15";
  EXPECT_NE(run_sd_bench(o).status().message().find("not both"), std::string::npos);
  o.model.clear();
  o.config = "sdxl";
  EXPECT_NE(run_sd_bench(o).status().message().find("known: sd15, sd21"), std::string::npos);
  o.config = "sd15";
  o.width = 100;
  EXPECT_NE(run_sd_bench(o).status().message().find("multiples of 8"), std::string::npos);
  const auto r = run_cli("bench --config sd15 --device cuda:7");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("cuda:7"), std::string::npos) << r.err;
}

TEST(Bench, BuiltinConfigsAreThePublishedArchitectures) {
  auto count = [](const UNetConfig& c) {
    int64_t n = 0;
    const auto shapes = UNet::parameter_shapes(c);
    for (const auto& [key, shape] : shapes.value()) n += numel_of(shape);
    return n;
  };
  auto sd15 = builtin_sd_config("sd15");
  ASSERT_TRUE(sd15);
  EXPECT_EQ(count(sd15->unet), 859520964);  // SD 1.5's UNet, as diffusers counts it
  EXPECT_EQ(sd15->default_size, 512);
  auto sd21 = builtin_sd_config("sd21");
  ASSERT_TRUE(sd21);
  EXPECT_EQ(count(sd21->unet), 865910724);  // SD 2.1's UNet
  EXPECT_EQ(sd21->unet.num_attention_heads, (std::vector<int>{5, 10, 20, 20}));
  for (int l = 0; l < sd21->unet.levels(); ++l) EXPECT_EQ(sd21->unet.head_dim(l), 64);
  EXPECT_EQ(sd21->unet.cross_attention_dim, (std::vector<int>{1024, 1024, 1024, 1024}));
  EXPECT_TRUE(sd21->unet.use_linear_projection);
  EXPECT_EQ(sd21->prediction, Prediction::kV);
  EXPECT_EQ(sd21->default_size, 768);
}

TEST(Bench, GenerateTraceHasEveryStage) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const fs::path out = temp_file("img.png");
  const fs::path trace_path = temp_file("trace.json");
  const auto r = run_cli("generate --model " + q(dir / "model") + " --prompt 'a red circle' --width 64 --height 64"
                         " --steps 2 --seed 3 --output " + q(out) + " --trace " + q(trace_path));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream f(trace_path);
  ASSERT_TRUE(f) << "no trace file";
  const auto j = nlohmann::json::parse(f);
  std::multiset<std::string> names;
  std::set<std::string> op_names;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    names.insert(e["name"].get<std::string>());
    if (e["cat"] == "op") op_names.insert(e["name"].get<std::string>());
  }
  for (const char* s : {"generate", "text_encode", "denoise", "vae_decode", "image_encode", "png_write"})
    EXPECT_GE(names.count(s), 1u) << s;
  EXPECT_EQ(names.count("text_encode"), 2u);  // prompt and negative prompt
  EXPECT_EQ(names.count("model_call"), 2u);
  EXPECT_EQ(names.count("unet"), 2u);
  EXPECT_EQ(names.count("sampler_step"), 2u);
  for (const char* op : {"conv2d", "linear", "attention", "group_norm"}) EXPECT_TRUE(op_names.count(op)) << op;
  fs::remove(out);
  fs::remove(fs::path(out).replace_extension(".json"));
  fs::remove(trace_path);
}

}  // namespace
}  // namespace atelier
