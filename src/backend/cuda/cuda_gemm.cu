// cuBLASLt products (see cuda_gemm.h) and the backend's gemm op.
#include "backend/cuda/cuda_gemm.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_event_timing.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {
namespace {

// Algorithms asked of cuBLASLt's heuristics per shape (all timed for tuned shapes); ATELIER_GEMM_CANDIDATES
// sets another count (at most kMaxHeuristicCandidates) to see whether the heuristics' later ones win.
constexpr int kHeuristicCandidates = 8;
constexpr int kMaxHeuristicCandidates = 64;
constexpr int kTimedRuns = 3;     // timed runs per candidate algorithm and turn, after one warm-up
constexpr int kTimingRounds = 3;  // turns (time_in_turns): each algorithm's best is kept
// Only products of at least this many FLOPs are tuned (about 70 us at 700 TFLOP/s: FLUX's and Z-Image's
// projections, SD's at large batches). Below it the kernels are short, the heuristics' choice is within noise,
// and timing every new shape costs the server's step-level batcher (a new batch size is a new shape) more
// than it wins. ATELIER_GEMM_MIN_TUNED_GFLOP sets another threshold.
constexpr double kMinTunedFlops = 5e10;
// Products that accumulate into a residual (beta != 0) have plans of their own (the heuristics do not see beta) and
// this threshold: session 24 measured SD's 16-row residual products, below 50 GFLOP, 17-96% slower than the same
// shapes without the residual on the heuristics' first choice; tuned from 1 GFLOP up, the 16-row UNet call ran
// 2.5% faster (session 26: 29.84 against 30.60 ms; the 65536x320 -> 320 product 0.081 -> 0.049 ms). SD's shapes
// are few and fixed per resolution, so the tuning is paid once. ATELIER_GEMM_MIN_TUNED_RESIDUAL_GFLOP sets another.
constexpr double kMinTunedResidualFlops = 1e9;
// The own linear kernel (cuda_gemm_wgmma.cu) is timed against the heuristics' first choice from this size on (and
// against every candidate where those are timed): at SD's 16 rows its 65536x320 -> 320 product took 0.032 ms against
// cuBLASLt's 0.054, while at batch 2 running it everywhere made the UNet step 12% slower (session 35). Timing two
// kernels per shape costs little.
constexpr double kMinOwnTunedFlops = 1e9;

double env_gflop(const char* name, double fallback) {
  const std::optional<double> v = env_number(name);
  return v ? *v * 1e9 : fallback;
}

double min_tuned_flops(bool residual) {
  static const double plain = env_gflop("ATELIER_GEMM_MIN_TUNED_GFLOP", kMinTunedFlops);
  static const double with_residual = env_gflop("ATELIER_GEMM_MIN_TUNED_RESIDUAL_GFLOP", kMinTunedResidualFlops);
  return residual ? with_residual : plain;
}

bool gemm_log() {
  static const bool on = env_is("ATELIER_GEMM_LOG", "1");
  return on;
}

void blas_ok(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(internal_error(std::string("cuBLAS error ") + cublasGetStatusString(st) + " in " + what));
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: throw Error(unsupported("gemm: dtype " + std::string(dtype_name(t)) + " is not supported on CUDA (f32, bf16, f16 are)"));
  }
}

// A column-major view of a row-major operand (see cuda_gemm.h: C^T = op(B)^T op(A)^T).
struct CmLayout {
  uint64_t rows, cols;
  int64_t ld;
};

CmLayout cm_layout(bool trans, int64_t rows_if_n, int64_t cols_if_n, int64_t ld) {
  CmLayout l{uint64_t(trans ? cols_if_n : rows_if_n), uint64_t(trans ? rows_if_n : cols_if_n), ld};
  // A single column may carry any stride in a view; cuBLAS insists on ld >= rows.
  if (l.cols <= 1) l.ld = std::max<int64_t>(l.ld, int64_t(std::max<uint64_t>(l.rows, 1)));
  return l;
}

// --- the fallback epilogue kernel ------------------------------------------------------------------------

template <typename T>
__global__ void gemm_epilogue_kernel(T* c, int64_t m, int64_t n, int64_t ldc, int64_t batch, int64_t batch_stride,
                                     const T* bias, UnaryOp act, bool beta_only, float beta) {
  const int64_t total = batch * m * n;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t j = i % n, r = (i / n) % m, bi = i / (n * m);
    T* p = c + bi * batch_stride + r * ldc + j;
    float v = beta_only ? (beta == 0.0f ? 0.0f : beta * to_f32(*p)) : to_f32(*p);
    if (bias) v += to_f32(bias[j]);
    *p = from_f32<T>(apply_unary(v, act));
  }
}

}  // namespace

