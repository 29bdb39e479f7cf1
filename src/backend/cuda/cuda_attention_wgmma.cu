// Flash attention on Hopper's warpgroup MMA and bulk tensor copies (cuda_attention_wgmma.h).
//
// A block has one producer warpgroup and C consumer warpgroups of 64 queries each (C = 3 for head dims <= 64,
// whose softmax bounds them and wants more warps to hide its latencies; 2 above, for their registers; 4 over 64-key
// tiles at head dim 40 where whole waves make that cheaper, wgmma_block_shape_for), for one (batch, head). One
// producer thread loads Q once and the K and V tiles (128 keys, or 64) through the bulk tensor copy
// engine into two buffers, in wgmma's 128-byte swizzle (cuda_wgmma.cuh: rows of 64 elements, atom columns along
// the head dim), each load completing on the buffer's "full" mbarrier; it refills a buffer once every consumer
// thread arrived on its "empty" barrier. The consumers follow FlashAttention-3's schedule:
//   per tile j: S_j = Q K_j^T (wgmma, both operands in shared memory) issued together with O += P_{j-1} V_{j-1}
//   (P from registers, V as an MN-major operand), then the online softmax of S_j runs while P_{j-1} V_{j-1} is
//   still on the tensor cores; the consumers take turns issuing their products (a ring of named barriers), so
//   one's softmax overlaps the others' products.
// The softmax is lazy about its max (session 54, softmax_lazy): tiles after the first take their exponentials against
// the running max of the tiles before, with no max over S and no rescale of O, and rescale only where a row's scores
// grew by 2^64 within a tile (or recompute the rows exactly where they overflowed f32): 9% off the d40 kernel and 12%
// off d80 inside SD's 1024² step, 11-12% off d64 and FLUX's d128 (cuda_attention_lazy.cuh;
// ATELIER_ATTENTION_LAZY_MAX=0: the exact max per tile).
// Measured and not kept (docs/performance.md, sessions 20 and 33): consumers issuing without turns (8-20% slower),
// part of the exponentials as a polynomial on the FMA pipes (9-23% slower at head dims 40/64, in proportion to the
// instructions added: the consumers' issue bounds the tile as soon as the MUFU's share falls), 64-key tiles, three
// K/V buffers (within noise of two), the row sums on the tensor cores through a column of ones written into V (P V
// at N = D + 8: 4-6% slower at d40), bf16x2 exponentials (ptxas makes each two f32 MUFU operations: 14% slower);
// session 50: each consumer issuing S of the next tile before the softmax of this one into a second S buffer (two
// consumers over 128 keys or three over 64, for the registers: d40 190-224 against 138 us in SD's CFG step), three
// consumers over 96-key tiles (5% slower at 16 rows); session 52: three or four K/V buffers, K and V loaded by two
// producer threads, one empty-barrier arrival per consumer warp (each within 1%: the consumers do not wait for loads
// or releases). The SM does overlap wgmma with MUFU exponentials (session 52's probe, cuda_ops_bench --only units).
// Session 53 (docs/cuda.md): at head dim 40 with K/V as the UNet passes them (views of its fused q/k/v projection,
// rows 1,920 bytes apart) the kernel takes what its compute alone takes (1.83 ms at [2, 8, 16384²] on an H100): the
// softmax alone ~75% of that, the products alone ~48% (their probe, cuda_ops_bench --only products), overlapping by
// less than half of the products. With K/V contiguous per head (80-byte rows back to back, the bench's first rows)
// the loads alone take 1.60 and the kernel 1.96. Heads padded to 64 columns (128-byte-aligned rows) gain ~1%; K/V
// copied by the producer warpgroup's cp.async made the kernel 5-8% slower (neither kept).
// Head dims are padded to whole atom columns (64): the tensor maps zero-fill columns past the head dim and rows
// past the sequence (S's product stops at the head dim rounded up to 16; keys past the end are masked).
#include "backend/cuda/cuda_attention_wgmma.h"

#include <cuda.h>
#include <cuda_bf16.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_attention_lazy.cuh"
#include "backend/cuda/cuda_attention_lazy.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

