// The pieces of cuDNN's graph (backend) API that every graph-API path here shares (convolutions in
// cuda_conv_graph.cc, fused attention in cuda_sdpa.cc): the entry points looked up in the dlopen'ed library,
// RAII descriptors, a builder that keeps the first failure's reason, heuristics, plans, execution and timing.
// Every cuDNN status is checked; callers turn a failure into "decline this case" so another path runs it.
#pragma once
#include <cuda_runtime.h>
#include <cudnn.h>

#include "backend/choice_store.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_event_timing.h"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace atelier::cuda {

#define ATELIER_CUDNN_GRAPH_FUNCTIONS(X)                                                             \
  X(cudnnGetErrorString) X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor)           \
  X(cudnnBackendSetAttribute) X(cudnnBackendGetAttribute) X(cudnnBackendFinalize) X(cudnnBackendExecute)

struct CudnnGraphApi {
#define ATELIER_CUDNN_GRAPH_MEMBER(name) decltype(&::name) name = nullptr;
  ATELIER_CUDNN_GRAPH_FUNCTIONS(ATELIER_CUDNN_GRAPH_MEMBER)
#undef ATELIER_CUDNN_GRAPH_MEMBER
};

namespace cudnn_graph {

constexpr int64_t kAlignment = 16;                     // bytes, declared for every tensor (callers check pointers)
constexpr int kMaxEngineConfigs = 16;                  // configurations asked of each heuristics mode
constexpr int64_t kMaxWorkspace = int64_t(256) << 20;  // plans needing more are skipped

// ATELIER_CUDNN_LOG=1: the graph-API paths print one line per planned shape to stderr.
bool log_enabled();
// The backend entry points of `library` (cuDNN's dlopen handle); one table per call, kept for the process's
// life (like the library). Null with *why set when an entry point is missing.
const CudnnGraphApi* load_api(void* library, std::string* why);
// load_api for a path that runs on the device's cuDNN handle and may be switched off: null with *why set to
// `off_reason` when !on, to "no cuDNN handle" without one, or to load_api's reason.
const CudnnGraphApi* load_api_for(void* library, void* handle, bool on, const char* off_reason, std::string* why);

// One backend descriptor, destroyed with its owner (move-only).
class Descriptor {
 public:
  Descriptor() = default;
  Descriptor(const CudnnGraphApi* api, cudnnBackendDescriptorType_t type);
  Descriptor(Descriptor&& o) noexcept : api_(o.api_), d_(std::exchange(o.d_, nullptr)) {}
  Descriptor& operator=(Descriptor&& o) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() { reset(); }
  cudnnBackendDescriptor_t get() const { return d_; }
  explicit operator bool() const { return d_ != nullptr; }

 private:
  void reset();
  const CudnnGraphApi* api_ = nullptr;
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Builds descriptors, keeping the first failure's reason; every call after a failure does nothing, so a
// builder function reads as a straight list of attributes and checks ok() once at the end.
class Builder {
 public:
  explicit Builder(const CudnnGraphApi& api) : a_(api) {}
  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  Descriptor create(cudnnBackendDescriptorType_t type, const char* what);
  void set(const Descriptor& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
           const void* value, const char* what);
  void set_descriptor(const Descriptor& d, cudnnBackendAttributeName_t name, const Descriptor& value, const char* what);
  void finalize(const Descriptor& d, const char* what);
  void check(cudnnStatus_t st, const char* what);
  // The handle attributes of operation graphs and plans are deprecated in later cuDNN 9 releases (the
  // handle comes with cudnnBackendExecute): a refusal to take one is not a failure; a missing handle that
  // the release did need shows up as a failed finalize.
  void set_handle(const Descriptor& d, cudnnBackendAttributeName_t name, cudnnHandle_t handle);

 private:
  const CudnnGraphApi& a_;
  std::string why_;
};

// What a tensor of a graph is: device memory in the variant pack, a host scalar passed in the variant pack
// (e.g. an attention scale), or an intermediate that lives only inside the fused kernel.
enum class TensorKind { kMemory, kByValue, kVirtual };
// A finalized tensor descriptor: `rank` dims and strides (elements), 16-byte alignment declared.
Descriptor tensor(Builder& b, int64_t uid, cudnnDataType_t dt, int rank, const int64_t* dims, const int64_t* strides,
                  TensorKind kind = TensorKind::kMemory);
// A finalized operation graph of the given operations.
Descriptor operation_graph(Builder& b, cudnnHandle_t handle, const std::vector<cudnnBackendDescriptor_t>& ops);

// Builds a graph's nodes; every descriptor is kept alive here until the operation graph is finalized (and
// with the plan after that: cuDNN may refer to them). Virtual tensors take uids counting up from
// `first_virtual_uid`.
class GraphBuilder {
 public:
  GraphBuilder(Builder& b, int64_t first_virtual_uid) : b_(b), next_uid_(first_virtual_uid) {}

  Descriptor& keep(Descriptor d);
  // Keeps an operation the caller built and adds it to the graph's list.
  void add_op(Descriptor op);
  // A [d0, d1, d2, d3] tensor with the given strides (packed when null).
  const Descriptor& tensor4(int64_t uid, cudnnDataType_t dt, std::array<int64_t, 4> dims, const int64_t* strides,
                            TensorKind kind);
  // A virtual tensor (packed when strides is null).
  const Descriptor& virtual4(cudnnDataType_t dt, std::array<int64_t, 4> dims, const int64_t* strides = nullptr);
  const Descriptor& scalar(int64_t uid, TensorKind kind = TensorKind::kMemory);
  void matmul(const Descriptor& a, const Descriptor& bm, const Descriptor& c);
  // y = mode(x[, b]); b null for unary modes. Computed in f32.
  void pointwise(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor* bt, const Descriptor& y);
  // y = reduce(x) over the dims where y has size 1.
  void reduction(cudnnReduceTensorOp_t mode, const Descriptor& x, const Descriptor& y);
  const std::vector<cudnnBackendDescriptor_t>& ops() const { return ops_; }
  std::vector<std::unique_ptr<Descriptor>> release() { return std::move(kept_); }

