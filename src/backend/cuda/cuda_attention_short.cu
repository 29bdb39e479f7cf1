// Attention over at most 80 keys at head dims up to 128, on mma.sync tensor cores (bf16/f16, f32 accumulation).
//
// Why a kernel of its own: SD's cross-attentions read 77 keys per head, so their work is small (at level 0 of a CFG
// call, [2, 8, 4096] queries at head dim 40: ~0.5 G multiply-adds, 5 M exponentials) and their floor is the traffic
// of Q in and O out (10.5 MB, ~3.5 us on an H100). The tiled kernels spend ~4x that (12.5 us for cuDNN's, 15 us for a
// one-tile flash kernel, session 48): their blocks load Q, K and V, compute and store one after the other, all blocks
// of the one wave in step, so the loads and the products never overlap.
//
// Here a block of 8 warps (4 or 16: ATELIER_SHORT_KV_WARPS) loads its head's K and V once (one 80-key tile, zero-filled
// past Sk and the head dim) and each warp then walks its own 16-query tiles (t, t + stride, ...) with the next two in flight
// (cp.async into two per-warp buffers, ordered by __syncwarp, no block barrier after the first): the loads of a tile
// overlap the products of the one before. The whole key range is one tile, so the softmax is exact in one pass (row
// max, exponentials, sum; no rescaling). The grid is one wave: floor(resident blocks / (B * H)) blocks per head,
// capped where every warp would hold one tile (ATELIER_SHORT_KV_TILES=n asks for n tiles a warp instead).
#include <algorithm>
#include <atomic>
#include <cmath>

#include "backend/cuda/cuda_attention_short.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_norm_common.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace atelier::cuda {
namespace {

// Warps a block: 8 by default (4 or 16: ATELIER_SHORT_KV_WARPS). More warps load K and V once for more query tiles:
// at CFG d40 five 4-warp blocks an SM read 75 KB of K/V from L2 beside 46 KB of Q. H100, session 49, SD's d40
// cross-attention in the replayed step: 4 warps 12.3 us at CFG and 57.3 at 16 rows, 8 warps 10.4 and 55.1, 16 warps
// 10.8 at CFG; 4 warps with 1 or 4 tiles a warp 14.6 and 10.8 at CFG, 8 warps with 2 tiles 71.6 at 16 rows.
constexpr int kDefaultWarps = 8;
constexpr int kRows = 16;  // query rows of a warp's tile (one m16 tile)
constexpr int kKeys = kShortKvMaxKeys;
static_assert(kKeys % 16 == 0, "P V takes the keys in 16-key k-steps");

// K and V (one key tile each) and every warp's two Q buffers.
template <typename T, int DPAD, int WARPS>
constexpr size_t short_smem_bytes() {
  return size_t(2 * kKeys + WARPS * 2 * kRows) * kPitch<DPAD> * sizeof(T);
}

// S = Q K^T for one warp's 16 rows over all kKeys keys: qf the Q fragments, ks K's tile [kKeys][PITCH].
template <typename T, int DPAD>
__device__ __forceinline__ void scores(float (&s)[kKeys / 8][4], const uint32_t (&qf)[DPAD / 16][4], const T* ks, int lane) {
  constexpr int PITCH = kPitch<DPAD>;
  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix roles: matrix (lane / 8), row within it (lane % 8)
#pragma unroll
  for (int i = 0; i < kKeys / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DPAD / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {  // one ldmatrix.x4: the B fragments of two n-tiles
      uint32_t kb[4];
      ldmatrix_x4(kb, ks + (np * 16 + (mi >> 1) * 8 + mr) * PITCH + kk * 16 + (mi & 1) * 8);
      mma16816<T>(s[2 * np], qf[kk], kb[0], kb[1]);
      mma16816<T>(s[2 * np + 1], qf[kk], kb[2], kb[3]);
    }
  }
}

// S (raw scores) -> P = 2^(S * scale_log2 - row max), keys >= sk at 0; returns this thread's part of the two rows'
// sums in sum[ri] (rows g and g + 8; the quad's four threads hold the rest of each row).
__device__ __forceinline__ void softmax_rows(float (&s)[kKeys / 8][4], float (&sum)[2], float scale_log2, int sk, int tig) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt) {
    const bool ragged = nt * 8 + 8 > sk;  // uniform across the warp
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s[nt][e] * scale_log2;
      if (ragged && nt * 8 + tig * 2 + (e & 1) >= sk) x = -INFINITY;
      s[nt][e] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
  }
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffffu, mx[ri], 1));
    mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffffu, mx[ri], 2));
    sum[ri] = 0.0f;
  }
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = fast_exp2(s[nt][e] - mx[e >> 1]);
      sum[e >> 1] += s[nt][e];
    }
}