namespace atelier::cuda {
namespace {

// Keys per K/V tile: 128 by default (64-key tiles measured slower at every head dim with three consumers); four
// consumers take 64 so that S, P and O fit the 112 registers each of them gets.
constexpr int kDefaultBlockK = 128;
constexpr int kStages = 2;    // K/V buffers (three measured within noise of two)
std::atomic<int64_t> g_launches{0};

struct KernelParams {
  CUtensorMap q, k, v;  // [batch][heads][rows][head dim] boxes of 64 head-dim columns
  AttentionViews views;  // the operands in global memory: out, and q/k/v for exact_rows (the lazy max's fallback)
  float scale_log2;      // softmax scale x log2(e)
};

// On unless ATELIER_WGMMA_ATTENTION=0 (then the mma.sync kernel takes these cases too).
bool& enabled_flag() {
  static bool on = [] {
    const char* v = std::getenv("ATELIER_WGMMA_ATTENTION");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

// How often the lazy max's rare paths ran (warps; cuda_attention_lazy.h).
__device__ unsigned long long g_lazy_rescales = 0, g_lazy_exact_rows = 0;

// The block shape asked for at head dims <= 64: ATELIER_WGMMA_ATTENTION_SHAPE=3x128 or =4x64, else {0, 0}: the
// choice by waves (launch_narrow).
WgmmaAttentionShape& shape_setting() {
  static WgmmaAttentionShape shape = [] {
    WgmmaAttentionShape s{};
    if (const char* v = std::getenv("ATELIER_WGMMA_ATTENTION_SHAPE")) {
      if (std::sscanf(v, "%dx%d", &s.consumers, &s.block_k) != 2 || !wgmma_attention_shape_supported(s)) s = {};
    }
    return s;
  }();
  return shape;
}

// One kernel's shape: head dim D (tiles padded to whole 64-column atoms), C consumer warpgroups of 64 queries, K/V
// tiles of BK keys.
template <int D, int C, int BK>
struct Cfg {
  static constexpr int kBlockK = BK;
  static constexpr int kAtoms = (D + 63) / 64;
  static constexpr int kThreads = 128 * (C + 1), kBlockQ = 64 * C;
  static constexpr uint32_t kQBytes = kBlockQ * kAtoms * 128, kTileBytes = kBlockK * kAtoms * 128;
  static constexpr size_t kSmem = kQBytes + 2 * kStages * kTileBytes + 8 * (1 + 4 * kStages) + 1024;
#ifdef ATELIER_WGMMA
  static constexpr int kN = (D + 7) / 8 * 8;  // O's columns: P V's N, the head dim (wgmma's N steps by 8)
  static constexpr int kConsumerThreads = 128 * C;
  static constexpr int kProducerRegs = 24;
  // setmaxnreg moves registers within the block's allocation at launch (the per-thread cap of
  // __launch_bounds__(kThreads, 1), a multiple of 8, times the threads): 384 x 168, 512 x 128, 640 x 96. A consumer
  // gets what the producer gives up (multiple of 8, at most 240: 112 with four consumers); asking for more than the
  // pool holds waits forever.
  static constexpr int kPool = kThreads * (65536 / kThreads / 8 * 8);
  static constexpr int kRegsLeft = (kPool - 128 * kProducerRegs) / kConsumerThreads / 8 * 8;
  static constexpr int kConsumerRegs = kRegsLeft > 240 ? 240 : kRegsLeft;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kPool);
#endif
};

#ifdef ATELIER_WGMMA
constexpr int kSchedBarrier = 1;  // named barriers 1 .. C: consumer c waits on 1 + c before issuing its products

// The shared-memory carve-up of one block.
template <class K>
struct Smem {
  uint8_t *q, *k, *v;
  uint64_t *q_full, *k_full, *v_full, *k_empty, *v_empty;
  __device__ explicit Smem(uint8_t* raw) {
    q = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    k = q + K::kQBytes;
    v = k + kStages * K::kTileBytes;
    q_full = reinterpret_cast<uint64_t*>(v + kStages * K::kTileBytes);
    k_full = q_full + 1;
    v_full = k_full + kStages;
    k_empty = v_full + kStages;
    v_empty = k_empty + kStages;
  }
};

// K/V tile j's buffer (of the kStages in `ring`), and the phase parity its full barrier completes in for tile j
// (the producer waits on the empty barrier's other phase).
template <class K>
__device__ __forceinline__ uint8_t* tile_buffer(uint8_t* ring, int j) {
  return ring + (j % kStages) * K::kTileBytes;
}
__device__ __forceinline__ uint32_t tile_parity(int j) { return uint32_t((j / kStages) & 1); }

// The producer's one thread: Q, then K_j and V_j into buffer j % kStages once the consumers released it.
template <class K>
__device__ __forceinline__ void produce(const KernelParams& p, const Smem<K>& sm, int n_tiles) {
  const int h = int(blockIdx.y), b = int(blockIdx.z), q0 = int(blockIdx.x) * K::kBlockQ, kvh = h / p.views.group;
  tma::arrive_expect_tx(sm.q_full, K::kQBytes);
#pragma unroll
  for (int a = 0; a < K::kAtoms; ++a) tma::load_4d(sm.q + a * K::kBlockQ * 128, &p.q, 64 * a, q0, h, b, sm.q_full);
  for (int j = 0; j < n_tiles; ++j) {
    const int st = j % kStages;
    const uint32_t parity = tile_parity(j) ^ 1;
    tma::wait(&sm.k_empty[st], parity);
    tma::arrive_expect_tx(&sm.k_full[st], K::kTileBytes);
#pragma unroll
    for (int a = 0; a < K::kAtoms; ++a)
      tma::load_4d(tile_buffer<K>(sm.k, j) + a * K::kBlockK * 128, &p.k, 64 * a, j * K::kBlockK, kvh, b, &sm.k_full[st]);
    tma::wait(&sm.v_empty[st], parity);
    tma::arrive_expect_tx(&sm.v_full[st], K::kTileBytes);
#pragma unroll
    for (int a = 0; a < K::kAtoms; ++a)
      tma::load_4d(tile_buffer<K>(sm.v, j) + a * K::kBlockK * 128, &p.v, 64 * a, j * K::kBlockK, kvh, b, &sm.v_full[st]);
  }
}

// One consumer warpgroup's state: O (64 x kN accumulators), S of the current tile, P of the previous one in
// A-fragment form, and the softmax's running max and sum of this thread's two rows.
template <class K>
struct Consumer {
  float o[K::kN / 2];
  float s[K::kBlockK / 2];
  uint32_t pa[K::kBlockK / 16][4];
  float m[2], l[2];
  bool exact_needed;  // an exponential overflowed (softmax_lazy): exact_rows recomputes this warp's rows
  __device__ void clear() {
#pragma unroll
    for (int i = 0; i < K::kN / 2; ++i) o[i] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
    exact_needed = false;
  }
};

// S = Q K^T over the head dim rounded up to 16 (64 x BK per warpgroup).
template <class K, int D>
__device__ __forceinline__ void issue_s(float (&s)[K::kBlockK / 2], uint32_t q_addr, uint32_t k_addr) {
#pragma unroll
  for (int kk = 0; kk < (D + 15) / 16; ++kk) {
    const uint32_t step = (kk % 4) * 32;
    const uint64_t da = wgmma::desc_sw128(q_addr + (kk / 4) * K::kBlockQ * 128 + step, 0, wgmma::kAtomGroupBytes);
    const uint64_t db = wgmma::desc_sw128(k_addr + (kk / 4) * K::kBlockK * 128 + step, 0, wgmma::kAtomGroupBytes);
    wgmma::mma_ss<K::kBlockK, 0>(s, da, db, kk > 0);
  }
}

// O += P V: V's rows 16 kk .. as an MN-major operand, atom columns BK * 128 bytes apart (LBO).
template <int N, int BK>
__device__ __forceinline__ void issue_pv(float (&o)[N / 2], const uint32_t (&pa)[BK / 16][4], uint32_t v_addr) {
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk)
    wgmma::mma_rs<N, 1>(o, pa[kk], wgmma::desc_sw128(v_addr + kk * 16 * 128, BK * 128, wgmma::kAtomGroupBytes), true);
}

// Keys at or past `valid` (columns of this tile) get -inf. Column of s[4j + e]: 8j + 2t + (e & 1).
template <int BK>
__device__ __forceinline__ void mask_keys(float (&s)[BK / 2], int valid, int t) {
#pragma unroll
  for (int j = 0; j < BK / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (8 * j + 2 * t + (e & 1) >= valid) s[4 * j + e] = -INFINITY;
}

// Online softmax of S (this thread: rows g (e = 0, 1) and g + 8 (e = 2, 3) of its warp's 16): S becomes P
// (unnormalised, in f32), m and l move on; returns O's rescale factors in alpha. The row max and sum are four
// partial ones each, so that the one warp per scheduler of this warpgroup is not waiting on a chain.
template <int BK>
__device__ __forceinline__ void softmax(float (&s)[BK / 2], float (&m)[2], float (&l)[2], float (&alpha)[2], float sl) {
  constexpr int kPairs = BK / 8;  // column pairs per row and thread
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kPairs; ++j) mx[j % 4] = fmaxf(mx[j % 4], fmaxf(s[4 * j + 2 * ri], s[4 * j + 2 * ri + 1]));
    mx[0] = fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3]));
    float row_max = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], 1));
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
    const float m_new = fmaxf(m[ri], row_max * sl);
    alpha[ri] = fast_exp2(m[ri] - m_new);
    m[ri] = m_new;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kPairs; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = fmaf(s[4 * j + 2 * ri + e], sl, -m_new);
        const float pv = fast_exp2(x);
        s[4 * j + 2 * ri + e] = pv;
        sum[(2 * j + e) % 4] += pv;
      }
    l[ri] = l[ri] * alpha[ri] + ((sum[0] + sum[1]) + (sum[2] + sum[3]));
  }
}

