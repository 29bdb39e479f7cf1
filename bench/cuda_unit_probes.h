// Probes of one GPU unit's issue rate, for the floors that the kernels' analyses use (docs/cuda.md): the MUFU
// exponential (ex2.approx), which bounds flash attention's softmax at small head dims, and whether it overlaps the
// tensor pipe. Part of cuda_ops_bench, which times the launches like its other rows.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace atelier::bench {

// The current device's compute capability major (9: Hopper): which probes run (this file's and
// cuda_product_probes.h's).
int device_major();

enum class Exp2Form { kF32, kBf16x2, kF16x2 };  // ex2.approx.ftz.f32, ex2.approx.ftz.bf16x2, ex2.approx.f16x2

// Whether the current device runs `form` (the packed forms need sm_90).
bool exp2_form_runs(Exp2Form form);
// Enqueues one probe: eight independent chains of exponentials per thread, 64 warps on each of `sms` SMs; `sink`
// (one word of device memory) keeps the chains from being optimised away.
void launch_exp2_chains(Exp2Form form, int sms, uint32_t* sink, cudaStream_t stream);
// Exponentials one launch computes (a packed instruction counts two).
double exp2_per_launch(Exp2Form form, int sms);

// Whether the tensor pipe and the MUFU overlap inside one SM (session 52): one block of three warpgroups per SM,
// each with a role, `roles` a string of up to three of
//   'T'  wgmma m64n128k16 with both operands in shared memory, 8 per commit group, one group kept in flight (the
//        d40 attention's S = Q K^T),
//   'R'  the same product with A from registers (as P V takes P; P V itself is m64n40k16 with V MN-major),
//   'M'  16 independent chains of ex2.approx.ftz.f32 per thread (its softmax's exponentials),
//   'F'  16 independent FFMA chains per thread, 4 FMAs for each exponential of 'M' (the FMA pipes),
//   'S'  as many exponentials inside the softmax's instruction mix (64 scores a thread: max, FFMA, exp, sum, pack),
//   '.'  idle.
// Each role's warpgroup does the same work whatever the others do, so a mix that takes max(alone) overlaps and one
// that takes the sum of them does not.
bool overlap_probe_runs();
void launch_overlap_probe(const char* roles, int sms, uint32_t* sink, cudaStream_t stream);
// Per SM and launch: tensor FLOPs of one 'T' or 'R' warpgroup, exponentials of one 'M' or 'S' warpgroup, FMA FLOPs
// of one 'F' warpgroup.
double overlap_probe_tensor_flops_per_role();
double overlap_probe_exp2_per_role();
double overlap_probe_fma_flops_per_role();

}  // namespace atelier::bench
