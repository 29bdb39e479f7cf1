// Flash attention on tensor cores (bf16/f16 inputs, f32 accumulation), and the attention op's dispatch.
//
// One block of 4 warps takes 64 * MT queries of one (batch, head); each warp owns MT m-tiles of 16 query rows
// (MT = 2 reuses every K/V fragment for two m-tiles: half the shared-memory reads per FLOP, used when the grid
// is large enough). K and V tiles of BN keys stream through shared memory with cp.async (double-buffered:
// tile t+1 loads while tile t is used). Per tile, S = Q K^T with mma.sync m16n8k16 (Q and K fragments through
// ldmatrix); the online softmax (running max and sum per row, in the log2 domain, MUFU ex2; unmasked tiles after
// the first with the lazy max of cuda_attention_lazy.cuh) turns S into P in registers, where the m16n8 accumulator
// layout of S is exactly the A-operand layout of the next product;
// O += P V takes V's B operand through ldmatrix.trans. The head dim is padded to DPAD (a multiple of 16) with
// zeros in shared memory, so SD's 40/80/160 run with 48/80/160 columns. Masks and ragged key tiles take
// their checks only where they apply (a MASKED instantiation; bounds on the last tile only).
// (fragment layouts: cuda_mma.cuh)
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_attention_lazy.cuh"
#include "backend/cuda/cuda_attention_lazy.h"
#include "backend/cuda/cuda_attention_short.h"
#include "backend/cuda/cuda_attention_views.h"
#include "backend/cuda/cuda_attention_wgmma.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_conv.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_nvtx.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_sdpa.h"