// The exponentials of tile j > 0 against the running max of the tiles before it (m), without a max over S: P may
// exceed 1 and nothing needs rescaling, which takes the max's FMNMX chain and shuffles, O's rescale and alpha's
// exponentials off every tile (cuda_attention_lazy.cuh); settle_lazy checks the exponentials once P is packed. Rows
// of S as in softmax(); the thread's share of each row's sum over the tile in tile_sum.
template <int BK>
__device__ __forceinline__ void softmax_lazy(float (&s)[BK / 2], const float (&m)[2], float (&tile_sum)[2], float sl) {
  constexpr int kPairs = BK / 8;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kPairs; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = fast_exp2(fmaf(s[4 * j + 2 * ri + e], sl, -m[ri]));
        s[4 * j + 2 * ri + e] = pv;
        sum[(2 * j + e) % 4] += pv;
      }
    tile_sum[ri] = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  }
}

template <int BK>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[BK / 16][4], const float (&s)[BK / 2]) {
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) pa[kk][i] = pack2<__nv_bfloat16>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
}

template <int N>
__device__ __forceinline__ void rescale(float (&o)[N / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[4 * j + e] *= alpha[e / 2];
}

// After softmax_lazy and pack_p (O no longer on the tensor cores): the tile's sums join l, unless a thread's share
// of a row's sum passed kLazyCap somewhere in this warp (the vote runs after the packing so that nothing waits on the
// last exponentials). Then each row is rescaled exactly, by r = 2^-e with 2^(e-1) <= its largest P < 2^e: P (and
// its packed copy), l and O by r, m to m + e. An exponential that overflowed (scores 128 / log2(e) = 89 over the
// running max within one tile) cannot be rescaled: the warp flags exact_needed and finish() recomputes its rows.
template <int N, int BK>
__device__ __forceinline__ void settle_lazy(float (&s)[BK / 2], uint32_t (&pa)[BK / 16][4], float (&o)[N / 2],
                                            float (&m)[2], float (&l)[2], const float (&tile_sum)[2],
                                            bool& exact_needed) {
  constexpr int kPairs = BK / 8;
  constexpr float kCap = kLazyCap<__nv_bfloat16>;
  if (!__any_sync(0xffffffffu, tile_sum[0] > kCap || tile_sum[1] > kCap)) {
    l[0] += tile_sum[0];
    l[1] += tile_sum[1];
    return;
  }
  if ((threadIdx.x & 31) == 0) atomicAdd(&g_lazy_rescales, 1ull);
  float alpha[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float mx = 0.0f;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * ri], s[4 * j + 2 * ri + 1]));
    alpha[ri] = lazy_settle_row(mx, tile_sum[ri], l[ri], m[ri], exact_needed);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      s[4 * j + 2 * ri] *= alpha[ri];
      s[4 * j + 2 * ri + 1] *= alpha[ri];
    }
  }
  rescale<N>(o, alpha);
  pack_p<BK>(pa, s);
}

