// Convolution through cuDNN's graph (backend) API: see cuda_conv_graph.h. Every cuDNN status is checked; a
// failure anywhere declines the case (false) so that the legacy path runs it.
#include "backend/cuda/cuda_conv_graph.h"

#include "backend/cuda/cudnn_graph_api.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
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
// A fused epilogue's candidates: each finalized and timed plan costs host time at a shape's first call. SD 1.5's
// first UNet call on the H200 (session 22) plans ~30 fused shapes; with 4 candidates it took 0.6 s longer than
// without fusion (8 candidates: 3.2 s, cold library caches included), and the best plan was the heuristics'
// first or second at every shape but the 4-channel conv_in.
constexpr size_t kMaxFusedCandidates = 4;
// A candidate whose first timed run is this many times slower than the best so far is not run again.
constexpr float kSlowCandidateFactor = 3.0f;
constexpr float kConfirmFactor = 1.15f;  // plans this close to the fastest are timed again, in turns
constexpr int kConfirmRounds = 2;
// Tensor uids in the graph and the variant pack; the epilogue's intermediates count up from kUidVirtual.
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3, kUidBias = 4, kUidAddend = 5, kUidVirtual = 100;

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{!env_is("ATELIER_CUDNN_GRAPH", "0")};
  return on;
}

std::atomic<ConvFusedEpilogue>& fused_epilogue_mode() {
  static std::atomic<ConvFusedEpilogue> mode{env_is("ATELIER_CONV_FUSED_EPILOGUE", "0")       ? ConvFusedEpilogue::kOff
                                             : env_is("ATELIER_CONV_FUSED_EPILOGUE", "force") ? ConvFusedEpilogue::kForce
                                                                                               : ConvFusedEpilogue::kAuto};
  return mode;
}

struct Counters {
  std::atomic<int64_t> plans{0}, declined{0}, autotuned{0}, runs{0}, fused_plans{0}, fused_declined{0}, fused_runs{0}, from_store{0},
      deserialized{0};
};
Counters& counters() {
  static Counters c;
  return c;
}