namespace atelier::cuda {
namespace {

constexpr int kFlashThreads = 128;  // 4 warps
constexpr int kWarpRows = 16;       // rows of one m-tile
constexpr int kMaxFlashHeadDim = 256;

struct FlashParams : AttentionViews {
  AttentionMask mask;
  bool lazy;  // the lazy running max on the unmasked kernels' tiles after the first (cuda_attention_lazy.cuh)
};

std::atomic<bool> g_lazy_max{!env_is("ATELIER_ATTENTION_LAZY_MAX", "0")};
// How often the lazy max's rare paths ran in this kernel (warps; flash_lazy_max_counts).
__device__ unsigned long long g_flash_lazy_rescales = 0, g_flash_lazy_exact_rows = 0;

// Queries per block: 4 warps x MT m-tiles x 16 rows.
template <int MT> constexpr int kBlockM = 4 * MT * kWarpRows;
// Keys per tile: 64 while the registers allow (S takes MT * BN / 2 per thread, O MT * DPAD / 2), else 32.
template <int DPAD, int MT> constexpr int kBlockN = (MT == 1 ? DPAD <= 128 : DPAD <= 64) ? 64 : 32;
// A second, twice as wide key tile is compiled for the two-m-tile kernels at head dims 48, 64 and 128 (more
// work per barrier and per softmax rescale, more registers: ptxas spills 56-128 bytes). On the H200 it is
// faster at 48 (172 -> 193 TFLOP/s at SD's head dim 40) and 128 (234 -> 264) and slower at 64 (270 -> 233),
// so it is the default at 48 and 128 (kWideByDefault); CudaBackend::set_flash_key_tile forces either.
template <int DPAD, int MT> constexpr int kWideBlockN = MT == 2 && (DPAD == 48 || DPAD == 64 || DPAD == 128) ? 2 * kBlockN<DPAD, MT> : 0;
template <int DPAD> constexpr bool kWideByDefault = DPAD == 48 || DPAD == 128;
// Short key sequences (at most kShortKeys: CLIP's 77 tokens, the cross-attentions of SD's UNet) at the widest head
// dims run as one key tile of kShortKeys keys in one K and one V buffer (NBUF = 1): no third tile computed over
// padding (77 keys were three 32-key tiles at head dim 160: 96 keys' products), one barrier instead of three, no
// prefetch, no softmax rescale (launch_flash_short says where). ATELIER_SHORT_KV_ATTENTION=0 leaves them to the tiled
// kernels.
constexpr int kShortKeys = kShortKvMaxKeys;
// Q's tile plus NBUF buffers of one K and one V tile each.
template <typename T, int DPAD, int MT, int BN, int NBUF = 2>
constexpr size_t flash_smem_bytes() {
  return size_t(kBlockM<MT> + 2 * NBUF * BN) * kPitch<DPAD> * sizeof(T);
}

// Starts the copy of a ROWS x DPAD tile by the block's threads (zero-filled past rows_valid and d).
template <typename T, int DPAD, int ROWS>
__device__ __forceinline__ void load_tile(T* smem, const T* g, int64_t stride, int rows_valid, int d) {
  copy_tile_async<T, DPAD, kPitch<DPAD>, ROWS>(smem, g, stride, rows_valid, d, threadIdx.x, kFlashThreads);
}

// The per-thread state of MT m-tiles: rows r = 2 * mt + ri are (warp's row mt * 16 + g + 8 * ri).
template <int MT>
struct SoftmaxRows {
  float m[2 * MT];  // running max (log2 units)
  float l[2 * MT];  // this thread's part of the running sum
};

// Scales S to log2 units and applies the mask and the key bound (the kernel's slow path: masked attention
// or a ragged last tile). s [MT][NT][4] accumulators of keys kv0.. for queries query[2 * MT].
template <bool MASKED, int MT, int NT>
__device__ __forceinline__ void scale_scores(float (&s)[MT][NT][4], const FlashParams& p, int b, int h, int kv0,
                                             const int (&query)[2 * MT], int tig, bool check_keys) {
  const float scale_log2 = p.scale * kLog2e;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kv0 + nt * 8 + tig * 2 + (e & 1);
        float x = s[mt][nt][e] * scale_log2;
        if constexpr (MASKED) {
          const int qr = query[2 * mt + (e >> 1)];
          const float mv = qr < p.sq && key < p.sk
                               ? load_any(p.mask.ptr, p.mask.dtype,
                                          b * p.mask.s0 + h * p.mask.s1 + int64_t(qr) * p.mask.s2 + int64_t(key) * p.mask.s3)
                               : 0.0f;
          x = (s[mt][nt][e] * p.scale + mv) * kLog2e;
        }
        if (check_keys && key >= p.sk) x = -INFINITY;
        s[mt][nt][e] = x;
      }
}

// The online softmax of one tile (FlashAttention's): S in log2 units becomes P against the new row max, and acc and
// the row sums are rescaled to it. s [MT][NT][4], acc [MT][OT][4].
template <int MT, int NT, int OT>
__device__ __forceinline__ void online_softmax_tile(float (&s)[MT][NT][4], float (&acc)[MT][OT][4],
                                                    SoftmaxRows<MT>& rows) {
  float m_use[2 * MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int r = 2 * mt + ri;
      float tile_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) tile_max = fmaxf(tile_max, fmaxf(s[mt][nt][2 * ri], s[mt][nt][2 * ri + 1]));
      // The four threads of a quad hold the same row.
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(rows.m[r], tile_max);
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: exps of -inf are 0, not NaN
      const float alpha = fast_exp2(rows.m[r] - m_use[r]);
      rows.m[r] = m_new;
      float row_sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        s[mt][nt][2 * ri] = fast_exp2(s[mt][nt][2 * ri] - m_use[r]);
        s[mt][nt][2 * ri + 1] = fast_exp2(s[mt][nt][2 * ri + 1] - m_use[r]);
        row_sum += s[mt][nt][2 * ri] + s[mt][nt][2 * ri + 1];
      }
      rows.l[r] = rows.l[r] * alpha + row_sum;
#pragma unroll
      for (int ot = 0; ot < OT; ++ot) {
        acc[mt][ot][2 * ri] *= alpha;
        acc[mt][ot][2 * ri + 1] *= alpha;
      }
    }
  }
}

