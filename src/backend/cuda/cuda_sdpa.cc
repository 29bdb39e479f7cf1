// Attention through cuDNN's fused SDPA node: see cuda_sdpa.h.
#include "backend/cuda/cuda_sdpa.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "backend/cuda/cudnn_graph_api.h"

namespace atelier::cuda {

namespace sdpa_detail {

using namespace cudnn_graph;

constexpr int64_t kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidScale = 5;
constexpr size_t kMaxCandidates = 4;  // heuristics' first plans timed per shape
constexpr int kTimedRuns = 3;         // timed runs of each candidate (and of our kernel) per turn, after one warm-up
constexpr int kTimingRounds = 3;      // turns (time_in_turns): each candidate's best is kept
// cuDNN is taken only when it is at least this much faster than our kernel: below that the difference is
// noise, and our kernel has no planning or library-version risk.
constexpr float kMinGain = 0.97f;

struct Counters {
  std::atomic<int64_t> cudnn{0}, ours{0}, declined{0}, runs{0}, timed{0}, from_store{0}, deserialized{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

}  // namespace sdpa_detail

bool cudnn_sdpa_enabled() {
  static const bool on = !env_is("ATELIER_CUDNN_SDPA", "0");
  return on;
}

std::array<int64_t, 4> sdpa_strides(const Tensor& t) {
  std::array<int64_t, 4> s{};
  for (int i = 0; i < 4; ++i) s[i] = t.strides()[i];
  for (int i = 2; i >= 0; --i)
    if (t.size(i) == 1) s[i] = s[i + 1] * t.size(i + 1);
  return s;
}

std::string sdpa_shape_text(const Tensor& q, const Tensor& k) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s q[%lld,%lld,%lld,%lld] kv[%lld,%lld,%lld]", std::string(dtype_name(q.dtype())).c_str(), (long long)q.size(0),
                (long long)q.size(1), (long long)q.size(2), (long long)q.size(3), (long long)k.size(1), (long long)k.size(2),
                (long long)k.size(3));
  return buf;
}

namespace sdpa_detail {

// The operation graph of one SDPA node, f32 softmax and accumulation (the node's only mode for 16-bit data).
struct OpGraph {
  Descriptor q, k, v, o, scale, op, graph;
};

OpGraph build_graph(Builder& b, cudnnHandle_t handle, const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v) {
  OpGraph g;
  const cudnnDataType_t dt = q.dtype() == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  const auto desc = [&](int64_t uid, const Tensor& t) {
    const int64_t dims[4] = {t.size(0), t.size(1), t.size(2), t.size(3)};
    const std::array<int64_t, 4> st = sdpa_strides(t);
    return tensor(b, uid, dt, 4, dims, st.data());
  };
  g.q = desc(kUidQ, q);
  g.k = desc(kUidK, k);
  g.v = desc(kUidV, v);
  g.o = desc(kUidO, out);
  const int64_t one = 1;
  g.scale = tensor(b, kUidScale, CUDNN_DATA_FLOAT, 1, &one, &one, TensorKind::kByValue);

  g.op = b.create(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, "SDPA forward op (cuDNN >= 9.13.1)");
  b.set_descriptor(g.op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, g.q, "sdpa q");
  b.set_descriptor(g.op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, g.k, "sdpa k");
  b.set_descriptor(g.op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, g.v, "sdpa v");
  b.set_descriptor(g.op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, g.o, "sdpa o");
  b.set_descriptor(g.op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, g.scale, "sdpa scale");
  b.finalize(g.op, "sdpa finalize");
  g.graph = operation_graph(b, handle, {g.op.get()});
  return g;
}

// Enqueues one execution of `plan` on the call's buffers; the scale is a by-value scalar, read from the host
// when cudnnBackendExecute enqueues.
bool execute_sdpa(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& plan, Tensor& out, const Tensor& q,
                  const Tensor& k, const Tensor& v, float scale, void* workspace, std::string* why) {
  return execute(a, handle, plan, {kUidQ, kUidK, kUidV, kUidO, kUidScale}, {q.raw(), k.raw(), v.raw(), out.raw(), &scale},
                 workspace, why);
}

// The stored value of a shape whose faster path is our kernel (cuDNN's are its plan's PlanOrigin, >= 0).
constexpr int64_t kStoredOurs = -1;

std::string stored_key(const std::array<int64_t, 20>& key) { return choice_key("sdpa", key); }

}  // namespace sdpa_detail

using namespace sdpa_detail;

SdpaStats sdpa_stats() {
  const Counters& c = counters();
  return SdpaStats{c.cudnn.load(), c.ours.load(), c.declined.load(), c.runs.load(), c.timed.load(), c.from_store.load(),
                   c.deserialized.load()};
}

struct CudnnSdpa::Plan {
  bool use_cudnn = false;
  OpGraph graph;
  Candidate chosen;
};

CudnnSdpa::CudnnSdpa(void* library, void* handle, cudaStream_t stream, ChoiceStore* choices)
    : handle_(handle), stream_(stream), choices_(choices) {
  api_ = load_api_for(library, handle, cudnn_sdpa_enabled(), "off by ATELIER_CUDNN_SDPA=0", &why_);  // (why_ is constructed by now)
}

CudnnSdpa::~CudnnSdpa() { plans_.clear(); }

CudnnSdpa::Plan* CudnnSdpa::plan_for(const Key& key, Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                     DeviceAllocator& alloc, const std::function<bool()>& ours) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  if (stream_capturing(stream_)) return nullptr;