void launch_gemm_epilogue(void* c, DType dtype, int64_t m, int64_t n, int64_t ldc, int64_t batch, int64_t batch_stride,
                          const void* bias, UnaryOp act, bool beta_only, float beta, cudaStream_t stream) {
  const int64_t total = batch * m * n;
  if (total == 0) return;
  const unsigned blocks = grid_for(total);
  switch (dtype) {
    case DType::F32:
      gemm_epilogue_kernel<float><<<blocks, kThreads, 0, stream>>>(static_cast<float*>(c), m, n, ldc, batch, batch_stride,
                                                                  static_cast<const float*>(bias), act, beta_only, beta);
      break;
    case DType::BF16:
      gemm_epilogue_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(c), m, n, ldc, batch, batch_stride,
                                                                          static_cast<const __nv_bfloat16*>(bias), act, beta_only, beta);
      break;
    case DType::F16:
      gemm_epilogue_kernel<__half><<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(c), m, n, ldc, batch, batch_stride,
                                                                   static_cast<const __half*>(bias), act, beta_only, beta);
      break;
    default: throw Error(unsupported("gemm epilogue: dtype " + std::string(dtype_name(dtype))));
  }
  ATELIER_CUDA_LAUNCHED();
}

// --- GemmEngine ----------------------------------------------------------------------------------------------

struct GemmEngine::Plan {
  bool valid = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  // The heuristics' algorithms that fit the workspace, best first; timed once (tuned) at the first eager call.
  std::vector<std::pair<cublasLtMatmulAlgo_t, size_t>> candidates;
  bool tuned = false;
  bool own = false;  // the own kernel measured faster than every timed algorithm
  std::string site;  // names the plan's kind and shape in the choice store ("gemm [...]", "gemm fp8 [...]")
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

GemmEngine::GemmEngine(int device, cudaStream_t stream, DeviceAllocator& alloc) : device_(device), stream_(stream), alloc_(alloc) {
  DeviceGuard guard(device_);
  blas_ok(cublasLtCreate(&lt_), "cublasLtCreate");
  blas_ok(cublasCreate(&blas_), "cublasCreate");
  blas_ok(cublasSetStream(blas_, stream_), "cublasSetStream");
  workspace_ = alloc.allocate(kWorkspaceBytes);
  blas_ok(cublasSetWorkspace(blas_, workspace_->data(), kWorkspaceBytes), "cublasSetWorkspace");
}

GemmEngine::~GemmEngine() {
  plans_.clear();
  if (warm_up_memory_) cudaFree(warm_up_memory_);
  if (blas_) cublasDestroy(blas_);
  if (lt_) cublasLtDestroy(lt_);
}

bool GemmEngine::warm_up() {
  // A square bf16 product [n, n] x [n, n]^T + bias: the layout and epilogue of a linear layer, SD's and the DiTs'
  // most common product. Its own stream and no workspace, so that it shares nothing with the engine's stream; its
  // buffers stay until the engine goes (a cudaFree here could meet another thread's graph capture).
  constexpr int64_t kN = 256;
  constexpr size_t kMatrixBytes = size_t(kN * kN) * 2;
  DeviceGuard guard(device_);
  std::lock_guard<std::mutex> lock(mu_);
  cudaStream_t stream = nullptr;
  void*& mem = warm_up_memory_;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
            (mem || cudaMalloc(&mem, 3 * kMatrixBytes + kN * 2) == cudaSuccess) &&
            cudaMemsetAsync(mem, 0, 3 * kMatrixBytes + kN * 2, stream) == cudaSuccess &&
            cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, kN, kN, kN) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
  if (ok) {
    char* base = static_cast<char*>(mem);
    const void *a = base, *b = base + kMatrixBytes, *bias = base + 3 * kMatrixBytes;
    void* c = base + 2 * kMatrixBytes;
    const cublasOperation_t trans = CUBLAS_OP_T, none = CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    const uint64_t no_workspace = 0;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &no_workspace, sizeof(no_workspace));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const float alpha = 1.0f, beta = 0.0f;
    ok = cublasLtMatmulAlgoGetHeuristic(lt_, desc, layout, layout, layout, layout, pref, 1, &result, &found) ==
             CUBLAS_STATUS_SUCCESS &&
         found == 1 &&
         cublasLtMatmul(lt_, desc, &alpha, a, layout, b, layout, &beta, c, layout, c, layout, &result.algo, nullptr, 0,
                        stream) == CUBLAS_STATUS_SUCCESS &&
         cudaStreamSynchronize(stream) == cudaSuccess;
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (layout) cublasLtMatrixLayoutDestroy(layout);
  if (desc) cublasLtMatmulDescDestroy(desc);
  if (stream) cudaStreamDestroy(stream);
  return ok;
}

