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
// Environment: ATELIER_CUDNN_GRAPH=0 switches the path off (set_conv_graph_enabled at run time);
// ATELIER_CUDNN_AUTOTUNE=0 takes the first plan that finalizes instead of timing them; ATELIER_CUDNN_LOG=1
// prints one line per planned shape (candidates, the engine chosen, its time) to stderr.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
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
};
ConvGraphStats conv_graph_stats();

// Whether the graph path is tried (default on; ATELIER_CUDNN_GRAPH=0 starts it off). Cached plans stay.
bool conv_graph_enabled();
void set_conv_graph_enabled(bool on);
// Whether plans are timed (default on; ATELIER_CUDNN_AUTOTUNE=0 takes the heuristics' first plan).
bool conv_graph_autotune();

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
  bool forward(void* y, const void* x, const void* w, DType dtype, const ConvShape& s, const Conv2dParams& p,
               DeviceAllocator& alloc);

 private:
  struct Plan;
  using Key = std::array<int64_t, 16>;
  // The cached plan of a shape, planning it on first use; null when it has none (remembered) or when the
  // stream is capturing and the shape is new (not remembered).
  Plan* plan_for(const Key& key, void* y, const void* x, const void* w, DType dtype, const ConvShape& s,
                 const Conv2dParams& p, DeviceAllocator& alloc);

  const CudnnGraphApi* api_ = nullptr;
  void* handle_ = nullptr;  // cudnnHandle_t
  cudaStream_t stream_;
  std::string why_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace atelier::cuda