// The lazy max's rare path for a warp where some row passed the cap: each row rescales exactly by a power of two (P
// in s, acc, l, m; lazy_settle_row), and a row whose exponentials overflowed flags exact_needed. s [MT][NT][4] holds
// P, acc [MT][OT][4] O, tile_sum the thread's shares of the rows' tile sums.
template <int MT, int NT, int OT>
__device__ __forceinline__ void lazy_rescale_rows(float (&s)[MT][NT][4], float (&acc)[MT][OT][4], SoftmaxRows<MT>& rows,
                                                   const float (&tile_sum)[2 * MT], bool& exact_needed) {
  if ((threadIdx.x & 31) == 0) atomicAdd(&g_flash_lazy_rescales, 1ull);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int r = 2 * mt + ri;
      float mx = 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * ri], s[mt][nt][2 * ri + 1]));
      const float scale = lazy_settle_row(mx, tile_sum[r], rows.l[r], rows.m[r], exact_needed);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) s[mt][nt][2 * ri] *= scale, s[mt][nt][2 * ri + 1] *= scale;
#pragma unroll
      for (int ot = 0; ot < OT; ++ot) acc[mt][ot][2 * ri] *= scale, acc[mt][ot][2 * ri + 1] *= scale;
    }
}

// A whole key tile after the first under the lazy max (cuda_attention_lazy.cuh): S (raw scores, times sl to log2
// units) becomes P against the running max, without a row max or a rescale of acc, unless some row of this warp passed
// the cap (lazy_rescale_rows). s [MT][NT][4], acc [MT][OT][4].
template <typename T, int MT, int NT, int OT>
__device__ __forceinline__ void lazy_softmax_tile(float (&s)[MT][NT][4], float (&acc)[MT][OT][4], SoftmaxRows<MT>& rows,
                                                  float sl, bool& exact_needed) {
  float tile_sum[2 * MT];
  bool over = false;
#pragma unroll
  for (int r = 0; r < 2 * MT; ++r) {  // row r: m-tile r / 2, its row g + 8 (r % 2)
    const int mt = r / 2, c0 = 2 * (r % 2);  // the row's two columns of each n-tile: c0, c0 + 1
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s[mt][nt][c0] = fast_exp2(fmaf(s[mt][nt][c0], sl, -rows.m[r]));
      s[mt][nt][c0 + 1] = fast_exp2(fmaf(s[mt][nt][c0 + 1], sl, -rows.m[r]));
      sum += s[mt][nt][c0] + s[mt][nt][c0 + 1];
    }
    tile_sum[r] = sum;
    over |= sum > kLazyCap<T>;
  }
  if (__any_sync(0xffffffffu, over)) {
    lazy_rescale_rows(s, acc, rows, tile_sum, exact_needed);
    return;
  }
#pragma unroll
  for (int r = 0; r < 2 * MT; ++r) rows.l[r] += tile_sum[r];
}