GemmEngine::Plan* GemmEngine::plan_for(const GemmCall& call, bool allow_tf32, int epilogue) {
  const bool tf32 = allow_tf32 && call.a.dtype == DType::F32;
  const int64_t cm_m = call.n, cm_n = call.m;
  const CmLayout la = cm_layout(call.b.trans, cm_m, call.k, call.b.ld);
  const CmLayout lb = cm_layout(call.a.trans, call.k, cm_n, call.a.ld);
  const CmLayout lc = cm_layout(false, cm_m, cm_n, call.ldc);
  const uint32_t al_a = gemm_alignment(call.b.ptr, la.ld, call.b.batch_stride, dtype_size(call.b.dtype));
  const uint32_t al_b = gemm_alignment(call.a.ptr, lb.ld, call.a.batch_stride, dtype_size(call.a.dtype));
  // C's alignment, and the separate beta input's where there is one (both are read through C's layout).
  const uint32_t al_c = std::min(gemm_alignment(call.c, lc.ld, call.c_batch_stride, dtype_size(call.c_dtype)),
                                 call.c_in ? gemm_alignment(call.c_in, lc.ld, call.c_batch_stride, dtype_size(call.c_dtype))
                                           : UINT32_MAX);
  const Key key{int64_t(call.a.dtype), int64_t(call.c_dtype), tf32, cm_m, cm_n, call.k, call.batch, la.ld, lb.ld, lc.ld,
                call.b.batch_stride, call.a.batch_stride, call.c_batch_stride, call.b.trans, call.a.trans, epilogue,
                al_a, al_b, al_c, call.beta != 0.0f};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second->valid ? it->second.get() : nullptr;

  auto plan = std::make_unique<Plan>();
  Plan* p = plan.get();
  plans_.emplace(key, std::move(plan));
  p->site = choice_key("gemm", key);
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  if (cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return nullptr;
  const cublasOperation_t op_a = call.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = call.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = cublasLtEpilogue_t(epilogue);
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
  auto make_layout = [&](cublasLtMatrixLayout_t* l, DType t, const CmLayout& cm, int64_t stride) {
    if (cublasLtMatrixLayoutCreate(l, cuda_type(t), cm.rows, cm.cols, cm.ld) != CUBLAS_STATUS_SUCCESS) return false;
    if (call.batch > 1) {
      const int32_t count = int32_t(call.batch);
      cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count));
      cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride));
    }
    return true;
  };
  if (!make_layout(&p->a, call.b.dtype, la, call.b.batch_stride) || !make_layout(&p->b, call.a.dtype, lb, call.a.batch_stride) ||
      !make_layout(&p->c, call.c_dtype, lc, call.c_batch_stride))
    return nullptr;

  const bool ok = choose_algorithms(p, al_a, al_b, al_c);
  if (gemm_log())
    std::fprintf(stderr, "[atelier gemm] plan %lldx%lldx%lld batch %lld%s, epilogue %d: %zu algorithms\n", (long long)call.m,
                 (long long)call.n, (long long)call.k, (long long)call.batch, call.beta != 0.0f ? " +residual" : "", epilogue,
                 p->candidates.size());
  return ok ? p : nullptr;
}

bool GemmEngine::choose_algorithms(Plan* p, uint32_t align_a, uint32_t align_b, uint32_t align_c) {
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return false;
  const uint64_t ws = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c));
  static const int wanted = [] {
    const char* v = std::getenv("ATELIER_GEMM_CANDIDATES");
    const int n = v ? std::atoi(v) : 0;
    return n > 0 ? std::min(n, kMaxHeuristicCandidates) : kHeuristicCandidates;
  }();
  cublasLtMatmulHeuristicResult_t results[kMaxHeuristicCandidates] = {};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_, p->desc, p->a, p->b, p->c, p->c, pref, wanted, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= kWorkspaceBytes)
      p->candidates.emplace_back(results[i].algo, results[i].workspaceSize);
  if (p->candidates.empty()) return false;
  p->algo = p->candidates[0].first;
  p->workspace = p->candidates[0].second;
  p->valid = true;
  return true;
}

namespace {
template <typename V>
V algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  V v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
  return v;
}

// "algorithm A tile T cluster C stages S" (cuBLASLt's ids) of a chosen algorithm, for ATELIER_GEMM_LOG.
std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
  return "algorithm " + std::to_string(algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
         std::to_string(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) + " cluster " +
         std::to_string(algo_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)) + " stages " +
         std::to_string(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID));
}
}  // namespace