cudnnDataType_t data_type(DType t) { return t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

// The dims of a channels-last buffer [n, h, w, c] in the NCHW order the graph API wants, and its strides.
std::array<int64_t, 4> nhwc_strides(int64_t c, int64_t h, int64_t w) { return {h * w * c, 1, w * c, c}; }

// The pointers of one execution: the epilogue's two are null when the plan has no epilogue.
struct Operands {
  void* y;
  const void* x;
  const void* w;
  const void* bias = nullptr;
  const void* addend = nullptr;
};

bool has_epilogue(const ConvEpilogue* e) { return e && (e->bias || e->addend); }

// The pointers of a convolution into y with the epilogue's operands (none when it has none).
Operands operands(void* y, const void* x, const void* w, const ConvEpilogue* e) {
  return has_epilogue(e) ? Operands{y, x, w, e->bias, e->addend} : Operands{y, x, w};
}

// The graph of one convolution: x [n, h, w, c] * w [o, kh, kw, c] -> y [n, ho, wo, o], f32 compute. With an
// epilogue the convolution writes a virtual f32 tensor, and pointwise additions of the bias ([1, O, 1, 1]) and
// the addend (y's layout) make y: rounded to y's dtype once, at the store.
struct OpGraph {
  std::vector<std::unique_ptr<Descriptor>> nodes;  // tensors and operations the graph refers to
  Descriptor graph;
};

OpGraph build_graph(Builder& b, cudnnHandle_t handle, DType dtype, const ConvShape& s, const Conv2dParams& p,
                    const ConvEpilogue* epilogue) {
  GraphBuilder g(b, kUidVirtual);
  const cudnnDataType_t dt = data_type(dtype), f32 = CUDNN_DATA_FLOAT;
  const auto xs = nhwc_strides(s.c, s.h, s.w), ws = nhwc_strides(s.c, s.kh, s.kw), ys = nhwc_strides(s.o, s.ho, s.wo);
  const std::array<int64_t, 4> y_dims{s.n, s.o, s.ho, s.wo};
  const Descriptor& x = g.tensor4(kUidX, dt, {s.n, s.c, s.h, s.w}, xs.data(), TensorKind::kMemory);
  const Descriptor& w = g.tensor4(kUidW, dt, {s.o, s.c, s.kh, s.kw}, ws.data(), TensorKind::kMemory);
  const Descriptor& y = g.tensor4(kUidY, dt, y_dims, ys.data(), TensorKind::kMemory);
  const bool fused = has_epilogue(epilogue);
  const Descriptor& conv_y = fused ? g.virtual4(f32, y_dims, ys.data()) : y;

  Descriptor& conv = g.keep(b.create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "convolution"));
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial = 2;
  const int64_t pad[2] = {p.pad_h, p.pad_w}, stride[2] = {p.stride_h, p.stride_w}, dilation[2] = {p.dilation_h, p.dilation_w};
  b.set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "conv compute type");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "conv mode");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial, "conv spatial dims");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "conv pre paddings");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "conv post paddings");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride, "conv strides");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation, "conv dilations");
  b.finalize(conv, "conv finalize");

  Descriptor op = b.create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, "conv forward op");
  const float alpha = 1.0f, beta = 0.0f;  // float scalars: the compute type is float
  b.set_descriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x, "op x");
  b.set_descriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w, "op w");
  b.set_descriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, conv_y, "op y");
  b.set_descriptor(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv, "op conv desc");
  b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha, "op alpha");
  b.set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta, "op beta");
  b.finalize(op, "op finalize");
  g.add_op(std::move(op));

  if (fused) {
    const Descriptor* acc = &conv_y;
    if (epilogue->bias) {
      const cudnnDataType_t bias_dt = epilogue->bias_dtype == DType::F32 ? f32 : data_type(epilogue->bias_dtype);
      const int64_t bias_strides[4] = {s.o, 1, s.o, s.o};
      const Descriptor& bias = g.tensor4(kUidBias, bias_dt, {1, s.o, 1, 1}, bias_strides, TensorKind::kMemory);
      const Descriptor& sum = epilogue->addend ? g.virtual4(f32, y_dims, ys.data()) : y;
      g.pointwise(CUDNN_POINTWISE_ADD, *acc, &bias, sum);
      acc = &sum;
    }
    if (epilogue->addend) {
      const Descriptor& addend = g.tensor4(kUidAddend, dt, y_dims, ys.data(), TensorKind::kMemory);
      g.pointwise(CUDNN_POINTWISE_ADD, *acc, &addend, y);
    }
  }
  OpGraph out;
  out.graph = operation_graph(b, handle, g.ops());
  out.nodes = g.release();
  return out;
}

bool execute_conv(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& plan, const Operands& o, void* workspace,
                  std::string* why) {
  std::vector<int64_t> uids{kUidX, kUidW, kUidY};
  std::vector<void*> pointers{const_cast<void*>(o.x), const_cast<void*>(o.w), o.y};
  if (o.bias) uids.push_back(kUidBias), pointers.push_back(const_cast<void*>(o.bias));
  if (o.addend) uids.push_back(kUidAddend), pointers.push_back(const_cast<void*>(o.addend));
  return execute(a, handle, plan, uids, pointers, workspace, why);
}

// Mean device time of one execution of `c`: a first run (timed, since a very slow engine should cost one run
// only), then kTimedRuns more unless the first was kSlowCandidateFactor times slower than `best_ms` (> 0).
// Synchronises: never called while the stream is being captured.
float time_plan(const CudnnGraphApi& a, cudnnHandle_t handle, cudaStream_t stream, const EventPair& ev, const Candidate& c,
                const Operands& ops, void* workspace, float best_ms) {
  std::string why;
  const auto run = [&] { return execute_conv(a, handle, c.plan, ops, workspace, &why); };
  const float first = time_runs(ev, stream, 1, run);
  if (first < 0.0f || (best_ms > 0.0f && first > kSlowCandidateFactor * best_ms)) return first;
  return time_runs(ev, stream, kTimedRuns, run);
}

// The host-time budget of one shape's planning (kPlanningBudget), and whether it cut the candidates short.
struct PlanningBudget {
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::now() + kPlanningBudget;
  bool cut = false;
  bool over() const { return std::chrono::steady_clock::now() > deadline; }
};

// A stored answer for a fused shape: its epilogue runs as the separate pass (slower fused, or a different result).
// (A plan's stored answer is its PlanOrigin's stored_value, never negative.)
constexpr int64_t kStoredNotFused = -1;
constexpr int64_t kNothingStored = -2;

