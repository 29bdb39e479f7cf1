// Probes of one GPU unit's issue rate, for the floors that the kernels' analyses use (docs/cuda.md): the MUFU
// exponential (ex2.approx), which bounds flash attention's softmax at small head dims. Part of cuda_ops_bench.
#pragma once
#include <cuda_runtime.h>

namespace atelier::bench {

enum class Exp2Form { kF32, kBf16x2, kF16x2 };  // ex2.approx.ftz.f32, ex2.approx.ftz.bf16x2, ex2.approx.f16x2

struct UnitRate {
  double ms = 0.0;         // median kernel time
  double per_second = 0.0; // exponentials per second over the whole device (a packed instruction counts two)
};

// Eight independent chains of exponentials per thread, 64 warps per SM, on `stream`; {0, 0} where the device
// cannot run the form (the packed forms need sm_90). Median of `iters` timed launches after a warm-up.
UnitRate exp2_rate(Exp2Form form, int iters, cudaStream_t stream);

}  // namespace atelier::bench