 private:
  Builder& b_;
  int64_t next_uid_;
  std::vector<std::unique_ptr<Descriptor>> kept_;
  std::vector<cudnnBackendDescriptor_t> ops_;
};

// What the engine behind a configuration is, and whether its numerics are acceptable here: reductions in
// 16 bits, FFT and Winograd (transforms lose accuracy in 16-bit data) and nondeterministic engines are
// refused; everything else the heuristics offer is kept (PyTorch keeps the same and more).
struct EngineInfo {
  int64_t index = -1;  // cuDNN's global engine index, for logs
  bool acceptable = true;
  bool runtime_compiled = false;
};
EngineInfo engine_info(const CudnnGraphApi& a, const Descriptor& cfg);

// Up to kMaxEngineConfigs engine configurations for `graph` from one heuristics mode, best first.
std::vector<Descriptor> engine_configs(const CudnnGraphApi& a, const Descriptor& graph, cudnnBackendHeurMode_t mode,
                                       std::string* why);

// Where a configuration came from: its heuristics mode and place in that mode's list, and its engine. Kept in the
// choice store (backend/choice_store.h) for the plan chosen, so that a later process finalizes that configuration
// only: the store's fingerprint pins the card and cuDNN's version, so the heuristics list the same configurations
// (the engine is checked all the same).
struct PlanOrigin {
  int64_t engine = -1;
  bool fallback = false;
  int position = 0;
};
// A PlanOrigin as one non-negative stored value, and back (nullopt for a negative value: the callers' own answers,
// such as "not fused" or "our kernel", are negative).
int64_t stored_value(const PlanOrigin& o);
std::optional<PlanOrigin> stored_origin(int64_t v);

// One execution plan that finalized, with what it needs.
struct Candidate {
  Descriptor cfg, plan;
  int64_t workspace = 0;
  EngineInfo engine;
  PlanOrigin origin;
  float ms = -1.0f;  // timed mean per run; negative: not timed
};
// Finalizes c.plan from c.cfg; false (with *why) when it fails or needs more than kMaxWorkspace.
bool make_plan(const CudnnGraphApi& a, cudnnHandle_t handle, Candidate& c, std::string* why);
// A finalized plan's serialized form (cuDNN's JSON representation, which holds a runtime-compiled engine's kernel),
// or "" with *why.
std::string serialize_plan(const CudnnGraphApi& a, const Descriptor& plan, std::string* why);
// c.plan (and c.workspace) restored from serialize_plan's text without finalizing an engine configuration: false
// with *why when cuDNN refuses the text (another release, another card) or the plan needs more than kMaxWorkspace.
bool deserialize_plan(const CudnnGraphApi& a, cudnnHandle_t handle, const std::string& text, Candidate& c, std::string* why);

// Execution plans for `graph`: the first `max_candidates` configurations of heuristics mode A that finalize
// (FALLBACK's when A gives none); empty with *why when there are none.
std::vector<Candidate> plan_candidates(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& graph,
                                       size_t max_candidates, std::string* why);
// The configuration an earlier process chose (stored_origin), finalized: nullopt (with *why) when the heuristics no
// longer offer that engine at that place, or its plan does not finalize; the caller then searches afresh.
std::optional<Candidate> stored_candidate(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& graph,
                                          const PlanOrigin& o, std::string* why);
// The key of a plan's serialized form in a ChoiceStore, beside the answer `answer` (a stored_value) of `answer_key`:
// it names the answer, so that a changed answer never takes an older plan.
std::string plan_text_key(const std::string& answer_key, int64_t answer);
// Keeps `chosen` as the answer of `answer_key` (its origin's stored_value) and, beside it, its plan's serialized form;
// false (with *why) where cuDNN gives no serialized form or it is not written (the answer is kept all the same).
bool keep_plan(const CudnnGraphApi& a, ChoiceStore& store, const std::string& answer_key, const Candidate& chosen,
               std::string* why);
// An earlier process's plan for the answer `answer` of `answer_key`, untimed: restored from its kept serialized form
// (no graph, heuristics or compilation: a runtime-compiled engine's ~70 ms become ~2 ms), else its configuration
// finalized from the graph that `graph` builds (null when it cannot). nullopt (with *why) when neither works: the
// caller then plans afresh. *restored: whether the serialized form served.
std::optional<Candidate> kept_plan(const CudnnGraphApi& a, cudnnHandle_t handle, const ChoiceStore& store,
                                   const std::string& answer_key, int64_t answer,
                                   const std::function<const Descriptor*()>& graph, bool* restored, std::string* why);
// The largest workspace the candidates need.
int64_t max_workspace(const std::vector<Candidate>& candidates);
// Records each candidate's time (ms[i], time_in_turns's order) and returns the fastest one's index, or
// candidates.size() when none ran.
size_t fastest(std::vector<Candidate>& candidates, const std::vector<float>& ms);

// Enqueues one execution of `plan` with the tensors `uids[i]` at `pointers[i]` (host pointers for by-value
// scalars) and `workspace` (as large as the plan asked for).
bool execute(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, std::string* why);

}  // namespace cudnn_graph
}  // namespace atelier::cuda
