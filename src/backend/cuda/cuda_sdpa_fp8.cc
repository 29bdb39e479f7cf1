// FP8 attention as a cuDNN operation graph of primitive nodes: see cuda_sdpa_fp8.h.
#include "backend/cuda/cuda_sdpa_fp8.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_sdpa.h"
#include "backend/cuda/cudnn_graph_api.h"

namespace atelier::cuda {

namespace sdpa_fp8_detail {

using namespace cudnn_graph;
using S = Fp8AttentionScalars;

// Tensors in device memory (the variant pack) and the by-value attention scale.
enum Uid : int64_t {
  kUidQ = 1, kUidK, kUidV, kUidO, kUidScale, kUidDescaleQ, kUidDescaleK, kUidDescaleV, kUidDescaleS, kUidScaleS,
  kUidScaleO, kUidAmaxS, kUidAmaxO, kUidStats,
  kUidVirtual = 100  // intermediates count up from here
};
constexpr size_t kMaxCandidates = 4;  // heuristics' first plans timed per shape
constexpr int kTimedRuns = 3;
constexpr int kTimingRounds = 2;

struct Counters {
  std::atomic<int64_t> planned{0}, declined{0}, runs{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

// How the softmax's log-sum-exp statistics appear in the graph. cuDNN's frontend emits them as a virtual
// tensor for inference (the first form); the training form (statistics written to memory, as Transformer
// Engine builds it) is the pattern most used, and the form without them the simplest. They are tried in this
// order until cuDNN's heuristics offer an engine: written without a GPU at hand, the graph must not depend on
// one guess of what the fusion engine recognises.
enum class StatsForm { kVirtual, kNone, kInMemory };
constexpr StatsForm kStatsForms[] = {StatsForm::kVirtual, StatsForm::kNone, StatsForm::kInMemory};
const char* stats_form_name(StatsForm f) {
  return f == StatsForm::kVirtual ? "virtual statistics" : f == StatsForm::kNone ? "no statistics" : "statistics in memory";
}

struct OpGraph {
  std::vector<std::unique_ptr<Descriptor>> nodes;  // tensors and operations the graph refers to
  Descriptor graph;
  StatsForm stats = StatsForm::kVirtual;
};

// The graph of cuda_sdpa_fp8.h's formula for q8 [B, H, Sq, D], k8/v8 [B, H, Sk, D], o8 [B, H, Sq, D]; the
// statistics (when in memory) [B, H, Sq, 1] f32 contiguous.
OpGraph build_graph(Builder& b, cudnnHandle_t handle, const Tensor& o8, const Tensor& q8, const Tensor& k8, const Tensor& v8,
                    StatsForm stats_form) {
  GraphBuilder g(b, kUidVirtual);
  const int64_t bs = q8.size(0), h = q8.size(1), sq = q8.size(2), d = q8.size(3), sk = k8.size(2);
  constexpr cudnnDataType_t kF8 = CUDNN_DATA_FP8_E4M3, kF32 = CUDNN_DATA_FLOAT;
  const std::array<int64_t, 4> qs = sdpa_strides(q8), ks = sdpa_strides(k8), vs = sdpa_strides(v8), os = sdpa_strides(o8);
  const Descriptor& q = g.tensor4(kUidQ, kF8, {bs, h, sq, d}, qs.data(), TensorKind::kMemory);
  const int64_t kt_strides[4] = {ks[0], ks[1], ks[3], ks[2]};  // K^T: [B, H, D, Sk], the same memory
  const Descriptor& kt = g.tensor4(kUidK, kF8, {bs, h, d, sk}, kt_strides, TensorKind::kMemory);
  const Descriptor& v = g.tensor4(kUidV, kF8, {bs, h, sk, d}, vs.data(), TensorKind::kMemory);
  const Descriptor& o = g.tensor4(kUidO, kF8, {bs, h, sq, d}, os.data(), TensorKind::kMemory);
  const Descriptor& attn_scale = g.scalar(kUidScale, TensorKind::kByValue);
  const Descriptor &descale_q = g.scalar(kUidDescaleQ), &descale_k = g.scalar(kUidDescaleK);
  const Descriptor &descale_v = g.scalar(kUidDescaleV), &descale_s = g.scalar(kUidDescaleS);
  const Descriptor &scale_s = g.scalar(kUidScaleS), &scale_o = g.scalar(kUidScaleO);
  const Descriptor &amax_s = g.scalar(kUidAmaxS), &amax_o = g.scalar(kUidAmaxO);

  const std::array<int64_t, 4> scores{bs, h, sq, sk}, rows{bs, h, sq, 1}, outs{bs, h, sq, d};
  // S = Q K^T * scale * descale_q * descale_k
  const Descriptor& s0 = g.virtual4(kF32, scores);
  g.matmul(q, kt, s0);
  const Descriptor& s1 = g.virtual4(kF32, scores);
  g.pointwise(CUDNN_POINTWISE_MUL, s0, &attn_scale, s1);
  const Descriptor& s2 = g.virtual4(kF32, scores);
  g.pointwise(CUDNN_POINTWISE_MUL, s1, &descale_q, s2);
  const Descriptor& s3 = g.virtual4(kF32, scores);
  g.pointwise(CUDNN_POINTWISE_MUL, s2, &descale_k, s3);
  // softmax, with the log-sum-exp statistics node the fused pattern carries (virtual: inference)
  const Descriptor& max = g.virtual4(kF32, rows);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s3, max);
  const Descriptor& shifted = g.virtual4(kF32, scores);
  g.pointwise(CUDNN_POINTWISE_SUB, s3, &max, shifted);
  const Descriptor& e = g.virtual4(kF32, scores);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, e);
  const Descriptor& sum = g.virtual4(kF32, rows);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  if (stats_form != StatsForm::kNone) {
    const Descriptor& log_sum = g.virtual4(kF32, rows);
    g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, log_sum);
    const Descriptor& stats = stats_form == StatsForm::kVirtual
                                  ? g.virtual4(kF32, rows)
                                  : g.tensor4(kUidStats, kF32, rows, nullptr, TensorKind::kMemory);
    g.pointwise(CUDNN_POINTWISE_ADD, max, &log_sum, stats);
  }
  const Descriptor& p = g.virtual4(kF32, scores);
  g.pointwise(CUDNN_POINTWISE_DIV, e, &sum, p);
  // P into e4m3
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, p, amax_s);
  const Descriptor& p8 = g.virtual4(kF8, scores);
  g.pointwise(CUDNN_POINTWISE_MUL, p, &scale_s, p8);
  // O = P V * descale_s * descale_v, into e4m3
  const Descriptor& o0 = g.virtual4(kF32, outs);
  g.matmul(p8, v, o0);
  const Descriptor& o1 = g.virtual4(kF32, outs);
  g.pointwise(CUDNN_POINTWISE_MUL, o0, &descale_s, o1);
  const Descriptor& o2 = g.virtual4(kF32, outs);
  g.pointwise(CUDNN_POINTWISE_MUL, o1, &descale_v, o2);
  g.pointwise(CUDNN_POINTWISE_MUL, o2, &scale_o, o);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, o2, amax_o);

  OpGraph out;
  out.graph = operation_graph(b, handle, g.ops());
  out.nodes = g.release();
  out.stats = stats_form;
  return out;
}