bool gemm_autotune() {
  static const bool on = !env_is("ATELIER_GEMM_AUTOTUNE", "0");
  return on;
}

// Times the plan's candidate algorithms (the output into a scratch buffer, so that a beta = 1 accumulation is
// not disturbed) and keeps the fastest, as cudnn.benchmark does for convolutions: cuBLASLt's first heuristic
// choice is not always its fastest algorithm for a shape. An earlier process's answer for the same candidates
// (the store's fingerprint pins the card and cuBLASLt's version, so the heuristics list the same algorithms) is
// taken without timing.
void GemmEngine::tune(Plan* p, double flops, bool residual, size_t out_bytes, const AlgoRun& run, const std::function<bool(void*)>& own) {
  if (stream_capturing(stream_)) return;  // tuned at the shape's next eager call
  p->tuned = true;
  if (!gemm_autotune()) return;
  const bool all = flops >= min_tuned_flops(residual) && p->candidates.size() >= 2;
  const bool with_own = own && flops >= kMinOwnTunedFlops;
  if (!all && !with_own) return;
  const size_t timed = all ? p->candidates.size() : 1;  // cuBLASLt's; then the own kernel's where it is one
  // The answer: a candidate's index, or `timed` for the own kernel. The key names what was timed.
  const std::string stored_key = choice_key(p->site, "of", timed, with_own ? "and own" : "alone");
  if (const std::optional<int64_t> kept = choices_ ? choices_->get(stored_key) : std::nullopt;
      kept && *kept >= 0 && size_t(*kept) <= timed && (size_t(*kept) < timed || with_own)) {
    ++from_store_;
    p->own = size_t(*kept) == timed;
    if (!p->own) {
      p->algo = p->candidates[size_t(*kept)].first;
      p->workspace = p->candidates[size_t(*kept)].second;
    }
    if (gemm_log())
      std::fprintf(stderr, "[atelier gemm] %.3g GFLOP%s: %s (stored choice)\n", flops / 1e9, residual ? " +residual" : "",
                   p->own ? "own kernel" : ("candidate " + std::to_string(*kept) + " of " + std::to_string(timed)).c_str());
    return;
  }
  std::shared_ptr<Buffer> scratch;
  try {
    scratch = alloc_.allocate(out_bytes);
  } catch (const Error&) {
    return;  // no room to time: keep the heuristics' first choice
  }
  EventPair ev;
  std::vector<std::function<bool()>> runs;
  for (size_t i = 0; i < timed; ++i)
    runs.push_back([&, algo = p->candidates[i].first, ws = p->candidates[i].second] { return run(algo, ws, scratch->data()); });
  if (with_own) runs.push_back([&] { return own(scratch->data()); });
  const std::vector<float> ms = time_in_turns(ev, stream_, kTimingRounds, kTimedRuns, runs);
  ++timed_;
  float best = -1.0f;
  size_t chosen = 0;
  for (size_t i = 0; i < timed; ++i) {
    if (ms[i] >= 0.0f && (best < 0.0f || ms[i] < best)) {
      best = ms[i];
      chosen = i;
      p->algo = p->candidates[i].first;
      p->workspace = p->candidates[i].second;
    }
  }
  const float own_ms = with_own ? ms.back() : -1.0f;
  p->own = own_ms >= 0.0f && (best < 0.0f || own_ms < best);
  if (choices_ && (best >= 0.0f || p->own)) choices_->put(stored_key, p->own ? int64_t(timed) : int64_t(chosen));
  if (gemm_log() && best >= 0.0f)
    std::fprintf(stderr, "[atelier gemm] tuned %.3g GFLOP%s: candidate %zu of %zu (%s), %.1f TFLOP/s; the heuristics' first %.1f; own kernel %.1f%s\n",
                 flops / 1e9, residual ? " +residual" : "", chosen, timed, describe_algo(p->algo).c_str(), flops / (best * 1e9),
                 ms[0] >= 0.0f ? flops / (ms[0] * 1e9) : 0.0, own_ms > 0.0f ? flops / (own_ms * 1e9) : 0.0, p->own ? " (chosen)" : "");
}

