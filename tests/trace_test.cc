// The trace registry (core/trace.h): who receives ranges, the FLOP counter against hand counts, op nesting,
// device-time hooks, and the Chrome trace JSON.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "core/trace.h"
#include "test_util.h"

namespace atelier {
namespace {

using trace::Category;

Tensor ramp(const Shape& shape) {
  std::vector<float> v(size_t(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * float(i % 17);
  return Tensor::from_vector(v, shape);
}

uint64_t flops_of(const std::function<void()>& fn) {
  const uint64_t f0 = trace::thread_flops();
  fn();
  return trace::thread_flops() - f0;
}

TEST(Trace, RangesReachOnlyRecordersThatWantTheirCategory) {
  {
    trace::Scope idle("idle", Category::kStage);
    EXPECT_FALSE(idle.active()) << "nothing attached: a range must be inactive";
  }
  trace::Recorder stages(trace::bit(Category::kStage));
  trace::Recorder ops(trace::bit(Category::kOp));
  {
    trace::ThreadAttach a(stages);
    trace::ThreadAttach b(ops);
    trace::Scope s("my_stage", Category::kStage, 3);
    EXPECT_TRUE(s.active());
    (void)ops::add(ramp({4}), ramp({4}));
  }
  trace::Scope after("after", Category::kStage);
  EXPECT_FALSE(after.active());
  const auto se = stages.events();
  ASSERT_EQ(se.size(), 1u);
  EXPECT_STREQ(se[0].name, "my_stage");
  EXPECT_EQ(se[0].index, 3);
  EXPECT_GE(se[0].dur_ns, 0);
  EXPECT_EQ(se[0].thread, trace::thread_number());
  const auto oe = ops.events();
  ASSERT_EQ(oe.size(), 1u);
  EXPECT_STREQ(oe[0].name, "binary");
  EXPECT_EQ(oe[0].category, Category::kOp);
}

TEST(Trace, GlobalRecorderHearsEveryThread) {
  trace::Recorder all;
  {
    trace::GlobalAttach g(all);
    trace::Scope main_range("main_thread", Category::kStage);
    std::thread([] { trace::Scope r("other_thread", Category::kStage); }).join();
  }
  const auto ev = all.events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_STREQ(ev[0].name, "other_thread");  // closed first
  EXPECT_NE(ev[0].thread, ev[1].thread);
}

// Hand counts, 2 FLOPs per multiply-add.
TEST(Trace, FlopCounterMatchesHandCountsOfGemmConvAttention) {
  // matmul [3, 5, 7] @ [3, 7, 4]: 3 batches of 5x4 outputs, 7 MACs each -> 2 * 3 * 5 * 4 * 7
  EXPECT_EQ(flops_of([] { (void)ops::matmul(ramp({3, 5, 7}), ramp({3, 7, 4})); }), 840u);
  // linear x [2, 3, 8], w [5, 8]: 6 rows x 5 outputs x 8 MACs (the bias is not counted, as torch's addmm)
  EXPECT_EQ(flops_of([] { (void)ops::linear(ramp({2, 3, 8}), ramp({5, 8}), ramp({5})); }), 480u);
  EXPECT_EQ(flops_of([] { (void)ops::linear_residual(ramp({2, 3, 8}), ramp({5, 8}), ramp({5}), ramp({2, 3, 5})); }), 480u);
  // conv x [2, 6, 9, 9], w [4, 3, 3, 3], groups 2, stride 2, pad 1 -> out [2, 4, 5, 5];
  // each output element: (6 / 2) * 3 * 3 = 27 MACs -> 2 * 2 * 4 * 25 * 27
  Conv2dParams p;
  p.groups = 2;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  EXPECT_EQ(flops_of([&] {
              const Tensor y = ops::conv2d(ramp({2, 6, 9, 9}), ramp({4, 3, 3, 3}), ramp({4}), p);
              EXPECT_EQ(y.shape(), (Shape{2, 4, 5, 5}));
            }),
            10800u);
  // attention q [1, 2, 5, 8], k/v [1, 2, 7, 8]: QK^T 2*2*5*7*8 + PV 2*2*5*7*8 = 4 * B*H*Sq*Sk*D
  EXPECT_EQ(flops_of([] { (void)ops::attention(ramp({1, 2, 5, 8}), ramp({1, 2, 7, 8}), ramp({1, 2, 7, 8})); }), 2240u);
  // v with another head dim (6): 2*2*5*7*8 + 2*2*5*7*6
  EXPECT_EQ(flops_of([] { (void)ops::attention(ramp({1, 2, 5, 8}), ramp({1, 2, 7, 8}), ramp({1, 2, 7, 6})); }), 1960u);
  // multi_head_attention on [B, S, H*D] sequences counts the same attention once
  EXPECT_EQ(flops_of([] { (void)ops::multi_head_attention(ramp({1, 5, 16}), ramp({1, 7, 16}), ramp({1, 7, 16}), 2); }), 2240u);
  // elementwise, normalisation and softmax work is not counted
  EXPECT_EQ(flops_of([] {
              (void)ops::softmax(ramp({4, 4}));
              (void)ops::group_norm(ramp({1, 4, 3, 3}), 2, Tensor(), Tensor(), 1e-5f);
              (void)ops::silu(ramp({8}));
            }),
            0u);
}

TEST(Trace, OpRangesCarryFlopsShapesAndNesting) {
  trace::Recorder rec(trace::bit(Category::kOp));
  {
    trace::ThreadAttach a(rec);
    // linear_residual packs a transposed residual (an op inside an op: depth 1; a contiguous one is read in place)
    (void)ops::linear_residual(ramp({2, 3, 8}), ramp({5, 8}), ramp({5}), ramp({2, 5, 3}).transpose(1, 2));
  }
  const auto ev = rec.events();
  const auto outer = trace::named(ev, "linear_residual");
  const auto inner = trace::named(ev, "clone");
  ASSERT_EQ(outer.size(), 1u);
  ASSERT_EQ(inner.size(), 1u);
  EXPECT_EQ(outer[0]->depth, 0);
  EXPECT_EQ(inner[0]->depth, 1);
  EXPECT_EQ(outer[0]->flops, 480u);
  EXPECT_EQ(outer[0]->detail, "[2, 3, 8] x [5, 8]^T");
  EXPECT_GE(inner[0]->start_ns, outer[0]->start_ns);
  EXPECT_LE(inner[0]->start_ns + inner[0]->dur_ns, outer[0]->start_ns + outer[0]->dur_ns);
  // Busy time counts the outer op only (the clone is inside it).
  const int64_t from = outer[0]->start_ns, to = from + outer[0]->dur_ns;
  EXPECT_DOUBLE_EQ(trace::op_busy_seconds(ev, from, to), outer[0]->seconds());
  EXPECT_FALSE(trace::has_device_times(ev, from, to));
}

// A device timer that reports fixed spans: what the CUDA backend's CUDA-event timer will plug into.
class FakeDeviceTimer final : public trace::DeviceTimer {
 public:
  std::string device_name() const override { return "fake:0"; }
  int64_t origin_host_ns() const override { return origin; }
  uint64_t begin(const char* name, Category) override {
    names.push_back(name);
    return ++next;
  }
  void end(uint64_t token) override { ended.push_back(token); }
  std::optional<trace::DeviceSpan> resolve(uint64_t token) override {
    return trace::DeviceSpan{10.0 * double(token), 2.5};
  }
  int64_t origin = 0;
  uint64_t next = 0;
  std::vector<std::string> names;
  std::vector<uint64_t> ended;
};

TEST(Trace, DeviceTimerHooksGiveDeviceSpans) {
  FakeDeviceTimer timer;
  trace::Recorder rec;
  timer.origin = rec.origin_ns() + 1000;  // the device clock's zero 1 us after the recorder's
  trace::set_device_timer(&timer);
  {
    trace::ThreadAttach a(rec);
    trace::Scope s("stage", Category::kStage);
    (void)ops::silu(ramp({4}));
  }
  trace::set_device_timer(nullptr);
  ASSERT_EQ(timer.names, (std::vector<std::string>{"stage", "unary"}));
  ASSERT_EQ(timer.ended, (std::vector<uint64_t>{2, 1}));  // closed inside out
  trace::set_device_timer(&timer);
  rec.resolve_device_times();
  trace::set_device_timer(nullptr);
  const auto ev = rec.events();
  ASSERT_EQ(ev.size(), 2u);
  const trace::Event& op = *trace::named(ev, "unary").at(0);
  const trace::Event& stage = *trace::named(ev, "stage").at(0);
  EXPECT_DOUBLE_EQ(op.device_start_us, 20.0 + 1.0);  // token 2, shifted by the origins' 1 us offset
  EXPECT_DOUBLE_EQ(op.device_dur_us, 2.5);
  EXPECT_DOUBLE_EQ(op.busy_seconds(), 2.5e-6);
  EXPECT_DOUBLE_EQ(stage.device_start_us, 10.0 + 1.0);
  EXPECT_TRUE(trace::has_device_times(ev, stage.start_ns, stage.start_ns + stage.dur_ns));
  // Busy time of the stage: its one op's device time.
  EXPECT_DOUBLE_EQ(trace::op_busy_seconds(ev, stage.start_ns, stage.start_ns + stage.dur_ns), 2.5e-6);
  const nlohmann::json j = rec.chrome_json();
  int device_events = 0;
  for (const auto& e : j["traceEvents"])
    if (e["pid"] == 2 && e["ph"] == "X") ++device_events;
  EXPECT_EQ(device_events, 2);
}

TEST(Trace, ChromeJsonIsValidWithMicrosecondCompleteEvents) {
  trace::Recorder rec;
  {
    trace::ThreadAttach a(rec);
    trace::Scope outer("outer_stage", Category::kStage);
    trace::Scope call("a_call", Category::kCall, 7);
    (void)ops::matmul(ramp({4, 4}), ramp({4, 4}));
  }
  const auto path = std::filesystem::temp_directory_path() / ("atelier_trace_test_" + std::to_string(::getpid()) + ".json");
  ASSERT_TRUE(rec.write_chrome_json(path.string()).is_ok());
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f);  // throws (fails the test) on invalid JSON
  std::filesystem::remove(path);
  ASSERT_TRUE(j.contains("traceEvents"));
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name"));
    if (e["ph"] != "X") continue;
    for (const char* k : {"ts", "dur", "tid", "cat"}) EXPECT_TRUE(e.contains(k)) << e.dump();
    EXPECT_GE(e["ts"].get<double>(), 0.0);
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    by_name[e["name"]] = e;
  }
  ASSERT_TRUE(by_name.count("outer_stage") && by_name.count("a_call") && by_name.count("matmul"));
  EXPECT_EQ(by_name["outer_stage"]["cat"], "stage");
  EXPECT_EQ(by_name["a_call"]["args"]["index"], 7);
  EXPECT_EQ(by_name["matmul"]["cat"], "op");
  EXPECT_EQ(by_name["matmul"]["args"]["flops"], 128);
  // Nesting by time: the call lies inside the stage, the op inside the call.
  auto inside = [](const nlohmann::json& in, const nlohmann::json& out) {
    return in["ts"].get<double>() >= out["ts"].get<double>() &&
           in["ts"].get<double>() + in["dur"].get<double>() <= out["ts"].get<double>() + out["dur"].get<double>() + 1e-3;
  };
  EXPECT_TRUE(inside(by_name["a_call"], by_name["outer_stage"]));
  EXPECT_TRUE(inside(by_name["matmul"], by_name["a_call"]));
}

TEST(Trace, WriteToAnUnwritablePathIsAnError) {
  trace::Recorder rec;
  const Status st = rec.write_chrome_json("/nonexistent-dir/x/trace.json");
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("/nonexistent-dir/x/trace.json"), std::string::npos);
}

}  // namespace
}  // namespace atelier