// O = P V: P's A fragments straight from S's accumulators (the m16n8 C layout is the A layout), V [kKeys][PITCH].
template <typename T, int DPAD>
__device__ __forceinline__ void weighted_values(float (&acc)[DPAD / 8][4], const float (&s)[kKeys / 8][4], const T* vs, int lane) {
  constexpr int PITCH = kPitch<DPAD>;
  const int mi = lane >> 3, mr = lane & 7;
#pragma unroll
  for (int i = 0; i < DPAD / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                           pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int n2 = 0; n2 < DPAD / 16; ++n2) {
      uint32_t bv[4];
      ldmatrix_x4_trans(bv, vs + (kk * 16 + mr + (mi & 1) * 8) * PITCH + n2 * 16 + (mi >> 1) * 8);
      mma16816<T>(acc[2 * n2], a, bv[0], bv[1]);
      mma16816<T>(acc[2 * n2 + 1], a, bv[2], bv[3]);
    }
  }
}

// Grid: x = blocks per (batch, head), y = heads, z = batch. Block: WARPS warps; warp w of block x takes the 16-row
// query tiles x * WARPS + w, then + gridDim.x * WARPS, ...
template <typename T, int DPAD, int WARPS>
__global__ void __launch_bounds__(32 * WARPS) short_kv_attention_kernel(const ShortKvArgs p) {
  constexpr int PITCH = kPitch<DPAD>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* ks = reinterpret_cast<T*>(smem_raw);  // [kKeys][PITCH]
  T* vs = ks + kKeys * PITCH;              // [kKeys][PITCH]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  T* qbuf = vs + kKeys * PITCH + warp * 2 * kRows * PITCH;  // this warp's two Q tiles [2][kRows][PITCH]
  const int b = blockIdx.z, h = blockIdx.y;
  const T* qg = static_cast<const T*>(p.q) + b * p.qs0 + h * p.qs1;
  const T* kg = static_cast<const T*>(p.k) + b * p.ks0 + (h / p.group) * p.ks1;
  const T* vg = static_cast<const T*>(p.v) + b * p.vs0 + (h / p.group) * p.vs1;
  T* og = static_cast<T*>(p.out) + b * p.os0 + h * p.os1;
  const int n_tiles = (p.sq + kRows - 1) / kRows;
  const int stride = gridDim.x * WARPS;

  // One commit group per Q tile (empty past the last), so that "all but the newest group landed" always means
  // "the tile about to be used landed".
  const auto load_q = [&](int tile, int buf) {
    if (tile < n_tiles) {
      const T* rows = qg + int64_t(tile) * kRows * p.qs2;
      copy_tile_async<T, DPAD, PITCH, kRows>(qbuf + buf * kRows * PITCH, rows, p.qs2, p.sq - tile * kRows, p.d, lane, 32);
    }
    cp_async_commit();
  };
  int t = blockIdx.x * WARPS + warp;
  copy_tile_async<T, DPAD, PITCH, kKeys>(ks, kg, p.ks2, p.sk, p.d, threadIdx.x, 32 * WARPS);
  copy_tile_async<T, DPAD, PITCH, kKeys>(vs, vg, p.vs2, p.sk, p.d, threadIdx.x, 32 * WARPS);
  load_q(t, 0);           // K, V and the first Q tile: one group
  load_q(t + stride, 1);  // the second tile in flight
  cp_async_wait<1>();
  __syncthreads();  // K and V, copied by every thread, visible to every warp

  const float scale_log2 = p.scale * kLog2e;
  const int g = (lane >> 2), tig = lane & 3;
  for (int buf = 0; t < n_tiles; t += stride, buf ^= 1) {
    cp_async_wait<1>();
    __syncwarp();  // every lane's part of this tile landed
    const T* qt = qbuf + buf * kRows * PITCH;
    uint32_t qf[DPAD / 16][4];
#pragma unroll
    for (int kk = 0; kk < DPAD / 16; ++kk) load_a_frag<PITCH>(qf[kk], qt, 0, kk * 16, lane);
    __syncwarp();  // every lane has read the tile: its buffer takes the tile after next
    load_q(t + 2 * stride, buf);

    float s[kKeys / 8][4];
    scores<T, DPAD>(s, qf, ks, lane);
    float sum[2];
    softmax_rows(s, sum, scale_log2, p.sk, tig);
    float acc[DPAD / 8][4];
    weighted_values<T, DPAD>(acc, s, vs, lane);

#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      float l = sum[ri];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = 1.0f / l;
      const int row = t * kRows + g + 8 * ri;
      if (row >= p.sq) continue;
#pragma unroll
      for (int ot = 0; ot < DPAD / 8; ++ot) {
        const int col = ot * 8 + tig * 2;
        if (col < p.d)
          *reinterpret_cast<uint32_t*>(og + int64_t(row) * p.os2 + col) = pack2<T>(acc[ot][2 * ri] * inv, acc[ot][2 * ri + 1] * inv);
      }
    }
  }
}

