// The lazy running max of the flash-attention kernels (cuda_attention_lazy.cuh): its switch and its rare paths'
// counters, for the backend, tests and benches (host code).
#pragma once

namespace atelier::cuda {

// On by default: key tiles after the first take their exponentials against the running max of the tiles before (no
// row max, no rescale of O) in the wgmma kernel and in the mma.sync kernel's unmasked cases.
// ATELIER_ATTENTION_LAZY_MAX=0 or the setter give every tile its exact max (FlashAttention's online softmax).
bool attention_lazy_max();
void set_attention_lazy_max(bool on);

// How often the rare paths ran since the process started: warp-tiles rescaled (a row's scores grew by 2^64 within a
// tile), and warps whose rows were recomputed exactly (an exponential overflowed f32). Tests check that the inputs
// meant to take each path did. Reading them synchronizes the device.
struct LazyMaxCounts {
  unsigned long long rescaled_warp_tiles = 0, exact_warps = 0;
};
LazyMaxCounts wgmma_lazy_max_counts();  // the wgmma kernel's (cuda_attention_wgmma.cu)
LazyMaxCounts flash_lazy_max_counts();  // the mma.sync kernel's (cuda_attention.cu)

}  // namespace atelier::cuda