// Bytes of the statistics a graph of StatsForm::kInMemory writes for q8 [B, H, Sq, D].
int64_t stats_bytes(const Tensor& q8) { return q8.size(0) * q8.size(1) * q8.size(2) * int64_t(sizeof(float)); }

// One execution; `stats` [B, H, Sq] f32 when the graph writes them (else unused).
bool execute_fp8(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& plan, StatsForm form, Tensor& o8,
                 const Tensor& q8, const Tensor& k8, const Tensor& v8, float scale, float* sc, void* stats, void* workspace,
                 std::string* why) {
  const auto slot = [&](S::Slot s) { return static_cast<void*>(S::at(sc, s)); };
  std::vector<int64_t> uids = {kUidQ,         kUidK,         kUidV,         kUidO,      kUidScale, kUidDescaleQ, kUidDescaleK,
                               kUidDescaleV, kUidDescaleS, kUidScaleS,    kUidScaleO, kUidAmaxS, kUidAmaxO};
  std::vector<void*> ptrs = {q8.raw(),           k8.raw(),           v8.raw(),           o8.raw(),  &scale,
                             slot(S::kDescaleQ), slot(S::kDescaleK), slot(S::kDescaleV), slot(S::kDescaleS),
                             slot(S::kScaleS),   slot(S::kScaleO),   slot(S::kAmaxS),    slot(S::kAmaxO)};
  if (form == StatsForm::kInMemory) {
    uids.push_back(kUidStats);
    ptrs.push_back(stats);
  }
  return execute(a, handle, plan, uids, ptrs, workspace, why);
}

}  // namespace sdpa_fp8_detail