// The finalized plans a shape's graph offers, where each came from, and what was offered and refused on the way
// (for the log).
struct CandidateSearch {
  std::vector<Candidate> list;
  int offered = 0, refused = 0;
  std::string why = "heuristics gave no engine configuration";
};

// Engine configurations from heuristics mode A, best first (at most kMaxTimedCandidates plans when they are
// timed, the first that finalizes otherwise); FALLBACK's only when A gives none that finalizes.
CandidateSearch find_candidates(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& graph, bool fused,
                                PlanningBudget& budget) {
  CandidateSearch found;
  const size_t wanted = conv_graph_autotune() ? (fused ? kMaxFusedCandidates : kMaxTimedCandidates) : 1;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    if (!found.list.empty()) break;
    int position = -1;
    for (Descriptor& cfg : engine_configs(a, graph, mode, &found.why)) {
      ++position;
      if (found.list.size() >= wanted) break;
      ++found.offered;
      Candidate c;
      c.engine = engine_info(a, cfg);
      if (!c.engine.acceptable) {
        ++found.refused;
        continue;
      }
      // A fused graph's runtime-compiled engines are not taken: each compiles at finalize (about a second),
      // which for SD 1.5's residual convolutions added 8.7 s to the first UNet call to save ~50 us per step
      // (H200, session 22). Precompiled engines take the bias.
      if (fused && c.engine.runtime_compiled) {
        ++found.refused;
        continue;
      }
      c.cfg = std::move(cfg);
      if (!found.list.empty() && budget.over()) {
        budget.cut = true;
        break;
      }
      c.origin = PlanOrigin{c.engine.index, mode == CUDNN_HEUR_MODE_FALLBACK, position};
      if (make_plan(a, handle, c, &found.why)) found.list.push_back(std::move(c));
    }
  }
  return found;
}

// Times every candidate on the real buffers (the output is overwritten by the real call after) and returns the
// fastest one's index, or -1 when every plan failed to execute. Candidates left untimed (no workspace, no events,
// autotuning off or a single candidate) leave the heuristics' first choice, index 0. `first_ms`: the heuristics'
// first choice's time, for the log. Synchronises: never called while the stream is being captured.
int fastest_candidate(const CudnnGraphApi& a, cudnnHandle_t handle, cudaStream_t stream, std::vector<Candidate>& candidates,
                      const Operands& ops, DeviceAllocator& alloc, PlanningBudget& budget, float* first_ms) {
  if (!conv_graph_autotune() || candidates.size() < 2) return 0;
  EventPair events;
  int64_t max_ws = 0;
  for (const Candidate& c : candidates) max_ws = std::max(max_ws, c.workspace);
  std::shared_ptr<Buffer> ws;
  try {
    if (max_ws > 0) ws = alloc.allocate(size_t(max_ws));
  } catch (const Error&) {
    ws = nullptr;
  }
  if (!events.ok || (max_ws > 0 && !ws)) return 0;
  void* const workspace = ws ? ws->data() : nullptr;
  size_t best = 0;
  bool any = false;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (any && budget.over()) {
      budget.cut = true;
      break;
    }
    Candidate& c = candidates[i];
    c.ms = time_plan(a, handle, stream, events, c, ops, workspace, any ? candidates[best].ms : -1.0f);
    if (i == 0) *first_ms = c.ms;
    if (c.ms >= 0.0f && (!any || c.ms < candidates[best].ms)) {
      best = i;
      any = true;
    }
  }
  if (!any) return -1;
  // The plans within kConfirmFactor of the best take turns (time_in_turns) and keep their best time: timed
  // once each in order, the first met lower clocks than the last.
  std::vector<size_t> close;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].ms >= 0.0f && candidates[i].ms <= kConfirmFactor * candidates[best].ms) close.push_back(i);
  if (close.size() > 1 && !budget.over()) {
    std::string ignored;
    std::vector<std::function<bool()>> runs;
    for (size_t i : close)
      runs.push_back([&, cp = &candidates[i]] { return execute_conv(a, handle, cp->plan, ops, workspace, &ignored); });
    const std::vector<float> ms = time_in_turns(events, stream, kConfirmRounds, kTimedRuns, runs);
    for (size_t j = 0; j < close.size(); ++j) {
      Candidate& c = candidates[close[j]];
      if (ms[j] >= 0.0f) c.ms = std::min(c.ms, ms[j]);
      if (c.ms < candidates[best].ms) best = close[j];
    }
  }
  counters().autotuned.fetch_add(1);
  return int(best);
}

