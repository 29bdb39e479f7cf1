// A self-check of the wgmma building blocks (cuda_wgmma.cuh) for the GPU tests: one warpgroup computes
// C[64 x 64] (f32) = A[64 x K] x B with bf16 operands.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atelier::cuda {

struct WgmmaCase {
  int k = 64;                 // 64 or 128: one or two atom columns of A (and of a K-major B)
  bool a_in_registers = false;  // A as mma.sync-layout fragments (the P V product) instead of shared memory
  bool b_mn_major = false;      // B given [K][64] (V) instead of [64][K] (K in Q K^T)
};

// a: [64][k] row-major bf16 bits; b: [64][k] (K-major) or [k][64] (MN-major). Returns C [64][64] row-major, or
// empty with *why where the device cannot run wgmma (before sm_90, or a build without sm_90a code).
std::vector<float> wgmma_check(const WgmmaCase& c, const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                               std::string* why);

}  // namespace atelier::cuda
