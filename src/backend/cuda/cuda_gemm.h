// Matrix products on the GPU through cuBLASLt: row-major operands mapped onto cuBLAS's column-major
// convention, bias and (where cuBLASLt offers it) activation fused into the epilogue, alpha/beta for the
// residual, strided batches (a zero batch stride broadcasts an operand). Plans (descriptors + the heuristic's
// algorithm) are cached per shape; when cuBLASLt has no algorithm for a case (odd alignments), the classic
// cublasGemmStridedBatchedEx runs instead and a small kernel applies bias and activation.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <array>
#include <atomic>

#include "backend/backend.h"
#include "backend/choice_store.h"
#include "backend/cuda/cuda_allocator.h"

namespace atelier::cuda {

// One operand of a row-major product: element (r, c) of the stored matrix is ptr[r * ld + c]; `trans` uses
// it transposed. Batch entry i starts batch_stride elements further (0: the same matrix for every entry).
struct GemmOperand {
  const void* ptr = nullptr;
  DType dtype = DType::F32;
  int64_t ld = 0;
  int64_t batch_stride = 0;
  bool trans = false;
};

// C[i] (m x n, row-major, ldc) = act(alpha * op(A[i]) @ op(B[i]) + beta * C[i] + bias) for i < batch.
// A and B share a dtype; C may be f32 with 16-bit A/B. bias [n] has C's dtype (or is null).
struct GemmCall {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  GemmOperand a, b;
  void* c = nullptr;
  const void* c_in = nullptr;  // beta's term reads this (C's layout) instead of C when set; C is then only written
  DType c_dtype = DType::F32;
  int64_t ldc = 0;
  int64_t c_batch_stride = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* bias = nullptr;
  UnaryOp act = UnaryOp::kIdentity;
};

// One FP8 product (ops::linear_fp8): C [m, n] row-major (ldc = n) =
// act(x_scale[i] * w_scale[j] * sum_k X[i, k] W[j, k] + bias[j] + beta * C[i, j]); X [m, k] and W [n, k]
// e4m3 row-major (row strides ldx, ldw); C and bias bf16 or f16.
struct Fp8GemmCall {
  int64_t m = 0, n = 0, k = 0;
  const void* x = nullptr;
  int64_t ldx = 0;
  const void* w = nullptr;
  int64_t ldw = 0;
  const float* x_scale = nullptr;  // [m]
  const float* w_scale = nullptr;  // [n]
  void* c = nullptr;
  DType c_dtype = DType::BF16;
  float beta = 0.0f;
  const void* bias = nullptr;
  UnaryOp act = UnaryOp::kIdentity;
};

// How FP8 products ran (cumulative, all devices): cuBLASLt with outer-vector scales; cuBLASLt unscaled plus
// launch_fp8_scale_epilogue; both operands dequantized and the ordinary GEMM; one-row products by
// launch_gemv_fp8 (cuda_fp8.cu); how many carried an adaLN gate.
struct Fp8GemmStats {
  std::atomic<int64_t> outer_vector{0}, unscaled_then_epilogue{0}, dequantized{0}, gemv{0};
  std::atomic<int64_t> gated{0};  // products with an adaLN gate folded in (CudaBackend::gemm_fp8_gated), also counted above
};
Fp8GemmStats& fp8_gemm_stats();

// C = act(raw[i, j] * x_scale[i] * w_scale[j] + bias[j] + beta * C) over call's [m, n] output, raw [m, n] in
// C's dtype (the unscaled FP8 product); in cuda_fp8.cu.
void launch_fp8_scale_epilogue(const Fp8GemmCall& call, const void* raw, cudaStream_t stream);
// The one-row FP8 product (adaLN modulation GEMVs) by a kernel of ours: false where it does not take the call
// (in cuda_fp8.cu).
bool launch_gemv_fp8(const Fp8GemmCall& call, cudaStream_t stream);

class GemmEngine {
 public:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper
  GemmEngine(int device, cudaStream_t stream, DeviceAllocator& alloc);
  ~GemmEngine();
  // Enqueues the product on the stream. allow_tf32 applies to f32 operands only.
  void run(const GemmCall& call, bool allow_tf32);
  // Enqueues an FP8 product with row-wise (outer-vector) scales on Hopper's FP8 tensor cores; false when
  // cuBLASLt has no algorithm for it (before sm_90, odd alignments): the caller then computes it otherwise.
  bool run_fp8(const Fp8GemmCall& call);
  // A kernel of our own as one more candidate when a plan is timed: it enqueues `call` with its output at `out`,
  // false where it does not take the call (run_own_linear_call). Plans where it measured fastest run it.
  using OwnRun = std::function<bool(const GemmCall& call, void* out)>;
  void set_own_kernel(OwnRun run) { own_ = std::move(run); }
  // Tuned answers are also kept in `store` (not owned; null: this process only) and taken from it untimed
  // (backend/choice_store.h). Set before the first product.
  void keep_choices_in(ChoiceStore* store) { choices_ = store; }
  // Shapes whose candidates this engine timed, and shapes that took a stored answer instead (tests, diagnostics).
  struct TuneCounts {
    int64_t timed = 0, from_store = 0;
  };
  TuneCounts tune_counts() const { return {timed_.load(), from_store_.load()}; }
  // Pays cuBLASLt's one-time costs (its heuristics' first query, its first kernel's loading) ahead of the first real
  // product: one small bf16 product with a bias epilogue on a stream and buffers of its own, waited for. The
  // backend's start-up thread calls it while the weights load; a real product meanwhile waits for it (the engine's
  // lock). False when something failed (the first real product then pays as before).
  bool warm_up();

