// Flash attention on Hopper's warpgroup MMA (wgmma) and the bulk tensor copy engine (TMA), bf16, head dims 40,
// 64, 80 and 128, any sequence lengths, grouped K/V heads, no mask. CudaBackend::attention_flash tries it ahead
// of the mma.sync kernel on sm_90, so kAuto's per-shape timing against cuDNN's SDPA sees it (docs/cuda.md).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace atelier::cuda {

struct WgmmaAttentionArgs {
  const void *q, *k, *v;
  void* out;
  int64_t qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2, os0, os1, os2;  // element strides (batch, head, row)
  int batch, heads, group, sq, sk, d;
  float scale;
  size_t max_smem;
};

// Enqueues the kernel; false (nothing launched) where it does not take the case: another head dim, strides or
// base addresses not 16-byte aligned (the tensor maps' rule), a device other than sm_90.
bool launch_attention_wgmma(const WgmmaAttentionArgs& a, int cc_major, cudaStream_t stream);

// On by default; ATELIER_WGMMA_ATTENTION=0 (or the setter: tests, benches) leaves these cases to mma.sync.
bool wgmma_attention_enabled();
void set_wgmma_attention(bool on);
// Kernels launched so far (tests: the case was taken).
int64_t wgmma_attention_launches();

// The kernel's block shape: consumer warpgroups of 64 queries, keys per K/V tile, and whether each consumer
// computes S a tile ahead of its softmax (two S buffers). {0, 0} is the default (3 x 128 at head dims <= 64, 2 x 128
// above). The others are for measuring (ATELIER_WGMMA_ATTENTION_SHAPE=4x64, =2x128L, ..., or the setter; an
// unsupported shape gives the default): 3 x 96 and 4 x 64 at head dims <= 64; ahead, 3 x 64 at head dims <= 64,
// 2 x 128 up to 80, 2 x 64 at every head dim. A head dim a shape is not built for runs the default.
struct WgmmaAttentionShape {
  int consumers = 0, block_k = 0;
  bool lookahead = false;
};
bool wgmma_attention_shape_supported(WgmmaAttentionShape s);
// Whether the kernel at `head_dim` (40, 64, 80 or 128) runs in shape s rather than the default (benches' labels).
bool wgmma_attention_shape_built(WgmmaAttentionShape s, int head_dim);
void set_wgmma_attention_shape(WgmmaAttentionShape s);
WgmmaAttentionShape wgmma_attention_shape();

}  // namespace atelier::cuda