template <class K, int D>
__device__ __forceinline__ void store_out(const KernelParams& p, const Consumer<K>& st, int c, int tid) {
  const int warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  float inv[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float sum = st.l[ri];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv[ri] = 1.0f / sum;
  }
  auto* og =
      static_cast<__nv_bfloat16*>(p.views.out) + int64_t(blockIdx.z) * p.views.os0 + int64_t(blockIdx.y) * p.views.os1;
  const int row0 = int(blockIdx.x) * K::kBlockQ + c * 64 + warp * 16 + g;
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int row = row0 + 8 * ri;
    if (row >= p.views.sq) continue;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(og + row * p.views.os2 + 8 * j + 2 * t) =
          pack2<__nv_bfloat16>(st.o[4 * j + 2 * ri] * inv[ri], st.o[4 * j + 2 * ri + 1] * inv[ri]);
  }
}

// The last tile's P V, then O out. The last consumer does not hand the turn on: each barrier then sees as many
// arrivals as waits.
template <class K, int D>
__device__ __forceinline__ void finish(const KernelParams& p, const Smem<K>& sm, Consumer<K>& st,
                                       const tma::TurnRing& turn, int last, int c, int tid) {
  tma::wait(&sm.v_full[last % kStages], tile_parity(last));
  turn.begin();
  wgmma::fence();
  issue_pv<K::kN, K::kBlockK>(st.o, st.pa, smem_u32(tile_buffer<K>(sm.v, last)));
  wgmma::commit();
  if (!turn.last) turn.end();
  wgmma::wait<0>();
  wgmma::fence_operands(st.o);
  if (__any_sync(0xffffffffu, st.exact_needed))
    exact_rows<__nv_bfloat16, D>(p.views, int(blockIdx.z), int(blockIdx.y),
                                 int(blockIdx.x) * K::kBlockQ + c * 64 + (tid % 128) / 32 * 16, 16, tid % 32,
                                 &g_lazy_exact_rows);
  else
    store_out<K, D>(p, st, c, tid);
}