// Tiles a warp takes: 0 = the one-wave rule above, else n (ATELIER_SHORT_KV_TILES=n at start-up, or
// set_short_kv_tiles_per_warp: a tuning and test switch).
std::atomic<int> g_tiles_per_warp{[] {
  const auto v = env_number("ATELIER_SHORT_KV_TILES");
  return v && *v >= 1 ? int(std::min(*v, double(1 << 20))) : 0;
}()};

std::atomic<int> g_block_warps{[] {
  const auto v = env_number("ATELIER_SHORT_KV_WARPS");
  return v && (*v == 4 || *v == 8 || *v == 16) ? int(*v) : kDefaultWarps;
}()};

// False (nothing enqueued) where no block of this shape fits on an SM.
template <typename T, int DPAD, int WARPS>
bool launch_short(const ShortKvArgs& a, cudaStream_t stream) {
  constexpr int kThreads = 32 * WARPS;
  constexpr size_t smem = short_smem_bytes<T, DPAD, WARPS>();
  const auto kernel = short_kv_attention_kernel<T, DPAD, WARPS>;
  if (smem > 48 * 1024) ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, smem);
  if (per_sm < 1) return false;
  const int64_t tiles = (a.sq + kRows - 1) / kRows;
  const int64_t all_warps = (tiles + WARPS - 1) / WARPS;  // blocks per head where each warp holds one tile
  int64_t per_head = all_warps;
  if (const int forced = g_tiles_per_warp.load(); forced > 0) {
    per_head = (tiles + int64_t(WARPS) * forced - 1) / (int64_t(WARPS) * forced);
  } else {
    const int64_t resident = int64_t(per_sm) * std::max(a.sm_count, 1);
    const int64_t heads = int64_t(a.batch) * a.heads;
    per_head = std::min(all_warps, std::max<int64_t>(resident / heads, 1));  // no block in a second wave
  }
  const dim3 grid(unsigned(std::clamp<int64_t>(per_head, 1, 65535)), unsigned(a.heads), unsigned(a.batch));
  kernel<<<grid, kThreads, smem, stream>>>(a);
  ATELIER_CUDA_LAUNCHED();
  return true;
}

// The block size asked for, else the next smaller one that fits. No 16-warp blocks at head dim 128: 512 threads
// leave 128 registers a thread, and that kernel needs 134.
template <typename T, int DPAD>
bool launch_warps(const ShortKvArgs& a, cudaStream_t stream) {
  const int warps = g_block_warps.load();
  if constexpr (DPAD <= 80) {
    if (warps >= 16 && launch_short<T, DPAD, 16>(a, stream)) return true;
  }
  if (warps >= 8 && launch_short<T, DPAD, 8>(a, stream)) return true;
  return launch_short<T, DPAD, 4>(a, stream);
}

template <typename T>
bool launch_bucket(const ShortKvArgs& a, cudaStream_t stream) {
  if (a.d <= 32) return launch_warps<T, 32>(a, stream);
  if (a.d <= 48) return launch_warps<T, 48>(a, stream);
  if (a.d <= 64) return launch_warps<T, 64>(a, stream);
  if (a.d <= 80) return launch_warps<T, 80>(a, stream);
  return launch_warps<T, 128>(a, stream);
}

}  // namespace

void set_short_kv_tiles_per_warp(int tiles) { g_tiles_per_warp = std::clamp(tiles, 0, 1 << 20); }
void set_short_kv_block_warps(int warps) { g_block_warps = warps == 4 || warps == 8 || warps == 16 ? warps : kDefaultWarps; }

bool launch_short_kv_attention(const ShortKvArgs& a, cudaStream_t stream) {
  if (a.sk < 1 || a.sk > kShortKvMaxKeys || a.d < 8 || a.d > kShortKvMaxHeadDim || a.d % 8 != 0) return false;
  if (a.batch < 1 || a.batch > 65535 || a.heads < 1 || a.heads > 65535 || a.group < 1 || a.sq < 1) return false;
  return a.bf16 ? launch_bucket<__nv_bfloat16>(a, stream) : launch_bucket<__half>(a, stream);
}

}  // namespace atelier::cuda
