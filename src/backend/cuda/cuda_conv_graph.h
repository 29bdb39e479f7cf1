// Convolution through cuDNN's graph (backend) API, the way PyTorch reaches cuDNN's fast kernels: an operation
// graph with one convolution-forward node over channels-last tensors, engine configurations from cuDNN's
// heuristics (mode A, best first; FALLBACK's only when A gives nothing usable), execution plans for A's first
// few configurations that finalize, and, as cudnn.benchmark does, each plan timed once per shape on the real
// buffers (CUDA events) with the fastest kept (within a planning budget of 3 s a shape).
// Why: the legacy descriptor API (ConvEngine's other path) reached 97-402 TFLOP/s on SD's bf16 3x3
// convolutions on an H200 where PyTorch, through graph-API plans, reaches 328-495 (2026-11-29).
//
// Scope: bf16/f16 data, f32 accumulation, NHWC buffers, groups 1, 2-D, cross-correlation. f32 stays on the
// legacy path (its strict-f32 filter is proven there). Anything this path cannot plan or run answers false
// and the caller takes the legacy path, so a failure here costs speed, never a result.
//
// CUDA graph capture: a shape met for the first time while the stream is being recorded is declined (no
// planning, timing or synchronisation during a capture) and planned at its next eager call; executing a
// cached plan during a capture only enqueues kernels.
//
// Fused epilogue: a convolution's bias and a residual addend can be pointwise nodes after the convolution
// node, so cuDNN adds them before its kernel stores the output (no separate pass over y, no second launch).
// Only precompiled engines are taken (runtime-compiled ones cost about a second each at the first call). Each
// shape's fused plan is timed against the plain plan plus the separate pass, and kept only when faster
// (ConvFusedEpilogue::kAuto) and when its result is the separate pass's to rounding (checked once per shape,
// at planning).
//
// Environment: ATELIER_CUDNN_GRAPH=0 switches the path off (set_conv_graph_enabled at run time);
// ATELIER_CONV_FUSED_EPILOGUE=0 never fuses the epilogue, =force fuses it wherever a plan passes the check;
// ATELIER_CUDNN_AUTOTUNE=0 takes the first plan that finalizes instead of timing them; ATELIER_CUDNN_LOG=1
// prints one line per planned shape (candidates, the engine chosen, its time) to stderr.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_conv.h"

namespace atelier::cuda {

struct CudnnGraphApi;

// Process-wide counters of the graph path (all devices), for tests and diagnostics.
struct ConvGraphStats {
  int64_t plans = 0;     // shapes planned (an execution plan chosen)
  int64_t declined = 0;  // shapes without a usable plan (they run on the legacy path)
  int64_t autotuned = 0; // shapes whose plan was chosen by timing more than one candidate
  int64_t runs = 0;      // convolutions executed through a graph-API plan
  int64_t fused_plans = 0;     // shapes whose bias/addend run inside cuDNN's kernel
  int64_t fused_declined = 0;  // shapes whose epilogue runs as a separate pass (no plan, slower, or different)
  int64_t fused_runs = 0;      // convolutions executed with a fused epilogue
  int64_t from_store = 0;      // shapes planned from an earlier process's choice (ConvGraph::keep_choices_in), untimed
  int64_t deserialized = 0;    // of those, plans restored from their serialized form (nothing finalized)
};
ConvGraphStats conv_graph_stats();

// Whether the graph path is tried (default on; ATELIER_CUDNN_GRAPH=0 starts it off). Cached plans stay.
bool conv_graph_enabled();
void set_conv_graph_enabled(bool on);
// Whether plans are timed (default on; ATELIER_CUDNN_AUTOTUNE=0 takes the heuristics' first plan).
bool conv_graph_autotune();

// Whether a convolution's bias and addend may run inside cuDNN's kernel: never, when it measures faster than
// the plain plan plus the separate pass (the default), or wherever a plan gives the separate pass's result
// (tests).
enum class ConvFusedEpilogue { kOff, kAuto, kForce };
ConvFusedEpilogue conv_fused_epilogue();
void set_conv_fused_epilogue(ConvFusedEpilogue mode);

// y = conv + bias[o] + addend, inside cuDNN's kernel. bias: [O] of bias_dtype, or null; addend: of y's dtype
// and layout (a residual), not overlapping y, or null. Not a per-sample addend (the resnets' time embedding,
// [N, O, 1, 1] broadcast with N > 1): cuDNN 9's fused engines on the H200 returned wrong sums for it described
// with dims of 1, faulted with stride-0 dims, and offered no plan for [N, O, H, W] with stride 0 (session 22).
// At a shape's planning the fused plan is timed against a plain convolution followed by `separate` (which
// enqueues the same bias + addend as a pass over y), and its result is checked by `agrees` (given a buffer of
// y's shape and dtype: whether it equals y, as the separate pass left it, to rounding; synchronises).
struct ConvEpilogue {
  const void* bias = nullptr;
  DType bias_dtype = DType::F32;
  const void* addend = nullptr;
  std::function<void()> separate;
  std::function<bool(const void*)> agrees;
};

class ConvGraph {
 public:
  // library: cuDNN's dlopen handle (the backend functions are looked up in it); handle: the device's
  // cudnnHandle_t, already bound to `stream`. Neither is owned.
  ConvGraph(void* library, void* handle, cudaStream_t stream);
  ~ConvGraph();
  bool available() const { return api_ != nullptr; }
  const std::string& why_unavailable() const { return why_; }

