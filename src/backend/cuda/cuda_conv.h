// Convolution through cuDNN, loaded at run time with dlopen: a machine
// without cuDNN (or with another major version) still runs every model through the im2col + GEMM path
// (CudaBackend::conv2d_im2col), and the binary has no link-time dependency on cuDNN.
// Search order: $ATELIER_CUDNN_LIBRARY, then libcudnn.so.9 on the loader's path; ATELIER_CUDNN=0 disables it.
// Algorithms come from cuDNN's heuristics (cudnnGetConvolutionForwardAlgorithm_v7), or from timing them
// once per shape (cudnnFindConvolutionForwardAlgorithmEx) when ATELIER_CUDNN_FIND=1. In strict f32 mode
// (no TF32) only FMA-math GEMM-family algorithms are taken, whose results match the CPU to f32 rounding.
// Channels-last bf16/f16 convolutions first try cuDNN's graph API (ConvGraph, cuda_conv_graph.h: heuristics
// mode A plus timing of the candidate plans, as PyTorch's cudnn.benchmark does); what it declines, and
// everything else, runs through the legacy descriptor API above.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/choice_store.h"
#include "backend/cuda/cuda_allocator.h"

namespace atelier::cuda {

struct CudnnApi;
class ConvGraph;
struct ConvEpilogue;

// Shapes of one convolution: x [n, c, h, w], w [o, c/groups, kh, kw], y [n, o, ho, wo].
struct ConvShape {
  int64_t n, c, h, w, o, kh, kw, ho, wo;
};

// A 1x1 kernel, stride 1, no padding: the convolution multiplies its input's pixels (as rows) by the weights, with
// no im2col matrix (the GEMM paths read x itself).
inline bool multiplies_input(int64_t kh, int64_t kw, const Conv2dParams& p) {
  return kh == 1 && kw == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0;
}

struct OwnConvArgs;

// The conv choices' name of the own kernel's split-K candidate of `split` parts (kept for the process: the names
// are the choices' keys and their logs' words; cuda_conv.cu).
const char* split_candidate_name(int split);
// Appends the own kernel's split-K forms for `a` (conv_implicit_splits; none where own_conv_split() is 1) to a timed
// choice's candidates, each `own(split)`, and their names; returns their part counts in that order.
std::vector<int> add_split_candidates(const OwnConvArgs& a, const std::function<bool(int)>& own,
                                      std::vector<std::function<bool()>>& candidates, std::vector<const char*>& names);
// A timed choice's log words: "name t ms, name t ms, ...".
std::string candidate_times(const std::vector<float>& ms, const std::vector<const char*>& names);
// The candidates' names as part of a timed choice's key ("a;b;..."): its answer is an index into that list, and the
// switches change which paths the list holds.
std::string candidate_names_key(const std::vector<const char*>& names);

// Loads cuDNN's engine libraries (which cuDNN itself opens at its first plan: ~0.07 s, session 65) from the folder
// that cuDNN was loaded from, so that a start-up thread pays for them; nothing where cuDNN did not load.
void load_cudnn_engine_libraries();

class ConvEngine {
 public:
  ConvEngine(int device, cudaStream_t stream);
  ~ConvEngine();
  bool available() const { return api_ != nullptr; }
  // cuDNN's version and the path bf16/f16 channels-last convolutions take, e.g. "9.14.0 (graph API,
  // autotuned; legacy API for f32)" or "9.14.0 (legacy API)".
  std::string version() const;
  const std::string& why_unavailable() const { return why_; }
  // cuDNN's dlopen handle and this device's cudnnHandle_t (bound to the stream), for the other graph-API
  // paths (cuda_sdpa.h); null when cuDNN did not load.
  void* library() const;
  void* handle() const { return handle_; }
  // Enqueues y = conv(x, w) (no bias). Returns false when cuDNN has no algorithm for the case, so that the
  // caller takes another path; throws on a failed launch.
  // nhwc: x [n, h, w, c], w [o, kh, kw, c], y [n, ho, wo, o] (channels last) instead of NCHW; bf16/f16
  // ungrouped cases then try the graph API first (unless conv_graph_enabled() is off).
  bool forward(void* y, const void* x, const void* w, DType dtype, const ConvShape& s, const Conv2dParams& p, bool strict_f32,
               DeviceAllocator& alloc, bool nhwc = false);
  // Enqueues channels-last y = conv(x, w) + the epilogue's bias and addend in one cuDNN plan (graph API only).
  // Returns false, enqueuing nothing, when that path keeps no fused plan for the case: the caller then runs
  // forward() and the epilogue as its own pass.
  bool forward_fused(void* y, const void* x, const void* w, DType dtype, const ConvShape& s, const Conv2dParams& p,
                     DeviceAllocator& alloc, const ConvEpilogue& epilogue);
  // The graph path's plan choices are also kept in `store` (not owned; null: this process only).
  void keep_choices_in(ChoiceStore* store);
  // cuDNN's one-time costs of restoring a kept plan, paid ahead on a handle of the engine's own (ConvGraph::warm_up);
  // safe beside the engine's use from another thread. False when nothing was restored.
  bool warm_up();

 private:
  struct Plan;
  using Key = std::array<int64_t, 20>;
  Plan* plan_for(const ConvShape& s, const Conv2dParams& p, DType dtype, bool strict_f32, void* y, const void* x, const void* w,
                 DeviceAllocator& alloc, bool nhwc);

  int device_;
  cudaStream_t stream_;
  const CudnnApi* api_ = nullptr;
  void* handle_ = nullptr;       // cudnnHandle_t
  void* warm_handle_ = nullptr;  // warm_up's, made there; like handle_, it lives as long as the process
  std::string version_, why_;
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::unique_ptr<ConvGraph> graph_;  // null when cuDNN did not load
};

}  // namespace atelier::cuda