  const CudnnGraphApi& a = *api_;
  const auto handle = static_cast<cudnnHandle_t>(handle_);
  Plan* plan = plans_.emplace(key, std::make_unique<Plan>()).first->second.get();
  const std::string what = log_enabled() ? sdpa_shape_text(q, k) : std::string();
  const auto decline = [&](const std::string& why) {
    counters().declined.fetch_add(1);
    if (log_enabled()) std::fprintf(stderr, "[cudnn sdpa] %s: our kernel (cuDNN declined: %s)\n", what.c_str(), why.c_str());
    return plan;  // use_cudnn stays false: remembered
  };
  // An earlier process's choice: our kernel needs no cuDNN graph at all; cuDNN's plan is restored (take_kept).
  constexpr int64_t kNothingStored = -2;
  const int64_t stored = choices_ ? choices_->get(stored_key(key)).value_or(kNothingStored) : kNothingStored;
  if (stored == kStoredOurs && ours) {
    counters().ours.fetch_add(1);
    counters().from_store.fetch_add(1);
    if (log_enabled()) std::fprintf(stderr, "[cudnn sdpa] %s: our kernel (stored choice)\n", what.c_str());
    return plan;
  }
  bool graph_built = false;
  if (stored >= 0 && take_kept(*plan, key, stored, out, q, k, v, &graph_built)) return plan;

  if (!graph_built) {
    Builder b(a);
    plan->graph = build_graph(b, handle, out, q, k, v);
    if (!b.ok()) return decline(b.why());
  }
  std::string why;
  std::vector<Candidate> candidates = plan_candidates(a, handle, plan->graph.graph, kMaxCandidates, &why);
  if (candidates.empty()) return decline(why);

  // Time each candidate, and our kernel, on the real buffers (the caller's real call overwrites `out`).
  EventPair events;
  const int64_t max_ws = max_workspace(candidates);
  std::shared_ptr<Buffer> ws = max_ws > 0 ? alloc.allocate(size_t(max_ws)) : nullptr;
  // cuDNN's plans and our kernel (last) in turns, each its best turn.
  std::vector<std::function<bool()>> runs;
  for (const Candidate& c : candidates)
    runs.push_back([&, cp = &c] { return execute_sdpa(a, handle, cp->plan, out, q, k, v, scale, ws ? ws->data() : nullptr, &why); });
  if (ours) runs.push_back(ours);
  const std::vector<float> ms = time_in_turns(events, stream_, kTimingRounds, kTimedRuns, runs);
  counters().timed.fetch_add(1);
  const size_t best = fastest(candidates, ms);
  if (best == candidates.size()) return decline("every plan failed to execute (" + why + ")");
  const float ours_ms = ours ? ms.back() : -1.0f;
  plan->use_cudnn = ours_ms < 0.0f || candidates[best].ms < kMinGain * ours_ms;
  plan->chosen = std::move(candidates[best]);
  (plan->use_cudnn ? counters().cudnn : counters().ours).fetch_add(1);
  if (choices_) keep_choice(*plan, key);
  if (log_enabled())
    std::fprintf(stderr, "[cudnn sdpa] %s: %zu plans, engine %lld, workspace %lld B, %.4f ms; ours %.4f ms -> %s\n",
                 what.c_str(), candidates.size(), (long long)plan->chosen.engine.index, (long long)plan->chosen.workspace,
                 double(plan->chosen.ms), double(ours_ms), plan->use_cudnn ? "cuDNN" : "ours");
  return plan;
}

