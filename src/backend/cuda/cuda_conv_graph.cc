// Convolution through cuDNN's graph (backend) API: see cuda_conv_graph.h. Every cuDNN status is checked; a
// failure anywhere declines the case (false) so that the legacy path runs it.
#include "backend/cuda/cuda_conv_graph.h"

#include "backend/cuda/cudnn_graph_api.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <utility>
#include <vector>

namespace atelier::cuda {

// Helpers live in a named namespace (not an anonymous one): ConvGraph::Plan holds their types.
namespace conv_graph_detail {

using namespace cudnn_graph;

constexpr int kTimedRuns = 2;                            // timed executions per candidate, after a first one
// Host time one shape's planning may take before no further candidates are finalized or timed (the best so
// far is kept): runtime-compiled engines compile at finalize, and a long list of them must not stall a run.
constexpr std::chrono::milliseconds kPlanningBudget{3000};
// Candidates timed per shape: heuristics mode A's best first. On the H200 (2026-11-29) the fastest plan was
// always among A's first few, while FALLBACK's list added engines that took up to 2.5 s per timed run at the
// FLUX VAE's 512x512x512 convolutions (so planning, not running, ended that benchmark).
constexpr size_t kMaxTimedCandidates = 8;
// A candidate whose first timed run is this many times slower than the best so far is not run again.
constexpr float kSlowCandidateFactor = 3.0f;
constexpr float kConfirmFactor = 1.15f;  // plans this close to the fastest are timed again, in turns
constexpr int kConfirmRounds = 2;
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;       // tensor uids in the graph and the variant pack

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{!env_is("ATELIER_CUDNN_GRAPH", "0")};
  return on;
}

struct Counters {
  std::atomic<int64_t> plans{0}, declined{0}, autotuned{0}, runs{0};
};
Counters& counters() {
  static Counters c;
  return c;
}


cudnnDataType_t data_type(DType t) { return t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

// A channels-last buffer [n, h, w, c] described as the graph API wants it: dims in NCHW order with the
// strides of the NHWC layout.
Descriptor nhwc_tensor(Builder& b, int64_t uid, cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t dims[4] = {n, c, h, w};
  const int64_t strides[4] = {h * w * c, 1, w * c, c};
  return tensor(b, uid, dt, 4, dims, strides);
}

// The operation graph of one convolution: x [n, h, w, c] * w [o, kh, kw, c] -> y [n, ho, wo, o], f32 compute.
struct OpGraph {
  Descriptor x, w, y, conv, op, graph;
};

OpGraph build_graph(Builder& b, cudnnHandle_t handle, DType dtype, const ConvShape& s, const Conv2dParams& p) {
  OpGraph g;
  const cudnnDataType_t dt = data_type(dtype);
  g.x = nhwc_tensor(b, kUidX, dt, s.n, s.c, s.h, s.w);
  g.w = nhwc_tensor(b, kUidW, dt, s.o, s.c, s.kh, s.kw);
  g.y = nhwc_tensor(b, kUidY, dt, s.n, s.o, s.ho, s.wo);

  g.conv = b.create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "convolution");
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const int64_t pad[2] = {p.pad_h, p.pad_w}, stride[2] = {p.stride_h, p.stride_w}, dilation[2] = {p.dilation_h, p.dilation_w};
  b.set(g.conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "conv compute type");
  b.set(g.conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "conv mode");
  b.set(g.conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial, "conv spatial dims");
  b.set(g.conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "conv pre paddings");
  b.set(g.conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "conv post paddings");
  b.set(g.conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride, "conv strides");
  b.set(g.conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation, "conv dilations");
  b.finalize(g.conv, "conv finalize");

  g.op = b.create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, "conv forward op");
  const float alpha = 1.0f, beta = 0.0f;  // float scalars: the compute type is float
  b.set_descriptor(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, g.x, "op x");
  b.set_descriptor(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, g.w, "op w");
  b.set_descriptor(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, g.y, "op y");
  b.set_descriptor(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, g.conv, "op conv desc");
  b.set(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha, "op alpha");
  b.set(g.op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta, "op beta");
  b.finalize(g.op, "op finalize");

  g.graph = operation_graph(b, handle, {g.op.get()});
  return g;
}

bool execute_conv(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& plan, void* y, const void* x, const void* w,
                  void* workspace, std::string* why) {
  return execute(a, handle, plan, {kUidX, kUidW, kUidY}, {const_cast<void*>(x), const_cast<void*>(w), y}, workspace, why);
}

