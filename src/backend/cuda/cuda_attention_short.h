// Attention over short key sequences at head dims up to 128 (cuda_attention_short.cu): SD's cross-attentions over
// CLIP's 77 tokens at head dims 40 and 80 (SD 1.x) or 64 (SD 2.x). Reached through the flash path's dispatch
// (cuda_attention.cu, launch_flash_short), so cuDNN's SDPA races it per shape like the other flash kernels. By default
// it takes head dims up to 48 (SD 1.x's d40), where it measured faster; ATELIER_SHORT_KV_ATTENTION=all up to 128.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_attention_views.h"

namespace atelier::cuda {

// Keys the kernel holds at once: one tile of 80 (ten 8-key n-tiles of S, five 16-key k-steps of P V).
constexpr int kShortKvMaxKeys = 80;
constexpr int kShortKvMaxHeadDim = 128;

// The operands (bf16 or f16, no mask; the caller has checked 16-byte aligned q/k/v rows and 4-byte aligned out rows),
// their type, and the device's SMs (the grid is one wave of resident blocks).
struct ShortKvArgs : AttentionViews {
  bool bf16;
  int sm_count;
};

// Enqueues the kernel on `stream`; false (nothing enqueued) where it does not apply: more than kShortKvMaxKeys keys,
// a head dim above kShortKvMaxHeadDim or not a multiple of 8.
bool launch_short_kv_attention(const ShortKvArgs& a, cudaStream_t stream);

// Query tiles (16 rows) each warp takes: 0 (the default) sizes the grid as one wave of resident blocks, n > 0 gives
// every warp n tiles (ATELIER_SHORT_KV_TILES=n sets it at start-up). For tuning and for the tests of the pipelined
// tile loop.
void set_short_kv_tiles_per_warp(int tiles);
// Warps a block (8 by default; 4 or 16, anything else the default): more warps load K and V once for more query tiles. Where a block of
// that size does not fit (16 warps at head dims above 80), the next smaller one runs. ATELIER_SHORT_KV_WARPS=n sets it
// at start-up.
void set_short_kv_block_warps(int warps);

}  // namespace atelier::cuda