// NBUF = 1: the launcher guarantees one key tile (p.sk <= BN).
template <typename T, int DPAD, int MT, int BN, bool MASKED, int NBUF>
__global__ void __launch_bounds__(kFlashThreads) flash_attention_kernel(const FlashParams p) {
  constexpr int BM = kBlockM<MT>;
  constexpr int PITCH = kPitch<DPAD>;
  constexpr bool kQInRegs = MT * DPAD <= 128;  // else Q fragments are re-read from shared memory (registers)
  constexpr int kKSteps = DPAD / 16;           // k-steps of Q K^T
  constexpr int kSTiles = BN / 8;              // n-tiles of S
  constexpr int kOTiles = DPAD / 8;            // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);  // [BM][PITCH]
  T* ks = qs + BM * PITCH;                 // [NBUF][BN][PITCH]
  T* vs = ks + NBUF * BN * PITCH;          // [NBUF][BN][PITCH]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tig = lane & 3;
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BM;
  const int kvh = h / p.group;
  const T* qg = static_cast<const T*>(p.q) + b * p.qs0 + h * p.qs1 + int64_t(q0) * p.qs2;
  const T* kg = static_cast<const T*>(p.k) + b * p.ks0 + kvh * p.ks1;
  const T* vg = static_cast<const T*>(p.v) + b * p.vs0 + kvh * p.vs1;
  const int n_tiles = (p.sk + BN - 1) / BN;

  load_tile<T, DPAD, BM>(qs, qg, p.qs2, p.sq - q0, p.d);
  load_tile<T, DPAD, BN>(ks, kg, p.ks2, min(BN, p.sk), p.d);
  load_tile<T, DPAD, BN>(vs, vg, p.vs2, min(BN, p.sk), p.d);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  const int wrow = warp * MT * kWarpRows;  // the warp's first row in the block tile
  int query[2 * MT];
#pragma unroll
  for (int r = 0; r < 2 * MT; ++r) query[r] = q0 + wrow + (r >> 1) * kWarpRows + g + (r & 1) * 8;
  uint32_t qf[kQInRegs ? MT : 1][kQInRegs ? kKSteps : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) load_a_frag<PITCH>(qf[mt][kk], qs, wrow + mt * kWarpRows, kk * 16, lane);
  }
  float acc[MT][kOTiles][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < kOTiles; ++i) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.0f;
  SoftmaxRows<MT> rows;
#pragma unroll
  for (int r = 0; r < 2 * MT; ++r) rows.m[r] = -INFINITY, rows.l[r] = 0.0f;
  const float scale_log2 = p.scale * kLog2e;
  bool exact_needed = false;  // the lazy max met an overflow: exact_rows recomputes this warp's rows
  // ldmatrix lane roles: matrix index (lane / 8) and row within it (lane % 8).
  const int mi = lane >> 3, mr = lane & 7;

  for (int t = 0; t < n_tiles; ++t) {
    const int buf = NBUF == 1 ? 0 : t & 1;
    const int kv0 = t * BN;
    if (NBUF == 2 && t + 1 < n_tiles) {  // prefetch the next tile into the other buffer (freed by the last barrier)
      const int next = kv0 + BN;
      load_tile<T, DPAD, BN>(ks + (buf ^ 1) * BN * PITCH, kg + int64_t(next) * p.ks2, p.ks2, min(BN, p.sk - next), p.d);
      load_tile<T, DPAD, BN>(vs + (buf ^ 1) * BN * PITCH, vg + int64_t(next) * p.vs2, p.vs2, min(BN, p.sk - next), p.d);
    }
    cp_async_commit();
    const T* kt = ks + buf * BN * PITCH;
    const T* vt = vs + buf * BN * PITCH;

    // S = Q K^T for MT x 16 rows x BN keys; one ldmatrix.x4 gives the B fragments of two n-tiles.
    float s[MT][kSTiles][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < kSTiles; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int j = 0; j < 4; ++j) a[mt][j] = qf[mt][kk][j];
        } else {
          load_a_frag<PITCH>(a[mt], qs, wrow + mt * kWarpRows, kk * 16, lane);
        }
      }
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, kt + (np * 16 + (mi >> 1) * 8 + mr) * PITCH + kk * 16 + (mi & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(s[mt][2 * np], a[mt], kb[0], kb[1]);
          mma16816<T>(s[mt][2 * np + 1], a[mt], kb[2], kb[3]);
        }
      }
    }

    // Scores to log2 units (mask and key bound where they apply); the tile's row maxima, or the lazy max's tile.
    const bool ragged = kv0 + BN > p.sk;
    bool lazy = false;
    if constexpr (!MASKED) lazy = p.lazy && t > 0 && !ragged;  // the ragged last tile takes the exact max
    if (lazy) {
      lazy_softmax_tile<T>(s, acc, rows, scale_log2, exact_needed);
    } else {
      if (MASKED || ragged) {
        scale_scores<MASKED>(s, p, b, h, kv0, query, tig, ragged);
      } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] *= scale_log2;
      }
      online_softmax_tile(s, acc, rows);
    }

    // O += P V: P's A fragments come straight from the S accumulators.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int n2 = 0; n2 < DPAD / 16; ++n2) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, vt + (kk * 16 + mr + (mi & 1) * 8) * PITCH + n2 * 16 + (mi >> 1) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(acc[mt][2 * n2], a[mt], bv[0], bv[1]);
          mma16816<T>(acc[mt][2 * n2 + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
    cp_async_wait_all();  // the next tile has landed
    __syncthreads();      // and every warp is done with this one
  }

  if constexpr (!MASKED) {
    if (__any_sync(0xffffffffu, exact_needed)) {  // the lazy max met an overflow in this warp's rows
      exact_rows<T, DPAD>(p, b, h, q0 + wrow, MT * kWarpRows, lane, &g_flash_lazy_exact_rows);
      return;
    }
  }
  T* og = static_cast<T*>(p.out) + int64_t(b) * p.os0 + int64_t(h) * p.os1;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      float l = rows.l[2 * mt + ri];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv[ri] = 1.0f / l;  // 0 for a fully masked row: NaN output, as the CPU backend gives
    }