EpilogueChoice choose_epilogue(const void* bias, UnaryOp act, DType c_dtype) {
  const bool bias_fusable = bias && (reinterpret_cast<uintptr_t>(bias) & 15u) == 0;
  const bool relu = act == UnaryOp::kRelu;
  // cuBLASLt's GELU epilogue is the tanh approximation; used for 16-bit outputs only, so that f32 results
  // keep the CPU backend's exact formula.
  const bool gelu = act == UnaryOp::kGeluTanh && c_dtype != DType::F32;
  EpilogueChoice e;
  e.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (relu) e.epilogue = bias_fusable ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  else if (gelu) e.epilogue = bias_fusable ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  else if (bias_fusable) e.epilogue = CUBLASLT_EPILOGUE_BIAS;
  e.bias_done = bias_fusable;
  e.act_done = relu || gelu;
  // Activation epilogues need the bias fused too (else bias would come after the activation).
  if (e.act_done && bias && !bias_fusable) e = EpilogueChoice{CUBLASLT_EPILOGUE_DEFAULT, false, false};
  return e;
}

uint32_t gemm_alignment(const void* p, int64_t ld, int64_t batch_stride, size_t elem_bytes) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | 256u;
  if (ld) v |= uint64_t(ld) * elem_bytes;
  if (batch_stride) v |= uint64_t(batch_stride) * elem_bytes;
  return uint32_t(v & (~v + 1));  // lowest set bit
}

// cuBLASLt with the fused epilogue where it has one; false when no algorithm fits (the caller falls back).
bool GemmEngine::run_lt(const GemmCall& call, bool allow_tf32) {
  EpilogueChoice e = choose_epilogue(call.bias, call.act, call.c_dtype);
  Plan* p = plan_for(call, allow_tf32, e.epilogue);
  if (!p && e.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    e = EpilogueChoice{CUBLASLT_EPILOGUE_DEFAULT, false, false};
    p = plan_for(call, allow_tf32, e.epilogue);
  }
  if (!p) return false;
  if (e.bias_done) {
    const void* bias = call.bias;
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  }
  const AlgoRun run = [&](const cublasLtMatmulAlgo_t& algo, size_t ws, void* out) {
    const void* c_in = call.c_in ? call.c_in : out;
    return cublasLtMatmul(lt_, p->desc, &call.alpha, call.b.ptr, p->a, call.a.ptr, p->b, &call.beta, c_in, p->c, out, p->c,
                          &algo, workspace_->data(), ws, stream_) == CUBLAS_STATUS_SUCCESS;
  };
  std::function<bool(void*)> own;
  if (own_ && own_linear_mode() == OwnLinear::kTimed && own_linear_call_fits(call)) own = [&](void* out) { return own_(call, out); };
  if (!p->tuned) {
    const double flops = 2.0 * double(call.m) * double(call.n) * double(call.k) * double(call.batch);
    const int64_t elems = (call.batch - 1) * call.c_batch_stride + call.ldc * (call.m - 1) + call.n;
    tune(p, flops, call.beta != 0.0f, size_t(elems) * dtype_size(call.c_dtype), run, own);
  }
  if (p->own && own && own(call.c)) return true;  // the plan's bias pointer is not needed: the kernel adds the bias
  if (!run(p->algo, p->workspace, call.c)) return false;
  const bool need_bias = call.bias && !e.bias_done;
  const bool need_act = call.act != UnaryOp::kIdentity && !e.act_done;
  if (need_bias || need_act)
    launch_gemm_epilogue(call.c, call.c_dtype, call.m, call.n, call.ldc, call.batch, call.c_batch_stride,
                         need_bias ? call.bias : nullptr, need_act ? call.act : UnaryOp::kIdentity, false, 0.0f, stream_);
  return true;
}

// --- FP8 -------------------------------------------------------------------------------------------------

Fp8GemmStats& fp8_gemm_stats() {
  static Fp8GemmStats stats;
  return stats;
}

