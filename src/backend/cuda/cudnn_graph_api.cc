// Shared pieces of cuDNN's graph (backend) API: see cudnn_graph_api.h.
#include "backend/cuda/cudnn_graph_api.h"

#include <dlfcn.h>

#include <algorithm>
#include <memory>

namespace atelier::cuda::cudnn_graph {

bool log_enabled() {
  static const bool on = env_is("ATELIER_CUDNN_LOG", "1");
  return on;
}

const CudnnGraphApi* load_api(void* library, std::string* why) {
  if (!library) {
    *why = "no cuDNN library handle";
    return nullptr;
  }
  auto api = std::make_unique<CudnnGraphApi>();
#define ATELIER_CUDNN_GRAPH_LOAD(name)                                       \
  api->name = reinterpret_cast<decltype(&::name)>(dlsym(library, #name));    \
  if (!api->name) {                                                          \
    *why = std::string("cuDNN lacks ") + #name;                              \
    return nullptr;                                                          \
  }
  ATELIER_CUDNN_GRAPH_FUNCTIONS(ATELIER_CUDNN_GRAPH_LOAD)
#undef ATELIER_CUDNN_GRAPH_LOAD
  return api.release();
}

const CudnnGraphApi* load_api_for(void* library, void* handle, bool on, const char* off_reason, std::string* why) {
  if (!on) {
    *why = off_reason;
    return nullptr;
  }
  if (!handle) {
    *why = "no cuDNN handle";
    return nullptr;
  }
  return load_api(library, why);
}

// --- Descriptor ----------------------------------------------------------------------------------------------------

Descriptor::Descriptor(const CudnnGraphApi* api, cudnnBackendDescriptorType_t type) : api_(api) {
  if (api_->cudnnBackendCreateDescriptor(type, &d_) != CUDNN_STATUS_SUCCESS) d_ = nullptr;
}

Descriptor& Descriptor::operator=(Descriptor&& o) noexcept {
  if (this != &o) {
    reset();
    api_ = o.api_;
    d_ = std::exchange(o.d_, nullptr);
  }
  return *this;
}

void Descriptor::reset() {
  if (d_) api_->cudnnBackendDestroyDescriptor(d_);
  d_ = nullptr;
}

// --- Builder -------------------------------------------------------------------------------------------------------

Descriptor Builder::create(cudnnBackendDescriptorType_t type, const char* what) {
  if (!ok()) return Descriptor();
  Descriptor d(&a_, type);
  if (!d) why_ = std::string("create ") + what + " failed";
  return d;
}

void Builder::set(const Descriptor& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                  const void* value, const char* what) {
  if (ok()) check(a_.cudnnBackendSetAttribute(d.get(), name, type, count, value), what);
}

void Builder::set_descriptor(const Descriptor& d, cudnnBackendAttributeName_t name, const Descriptor& value, const char* what) {
  cudnnBackendDescriptor_t v = value.get();
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

void Builder::finalize(const Descriptor& d, const char* what) {
  if (ok()) check(a_.cudnnBackendFinalize(d.get()), what);
}

void Builder::check(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS && ok()) why_ = std::string(what) + ": " + a_.cudnnGetErrorString(st);
}

void Builder::set_handle(const Descriptor& d, cudnnBackendAttributeName_t name, cudnnHandle_t handle) {
  if (ok()) a_.cudnnBackendSetAttribute(d.get(), name, CUDNN_TYPE_HANDLE, 1, &handle);
}

// --- graphs --------------------------------------------------------------------------------------------------------

Descriptor tensor(Builder& b, int64_t uid, cudnnDataType_t dt, int rank, const int64_t* dims, const int64_t* strides,
                  TensorKind kind) {
  Descriptor t = b.create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
  b.set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
  b.set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, dims, "tensor dims");
  b.set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, strides, "tensor strides");
  b.set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
  b.set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment, "tensor alignment");
  const bool yes = true;
  if (kind == TensorKind::kByValue) b.set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor by value");
  if (kind == TensorKind::kVirtual) b.set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "tensor virtual");
  b.finalize(t, "tensor finalize");
  return t;
}

