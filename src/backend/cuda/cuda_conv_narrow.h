// Channels-last 16-bit convolutions with few output channels (SD's conv_out: 320 -> 4, the VAE's 128 -> 3) or few
// input channels (the latents into conv_in: 4 -> 320, the VAE decoder's 4 -> 512) on mma.sync tensor cores, one warp
// per 16 output pixels (cuda_conv_narrow.cu).
//
// Why: the general paths tile the product's narrow side to 128 columns (cuDNN, the own kernel) or build an im2col
// matrix (the GEMM path): at 16 rows conv_out took 70 us on cuDNN and conv_in 60 us on the GEMM path, against ~10 us
// of memory traffic each (42 MB read or written).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"
#include "core/dtype.h"

namespace atelier::cuda {

struct NarrowConvArgs {
  const void* x = nullptr;     // [N, H, W, C]
  const void* w = nullptr;     // [O, kh, kw, C]
  const void* bias = nullptr;  // [O] in the data's dtype, or null
  void* out = nullptr;         // [N, Ho, Wo, O]
  DType dtype = DType::BF16;
  int64_t n = 0, h = 0, w_in = 0, c = 0, o = 0, kh = 0, kw = 0, ho = 0, wo = 0;
  int pad_h = 0, pad_w = 0;
};

// Whether a kernel here takes the case: bf16 or f16, stride 1, and either at most 8 output channels over a multiple
// of 32 input channels, or an even count of input channels with kh * kw * C <= 64 into a multiple of 8 outputs;
// 16-byte aligned x and w.
bool conv_narrow_takes(const NarrowConvArgs& a);
// Enqueues it; false (nothing enqueued) where conv_narrow_takes does not hold.
bool launch_conv_narrow(const NarrowConvArgs& a, cudaStream_t stream);

// Whether conv2d offers these kernels: kAuto as one more candidate timed per shape, kOff never (the default until
// they are shown faster in the models: docs/cuda.md, session 59), kForce wherever they take the case (tests). ATELIER_NARROW_CONV=1 | force.
enum class NarrowConv { kAuto, kOff, kForce };
NarrowConv narrow_conv_default();
int64_t conv_narrow_launches();  // kernels enqueued so far (tests: which path ran)

}  // namespace atelier::cuda