GemmEngine::Plan* GemmEngine::plan_for_fp8(const Fp8GemmCall& call, int epilogue, bool outer_vec) {
  // Column-major: C^T [n, m] = W [k, n]^T (opA = T) . X^T [k, m]; cuBLASLt's A is our W, its B our X, so
  // its outer-vector scales are w_scale (length n) for A and x_scale (length m) for B.
  const uint32_t al_a = gemm_alignment(call.w, call.ldw, 0, 1);
  const uint32_t al_b = gemm_alignment(call.x, call.ldx, 0, 1);
  const uint32_t al_c = gemm_alignment(call.c, call.n, 0, dtype_size(call.c_dtype));
  const Key key{call.m, call.n, call.k, call.ldx, call.ldw, int64_t(call.c_dtype), epilogue, call.beta != 0.0f,
                al_a, al_b, al_c, outer_vec, 0, 0, 0, 0, 0, 0, 0, 0};
  auto it = fp8_plans_.find(key);
  if (it != fp8_plans_.end()) return it->second->valid ? it->second.get() : nullptr;
  auto plan = std::make_unique<Plan>();
  Plan* p = plan.get();
  fp8_plans_.emplace(key, std::move(plan));
  p->site = choice_key("gemm fp8", key);
  if (cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return nullptr;
  const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = cublasLtEpilogue_t(epilogue);
  // Hopper's fast accumulation (no periodic promotion of the tensor cores' partial sums to full f32): what
  // FP8 inference GEMMs use; it costs a little accuracy (the parity test's tolerance covers it).
  const int8_t fast_accum = env_is("ATELIER_FP8_FAST_ACCUM", "0") ? 0 : 1;
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum));
  if (outer_vec) {
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    if (cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof(outer)) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof(outer)) != CUBLAS_STATUS_SUCCESS)
      return nullptr;
    // The heuristics see the scale pointers (this call's; each run sets its own).
    const void* a_scale = call.w_scale;
    const void* b_scale = call.x_scale;
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale));
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale));
  }
  const cudaDataType_t c_type = call.c_dtype == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  if (cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, call.k, call.n, call.ldw) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, call.k, call.m, call.ldx) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&p->c, c_type, call.n, call.m, call.n) != CUBLAS_STATUS_SUCCESS)
    return nullptr;
  bool ok = choose_algorithms(p, al_a, al_b, al_c);
  bool fast = fast_accum != 0;
  if (!ok && fast) {  // some scale modes come without the fast-accumulation kernels: ask again without
    const int8_t precise = 0;
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &precise, sizeof(precise));
    ok = choose_algorithms(p, al_a, al_b, al_c);
    fast = false;
  }
  if (gemm_log())
    std::fprintf(stderr, "[atelier gemm] fp8 %lldx%lldx%lld %s scales, epilogue %d, fast accumulation %s: %s (%zu algorithms)\n",
                 (long long)call.m, (long long)call.n, (long long)call.k, outer_vec ? "outer-vector" : "no", epilogue,
                 fast ? "on" : "off", ok ? "planned" : "no algorithm", p->candidates.size());
  return ok ? p : nullptr;
}

// Outer-vector scales inside cuBLASLt (bias/GELU fused) when it has an algorithm for them; else the unscaled
// FP8 product into a temporary and launch_fp8_scale_epilogue applying both scales, bias, activation and the
// residual; false when cuBLASLt has no FP8 algorithm at all.
bool GemmEngine::run_fp8(const Fp8GemmCall& call) {
  if (call.m == 0 || call.n == 0) return true;
  if (call.c_dtype != DType::BF16 && call.c_dtype != DType::F16) return false;
  DeviceGuard guard(device_);
  std::lock_guard<std::mutex> lock(mu_);
  const float alpha = 1.0f, zero = 0.0f;
  const double flops = 2.0 * double(call.m) * double(call.n) * double(call.k);
  const size_t out_bytes = size_t(call.m * call.n) * dtype_size(call.c_dtype);
  EpilogueChoice e = choose_epilogue(call.bias, call.act, call.c_dtype);
  Plan* p = plan_for_fp8(call, e.epilogue, true);
  if (!p && e.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    e = EpilogueChoice{CUBLASLT_EPILOGUE_DEFAULT, false, false};
    p = plan_for_fp8(call, e.epilogue, true);
  }
  if (p) {
    const void* a_scale = call.w_scale;
    const void* b_scale = call.x_scale;
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale));
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale));
    if (e.bias_done) {
      const void* bias = call.bias;
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    }
    const AlgoRun run = [&](const cublasLtMatmulAlgo_t& algo, size_t ws, void* out) {
      return cublasLtMatmul(lt_, p->desc, &alpha, call.w, p->a, call.x, p->b, &call.beta, out, p->c, out, p->c, &algo,
                            workspace_->data(), ws, stream_) == CUBLAS_STATUS_SUCCESS;
    };
    if (!p->tuned) tune(p, flops, call.beta != 0.0f, out_bytes, run, {});
    if (run(p->algo, p->workspace, call.c)) {
      const bool need_bias = call.bias && !e.bias_done;
      const bool need_act = call.act != UnaryOp::kIdentity && !e.act_done;
      if (need_bias || need_act)
        launch_gemm_epilogue(call.c, call.c_dtype, call.m, call.n, call.n, 1, 0, need_bias ? call.bias : nullptr,
                             need_act ? call.act : UnaryOp::kIdentity, false, 0.0f, stream_);
      ++fp8_gemm_stats().outer_vector;
      return true;
    }
  }
  Plan* u = plan_for_fp8(call, CUBLASLT_EPILOGUE_DEFAULT, false);
  if (!u) return false;
  std::shared_ptr<Buffer> raw = alloc_.allocate(out_bytes);
  const AlgoRun run = [&](const cublasLtMatmulAlgo_t& algo, size_t ws, void* out) {
    return cublasLtMatmul(lt_, u->desc, &alpha, call.w, u->a, call.x, u->b, &zero, out, u->c, out, u->c, &algo,
                          workspace_->data(), ws, stream_) == CUBLAS_STATUS_SUCCESS;
  };
  if (!u->tuned) tune(u, flops, false, out_bytes, run, {});
  if (!run(u->algo, u->workspace, raw->data())) return false;
  launch_fp8_scale_epilogue(call, raw->data(), stream_);
  ++fp8_gemm_stats().unscaled_then_epilogue;
  return true;
}

