// FP8 (e4m3) attention through cuDNN's fused FP8 flash attention (Hopper, cuDNN >= 9.1). cuDNN 9.19's unified
// SDPA node (cuda_sdpa.h) takes no FP8 scales, so this builds the operation graph that cuDNN recognises as
// FP8 attention out of primitive nodes, as cuDNN's own frontend does for `sdpa_fp8`:
//
//   S = (Q8 K8^T) * scale * descale_q * descale_k         (matmul, three pointwise MULs)
//   P = softmax(S)                                          (MAX, SUB, EXP, ADD reduction, LOG + ADD: the
//                                                            log-sum-exp statistics, DIV)
//   amax_s = max|P|;  P8 = e4m3(P * scale_s)                (AMAX reduction, MUL into an FP8 virtual tensor)
//   O' = (P8 V8) * descale_s * descale_v;  amax_o = max|O'| (matmul, two MULs, AMAX)
//   O8 = e4m3(O' * scale_o)
//
// The statistics are tried in three forms until cuDNN's heuristics offer an engine (virtual, as the frontend
// builds inference graphs; left out; written to memory, as training graphs do): this was written without a GPU
// at hand, and ATELIER_CUDNN_LOG=1 says which form planned and why the others did not.
//
// Inside cuDNN's kernel this is an online softmax: P is exp(S - running max) taken through e4m3 before the
// final normalisation, so results differ from an f32 attention of the same Q8/K8/V8 by P's and O's e4m3
// rounding (2^-4 relative per element). On Hopper the output is FP8 only (bf16 output needs Blackwell).
//
// The scalars (descales, scales, the two amax outputs) are device floats, so a step replays as a CUDA graph
// with no host value: see Fp8AttentionScalars. Plans are made once per shape at its first eager call (the
// heuristics' first plans timed in turns); a shape met first during a capture is declined for that call.
// Anything cuDNN declines answers false with the reason, and the caller runs 16-bit attention instead.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "backend/cuda/cuda_allocator.h"
#include "core/tensor.h"

namespace atelier::cuda {

struct CudnnGraphApi;

// The device scalars of one FP8 attention, in one buffer of kCount * kStride floats: each slot 16 bytes
// apart (every graph tensor is declared 16-byte aligned).
struct Fp8AttentionScalars {
  enum Slot : int {
    kAmaxQ, kAmaxK, kAmaxV,              // per-tensor amax of the 16-bit q, k, v (quantization)
    kDescaleQ, kDescaleK, kDescaleV,     // f8e4m3_scale(amax): x = x8 * descale
    kDescaleS, kScaleS,                  // P's scale into e4m3 (448) and back
    kScaleO, kDescaleO,                  // O's scale into e4m3 and back
    kAmaxS, kAmaxO,                      // written by cuDNN (the pattern has them); unused here
    kCount
  };
  static constexpr int kStride = 4;
  static constexpr size_t bytes() { return size_t(kCount) * kStride * sizeof(float); }
  static __host__ __device__ float* at(float* base, Slot s) { return base + int(s) * kStride; }
  static __host__ __device__ const float* at(const float* base, Slot s) { return base + int(s) * kStride; }
};

struct SdpaFp8Stats {
  int64_t planned = 0;   // shapes planned
  int64_t declined = 0;  // shapes cuDNN could not plan (or failed to run)
  int64_t runs = 0;      // FP8 attentions executed by cuDNN
};
SdpaFp8Stats sdpa_fp8_stats();

class CudnnSdpaFp8 {
 public:
  // library: cuDNN's dlopen handle; handle: the device's cudnnHandle_t, bound to `stream`. Neither is owned.
  CudnnSdpaFp8(void* library, void* handle, cudaStream_t stream);
  ~CudnnSdpaFp8();
  bool available() const { return api_ != nullptr; }
  const std::string& why_unavailable() const { return why_; }

  // o8 [B, H, Sq, D] = e4m3(scale_o * attention of q8 [B, H, Sq, D], k8 [B, H, Sk, D], v8 [B, H, Sk, D]), all
  // f8e4m3 with unit last strides (any other strides, 16-byte aligned), with the scalars at `scalars`
  // (Fp8AttentionScalars: the descales, scale_s and scale_o already written on the stream). True when cuDNN
  // enqueued it; false (with *why) when it declines: nothing was written to o8.
  bool forward(Tensor& o8, const Tensor& q8, const Tensor& k8, const Tensor& v8, float scale, float* scalars,
               DeviceAllocator& alloc, std::string* why);
  // Whether a call with q [B, H, Sq, D] and k [B, H, Sk, D] was declined before (then the caller need not
  // quantize anything for it).
  bool declined_before(const Tensor& q, const Tensor& k);

 private:
  struct Plan;
  using Key = std::array<int64_t, 17>;        // shape and the four operands' strides
  using Shape5 = std::array<int64_t, 5>;     // (B, H, Sq, Sk, D)
  static Shape5 shape_of(const Tensor& q, const Tensor& k) { return {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)}; }
  Plan* plan_for(const Key& key, Tensor& o8, const Tensor& q8, const Tensor& k8, const Tensor& v8, float scale,
                 float* scalars, DeviceAllocator& alloc);

  const CudnnGraphApi* api_ = nullptr;
  void* handle_ = nullptr;  // cudnnHandle_t
  cudaStream_t stream_;
  std::string why_;
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::set<Shape5> declined_;
};

}  // namespace atelier::cuda