Descriptor operation_graph(Builder& b, cudnnHandle_t handle, const std::vector<cudnnBackendDescriptor_t>& ops) {
  Descriptor g = b.create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  b.set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()), ops.data(), "graph ops");
  b.set_handle(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle);
  b.finalize(g, "graph finalize");
  return g;
}

// --- GraphBuilder --------------------------------------------------------------------------------------------------

Descriptor& GraphBuilder::keep(Descriptor d) {
  kept_.push_back(std::make_unique<Descriptor>(std::move(d)));
  return *kept_.back();
}

void GraphBuilder::add_op(Descriptor op) { ops_.push_back(keep(std::move(op)).get()); }

const Descriptor& GraphBuilder::tensor4(int64_t uid, cudnnDataType_t dt, std::array<int64_t, 4> dims, const int64_t* strides,
                                        TensorKind kind) {
  int64_t packed[4] = {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  return keep(tensor(b_, uid, dt, 4, dims.data(), strides ? strides : packed, kind));
}

const Descriptor& GraphBuilder::virtual4(cudnnDataType_t dt, std::array<int64_t, 4> dims, const int64_t* strides) {
  return tensor4(next_uid_++, dt, dims, strides, TensorKind::kVirtual);
}

const Descriptor& GraphBuilder::scalar(int64_t uid, TensorKind kind) {
  return tensor4(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, nullptr, kind);
}

void GraphBuilder::matmul(const Descriptor& a, const Descriptor& bm, const Descriptor& c) {
  Descriptor& desc = keep(b_.create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul"));
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  b_.set(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
  b_.finalize(desc, "matmul finalize");
  Descriptor op = b_.create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op");
  b_.set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
  b_.set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, bm, "matmul b");
  b_.set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
  b_.set_descriptor(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, desc, "matmul desc");
  b_.finalize(op, "matmul op finalize");
  add_op(std::move(op));
}

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor* bt, const Descriptor& y) {
  Descriptor& desc = keep(b_.create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise"));
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  b_.set(desc, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
  b_.set(desc, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
  b_.finalize(desc, "pointwise finalize");
  Descriptor op = b_.create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op");
  b_.set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc, "pointwise desc");
  b_.set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
  if (bt) b_.set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *bt, "pointwise b");
  b_.set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
  const float one = 1.0f;
  b_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha1");
  b_.set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pointwise alpha2");
  b_.finalize(op, "pointwise op finalize");
  add_op(std::move(op));
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t mode, const Descriptor& x, const Descriptor& y) {
  Descriptor& desc = keep(b_.create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction"));
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  b_.set(desc, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction compute type");
  b_.set(desc, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
  b_.finalize(desc, "reduction finalize");
  Descriptor op = b_.create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op");
  b_.set_descriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
  b_.set_descriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
  b_.set_descriptor(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc, "reduction desc");
  b_.finalize(op, "reduction op finalize");
  add_op(std::move(op));
}

// --- engines and plans ---------------------------------------------------------------------------------------------

EngineInfo engine_info(const CudnnGraphApi& a, const Descriptor& cfg) {
  EngineInfo info;
  Descriptor engine(&a, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  if (!engine) return info;
  cudnnBackendDescriptor_t e = engine.get();
  int64_t count = 0;
  if (a.cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &e) !=
          CUDNN_STATUS_SUCCESS ||
      count != 1)
    return info;
  if (a.cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &info.index) !=
      CUDNN_STATUS_SUCCESS)
    info.index = -1;
  constexpr int kMaxNotes = 32;  // more than any cuDNN 9 release defines
  cudnnBackendNumericalNote_t notes[kMaxNotes];
  int64_t n = 0;
  if (a.cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, kMaxNotes, &n, notes) ==
      CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < std::min<int64_t>(n, kMaxNotes); ++i) {
      switch (notes[i]) {
        case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
        case CUDNN_NUMERICAL_NOTE_FFT:
        case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
        case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13: info.acceptable = false; break;
        default: break;
      }
    }
  }
  cudnnBackendBehaviorNote_t behaviour[kMaxNotes];
  if (a.cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE, kMaxNotes, &n, behaviour) ==
      CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < std::min<int64_t>(n, kMaxNotes); ++i)
      if (behaviour[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) info.runtime_compiled = true;
  }
  return info;
}

std::vector<Descriptor> engine_configs(const CudnnGraphApi& a, const Descriptor& graph, cudnnBackendHeurMode_t mode,
                                       std::string* why) {
  Builder b(a);
  Descriptor heur = b.create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
  b.set_descriptor(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
  b.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  b.finalize(heur, "heuristics finalize");
  std::vector<Descriptor> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < kMaxEngineConfigs && b.ok(); ++i) {
    cfgs.push_back(b.create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
    raw.push_back(cfgs.back().get());
  }
  int64_t count = 0;
  if (b.ok())
    b.check(a.cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                       kMaxEngineConfigs, &count, raw.data()),
            "heuristics results");
  if (!b.ok()) {
    *why = b.why();
    return {};
  }
  cfgs.resize(size_t(std::clamp<int64_t>(count, 0, kMaxEngineConfigs)));
  return cfgs;
}

namespace {
// c.workspace from the finalized c.plan (b's pending failure, if any, reported instead); false with *why when the
// plan failed or needs more than kMaxWorkspace.
bool read_workspace(const CudnnGraphApi& a, Builder& b, Candidate& c, std::string* why) {
  int64_t count = 0;
  if (b.ok())
    b.check(a.cudnnBackendGetAttribute(c.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count,
                                       &c.workspace),
            "plan workspace size");
  if (!b.ok()) {
    *why = b.why();
    return false;
  }
  if (c.workspace < 0 || c.workspace > kMaxWorkspace) {
    *why = "plan needs " + std::to_string(c.workspace) + " B of workspace";
    return false;
  }
  return true;
}
}  // namespace

bool make_plan(const CudnnGraphApi& a, cudnnHandle_t handle, Candidate& c, std::string* why) {
  Builder b(a);
  c.plan = b.create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
  b.set_handle(c.plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle);
  b.set_descriptor(c.plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, c.cfg, "plan engine config");
  b.finalize(c.plan, "plan finalize");
  return read_workspace(a, b, c, why);
}

std::string serialize_plan(const CudnnGraphApi& a, const Descriptor& plan, std::string* why) {
  Builder b(a);
  int64_t count = 0;
  b.check(a.cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &count,
                                     nullptr),
          "plan JSON size");
  std::string text(size_t(std::max<int64_t>(count, 0)), '\0');
  if (b.ok() && count > 0)
    b.check(a.cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, count,
                                       &count, text.data()),
            "plan JSON");
  if (!b.ok() || count <= 0) {
    *why = b.ok() ? "the plan has no serialized form" : b.why();
    return {};
  }
  text.resize(size_t(count));
  while (!text.empty() && text.back() == '\0') text.pop_back();  // the count may include a terminator
  return text;
}