// An earlier process's cuDNN plan for the shape, untimed (cudnn_graph::kept_plan); false when there is none to take
// (another cuDNN release, or an answer that names no configuration the heuristics offer): the caller then times the
// shape afresh.
bool CudnnSdpa::take_kept(Plan& plan, const Key& key, int64_t stored, const Tensor& out, const Tensor& q, const Tensor& k,
                          const Tensor& v, bool* graph_built) {
  const auto handle = static_cast<cudnnHandle_t>(handle_);
  const auto start = std::chrono::steady_clock::now();
  Builder b(*api_);
  const auto graph = [&]() -> const Descriptor* {
    plan.graph = build_graph(b, handle, out, q, k, v);
    *graph_built = b.ok();
    return b.ok() ? &plan.graph.graph : nullptr;
  };
  bool restored = false;
  std::string why;
  std::optional<Candidate> c = kept_plan(*api_, handle, *choices_, stored_key(key), stored, graph, &restored, &why);
  if (!c) return false;
  plan.use_cudnn = true;
  plan.chosen = std::move(*c);
  counters().cudnn.fetch_add(1);
  counters().from_store.fetch_add(1);
  if (restored) counters().deserialized.fetch_add(1);
  if (log_enabled())
    std::fprintf(stderr, "[cudnn sdpa] %s: engine %lld (stored choice: %s, %.1f ms)\n", sdpa_shape_text(q, k).c_str(),
                 (long long)plan.chosen.engine.index, restored ? "serialized plan" : "configuration finalized",
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return true;
}

// Keeps the shape's choice for later processes, and cuDNN's plan in its serialized form where cuDNN gives one.
void CudnnSdpa::keep_choice(const Plan& plan, const Key& key) {
  if (!plan.use_cudnn) {
    choices_->put(stored_key(key), kStoredOurs);
    return;
  }
  std::string why;
  if (!keep_plan(*api_, *choices_, stored_key(key), plan.chosen, &why) && log_enabled())
    std::fprintf(stderr, "[cudnn sdpa] engine %lld: plan not kept serialized (%s)\n", (long long)plan.chosen.engine.index,
                 why.c_str());
}

bool CudnnSdpa::forward(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale, DeviceAllocator& alloc,
                        const std::function<bool()>& ours) {
  if (!api_) return false;
  const DType dt = q.dtype();
  if ((dt != DType::BF16 && dt != DType::F16) || k.dtype() != dt || v.dtype() != dt || out.dtype() != dt) return false;
  if (v.size(3) != q.size(3) || k.size(3) != q.size(3) || q.size(1) % k.size(1) != 0) return false;
  for (const Tensor* t : {static_cast<const Tensor*>(&out), &q, &k, &v})
    if (t->strides()[3] != 1 || reinterpret_cast<uintptr_t>(t->raw()) % uintptr_t(kAlignment) != 0) return false;
  const std::array<int64_t, 4> qs = sdpa_strides(q), ks = sdpa_strides(k), vs = sdpa_strides(v), os = sdpa_strides(out);
  const Key key{int64_t(dt), q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), qs[0], qs[1], qs[2],
                ks[0],       ks[1],     ks[2],     vs[0],     vs[1],     vs[2],     os[0],     os[1],     os[2], ours ? 1 : 0};
  std::lock_guard<std::mutex> lock(mu_);
  Plan* plan = plan_for(key, out, q, k, v, scale, alloc, ours);
  if (!plan || !plan->use_cudnn) return false;
  std::shared_ptr<Buffer> ws = plan->chosen.workspace > 0 ? alloc.allocate(size_t(plan->chosen.workspace)) : nullptr;
  std::string why;
  if (!execute_sdpa(*api_, static_cast<cudnnHandle_t>(handle_), plan->chosen.plan, out, q, k, v, scale, ws ? ws->data() : nullptr,
                    &why)) {
    plan->use_cudnn = false;  // never again for this shape
    counters().declined.fetch_add(1);
    if (log_enabled()) std::fprintf(stderr, "[cudnn sdpa] %s: execution failed (%s), our kernel from now on\n",
                                    sdpa_shape_text(q, k).c_str(), why.c_str());
    return false;
  }
  counters().runs.fetch_add(1);
  return true;
}

}  // namespace atelier::cuda