#pragma unroll
    for (int ot = 0; ot < kOTiles; ++ot) {
      const int col = ot * 8 + tig * 2;
      if (col >= p.d) continue;
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        const int qr = query[2 * mt + ri];
        if (qr >= p.sq) continue;
        *reinterpret_cast<uint32_t*>(og + int64_t(qr) * p.os2 + col) =
            pack2<T>(acc[mt][ot][2 * ri] * inv[ri], acc[mt][ot][2 * ri + 1] * inv[ri]);
      }
    }
  }
}

template <typename T, int DPAD, int MT, int BN, bool MASKED, int NBUF = 2>
bool launch_flash_kernel(const FlashParams& p, size_t max_smem, cudaStream_t stream) {
  constexpr size_t smem = flash_smem_bytes<T, DPAD, MT, BN, NBUF>();
  if (smem > max_smem) return false;
  const auto kernel = flash_attention_kernel<T, DPAD, MT, BN, MASKED, NBUF>;
  if (smem > 48 * 1024) ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((p.sq + kBlockM<MT> - 1) / kBlockM<MT>), unsigned(p.heads), unsigned(p.batch));
  kernel<<<grid, kFlashThreads, smem, stream>>>(p);
  ATELIER_CUDA_LAUNCHED();
  return true;
}

// The key tile: kBlockN, or the wide one where it is compiled and chosen (key_tile: 0 = kWideByDefault,
// else CudaBackend::kFlashNarrowKeys / kFlashWideKeys).
template <typename T, int DPAD, int MT>
bool launch_flash(const FlashParams& p, size_t max_smem, cudaStream_t stream, int key_tile) {
  constexpr int kWide = kWideBlockN<DPAD, MT>;
  if constexpr (kWide > 0) {
    const bool wide = key_tile == 0 ? kWideByDefault<DPAD> : key_tile == CudaBackend::kFlashWideKeys;
    if (wide) {
      if (p.mask.ptr) return launch_flash_kernel<T, DPAD, MT, kWide, true>(p, max_smem, stream);
      return launch_flash_kernel<T, DPAD, MT, kWide, false>(p, max_smem, stream);
    }
  }
  constexpr int kNarrow = kBlockN<DPAD, MT>;
  if (p.mask.ptr) return launch_flash_kernel<T, DPAD, MT, kNarrow, true>(p, max_smem, stream);
  return launch_flash_kernel<T, DPAD, MT, kNarrow, false>(p, max_smem, stream);
}