bool deserialize_plan(const CudnnGraphApi& a, cudnnHandle_t handle, const std::string& text, Candidate& c, std::string* why) {
  Builder b(a);
  c.plan = b.create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
  b.set_handle(c.plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle);
  b.set(c.plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, int64_t(text.size()), text.data(),
        "plan JSON");
  b.finalize(c.plan, "plan finalize from JSON");
  return read_workspace(a, b, c, why);
}

std::vector<Candidate> plan_candidates(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& graph,
                                       size_t max_candidates, std::string* why) {
  std::vector<Candidate> candidates;
  *why = "heuristics gave no engine configuration";
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    if (!candidates.empty()) break;
    int position = -1;
    for (Descriptor& cfg : engine_configs(a, graph, mode, why)) {
      ++position;
      if (candidates.size() >= max_candidates) break;
      Candidate c;
      c.engine = engine_info(a, cfg);
      c.origin = PlanOrigin{c.engine.index, mode == CUDNN_HEUR_MODE_FALLBACK, position};
      c.cfg = std::move(cfg);
      if (make_plan(a, handle, c, why)) candidates.push_back(std::move(c));
    }
  }
  return candidates;
}

namespace {
constexpr int kPositionBits = 15;  // places in a heuristics list (kMaxEngineConfigs) fit with room to spare
static_assert(kMaxEngineConfigs < (1 << kPositionBits));
}  // namespace