// " engine:ms" of every candidate, in the heuristics' order, for the log.
std::string candidate_timings(const std::vector<Candidate>& candidates) {
  std::string timings;
  for (const Candidate& c : candidates) {
    char item[48];
    std::snprintf(item, sizeof item, " %lld:%.4f", (long long)c.engine.index, double(c.ms));
    timings += item;
  }
  return timings;
}

std::string shape_text(DType dtype, const ConvShape& s, const Conv2dParams& p, const ConvEpilogue* e) {
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s x[%lld,%lld,%lld,%lld] w[%lld,%lld,%lld] stride %d,%d pad %d,%d dil %d,%d%s%s",
                dtype == DType::BF16 ? "bf16" : "f16", (long long)s.n, (long long)s.c, (long long)s.h, (long long)s.w,
                (long long)s.o, (long long)s.kh, (long long)s.kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h,
                p.dilation_w, has_epilogue(e) && e->bias ? " +bias" : "", has_epilogue(e) && e->addend ? " +addend" : "");
  return buf;
}

// A shape's key: the convolution, then what its fused epilogue reads (zeros without one).
std::array<int64_t, 18> key_for(DType dtype, const ConvShape& s, const Conv2dParams& p, const ConvEpilogue* e) {
  std::array<int64_t, 18> k{int64_t(dtype), s.n,          s.c,          s.h,        s.w,     s.o,          s.kh,         s.kw,
                            s.ho,           s.wo,         p.stride_h,   p.stride_w, p.pad_h, p.pad_w,      p.dilation_h, p.dilation_w};
  if (has_epilogue(e)) {
    k[16] = e->bias ? 1 + int64_t(e->bias_dtype) : 0;
    k[17] = e->addend ? 1 : 0;
  }
  return k;
}

}  // namespace conv_graph_detail

using namespace conv_graph_detail;

// --- public switches and counters ---------------------------------------------------------------------------------

ConvGraphStats conv_graph_stats() {
  const Counters& c = counters();
  return ConvGraphStats{c.plans.load(),       c.declined.load(),       c.autotuned.load(), c.runs.load(),
                        c.fused_plans.load(), c.fused_declined.load(), c.fused_runs.load(), c.from_store.load(),
                        c.deserialized.load()};
}

ConvFusedEpilogue conv_fused_epilogue() { return fused_epilogue_mode().load(); }
void set_conv_fused_epilogue(ConvFusedEpilogue mode) { fused_epilogue_mode().store(mode); }

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

struct ConvGraph::WarmPlan {
  Candidate plan;
};

bool ConvGraph::warm_up(void* handle) {
  if (!api_ || !choices_ || !handle) return false;
  for (const auto& [key, answer] : choices_->with_prefix(choice_key("cudnn conv"))) {
    if (answer < 0) continue;  // a refused fusion: no plan
    const std::optional<std::string> text = choices_->get_text(cudnn_graph::plan_text_key(key, answer));
    if (!text) continue;
    auto warm = std::make_unique<WarmPlan>();
    std::string why;
    if (!cudnn_graph::deserialize_plan(*api_, static_cast<cudnnHandle_t>(handle), *text, warm->plan, &why)) return false;
    warm_plan_ = std::move(warm);
    return true;
  }
  return false;
}