using namespace sdpa_fp8_detail;

SdpaFp8Stats sdpa_fp8_stats() {
  const Counters& c = counters();
  return SdpaFp8Stats{c.planned.load(), c.declined.load(), c.runs.load()};
}

struct CudnnSdpaFp8::Plan {
  bool ok = false;
  std::string why;  // when !ok
  OpGraph graph;
  Candidate chosen;
};

CudnnSdpaFp8::CudnnSdpaFp8(void* library, void* handle, cudaStream_t stream) : handle_(handle), stream_(stream) {
  api_ = load_api_for(library, handle, cudnn_sdpa_enabled(), "off by ATELIER_CUDNN_SDPA=0", &why_);  // (why_ is constructed by now)
}

CudnnSdpaFp8::~CudnnSdpaFp8() { plans_.clear(); }

CudnnSdpaFp8::Plan* CudnnSdpaFp8::plan_for(const Key& key, Tensor& o8, const Tensor& q8, const Tensor& k8, const Tensor& v8,
                                           float scale, float* scalars, DeviceAllocator& alloc) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  if (stream_capturing(stream_)) return nullptr;

  const CudnnGraphApi& a = *api_;
  const auto handle = static_cast<cudnnHandle_t>(handle_);
  Plan* plan = plans_.emplace(key, std::make_unique<Plan>()).first->second.get();
  const std::string what = sdpa_shape_text(q8, k8);
  const auto decline = [&](const std::string& why) {
    counters().declined.fetch_add(1);
    declined_.insert(shape_of(q8, k8));
    plan->why = why;
    if (log_enabled()) std::fprintf(stderr, "[cudnn sdpa fp8] %s: declined (%s)\n", what.c_str(), why.c_str());
    return plan;  // ok stays false: remembered
  };

  // The graph forms in turn (kStatsForms) until the heuristics offer an engine that makes a plan.
  std::vector<Candidate> candidates;
  std::string why, reasons;
  for (StatsForm form : kStatsForms) {
    Builder b(a);
    plan->graph = build_graph(b, handle, o8, q8, k8, v8, form);
    if (b.ok()) candidates = plan_candidates(a, handle, plan->graph.graph, kMaxCandidates, &why);
    else why = b.why();
    if (!candidates.empty()) break;
    reasons += std::string(reasons.empty() ? "" : "; ") + stats_form_name(form) + ": " + why;
  }
  if (candidates.empty()) return decline(reasons);

  const int64_t max_ws = max_workspace(candidates);
  std::shared_ptr<Buffer> ws = max_ws > 0 ? alloc.allocate(size_t(max_ws)) : nullptr;
  std::shared_ptr<Buffer> stats =
      plan->graph.stats == StatsForm::kInMemory ? alloc.allocate(size_t(stats_bytes(q8))) : nullptr;
  size_t best = 0;
  if (candidates.size() > 1) {  // timed in turns on the real buffers (the caller's call overwrites o8)
    EventPair events;
    std::vector<std::function<bool()>> runs;
    for (const Candidate& c : candidates)
      runs.push_back([&, cp = &c] {
        return execute_fp8(a, handle, cp->plan, plan->graph.stats, o8, q8, k8, v8, scale, scalars,
                           stats ? stats->data() : nullptr, ws ? ws->data() : nullptr, &why);
      });
    best = fastest(candidates, time_in_turns(events, stream_, kTimingRounds, kTimedRuns, runs));
    if (best == candidates.size()) return decline("every plan failed to execute (" + why + ")");
  }
  plan->ok = true;
  plan->chosen = std::move(candidates[best]);
  counters().planned.fetch_add(1);
  if (log_enabled())
    std::fprintf(stderr, "[cudnn sdpa fp8] %s: %s, %zu plans, engine %lld, workspace %lld B, %.4f ms%s%s\n", what.c_str(),
                 stats_form_name(plan->graph.stats), candidates.size(), (long long)plan->chosen.engine.index,
                 (long long)plan->chosen.workspace, double(plan->chosen.ms), reasons.empty() ? "" : "; declined first: ",
                 reasons.c_str());
  return plan;
}