// Two m-tiles per warp (128-query blocks) halve the shared-memory traffic per FLOP but need the grid to fill
// the card: taken when there are at least kMinWavesForWideBlocks blocks per multiprocessor, unless the
// backend forces one height (`forced`: 64 or 128, from CudaBackend::set_flash_block_rows).
constexpr int kMinWavesForWideBlocks = 2;
struct FlashLaunch {
  int sm_count;
  int forced_rows;
  int key_tile;  // CudaBackend::set_flash_key_tile's mode
  size_t max_smem;
  cudaStream_t stream;
};
bool wide_blocks(const FlashParams& p, const FlashLaunch& l) {
  if (l.forced_rows == 64 || l.forced_rows == 128) return l.forced_rows == 128;
  const int64_t blocks = int64_t((p.sq + kBlockM<2> - 1) / kBlockM<2>) * p.heads * p.batch;
  return blocks >= int64_t(kMinWavesForWideBlocks) * l.sm_count;
}

template <typename T, int DPAD>
bool launch_flash_rows(const FlashParams& p, const FlashLaunch& l) {
  if constexpr (DPAD <= 128) {
    if (wide_blocks(p, l)) return launch_flash<T, DPAD, 2>(p, l.max_smem, l.stream, l.key_tile);
  }
  return launch_flash<T, DPAD, 1>(p, l.max_smem, l.stream, l.key_tile);
}

// Padded head dims with a compiled kernel: the smallest bucket >= the head dim is used.
template <typename T>
bool launch_flash_bucket(const FlashParams& p, const FlashLaunch& l) {
  if (p.d <= 32) return launch_flash_rows<T, 32>(p, l);
  if (p.d <= 48) return launch_flash_rows<T, 48>(p, l);
  if (p.d <= 64) return launch_flash_rows<T, 64>(p, l);
  if (p.d <= 80) return launch_flash_rows<T, 80>(p, l);
  if (p.d <= 96) return launch_flash_rows<T, 96>(p, l);
  if (p.d <= 128) return launch_flash_rows<T, 128>(p, l);
  if (p.d <= 160) return launch_flash_rows<T, 160>(p, l);
  return launch_flash_rows<T, 256>(p, l);
}

// ATELIER_SHORT_KV_ATTENTION: "0" off; unset, the one-tile kernel at head dims 136-160 (session 48) and the narrow
// heads' kernel of cuda_attention_short.cu up to head dim 48 (SD's d40 cross-attentions: 12.5 -> 10.4 us in the CFG
// step, 78 -> 55 us at 16 rows on an H100, session 49); "all" that kernel up to 128 (at d80 it took 7.9-8.4 us against
// the wgmma kernel's 7.1, so not by default); "wide" the one-tile kernel only (as before session 49).
constexpr int kShortKvNarrowDefault = 48;
int short_kv_narrow_from_env() {
  if (env_is("ATELIER_SHORT_KV_ATTENTION", "all")) return kShortKvMaxHeadDim;
  if (env_is("ATELIER_SHORT_KV_ATTENTION", "wide")) return 0;
  return kShortKvNarrowDefault;
}
std::atomic<bool> g_short_kv{!env_is("ATELIER_SHORT_KV_ATTENTION", "0")};
std::atomic<int> g_short_kv_narrow{short_kv_narrow_from_env()};  // the narrow kernel's largest head dim (0: none)
std::atomic<int64_t> g_short_kv_launches{0};

// Up to head dim 128, unmasked: the kernel of cuda_attention_short.cu (K/V loaded once per block, each warp's query
// tiles pipelined). At head dims 136-160 (SD's 160): the flash kernel above as one key tile, faster there than the
// tiled kernel and cuDNN (session 48). One m-tile per warp: at head dim 160, S's 40 and O's 80 accumulators a thread
// leave no room for a second.
template <typename T>
bool launch_flash_short(const FlashParams& p, const FlashLaunch& l) {
  if (!g_short_kv.load() || p.sk > kShortKeys || p.d > 160) return false;
  bool launched = false;
  if (p.d <= kShortKvMaxHeadDim) {
    if (p.mask.ptr || p.d > g_short_kv_narrow.load()) return false;
    const ShortKvArgs a{p, std::is_same_v<T, __nv_bfloat16>, l.sm_count};
    launched = launch_short_kv_attention(a, l.stream);
  } else if (p.d > 128) {
    launched = p.mask.ptr ? launch_flash_kernel<T, 160, 1, kShortKeys, true, 1>(p, l.max_smem, l.stream)
                          : launch_flash_kernel<T, 160, 1, kShortKeys, false, 1>(p, l.max_smem, l.stream);
  }
  if (launched) g_short_kv_launches.fetch_add(1);
  return launched;
}