ConvGraph::Plan* ConvGraph::plan_for(void* y, const void* x, const void* w, DType dtype, const ConvShape& s,
                                     const Conv2dParams& p, DeviceAllocator& alloc, const ConvEpilogue* epilogue) {
  const Key key = key_for(dtype, s, p, epilogue);
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
  const bool fused = has_epilogue(epilogue);
  const Operands ops = operands(y, x, w, epilogue);
  const std::string what = log_enabled() ? shape_text(dtype, s, p, epilogue) : std::string();
  PlanningBudget budget;
  const auto started = std::chrono::steady_clock::now();
  auto decline = [&](const std::string& why) -> Plan* {
    (fused ? counters().fused_declined : counters().declined).fetch_add(1);
    if (log_enabled())
      std::fprintf(stderr, "[cudnn graph] %s: %s (%s)\n", what.c_str(), fused ? "separate epilogue" : "legacy path", why.c_str());
    return nullptr;
  };
  // An earlier process's answer, where answers are timed ones (autotuning on; a fused epilogue kept by measure).
  const bool storable = choices_ && conv_graph_autotune() && (!fused || conv_fused_epilogue() == ConvFusedEpilogue::kAuto);
  const std::string stored_key = storable ? choice_key("cudnn conv", key) : std::string();
  const int64_t stored = storable ? choices_->get(stored_key).value_or(kNothingStored) : kNothingStored;
  if (fused && stored == kStoredNotFused) {
    counters().from_store.fetch_add(1);
    return decline("stored choice");
  }

  // The graph is built when needed: a plan kept serialized runs without it.
  Builder b(a);
  bool built = false;
  const auto graph = [&]() -> const Descriptor* {
    if (!built) plan->graph = build_graph(b, handle, dtype, s, p, epilogue), built = true;
    return b.ok() ? &plan->graph.graph : nullptr;
  };
  CandidateSearch found;
  bool restored = false;
  if (stored >= 0) {
    ++found.offered;
    if (std::optional<Candidate> c = kept_plan(a, handle, *choices_, stored_key, stored, graph, &restored, &found.why))
      found.list.push_back(std::move(*c));
  }
  const bool from_store = !found.list.empty();
  if (from_store) {
    counters().from_store.fetch_add(1);
    if (restored) counters().deserialized.fetch_add(1);
  } else {
    if (!graph()) return decline(b.why());
    found = find_candidates(a, handle, *graph(), fused, budget);
  }
  std::vector<Candidate>& candidates = found.list;
  if (candidates.empty())
    return decline(std::to_string(found.offered) + " configurations, " + std::to_string(found.refused) +
                   (fused ? " refused for numerics or runtime compilation; " : " refused for numerics; ") + found.why);
  float first_ms = -1.0f;  // the heuristics' first choice, for the log
  const int best = from_store ? 0 : fastest_candidate(a, handle, stream_, candidates, ops, alloc, budget, &first_ms);
  if (best < 0) return decline("every plan failed to execute");
  const std::string timings = log_enabled() ? candidate_timings(candidates) : std::string();
  plan->chosen = std::move(candidates[size_t(best)]);
  if (fused) {
    std::string why_not;
    const FusedVerdict verdict = keep_fused(*plan, y, x, w, dtype, s, p, alloc, *epilogue, !from_store, &why_not);
    if (verdict != FusedVerdict::kKeep) {
      if (storable && (verdict == FusedVerdict::kSlower || verdict == FusedVerdict::kDiffers))
        choices_->put(stored_key, kStoredNotFused);
      return decline(why_not);  // remembered: plan->valid stays false
    }
  }
  plan->valid = true;
  (fused ? counters().fused_plans : counters().plans).fetch_add(1);
  if (storable && !from_store) {
    std::string why;
    if (!keep_plan(a, *choices_, stored_key, plan->chosen, &why) && log_enabled())
      std::fprintf(stderr, "[cudnn graph] %s: plan not kept serialized (%s)\n", what.c_str(), why.c_str());
  }
  if (log_enabled())
    std::fprintf(stderr,
                 "[cudnn graph] %s: %d configurations (%d refused for numerics), %zu plans; engine %lld%s, workspace %lld B, "
                 "%.4f ms (heuristics' first: %.4f ms)%s%s, planned in %.1f ms; engine:ms%s\n",
                 what.c_str(), found.offered, found.refused, candidates.size(), (long long)plan->chosen.engine.index,
                 plan->chosen.engine.runtime_compiled ? " (runtime-compiled)" : "", (long long)plan->chosen.workspace,
                 double(plan->chosen.ms), double(first_ms), budget.cut ? ", planning budget reached" : "",
                 from_store ? (restored ? ", stored choice (serialized plan)" : ", stored choice") : "",
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count(), timings.c_str());
  return plan;
}