bool CudnnSdpaFp8::forward(Tensor& o8, const Tensor& q8, const Tensor& k8, const Tensor& v8, float scale, float* scalars,
                           DeviceAllocator& alloc, std::string* why) {
  const auto fail = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (!api_) return fail(why_);
  for (const Tensor* t : {static_cast<const Tensor*>(&o8), &q8, &k8, &v8}) {
    if (t->dtype() != DType::F8E4M3 || t->dim() != 4) return fail("operands must be [B, H, S, D] f8e4m3");
    if (t->strides()[3] != 1 || !aligned16(t->raw()))
      return fail("operands need unit last strides and 16-byte alignment");
  }
  if (k8.size(1) != q8.size(1) || v8.size(3) != q8.size(3) || k8.size(3) != q8.size(3))
    return fail("FP8 attention takes equal q/k/v heads and head dims");
  const std::array<int64_t, 4> qs = sdpa_strides(q8), ks = sdpa_strides(k8), vs = sdpa_strides(v8), os = sdpa_strides(o8);
  const Key key{q8.size(0), q8.size(1), q8.size(2), k8.size(2), q8.size(3), qs[0], qs[1], qs[2], ks[0],
                ks[1],      ks[2],      vs[0],      vs[1],      vs[2],      os[0], os[1], os[2]};
  std::lock_guard<std::mutex> lock(mu_);
  Plan* plan = plan_for(key, o8, q8, k8, v8, scale, scalars, alloc);
  if (!plan) return fail("a new shape met during a CUDA graph capture is not planned");
  if (!plan->ok) return fail(plan->why);
  std::shared_ptr<Buffer> ws = plan->chosen.workspace > 0 ? alloc.allocate(size_t(plan->chosen.workspace)) : nullptr;
  std::shared_ptr<Buffer> stats =
      plan->graph.stats == StatsForm::kInMemory ? alloc.allocate(size_t(stats_bytes(q8))) : nullptr;
  std::string err;
  if (!execute_fp8(*api_, static_cast<cudnnHandle_t>(handle_), plan->chosen.plan, plan->graph.stats, o8, q8, k8, v8, scale,
                   scalars, stats ? stats->data() : nullptr, ws ? ws->data() : nullptr, &err)) {
    plan->ok = false;  // never again for this shape
    plan->why = "execution failed: " + err;
    declined_.insert(shape_of(q8, k8));
    counters().declined.fetch_add(1);
    return fail(plan->why);
  }
  counters().runs.fetch_add(1);
  return true;
}

bool CudnnSdpaFp8::declined_before(const Tensor& q, const Tensor& k) {
  std::lock_guard<std::mutex> lock(mu_);
  return declined_.count(shape_of(q, k)) > 0;
}

}  // namespace atelier::cuda