int64_t row_stride(const Tensor& t) { return t.size(2) == 1 ? t.size(3) : t.strides()[2]; }
int64_t dim_stride(const Tensor& t, int d) { return t.size(d) == 1 ? 0 : t.strides()[d]; }

// 16-byte aligned rows: what cp.async needs.
bool flash_aligned(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.raw()) % 16 != 0) return false;
  return dim_stride(t, 0) % 8 == 0 && dim_stride(t, 1) % 8 == 0 && row_stride(t) % 8 == 0;
}

// Rows of the output written two elements at a time (32-bit stores): even strides, 4-byte aligned.
bool pair_aligned(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.raw()) % 4 != 0 || t.strides()[3] != 1) return false;
  return dim_stride(t, 0) % 2 == 0 && dim_stride(t, 1) % 2 == 0 && row_stride(t) % 2 == 0;
}

}  // namespace

bool CudaBackend::attention_flash(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) {
  const DType dt = q.dtype();
  if (dt != DType::BF16 && dt != DType::F16) return false;
  if (k.dtype() != dt || v.dtype() != dt || out.dtype() != dt) return false;
  const int64_t b = q.size(0), h = q.size(1), sq = q.size(2), d = q.size(3), hk = k.size(1), sk = k.size(2);
  if (v.size(3) != d || d % 8 != 0 || d > kMaxFlashHeadDim) return false;
  if (b > 65535 || h > 65535 || sq >= (int64_t(1) << 30) || sk >= (int64_t(1) << 30)) return false;
  if (!flash_aligned(q) || !flash_aligned(k) || !flash_aligned(v) || !pair_aligned(out)) return false;
  FlashParams p{};
  p.q = q.raw();
  p.k = k.raw();
  p.v = v.raw();
  p.out = out.raw();
  p.qs0 = dim_stride(q, 0), p.qs1 = dim_stride(q, 1), p.qs2 = row_stride(q);
  p.ks0 = dim_stride(k, 0), p.ks1 = dim_stride(k, 1), p.ks2 = row_stride(k);
  p.vs0 = dim_stride(v, 0), p.vs1 = dim_stride(v, 1), p.vs2 = row_stride(v);
  p.os0 = dim_stride(out, 0), p.os1 = dim_stride(out, 1), p.os2 = row_stride(out);
  p.sq = int(sq);
  p.sk = int(sk);
  p.d = int(d);
  p.batch = int(b);
  p.heads = int(h);
  p.group = int(h / hk);
  p.scale = scale;
  p.mask = attention_mask_of(mask);
  p.lazy = g_lazy_max.load();
  NvtxRange range("attention_flash");
  const FlashLaunch launch{sm_count_, flash_block_rows_, flash_key_tile_, max_smem_optin_, stream_};
  if (dt == DType::BF16 ? launch_flash_short<__nv_bfloat16>(p, launch) : launch_flash_short<__half>(p, launch)) return true;
  // Hopper: the wgmma/TMA kernel (cuda_attention_wgmma.cu) takes unmasked bf16 at head dims 40/64/80/128 first;
  // 1.1-2.4x this file's mma.sync kernel, and ahead of cuDNN's SDPA at SD's head dims 40 and 80.
  if (wgmma_attention_enabled() && dt == DType::BF16 && !mask.defined() && h % hk == 0) {
    const WgmmaAttentionArgs wa{p, max_smem_optin_, sm_count_};
    if (launch_attention_wgmma(wa, cc_major_, stream_)) return true;
  }
  if (dt == DType::BF16) return launch_flash_bucket<__nv_bfloat16>(p, launch);
  return launch_flash_bucket<__half>(p, launch);
}