// Mean device time of one execution of `c`: a first run (timed, since a very slow engine should cost one run
// only), then kTimedRuns more unless the first was kSlowCandidateFactor times slower than `best_ms` (> 0).
// Synchronises: never called while the stream is being captured.
float time_plan(const CudnnGraphApi& a, cudnnHandle_t handle, cudaStream_t stream, const EventPair& ev, const Candidate& c,
                void* y, const void* x, const void* w, void* workspace, float best_ms) {
  std::string why;
  const auto run = [&] { return execute_conv(a, handle, c.plan, y, x, w, workspace, &why); };
  const float first = time_runs(ev, stream, 1, run);
  if (first < 0.0f || (best_ms > 0.0f && first > kSlowCandidateFactor * best_ms)) return first;
  return time_runs(ev, stream, kTimedRuns, run);
}

std::string shape_text(DType dtype, const ConvShape& s, const Conv2dParams& p) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s x[%lld,%lld,%lld,%lld] w[%lld,%lld,%lld] stride %d,%d pad %d,%d dil %d,%d",
                dtype == DType::BF16 ? "bf16" : "f16", (long long)s.n, (long long)s.c, (long long)s.h, (long long)s.w,
                (long long)s.o, (long long)s.kh, (long long)s.kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h,
                p.dilation_w);
  return buf;
}

}  // namespace conv_graph_detail

using namespace conv_graph_detail;

// --- public switches and counters ---------------------------------------------------------------------------------

ConvGraphStats conv_graph_stats() {
  const Counters& c = counters();
  return ConvGraphStats{c.plans.load(), c.declined.load(), c.autotuned.load(), c.runs.load()};
}

bool conv_graph_enabled() { return enabled_flag().load(); }
void set_conv_graph_enabled(bool on) { enabled_flag().store(on); }

bool conv_graph_autotune() {
  static const bool on = !env_is("ATELIER_CUDNN_AUTOTUNE", "0");
  return on;
}

// --- ConvGraph -----------------------------------------------------------------------------------------------------

struct ConvGraph::Plan {
  bool valid = false;
  OpGraph graph;       // the descriptors the plan was made from, kept as long as it
  Candidate chosen;
};

ConvGraph::ConvGraph(void* library, void* handle, cudaStream_t stream) : handle_(handle), stream_(stream) {
  api_ = handle ? cudnn_graph::load_api(library, &why_) : nullptr;
  if (!handle) why_ = "no cuDNN handle";
}

ConvGraph::~ConvGraph() { plans_.clear(); }