 private:
  struct Plan;
  using Key = std::array<int64_t, 20>;
  // Runs the plan's product with algorithm `algo` (workspace `ws` bytes) into `out`; false on a cuBLAS error.
  using AlgoRun = std::function<bool(const cublasLtMatmulAlgo_t& algo, size_t ws, void* out)>;
  // The cached plan for `call` with cuBLASLt epilogue `epilogue` (null when cuBLASLt has no algorithm).
  Plan* plan_for(const GemmCall& call, bool allow_tf32, int epilogue);
  // outer_vec: cuBLASLt applies the row scales (OUTER_VEC_32F modes); else the raw e4m3 product.
  Plan* plan_for_fp8(const Fp8GemmCall& call, int epilogue, bool outer_vec);
  // Asks cuBLASLt's heuristics for the plan's candidate algorithms (operands aligned to the given bytes);
  // false when there is none.
  bool choose_algorithms(Plan* p, uint32_t align_a, uint32_t align_b, uint32_t align_c);
  bool run_lt(const GemmCall& call, bool allow_tf32);
  // Picks the fastest of the plan's candidate algorithms by timing them once on an output of `out_bytes`
  // (ATELIER_GEMM_AUTOTUNE=0: the heuristics' first); nothing is timed while the stream is being captured.
  // residual: the product accumulates into C (beta != 0), which has its own size threshold.
  // own: the own kernel's run into an output (empty where it is not a candidate), timed from a lower size on.
  void tune(Plan* p, double flops, bool residual, size_t out_bytes, const AlgoRun& run, const std::function<bool(void*)>& own);
  void run_classic(const GemmCall& call, bool allow_tf32);
  // The call with its separate beta input (c_in) copied into C first (enqueued), for the paths that read C in place.
  GemmCall with_c_in_copied(const GemmCall& call);

  int device_;
  cudaStream_t stream_;
  DeviceAllocator& alloc_;  // scratch outputs for timing
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::shared_ptr<Buffer> workspace_;
  void* warm_up_memory_ = nullptr;  // warm_up's operands (cudaMalloc)
  OwnRun own_;
  ChoiceStore* choices_ = nullptr;
  std::atomic<int64_t> timed_{0}, from_store_{0};
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<Key, std::unique_ptr<Plan>> fp8_plans_;
};

// The product on the own linear kernel (cuda_gemm_wgmma.cu) with its output at `out` (the residual, beta = 1, read
// from c_in, else from out): bf16, one batch, a row-major [m, k] x times a [n, k] weight, no activation, alpha 1,
// beta 0 or 1; false (nothing enqueued) where it does not take the call.
bool run_own_linear_call(const GemmCall& c, void* out, int cc_major, int sm_count, size_t max_smem, cudaStream_t stream);
// Whether the call has that form (the kernel may still decline its shapes, alignments or device).
bool own_linear_call_fits(const GemmCall& c);

// Which parts of act(product + bias) a cuBLASLt epilogue does: bias and ReLU always, the tanh GELU for 16-bit
// outputs; the rest (unaligned bias, other activations) is left to launch_gemm_epilogue.
struct EpilogueChoice {
  int epilogue = 0;  // cublasLtEpilogue_t
  bool bias_done = false, act_done = false;
};
EpilogueChoice choose_epilogue(const void* bias, UnaryOp act, DType c_dtype);

// Largest power of two (at most 256) that divides the address and the byte strides of an operand:
// what cuBLASLt's MIN_ALIGNMENT preferences need so that it never picks a kernel the operand cannot feed.
uint32_t gemm_alignment(const void* p, int64_t ld, int64_t batch_stride, size_t elem_bytes);

// act(scale(C) + bias) in place over a strided batch of row-major matrices: the epilogue for products whose
// activation cuBLASLt does not fuse, and the whole result when k == 0 (beta_only: C = beta * C first).
void launch_gemm_epilogue(void* c, DType dtype, int64_t m, int64_t n, int64_t ldc, int64_t batch, int64_t batch_stride,
                          const void* bias, UnaryOp act, bool beta_only, float beta, cudaStream_t stream);

}  // namespace atelier::cuda