int64_t stored_value(const PlanOrigin& o) {
  return (o.engine << (kPositionBits + 1)) | (int64_t(o.position) << 1) | (o.fallback ? 1 : 0);
}

std::optional<PlanOrigin> stored_origin(int64_t v) {
  if (v < 0) return std::nullopt;
  return PlanOrigin{v >> (kPositionBits + 1), (v & 1) != 0, int((v >> 1) & ((1 << kPositionBits) - 1))};
}

std::optional<Candidate> stored_candidate(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& graph,
                                          const PlanOrigin& o, std::string* why) {
  std::vector<Descriptor> configs = engine_configs(a, graph, o.fallback ? CUDNN_HEUR_MODE_FALLBACK : CUDNN_HEUR_MODE_A, why);
  if (o.position < 0 || size_t(o.position) >= configs.size()) {
    *why = "the stored configuration is no longer offered";
    return std::nullopt;
  }
  Candidate c;
  c.engine = engine_info(a, configs[size_t(o.position)]);
  if (c.engine.index != o.engine || !c.engine.acceptable) {
    *why = "the stored configuration's place holds another engine";
    return std::nullopt;
  }
  c.origin = o;
  c.cfg = std::move(configs[size_t(o.position)]);
  if (!make_plan(a, handle, c, why)) return std::nullopt;
  return c;
}

std::string plan_text_key(const std::string& answer_key, int64_t answer) { return choice_key(answer_key, "plan", answer); }

bool keep_plan(const CudnnGraphApi& a, ChoiceStore& store, const std::string& answer_key, const Candidate& chosen,
               std::string* why) {
  const int64_t answer = stored_value(chosen.origin);
  store.put(answer_key, answer);
  const std::string text = serialize_plan(a, chosen.plan, why);
  if (text.empty()) return false;
  if (!store.put_text(plan_text_key(answer_key, answer), text)) {
    *why = "the serialized plan could not be written";
    return false;
  }
  return true;
}

std::optional<Candidate> kept_plan(const CudnnGraphApi& a, cudnnHandle_t handle, const ChoiceStore& store,
                                   const std::string& answer_key, int64_t answer,
                                   const std::function<const Descriptor*()>& graph, bool* restored, std::string* why) {
  *restored = false;
  const std::optional<PlanOrigin> o = stored_origin(answer);
  if (!o) {
    *why = "no stored plan";
    return std::nullopt;
  }
  if (const std::optional<std::string> text = store.get_text(plan_text_key(answer_key, answer))) {
    Candidate c;
    c.engine.index = o->engine;
    c.origin = *o;
    if (deserialize_plan(a, handle, *text, c, why)) {
      *restored = true;
      return c;
    }
  }
  const Descriptor* g = graph();
  if (!g) {
    *why = "the graph did not build";
    return std::nullopt;
  }
  return stored_candidate(a, handle, *g, *o, why);
}

int64_t max_workspace(const std::vector<Candidate>& candidates) {
  int64_t ws = 0;
  for (const Candidate& c : candidates) ws = std::max(ws, c.workspace);
  return ws;
}

size_t fastest(std::vector<Candidate>& candidates, const std::vector<float>& ms) {
  size_t best = candidates.size();
  for (size_t i = 0; i < candidates.size() && i < ms.size(); ++i) {
    candidates[i].ms = ms[i];
    if (ms[i] >= 0.0f && (best == candidates.size() || ms[i] < candidates[best].ms)) best = i;
  }
  return best;
}

bool execute(const CudnnGraphApi& a, cudnnHandle_t handle, const Descriptor& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, std::string* why) {
  Builder b(a);
  Descriptor pack = b.create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
  b.set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data(), "pack uids");
  b.set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(pointers.size()), pointers.data(),
        "pack pointers");
  b.set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, "pack workspace");
  b.finalize(pack, "pack finalize");
  if (b.ok()) b.check(a.cudnnBackendExecute(handle, plan.get(), pack.get()), "execute");
  if (!b.ok()) {
    *why = b.why();
    return false;
  }
  return true;
}

}  // namespace atelier::cuda::cudnn_graph
