// Attention through cuDNN's fused SDPA operation (the graph API's CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR,
// cuDNN >= 9.13.1: one node over Q, K, V and O, the softmax scale passed by value). On Hopper this reaches
// cuDNN's wgmma/TMA flash-attention kernels: PyTorch's SDPA measured 269-652 TFLOP/s on the H200 where our
// mma.sync kernel (cuda_attention.cu) reached 172-264 (2026-11-29, docs/performance.md).
//
// Which one runs is measured, per shape, as convolutions are (cuda_conv_graph.h): at a shape's first eager call
// the heuristics' first plans and our flash kernel are each timed on the real buffers and the faster is kept.
// Scope: bf16/f16, no mask (the unified node takes masks only in later releases), head dims of q and v equal,
// any strides with a unit last stride, 16-byte aligned. Anything else, or any cuDNN failure, answers false
// and the caller runs its own kernel, so a failure here costs speed, never a result.
//
// CUDA graph capture: a shape met for the first time while the stream is being recorded is not planned (no
// timing during a capture) and runs on our kernel; cached plans only enqueue kernels.
//
// Each shape's choice (our kernel, or cuDNN's configuration: its place in the heuristics' list and its engine) is
// also kept on disk for later processes (backend/choice_store.h). A shape that our kernel won then runs on it
// without building a cuDNN graph. One that cuDNN won restores the plan from the serialized form kept beside the
// choice (runtime-compiled engines are not compiled again), else finalizes only the configuration chosen
// (cudnn_graph::stored_candidate); either way it times nothing.
//
// Environment: ATELIER_CUDNN_SDPA=0 switches the path off; ATELIER_CUDNN_LOG=1 prints one line per planned
// shape (plans, engine, times of cuDNN and of our kernel, the choice) to stderr.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/choice_store.h"
#include "backend/cuda/cuda_allocator.h"
#include "core/tensor.h"

namespace atelier::cuda {

struct CudnnGraphApi;

// Process-wide counters (all devices), for tests, benchmarks and diagnostics.
struct SdpaStats {
  int64_t cudnn_shapes = 0;  // shapes planned where cuDNN was chosen
  int64_t ours_shapes = 0;   // shapes planned where our kernel measured faster
  int64_t declined = 0;      // shapes cuDNN could not plan (or failed to run)
  int64_t runs = 0;          // attention calls executed by cuDNN
  int64_t timed = 0;         // shapes whose plans (and our kernel) were timed
  int64_t from_store = 0;    // shapes that took an earlier process's choice, untimed
  int64_t deserialized = 0;  // of those on cuDNN, plans restored from their serialized form (nothing finalized)
};
SdpaStats sdpa_stats();

// Whether cuDNN's attention paths may be used (ATELIER_CUDNN_SDPA=0 switches both the SDPA node and the FP8
// graph off).
bool cudnn_sdpa_enabled();
// The [B, H, S, D] strides of an attention operand as cuDNN's graphs take them: size-1 dims get the stride of
// a packed layout (never used to address, but cuDNN checks that the layout is a permutation of a packed one).
std::array<int64_t, 4> sdpa_strides(const Tensor& t);
// "bf16 q[B,H,S,D] kv[Hk,Sk,D]": a shape in the ATELIER_CUDNN_LOG lines.
std::string sdpa_shape_text(const Tensor& q, const Tensor& k);

class CudnnSdpa {
 public:
  // library: cuDNN's dlopen handle; handle: the device's cudnnHandle_t, bound to `stream`; choices: the backend's
  // store of choices kept across processes (null: none). None is owned.
  CudnnSdpa(void* library, void* handle, cudaStream_t stream, ChoiceStore* choices);
  ~CudnnSdpa();
  bool available() const { return api_ != nullptr; }
  const std::string& why_unavailable() const { return why_; }

  // out [B, H, Sq, D] (unit last stride; heads may be merged) = softmax(scale * q k^T) v for q [B, H, Sq, D], k/v [B, Hk, Sk, D] (H % Hk
  // == 0, unit last strides), one 16-bit dtype. `ours` enqueues our kernel on the same buffers (false when it
  // cannot); null forces cuDNN (tests). Returns true when cuDNN enqueued the attention; false: the caller runs
  // its own kernel (nothing enqueued, or only timing runs whose output the caller overwrites).
  bool forward(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale, DeviceAllocator& alloc,
               const std::function<bool()>& ours);

 private:
  struct Plan;
  using Key = std::array<int64_t, 20>;
  Plan* plan_for(const Key& key, Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                 DeviceAllocator& alloc, const std::function<bool()>& ours);
  // *graph_built: whether plan.graph was built (and built well) on the way, so that a caller planning afresh reuses it.
  bool take_kept(Plan& plan, const Key& key, int64_t stored, const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                 bool* graph_built);
  void keep_choice(const Plan& plan, const Key& key);

  const CudnnGraphApi* api_ = nullptr;
  void* handle_ = nullptr;  // cudnnHandle_t
  cudaStream_t stream_;
  std::string why_;
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  ChoiceStore* choices_ = nullptr;  // earlier processes' choices, for this card, driver, cuDNN and binary
};

}  // namespace atelier::cuda
