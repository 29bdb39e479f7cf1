// Probes of the tensor pipe's rate at the Hopper attention kernel's own product shapes (session 53): what the d40
// kernel's consumers can reach with no softmax and no loads, and which of its products or hand-offs costs what.
// Part of cuda_ops_bench (section "products"), which times the launches like its other rows.
//
// One block of three warpgroups per SM. Each working warpgroup issues, per 128-key "tile", the kernel's products on
// operands in shared memory (zeros, or random bf16 values):
//   S    = Q K^T: three m64n128k16, both operands in shared memory (head dim 40 rounded up to 48),
//   P V  : eight m64nNk16 with P from registers and V MN-major (N = 40 for head dim 40; 64, 80, 128 to compare),
// either streamed (one commit group per tile, one group kept in flight: the products' own rate) or as the kernel's
// consumer does (S and P V committed as two groups, then waits for S and for P V before the next tile), with or
// without the kernel's ring of turns (named barriers: each warpgroup issues after the previous one issued).
// Session 53 (H100): the products reach 89-92% of the tensor pipe's dense rate at these shapes on zeros (P V at
// N = 40 91% streamed by three warpgroups, 76% by one), 84-87% on random operands; the consumer's schedule with the
// ring of turns takes 1,190-1,260 cycles per round of three tiles against 1,056 ideal: neither the narrow P V nor
// the per-tile waits is what keeps the d40 kernel at ~2,900 cycles a round on contiguous K/V (docs/cuda.md,
// session 53).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace atelier::bench {

struct ProductProbe {
  const char* name;      // the row's label
  int s_steps;           // S's k-steps per tile (0: no S)
  int pv_n;              // P V's N (0: no P V)
  bool pv_smem;          // P from shared memory (N = 64 only) instead of registers
  bool per_tile;         // the consumer's waits per tile (else streamed)
  bool turns;            // the ring of turns (per_tile only)
  int warpgroups;        // working warpgroups of the block's three
  bool random_operands;  // bf16 values in [-1, 1) instead of zeros
  void (*kernel)(int warpgroups, bool random_operands, uint32_t* sink);  // its kernel (cuda_product_probes.cu)
};

// The probes the bench runs, in order (the first call sets their kernels' shared-memory size).
const std::vector<ProductProbe>& product_probes();
bool product_probe_runs();  // sm_90 only
void launch_product_probe(const ProductProbe& probe, int sms, uint32_t* sink, cudaStream_t stream);
// Tensor FLOPs of one launch on `sms` SMs (S counted at its padded 48-deep k, P V at its N).
double product_probe_flops(const ProductProbe& probe, int sms);
// Tiles each working warpgroup runs per launch (for cycles per tile).
int product_probe_tiles();

}  // namespace atelier::bench