ConvGraph::Plan* ConvGraph::plan_for(const Key& key, void* y, const void* x, const void* w, DType dtype, const ConvShape& s,
                                     const Conv2dParams& p, DeviceAllocator& alloc) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second->valid ? it->second.get() : nullptr;
  // A new shape during a capture: no planning (it times and synchronises); the legacy path records this call
  // and the shape is planned at its next eager call.
  if (stream_capturing(stream_)) return nullptr;

  const CudnnGraphApi& a = *api_;
  const auto handle = static_cast<cudnnHandle_t>(handle_);
  auto owned = std::make_unique<Plan>();
  Plan* plan = owned.get();
  plans_.emplace(key, std::move(owned));
  const std::string what = log_enabled() ? shape_text(dtype, s, p) : std::string();
  const auto deadline = std::chrono::steady_clock::now() + kPlanningBudget;
  const auto over_budget = [&] { return std::chrono::steady_clock::now() > deadline; };
  bool budget_cut = false;
  auto decline = [&](const std::string& why) -> Plan* {
    counters().declined.fetch_add(1);
    if (log_enabled()) std::fprintf(stderr, "[cudnn graph] %s: legacy path (%s)\n", what.c_str(), why.c_str());
    return nullptr;
  };

  Builder b(a);
  plan->graph = build_graph(b, handle, dtype, s, p);
  if (!b.ok()) return decline(b.why());

  // Engine configurations from heuristics mode A, best first (at most kMaxTimedCandidates plans when they are
  // timed, the first that finalizes otherwise); FALLBACK's only when A gives none that finalizes.
  std::vector<Candidate> candidates;
  std::string why = "heuristics gave no engine configuration";
  int offered = 0, refused = 0;
  const size_t wanted = conv_graph_autotune() ? kMaxTimedCandidates : 1;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    if (!candidates.empty()) break;
    for (Descriptor& cfg : engine_configs(a, plan->graph.graph, mode, &why)) {
      if (candidates.size() >= wanted) break;
      ++offered;
      Candidate c;
      c.engine = engine_info(a, cfg);
      if (!c.engine.acceptable) {
        ++refused;
        continue;
      }
      c.cfg = std::move(cfg);
      if (!candidates.empty() && over_budget()) {
        budget_cut = true;
        break;
      }
      if (make_plan(a, handle, c, &why)) candidates.push_back(std::move(c));
    }
  }
  if (candidates.empty())
    return decline(std::to_string(offered) + " configurations, " + std::to_string(refused) + " refused for numerics; " + why);

  // Autotune: time every candidate on the real buffers (the output is overwritten by the real call after).
  size_t best = 0;
  float first_ms = -1.0f;  // the heuristics' first choice, for the log
  if (conv_graph_autotune() && candidates.size() > 1) {
    EventPair events;
    int64_t max_ws = 0;
    for (const Candidate& c : candidates) max_ws = std::max(max_ws, c.workspace);
    std::shared_ptr<Buffer> ws;
    try {
      if (max_ws > 0) ws = alloc.allocate(size_t(max_ws));
    } catch (const Error&) {
      ws = nullptr;
    }
    if (events.ok && (max_ws == 0 || ws)) {
      bool any = false;
      for (size_t i = 0; i < candidates.size(); ++i) {
        if (any && over_budget()) {
          budget_cut = true;
          break;
        }
        Candidate& c = candidates[i];
        c.ms = time_plan(a, handle, stream_, events, c, y, x, w, ws ? ws->data() : nullptr, any ? candidates[best].ms : -1.0f);
        if (i == 0) first_ms = c.ms;
        if (c.ms >= 0.0f && (!any || c.ms < candidates[best].ms)) {
          best = i;
          any = true;
        }
      }
      if (!any) return decline("every plan failed to execute");
      // The plans within kConfirmFactor of the best take turns (time_in_turns) and keep their best time: timed
      // once each in order, the first met lower clocks than the last.
      std::vector<size_t> close;
      for (size_t i = 0; i < candidates.size(); ++i)
        if (candidates[i].ms >= 0.0f && candidates[i].ms <= kConfirmFactor * candidates[best].ms) close.push_back(i);
      if (close.size() > 1 && !over_budget()) {
        std::string ignored;
        std::vector<std::function<bool()>> runs;
        for (size_t i : close)
          runs.push_back([&, cp = &candidates[i]] { return execute_conv(a, handle, cp->plan, y, x, w, ws ? ws->data() : nullptr, &ignored); });
        const std::vector<float> ms = time_in_turns(events, stream_, kConfirmRounds, kTimedRuns, runs);
        for (size_t j = 0; j < close.size(); ++j) {
          Candidate& c = candidates[close[j]];
          if (ms[j] >= 0.0f) c.ms = std::min(c.ms, ms[j]);
          if (c.ms < candidates[best].ms) best = close[j];
        }
      }
      counters().autotuned.fetch_add(1);
    }
  }
  std::string timings;  // "engine:ms" of every candidate, in the heuristics' order, for the log
  if (log_enabled())
    for (const Candidate& c : candidates) {
      char item[48];
      std::snprintf(item, sizeof item, " %lld:%.4f", (long long)c.engine.index, double(c.ms));
      timings += item;
    }
  plan->chosen = std::move(candidates[best]);
  plan->valid = true;
  counters().plans.fetch_add(1);
  if (log_enabled())
    std::fprintf(stderr,
                 "[cudnn graph] %s: %d configurations (%d refused for numerics), %zu plans; engine %lld%s, workspace %lld B, "
                 "%.4f ms (heuristics' first: %.4f ms)%s; engine:ms%s\n",
                 what.c_str(), offered, refused, candidates.size(), (long long)plan->chosen.engine.index,
                 plan->chosen.engine.runtime_compiled ? " (runtime-compiled)" : "", (long long)plan->chosen.workspace,
                 double(plan->chosen.ms), double(first_ms), budget_cut ? ", planning budget reached" : "", timings.c_str());
  return plan;
}

bool ConvGraph::forward(void* y, const void* x, const void* w, DType dtype, const ConvShape& s, const Conv2dParams& p,
                        DeviceAllocator& alloc) {
  if (!api_ || !conv_graph_enabled() || (dtype != DType::BF16 && dtype != DType::F16) || p.groups != 1) return false;
  for (const void* ptr : {static_cast<const void*>(y), x, w})
    if (reinterpret_cast<uintptr_t>(ptr) % uintptr_t(kAlignment) != 0) return false;
  const Key key{int64_t(dtype), s.n,          s.c,          s.h,        s.w,        s.o,          s.kh,         s.kw,
                s.ho,           s.wo,         p.stride_h,   p.stride_w, p.pad_h,    p.pad_w,      p.dilation_h, p.dilation_w};
  Plan* plan = plan_for(key, y, x, w, dtype, s, p, alloc);
  if (!plan) return false;
  std::shared_ptr<Buffer> ws = plan->chosen.workspace > 0 ? alloc.allocate(size_t(plan->chosen.workspace)) : nullptr;
  std::string why;
  if (!execute_conv(*api_, static_cast<cudnnHandle_t>(handle_), plan->chosen.plan, y, x, w, ws ? ws->data() : nullptr, &why)) {
    plan->valid = false;  // never again for this shape
    counters().declined.fetch_add(1);
    if (log_enabled()) std::fprintf(stderr, "[cudnn graph] %s: execution failed (%s), legacy path from now on\n",
                                    shape_text(dtype, s, p).c_str(), why.c_str());
    return false;
  }
  counters().runs.fetch_add(1);
  return true;
}

}  // namespace atelier::cuda