// Consumer c of the block's nc working ones (those with query rows inside the sequence).
template <class K, int D, bool kLazy>
__device__ __forceinline__ void consume(const KernelParams& p, const Smem<K>& sm, int n_tiles, int c, int nc, int tid) {
  const tma::TurnRing turn(kSchedBarrier, c, nc);  // the nc working consumers issue their products in turns
  Consumer<K> st;
  st.clear();
  const int t = tid % 4;
  const int tail = p.views.sk - (n_tiles - 1) * K::kBlockK;  // keys in the last tile
  const uint32_t q_addr = smem_u32(sm.q) + c * 64 * 128;
  const auto k_addr = [&](int j) { return smem_u32(tile_buffer<K>(sm.k, j)); };
  const auto v_addr = [&](int j) { return smem_u32(tile_buffer<K>(sm.v, j)); };
  float alpha[2];

  turn.start();  // consumer 0 issues first
  tma::wait(sm.q_full, 0);

  // Tile 0: S alone.
  tma::wait(&sm.k_full[0], 0);
  turn.begin();
  wgmma::fence();
  issue_s<K, D>(st.s, q_addr, k_addr(0));
  wgmma::commit();
  turn.end();
  wgmma::wait<0>();
  wgmma::fence_operands(st.s);
  tma::arrive(&sm.k_empty[0]);
  if (n_tiles == 1 && tail < K::kBlockK) mask_keys<K::kBlockK>(st.s, tail, t);
  softmax<K::kBlockK>(st.s, st.m, st.l, alpha, p.scale_log2);
  pack_p<K::kBlockK>(st.pa, st.s);

  for (int j = 1; j < n_tiles; ++j) {
    tma::wait(&sm.k_full[j % kStages], tile_parity(j));
    turn.begin();
    wgmma::fence();
    issue_s<K, D>(st.s, q_addr, k_addr(j));
    wgmma::commit();
    tma::wait(&sm.v_full[(j - 1) % kStages], tile_parity(j - 1));
    issue_pv<K::kN, K::kBlockK>(st.o, st.pa, v_addr(j - 1));
    wgmma::commit();
    turn.end();
    wgmma::wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
    wgmma::fence_operands(st.s);
    tma::arrive(&sm.k_empty[j % kStages]);
    if (j == n_tiles - 1 && tail < K::kBlockK) mask_keys<K::kBlockK>(st.s, tail, t);
    float tile_sum[2];
    if constexpr (kLazy)
      softmax_lazy<K::kBlockK>(st.s, st.m, tile_sum, p.scale_log2);
    else
      softmax<K::kBlockK>(st.s, st.m, st.l, alpha, p.scale_log2);
    wgmma::wait<0>();
    wgmma::fence_operands(st.o);
    tma::arrive(&sm.v_empty[(j - 1) % kStages]);
    if constexpr (!kLazy) rescale<K::kN>(st.o, alpha);
    pack_p<K::kBlockK>(st.pa, st.s);
    if constexpr (kLazy) settle_lazy<K::kN, K::kBlockK>(st.s, st.pa, st.o, st.m, st.l, tile_sum, st.exact_needed);
  }

  finish<K, D>(p, sm, st, turn, n_tiles - 1, c, tid);
}