ConvGraph::FusedVerdict ConvGraph::keep_fused(Plan& fused, void* y, const void* x, const void* w, DType dtype, const ConvShape& s,
                                              const Conv2dParams& p, DeviceAllocator& alloc, const ConvEpilogue& epilogue,
                                              bool timed, std::string* why) {
  Plan* plain = plan_for(y, x, w, dtype, s, p, alloc, nullptr);
  if (!plain || !epilogue.separate || !epilogue.agrees) {
    *why = plain ? "no separate pass to compare it with" : "no plain graph-API plan to compare it with";
    return FusedVerdict::kNotCompared;
  }
  const CudnnGraphApi& a = *api_;
  const auto handle = static_cast<cudnnHandle_t>(handle_);
  const size_t y_bytes = size_t(s.n * s.ho * s.wo * s.o) * dtype_size(dtype);
  std::shared_ptr<Buffer> ws, scratch;
  const int64_t need = std::max(fused.chosen.workspace, plain->chosen.workspace);
  try {
    if (need > 0) ws = alloc.allocate(size_t(need));
    scratch = alloc.allocate(y_bytes);
  } catch (const Error&) {
    *why = "no memory to compare it with the separate pass";
    return FusedVerdict::kNotCompared;
  }
  void* wsp = ws ? ws->data() : nullptr;
  std::string ignored;
  const auto fused_into = [&](void* out) {
    return execute_conv(a, handle, fused.chosen.plan, operands(out, x, w, &epilogue), wsp, &ignored);
  };
  const auto separate = [&] {
    if (!execute_conv(a, handle, plain->chosen.plan, operands(y, x, w, nullptr), wsp, &ignored)) return false;
    epilogue.separate();
    return true;
  };
  if (timed && conv_fused_epilogue() == ConvFusedEpilogue::kAuto) {
    EventPair events;
    const std::vector<float> ms = events.ok ? time_in_turns(events, stream_, kConfirmRounds, kTimedRuns,
                                                            {[&] { return fused_into(y); }, separate})
                                            : std::vector<float>{-1.0f, -1.0f};
    if (log_enabled())
      std::fprintf(stderr, "[cudnn graph] %s: fused %.4f ms against %.4f ms plain + separate epilogue\n",
                   shape_text(dtype, s, p, &epilogue).c_str(), double(ms[0]), double(ms[1]));
    if (ms[0] < 0.0f || (ms[1] >= 0.0f && ms[0] >= ms[1])) {
      *why = "slower than the plain plan and the separate pass";
      return FusedVerdict::kSlower;
    }
  }
  // The fused plan's result must be the separate pass's (to rounding): cuDNN's fused engines returned wrong sums
  // for a per-sample addend (ConvEpilogue), and a plan that does so for another operand would otherwise only show
  // in images.
  if (!fused_into(scratch->data()) || !separate() || !epilogue.agrees(scratch->data())) {
    *why = "its result differs from the plain plan and the separate pass";
    return FusedVerdict::kDiffers;
  }
  return FusedVerdict::kKeep;
}

bool ConvGraph::forward(void* y, const void* x, const void* w, DType dtype, const ConvShape& s, const Conv2dParams& p,
                        DeviceAllocator& alloc, const ConvEpilogue* epilogue) {
  if (!api_ || !conv_graph_enabled() || (dtype != DType::BF16 && dtype != DType::F16) || p.groups != 1) return false;
  const bool fused = has_epilogue(epilogue);
  if (fused && conv_fused_epilogue() == ConvFusedEpilogue::kOff) return false;
  const Operands ops = operands(y, x, w, epilogue);
  for (const void* ptr : {static_cast<const void*>(y), x, w, ops.bias, ops.addend})
    if (reinterpret_cast<uintptr_t>(ptr) % uintptr_t(kAlignment) != 0) return false;
  Plan* plan = plan_for(y, x, w, dtype, s, p, alloc, epilogue);
  if (!plan) return false;
  std::shared_ptr<Buffer> ws = plan->chosen.workspace > 0 ? alloc.allocate(size_t(plan->chosen.workspace)) : nullptr;
  std::string why;
  if (!execute_conv(*api_, static_cast<cudnnHandle_t>(handle_), plan->chosen.plan, ops, ws ? ws->data() : nullptr, &why)) {
    plan->valid = false;  // never again for this shape
    (fused ? counters().fused_declined : counters().declined).fetch_add(1);
    if (log_enabled()) std::fprintf(stderr, "[cudnn graph] %s: execution failed (%s), %s from now on\n",
                                    shape_text(dtype, s, p, epilogue).c_str(), why.c_str(),
                                    fused ? "separate epilogue" : "legacy path");
    return false;
  }
  counters().runs.fetch_add(1);
  if (fused) counters().fused_runs.fetch_add(1);
  return true;
}

}  // namespace atelier::cuda