  // Enqueues y [n, ho, wo, o] = conv(x [n, h, w, c], w [o, kh, kw, c]) (no bias), dtype BF16 or F16, all
  // contiguous. Returns false (nothing enqueued) when this path does not take the case; the caller then runs
  // the legacy path. Not thread-safe: the caller (ConvEngine) serialises calls.
  // With `epilogue`, y = conv + bias + addend in one plan; false when that shape has no fused plan that this
  // path keeps (the caller then runs the plain convolution and its separate pass).
  bool forward(void* y, const void* x, const void* w, DType dtype, const ConvShape& s, const Conv2dParams& p,
               DeviceAllocator& alloc, const ConvEpilogue* epilogue = nullptr);
  // Each shape's timed answer (the plan chosen; a fused epilogue not kept) is also kept in `store` (not owned;
  // null: this process only), and an earlier process's answer is taken there: only that plan is finalized,
  // nothing is timed (a kept fused plan's result is still checked against the separate pass).
  void keep_choices_in(ChoiceStore* store) { choices_ = store; }
  // Restores one kept convolution plan from its serialized form on `handle` (a cudnnHandle_t of the caller's: the
  // start-up thread runs beside the engine's use of its own), so that cuDNN's one-time costs of restoring a plan are
  // not paid by the process's first convolution. The plan is kept to the end (releasing it could unload a module
  // during another thread's graph capture). False when the store keeps no such plan or cuDNN refuses it.
  bool warm_up(void* handle);

 private:
  struct Plan;
  struct WarmPlan;
  using Key = std::array<int64_t, 18>;
  // The cached plan of a shape (with `epilogue`'s operands, when it has any), planning it on first use; null
  // when it has none (remembered) or when the stream is capturing and the shape is new (not remembered).
  Plan* plan_for(void* y, const void* x, const void* w, DType dtype, const ConvShape& s,
                 const Conv2dParams& p, DeviceAllocator& alloc, const ConvEpilogue* epilogue);
  // Whether the fused plan `fused` (just chosen for its key) is kept: faster than the plain plan plus the
  // separate pass (kAuto, unless `timed` is false: an earlier process measured it), and the same result.
  // Synchronises (planning only); *why says why not.
  enum class FusedVerdict { kKeep, kSlower, kDiffers, kNotCompared };
  FusedVerdict keep_fused(Plan& fused, void* y, const void* x, const void* w, DType dtype, const ConvShape& s,
                          const Conv2dParams& p, DeviceAllocator& alloc, const ConvEpilogue& epilogue, bool timed,
                          std::string* why);

  const CudnnGraphApi* api_ = nullptr;
  void* handle_ = nullptr;  // cudnnHandle_t
  cudaStream_t stream_;
  std::string why_;
  ChoiceStore* choices_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::unique_ptr<WarmPlan> warm_plan_;  // warm_up's plan
};

}  // namespace atelier::cuda