#endif  // ATELIER_WGMMA

template <int D, int C, int BK, bool kLazy>
__global__ void __launch_bounds__(Cfg<D, C, BK>::kThreads, 1)
    attention_wgmma_kernel(const __grid_constant__ KernelParams p) {
#ifdef ATELIER_WGMMA
  using K = Cfg<D, C, BK>;
  extern __shared__ uint8_t smem_raw[];
  const Smem<K> sm(smem_raw);
  const int tid = int(threadIdx.x), wg = tid / 128;
  const int n_tiles = (p.views.sk + BK - 1) / BK;
  // Consumers whose 64 query rows all lie past the sequence (the last block of a head: 4096 queries make 21 blocks
  // of 192 and one of 64) leave at once instead of computing rows nobody stores; the others' barriers count only them
  // (session 36: [16, 8, 4096²] d40 0.984 -> 0.963-0.971 ms).
  const int nc = min(C, (p.views.sq - int(blockIdx.x) * K::kBlockQ + 63) / 64);
  if (tid == 0) {
    tma::mbar_init(sm.q_full, 1);
    for (int i = 0; i < kStages; ++i) {
      tma::mbar_init(&sm.k_full[i], 1);
      tma::mbar_init(&sm.v_full[i], 1);
      tma::mbar_init(&sm.k_empty[i], 128 * nc);
      tma::mbar_init(&sm.v_empty[i], 128 * nc);
    }
    tma::fence_mbar_init();
  }
  __syncthreads();
  if (wg == 0) {
    tma::regs_dealloc<K::kProducerRegs>();
    if (tid == 0) produce<K>(p, sm, n_tiles);
  } else {
    tma::regs_alloc<K::kConsumerRegs>();
    if (wg - 1 < nc) consume<K, D, kLazy>(p, sm, n_tiles, wg - 1, nc, tid - 128);
  }
#else
  __trap();
#endif
}