bool CudaBackend::cudnn_sdpa_available(std::string* why) {
  {
    std::lock_guard<std::mutex> lock(engines_mu_);
    const ConvEngine& conv = conv_engine_locked();
    if (!sdpa_) sdpa_ = std::make_unique<CudnnSdpa>(conv.library(), conv.handle(), stream_, choices_.get());
  }
  if (!sdpa_->available() && why) *why = conv_->available() ? sdpa_->why_unavailable() : "cuDNN not loaded: " + conv_->why_unavailable();
  return sdpa_->available();
}

bool CudaBackend::attention_cudnn(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) {
  if (mask.defined() || !cudnn_sdpa_available(nullptr)) return false;
  NvtxRange range("attention_cudnn");
  if (attention_impl_ == AttentionImpl::kCudnnSdpa) return sdpa_->forward(out, q, k, v, scale, alloc_, nullptr);
  const auto ours = [&] { return attention_flash(out, q, k, v, mask, scale); };
  return sdpa_->forward(out, q, k, v, scale, alloc_, ours);
}

// q [B, H, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv] (unit last stride, any other strides); mask a
// [B, H, Sq, Sk] broadcast view (last stride 0 or 1) or undefined; out [B, H, Sq, Dv] with a unit last stride
// (contiguous, or heads merged). cuDNN's SDPA where it takes the case and measured faster, else the flash
// kernel, else the GEMM path.
void CudaBackend::attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) {
  if (out.numel() == 0) return;
  ATELIER_CHECK(k.size(2) > 0, "attention over an empty key sequence");
  DeviceGuard guard(index_);
  if ((attention_impl_ == AttentionImpl::kAuto || attention_impl_ == AttentionImpl::kCudnnSdpa) &&
      attention_cudnn(out, q, k, v, mask, scale))
    return;
  if (attention_impl_ == AttentionImpl::kCudnnSdpa)
    throw Error(unsupported("attention: cuDNN's SDPA node did not take " + std::string(dtype_name(q.dtype())) + " " +
                            shape_str(q.shape()) + " / " + shape_str(k.shape()) +
                            " (ATELIER_CUDNN_LOG=1 says why)"));
  if (attention_impl_ != AttentionImpl::kGemm && attention_flash(out, q, k, v, mask, scale)) return;
  // Heads merged: the GEMM path writes [B, H, Sq, Dv] rows only.
  if (!out.is_contiguous()) return attention_through_temporary(out, q, k, v, mask, scale);
  if (attention_impl_ == AttentionImpl::kFlash)
    throw Error(unsupported("attention: the flash kernel takes bf16/f16 q, k, v of one dtype, equal q/v head dims that are a "
                            "multiple of 8 and at most 256, and 16-byte aligned rows; got " +
                            std::string(dtype_name(q.dtype())) + " " + shape_str(q.shape()) + " / " + shape_str(v.shape())));
  attention_gemm(out, q, k, v, mask, scale);
}

void set_short_kv_attention(bool on) { g_short_kv = on; }
int set_short_kv_narrow_head_dims(int max_d) { return g_short_kv_narrow.exchange(std::clamp(max_d, 0, kShortKvMaxHeadDim)); }
int short_kv_narrow_head_dims_default() { return kShortKvNarrowDefault; }
int64_t short_kv_attention_launches() { return g_short_kv_launches.load(); }

bool attention_lazy_max() { return g_lazy_max.load(); }
void set_attention_lazy_max(bool on) { g_lazy_max = on; }
LazyMaxCounts flash_lazy_max_counts() { return read_lazy_max_counts(g_flash_lazy_rescales, g_flash_lazy_exact_rows); }

}  // namespace atelier::cuda
