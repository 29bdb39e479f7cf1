// Probes of one GPU unit's issue rate, for the floors that the kernels' analyses use (docs/cuda.md): the MUFU
// exponential (ex2.approx), which bounds flash attention's softmax at small head dims. Part of cuda_ops_bench,
// which times the launches like its other rows.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace atelier::bench {

enum class Exp2Form { kF32, kBf16x2, kF16x2 };  // ex2.approx.ftz.f32, ex2.approx.ftz.bf16x2, ex2.approx.f16x2

// Whether the current device runs `form` (the packed forms need sm_90).
bool exp2_form_runs(Exp2Form form);
// Enqueues one probe: eight independent chains of exponentials per thread, 64 warps on each of `sms` SMs; `sink`
// (one word of device memory) keeps the chains from being optimised away.
void launch_exp2_chains(Exp2Form form, int sms, uint32_t* sink, cudaStream_t stream);
// Exponentials one launch computes (a packed instruction counts two).
double exp2_per_launch(Exp2Form form, int sms);

}  // namespace atelier::bench