void GemmEngine::run_classic(const GemmCall& call, bool allow_tf32) {
  const int64_t cm_m = call.n, cm_n = call.m;
  const CmLayout la = cm_layout(call.b.trans, cm_m, call.k, call.b.ld);
  const CmLayout lb = cm_layout(call.a.trans, call.k, cm_n, call.a.ld);
  const CmLayout lc = cm_layout(false, cm_m, cm_n, call.ldc);
  for (int64_t v : {cm_m, cm_n, call.k, la.ld, lb.ld, lc.ld, call.batch})
    if (v > INT_MAX) throw Error(unsupported("gemm: dimension " + std::to_string(v) + " exceeds what cuBLAS takes"));
  const bool tf32 = allow_tf32 && call.a.dtype == DType::F32;
  blas_ok(cublasGemmStridedBatchedEx(blas_, call.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N, call.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     int(cm_m), int(cm_n), int(call.k), &call.alpha, call.b.ptr, cuda_type(call.b.dtype), int(la.ld),
                                     call.b.batch_stride, call.a.ptr, cuda_type(call.a.dtype), int(lb.ld), call.a.batch_stride,
                                     &call.beta, call.c, cuda_type(call.c_dtype), int(lc.ld), call.c_batch_stride, int(call.batch),
                                     tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  if (call.bias || call.act != UnaryOp::kIdentity)
    launch_gemm_epilogue(call.c, call.c_dtype, call.m, call.n, call.ldc, call.batch, call.c_batch_stride, call.bias, call.act,
                         false, 0.0f, stream_);
}

void GemmEngine::run(const GemmCall& call, bool allow_tf32) {
  if (call.m == 0 || call.n == 0 || call.batch == 0) return;
  ATELIER_CHECK(call.a.dtype == call.b.dtype, "gemm: A and B must share a dtype");
  DeviceGuard guard(device_);
  if (call.k == 0) {  // no products: C = act(beta * C + bias), as BLAS defines an empty sum
    const GemmCall c = with_c_in_copied(call);
    launch_gemm_epilogue(c.c, c.c_dtype, c.m, c.n, c.ldc, c.batch, c.c_batch_stride, c.bias, c.act, true, c.beta, stream_);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);  // plans (and the bias pointer set on a cached descriptor) are shared
  if (run_lt(call, allow_tf32)) return;
  run_classic(with_c_in_copied(call), allow_tf32);
}

// The call with a separate beta input (c_in) first copied into C, for paths that read and write C in place.
GemmCall GemmEngine::with_c_in_copied(const GemmCall& call) {
  if (!call.c_in || call.c_in == call.c) return call;
  const int64_t elems = (call.batch - 1) * call.c_batch_stride + (call.m - 1) * call.ldc + call.n;
  ATELIER_CUDA_OK(cudaMemcpyAsync(call.c, call.c_in, size_t(elems) * dtype_size(call.c_dtype), cudaMemcpyDeviceToDevice, stream_));
  GemmCall c = call;
  c.c_in = nullptr;
  return c;
}

// --- the backend op ---------------------------------------------------------------------------------------------

namespace {
int64_t leading_dim(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  return rows == 1 ? std::max<int64_t>(cols, 1) : t.strides()[t.dim() - 2];
}
}  // namespace

bool own_linear_call_fits(const GemmCall& c) {
  return c.c_dtype == DType::BF16 && c.a.dtype == DType::BF16 && c.batch == 1 && !c.a.trans && c.b.trans && c.alpha == 1.0f &&
         (c.beta == 0.0f || c.beta == 1.0f) && c.act == UnaryOp::kIdentity;
}

bool run_own_linear_call(const GemmCall& c, void* out, int cc_major, int sm_count, size_t max_smem, cudaStream_t stream) {
  if (!own_linear_call_fits(c)) return false;
  OwnGemmArgs a;
  a.x = c.a.ptr, a.ldx = c.a.ld;
  a.w = c.b.ptr, a.ldw = c.b.ld;
  a.bias = c.bias;
  a.residual = c.beta != 0.0f ? (c.c_in ? c.c_in : out) : nullptr;
  a.out = out, a.ldo = c.ldc;
  a.m = c.m, a.n = c.n, a.k = c.k;
  a.sm_count = sm_count, a.max_smem = max_smem;
  return launch_gemm_linear(a, cc_major, stream);
}

// out [B, M, N] = act(alpha * op(a) @ op(b) + beta * out + bias); a [Ba, M, K] / [Ba, K, M] (trans_a),
// b [Bb, K, N] / [Bb, N, K] (trans_b), Ba/Bb equal to B or 1; unit last strides; out contiguous.
// Operands in another dtype than out are cast to out's dtype first.
void CudaBackend::gemm(Tensor& out, const Tensor& a_in, const Tensor& b_in, const Tensor& bias_in, const GemmParams& p) {
  ATELIER_CHECK(out.is_contiguous() && out.dim() == 3, "gemm: out must be contiguous [B, M, N]");
  NvtxRange range("gemm");
  const DType dt = out.dtype();
  const Tensor a = as_dtype(a_in, dt), b = as_dtype(b_in, dt), bias = as_dtype(bias_in, dt);
  ATELIER_CHECK(a.strides()[2] == 1 || a.size(2) == 1, "gemm: a needs a unit last stride");
  ATELIER_CHECK(b.strides()[2] == 1 || b.size(2) == 1, "gemm: b needs a unit last stride");
  GemmCall c;
  c.batch = out.size(0);
  c.m = out.size(1);
  c.n = out.size(2);
  c.k = p.trans_a ? a.size(1) : a.size(2);
  c.a = {a.raw(), dt, leading_dim(a), a.size(0) == 1 ? 0 : a.strides()[0], p.trans_a};
  c.b = {b.raw(), dt, leading_dim(b), b.size(0) == 1 ? 0 : b.strides()[0], p.trans_b};
  c.c = out.raw();
  c.c_dtype = dt;
  c.ldc = c.n;
  c.c_batch_stride = c.m * c.n;
  c.alpha = p.alpha;
  c.beta = p.beta;
  if (p.addend.defined()) {
    ATELIER_CHECK(p.addend.is_contiguous() && p.addend.shape() == out.shape() && p.addend.dtype() == dt,
                  "gemm: the addend must be contiguous with out's shape and dtype");
    c.c_in = p.addend.raw();
  }
  c.bias = bias.defined() ? bias.raw() : nullptr;
  c.act = p.epilogue;
  if (own_linear_takes(c.beta != 0.0f)) {  // forced (ATELIER_OWN_LINEAR=1|residual); else timed in GemmEngine
    DeviceGuard guard(index_);
    if (run_own_linear_call(c, c.c, cc_major_, sm_count_, max_smem_optin_, stream_)) return;
  }
  run_gemm(c);
}

// The gated linear unit inside its product (cuda_gemm_wgmma.cu's fused kernel); an undefined tensor where the kernel
// does not take the case (the caller then runs the product and the glu pass).
Tensor CudaBackend::linear_glu(const Tensor& x, const Tensor& w, const Tensor& bias, UnaryOp act) {
  if (!fused_glu_enabled() || x.dtype() != DType::BF16 || w.dtype() != DType::BF16 || !x.is_contiguous() || !w.is_contiguous() ||
      (bias.defined() && (bias.dtype() != DType::BF16 || !bias.is_contiguous())))
    return Tensor();
  NvtxRange range("linear_glu");
  DeviceGuard guard(index_);
  Shape shape = x.shape();
  shape.back() = w.size(0) / 2;
  Tensor out = Tensor::empty(shape, DType::BF16, device());
  OwnGemmArgs a;
  a.x = x.data<__nv_bfloat16>();
  a.w = w.data<__nv_bfloat16>();
  a.bias = bias.defined() ? bias.data<__nv_bfloat16>() : nullptr;
  a.out = out.data<__nv_bfloat16>();
  a.m = x.numel() / x.size(-1), a.k = x.size(-1), a.n = shape.back();
  a.ldx = a.k, a.ldw = a.k, a.ldo = a.n;
  a.act = act;
  a.sm_count = sm_count_;
  a.max_smem = max_smem_optin_;
  return launch_gemm_glu(a, cc_major_, stream_) ? out : Tensor();
}

}  // namespace atelier::cuda
