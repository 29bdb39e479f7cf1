// Flash attention on Hopper's warpgroup MMA (wgmma) and the bulk tensor copy engine (TMA), bf16, head dims 40,
// 64, 80 and 128, any sequence lengths, grouped K/V heads, no mask. CudaBackend::attention_flash tries it ahead
// of the mma.sync kernel on sm_90, so kAuto's per-shape timing against cuDNN's SDPA sees it (docs/cuda.md).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_attention_views.h"

namespace atelier::cuda {

struct WgmmaAttentionArgs : AttentionViews {
  size_t max_smem;
  int sm_count;  // the device's SMs (the block shape's choice by waves; 0: the default shape)
};

// Enqueues the kernel; false (nothing launched) where it does not take the case: another head dim, strides or
// base addresses not 16-byte aligned (the tensor maps' rule), a device other than sm_90.
bool launch_attention_wgmma(const WgmmaAttentionArgs& a, int cc_major, cudaStream_t stream);

// On by default; ATELIER_WGMMA_ATTENTION=0 (or the setter: tests, benches) leaves these cases to mma.sync.
bool wgmma_attention_enabled();
void set_wgmma_attention(bool on);
// Kernels launched so far (tests: the case was taken).
int64_t wgmma_attention_launches();

// The kernel's block shape at head dims <= 64: consumer warpgroups of 64 queries and keys per K/V tile, 3 x 128 or
// 4 x 64 (four consumers get 112 registers each: S, P and O fit over 64 keys only). {0, 0}, the default, picks at
// head dim 40 the one whose whole waves of blocks cost less (4 x 64 for SD's CFG step, 3 x 128 at 16 rows and at
// 1024²; session 50) and 3 x 128 at 64. ATELIER_WGMMA_ATTENTION_SHAPE=3x128 / =4x64 or the setter force one.
struct WgmmaAttentionShape {
  int consumers = 0, block_k = 0;
};
bool wgmma_attention_shape_supported(WgmmaAttentionShape s);
// The shape a head dim <= 64 runs in for [batch, heads, sq] queries on `sm_count` SMs (one block per SM).
WgmmaAttentionShape wgmma_block_shape_for(int d, int batch, int heads, int sq, int sm_count);
void set_wgmma_attention_shape(WgmmaAttentionShape s);
WgmmaAttentionShape wgmma_attention_shape();

}  // namespace atelier::cuda