// A [batch][heads][rows][d] bf16 view (element strides s0, s1, s2; the head dim contiguous) as a tensor map of
// 64 x `rows_per_box` boxes in the 128-byte swizzle; false where the view breaks TMA's rules (16-byte strides).
bool make_map(CUtensorMap& map, const void* base, int batch, int heads, int rows, int d, int64_t s0, int64_t s1,
              int64_t s2, int rows_per_box) {
  const tma::EncodeTiled encode = tma::encode_tiled();
  if (!encode || reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  for (const int64_t s : {s0, s1, s2})
    if (s % 8 != 0) return false;
  const cuuint64_t dims[4] = {cuuint64_t(d), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(s2) * 2, cuuint64_t(s1) * 2, cuuint64_t(s0) * 2};
  const cuuint32_t box[4] = {64, cuuint32_t(rows_per_box), 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int D, int C = (D <= 64 ? 3 : 2), int BK = kDefaultBlockK>
bool launch(const WgmmaAttentionArgs& a, cudaStream_t stream) {
  using K = Cfg<D, C, BK>;
  if (K::kSmem > a.max_smem) return false;
  KernelParams p{};
  if (!make_map(p.q, a.q, a.batch, a.heads, a.sq, a.d, a.qs0, a.qs1, a.qs2, K::kBlockQ) ||
      !make_map(p.k, a.k, a.batch, a.heads / a.group, a.sk, a.d, a.ks0, a.ks1, a.ks2, BK) ||
      !make_map(p.v, a.v, a.batch, a.heads / a.group, a.sk, a.d, a.vs0, a.vs1, a.vs2, BK))
    return false;
  p.views = a;
  p.scale_log2 = a.scale * kLog2e;
  const auto kernel =
      attention_lazy_max() ? attention_wgmma_kernel<D, C, BK, true> : attention_wgmma_kernel<D, C, BK, false>;
  // Per launch, as the mma.sync kernel does: the attribute belongs to the current device's context, and each
  // GPU's backend launches on its own (a once-per-process call left a second GPU at the 48 KB default).
  ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(K::kSmem)));
  const dim3 grid(unsigned((a.sq + K::kBlockQ - 1) / K::kBlockQ), unsigned(a.heads), unsigned(a.batch));
  kernel<<<grid, K::kThreads, K::kSmem, stream>>>(p);
  ATELIER_CUDA_LAUNCHED();
  g_launches.fetch_add(1);
  return true;
}

// A block of four consumers over 64-key tiles (256 queries) takes ~1.46x as long as one of three over 128-key tiles
// (192 queries) on the same keys, ~10% more per query (session 50, H100, SD's d40 self-attention at 16 rows: 1145
// against 1077 us for 2048 and 2816 blocks). It wins where the grid is a few waves and the default's last one is
// mostly idle: SD's CFG step, 352 blocks on 132 SMs (2.67 waves) against 256 (1.94), 134 against 138 us.
constexpr double kFourConsumerBlockCost = 1.46;

template <int D>
bool launch_narrow(const WgmmaAttentionArgs& a, cudaStream_t stream) {
  return wgmma_block_shape_for(D, a.batch, a.heads, a.sq, a.sm_count).consumers == 4 ? launch<D, 4, 64>(a, stream)
                                                                                       : launch<D>(a, stream);
}

}  // namespace

WgmmaAttentionShape wgmma_block_shape_for(int d, int batch, int heads, int sq, int sm_count) {
  const WgmmaAttentionShape asked = shape_setting();
  if (asked.consumers != 0) return asked;
  if (d == 40 && sm_count > 0) {
    const auto waves = [&](int queries_per_block) {
      const int64_t blocks = int64_t((sq + queries_per_block - 1) / queries_per_block) * heads * batch;
      return double((blocks + sm_count - 1) / sm_count);
    };
    if (waves(256) * kFourConsumerBlockCost < waves(192)) return {4, 64};
  }
  return {3, 128};
}

bool wgmma_attention_shape_supported(WgmmaAttentionShape s) {
  return (s.consumers == 0 && s.block_k == 0) || (s.consumers == 3 && s.block_k == 128) ||
         (s.consumers == 4 && s.block_k == 64);
}
void set_wgmma_attention_shape(WgmmaAttentionShape s) { shape_setting() = wgmma_attention_shape_supported(s) ? s : WgmmaAttentionShape{}; }
WgmmaAttentionShape wgmma_attention_shape() { return shape_setting(); }

LazyMaxCounts wgmma_lazy_max_counts() { return read_lazy_max_counts(g_lazy_rescales, g_lazy_exact_rows); }

bool wgmma_attention_enabled() { return enabled_flag(); }
int64_t wgmma_attention_launches() { return g_launches.load(); }
void set_wgmma_attention(bool on) { enabled_flag() = on; }

bool launch_attention_wgmma(const WgmmaAttentionArgs& a, int cc_major, cudaStream_t stream) {
  if (cc_major != 9 || a.sq <= 0 || a.sk <= 0 || a.batch > 65535 || a.heads > 65535) return false;
  switch (a.d) {
    case 40: return launch_narrow<40>(a, stream);
    case 64: return launch_narrow<64>(a, stream);
    case 80: return launch<80>(a, stream);
    case 128: return launch<128>(a, stream);
    default: return false;
  }
}

}  // namespace atelier::cuda