namespace atelier {
namespace {

trace::Event device_event(trace::Category c, int64_t start_ns, int64_t dur_ns, double dev_start_us, double dev_dur_us,
                          int depth = 0) {
  return test::trace_event("op", c, start_ns, dur_ns, dev_start_us, dev_dur_us, depth);
}

// GPU busy %: the union of the top-level ops' device spans (overlaps count once); nested ops (depth > 0),
// call ranges, ops without device times and ranges outside the window do not count.
TEST(Trace, DeviceBusySecondsIsTheUnionOfTopLevelOps) {
  using trace::Category;
  std::vector<trace::Event> ev;
  ev.push_back(device_event(Category::kCall, 100'000, 100'000, 0, 80));  // a call: its ops speak for it
  ev.push_back(device_event(Category::kOp, 110'000, 10'000, 0, 30));
  ev.push_back(device_event(Category::kOp, 130'000, 10'000, 20, 30));    // overlaps the first by 10 us
  ev.push_back(device_event(Category::kOp, 131'000, 1'000, 25, 5, /*depth=*/1));
  ev.push_back(device_event(Category::kOp, 300'000, 10'000, 100, 300));  // a graph replay
  ev.push_back(device_event(Category::kOp, 320'000, 5'000, 390, 30));    // overlaps it by 10 us
  ev.push_back(device_event(Category::kOp, 330'000, 5'000, -1, -1));     // not timed
  ev.push_back(device_event(Category::kOp, 900'000, 5'000, 1000, 500));  // outside the window
  EXPECT_NEAR(trace::device_busy_seconds(ev, 0, 500'000) * 1e6, 50 + 320, 1e-6);
  // Where the same ops' device work ends: the graph replay's overlapping op, not the nested or outside ones.
  EXPECT_NEAR(trace::device_end_us(ev, 0, 500'000), 420, 1e-9);
  EXPECT_EQ(trace::device_end_us(ev, 600'000, 700'000), -1);
}

}  // namespace
}  // namespace atelier
