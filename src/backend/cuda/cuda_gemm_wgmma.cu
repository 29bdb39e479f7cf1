// Matrix products of our own on Hopper's warpgroup MMA and bulk tensor copies (cuda_gemm_wgmma.h).
//
// Persistent blocks (one per SM) walk output tiles of kBM rows, the tiles of one row block next to each other so
// that the blocks running at once share x's rows in L2. A block has one producer warpgroup and two consumer
// warpgroups that take the block's tiles in turns ("ping-pong", as CUTLASS's Hopper kernels): consumer 0 the
// block's tiles 0, 2, 4..., consumer 1 tiles 1, 3, 5...; each computes a whole 128-row tile (two m64 halves) and
// they hold the tensor cores in turns (a ring of two named barriers), so one's epilogue runs while the other's
// products do. (Session 26 measured the earlier form, both consumers on one tile, at 71% of cuBLASLt's mainloop:
// the tensor cores idled through every epilogue, a third of a tile's time at k = 320.) One producer thread streams,
// per k-step of 64, x's 128 x 64 box and BN (128 or 160) rows of w into a ring of kStages buffers (the 128-byte
// swizzle, cuda_wgmma.cuh), each completing on its buffer's "full" mbarrier; it refills a buffer once the consumer
// that read it arrived on its "empty" barrier, and runs ahead into the next tiles. One m64nBN product per half and
// k16 step covers the stage's rows of w:
//   - GLU: two 64 x 64 boxes, the value rows c0.. and the gate rows h + c0.. of w (64 output columns per tile): value
//     column c and gate column c land in the same thread (accumulators j and j + 8), and the epilogue writes
//     (value + b_v) * act(gate + b_g) as bf16 without the [M, 2H] product ever leaving registers;
//   - linear: rows c0.. c0 + BN - 1 (BN = 160 for widths that are multiples of 160, SD's 320/640/1280, else 128);
//     the epilogue adds the bias and the residual (which a bulk copy brought into the staging buffer during the
//     mainloop);
//   - convolution (implicit GEMM, channels-last, stride 1): the linear layer's tiles and epilogue over the output
//     pixels, k running over (tap, 64-channel chunk) as the weights [O][kh][kw][C] lay it out. x's box for a k-step
//     is a 4-D box of the input [N][H][W][C] shifted by the tap: the tile's 128 output pixels are whole output rows
//     (or whole images, or part of one row), the same box of input pixels moved by (i - pad_h, j - pad_w), and the
//     tensor map's zero fill outside the image is the convolution's padding. Its 128 rows of 128 bytes land in
//     shared memory exactly as the linear layer's 128 x 64 box does, so the mainloop is the same.
// Every tile leaves through a staging buffer in shared memory and bulk tensor stores (kStagingBytes), except a
// convolution's whose output rows are not 16-byte multiples (4-byte stores: kConvDirect). Rows past m and k past the
// end are the tensor maps' zero fill; rows and columns past the output are not stored.
//
// Split-K (convolutions only, the SK instances): a product of fewer tiles than SMs (SD's 8x8 level at 16 rows: 64
// tiles of 128 x 160, one consumer of two busy on 64 of 132 SMs) splits each tile's k-steps into `split` parts, the
// work units (part, tile) numbered part-major. Parts 0 .. split - 2 write their f32 sums to a slot of the workspace
// and count themselves on the tile's flag; the last part (the owner) waits for the count, adds the slots in part
// order (the same sum at every run) and runs the usual epilogue. An owner only waits on units numbered before it,
// which every block runs in order, and the launch is cooperative (all blocks resident), so the waits end.
#include "backend/cuda/cuda_gemm_wgmma.h"

#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_nvtx.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

namespace atelier::cuda {
namespace {

constexpr int kBM = 128;     // output rows per tile: one consumer warpgroup's, as two m64 halves
constexpr int kBoxRows = 64;  // rows of w per GLU box; two boxes per stage: 128 product columns
constexpr int kBK = 64;      // k per stage: one 128-byte swizzle atom of bf16
constexpr int kMaxStages = 6;  // buffers in the ring (192 KB): the producer runs a tile ahead of the consumer computing
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr uint32_t kRowBytes = kBK * 2;                       // one swizzled row: 128 bytes
constexpr uint32_t kABytes = kBM * kRowBytes;                // x's box: 16 KB
constexpr uint32_t kBoxBytes = kBoxRows * kRowBytes;         // one GLU w box: 8 KB
// Product columns per tile, BN: 128 (the GLU's two boxes; linear layers and convolutions whose width is not a multiple
// of 160) or 160 (widths of 320, 640, 1280: whole tiles, where 128 leaves half of every third 320-wide tile idle).
template <int BN>
constexpr uint32_t kStageBytes = kABytes + BN * kRowBytes;  // 32 or 36 KB
static_assert(2 * kBoxBytes == kStageBytes<128> - kABytes, "the GLU's two w boxes fill a 128-row stage");

// kConv: a convolution whose tile leaves staged like the linear layer's (session 36: 16 rows -0.21 ms, CFG -0.06,
// 1024² -0.25 against 4-byte stores, although the staging leaves the 160-column tiles 4 ring buffers instead of 6);
// kConvDirect: with 4-byte stores, for outputs whose rows are not 16-byte multiples (the maps need them).
enum class Epi { kGlu, kLinear, kConv, kConvDirect };
constexpr bool is_conv(Epi e) { return e == Epi::kConv || e == Epi::kConvDirect; }
constexpr bool staged_linear(Epi e) { return e == Epi::kLinear || e == Epi::kConv; }
// Output columns per tile: the GLU's 128 product columns make 64.
template <Epi E, int BN>
constexpr int kTileCols = E == Epi::kGlu ? kBoxRows : BN;
// The GLU's and the linear layer's output tiles are staged in shared memory, a buffer per consumer, and leave as bulk
// tensor stores: 4-byte stores (8 rows of 16 bytes per warp instruction) moved the GLU's [65536, 1280] output at
// ~0.8 TB/s, slower than its products (session 35). The GLU's tile is one box of 128 rows of 64 bf16 (128-byte
// rows, 128-byte swizzle); the linear layer's BN columns are BN / 32 boxes of 64 rows x 32 columns per m64 half
// (64-byte rows, 64-byte swizzle), which its residual also arrives in; a convolution's tile is the linear layer's.
constexpr uint32_t kGluTileBytes = kBM * kRowBytes;  // 16 KB
constexpr int kBoxCols = 32, kBoxHalfRows = 64;      // the linear layer's output boxes
constexpr uint32_t kOutBoxBytes = kBoxCols * 2 * kBoxHalfRows;  // 4 KB
template <Epi E, int BN>
constexpr uint32_t kOutTileBytes = E == Epi::kGlu ? kGluTileBytes : staged_linear(E) ? 2 * (BN / kBoxCols) * kOutBoxBytes : 0;
template <Epi E, int BN>
constexpr uint32_t kStagingBytes = kConsumers * kOutTileBytes<E, BN>;
// Ring buffers: as many as fit beside the staging (6 for the GLU and the 4-byte-store convolutions, 5 and 4 for the
// linear layer's and the staged convolutions' 128- and 160-column tiles); one full and one empty barrier each, and a
// residual barrier per consumer.
constexpr size_t kSmemLimit = 227 * 1024;
constexpr size_t kSmemSlack = 1024 + 2 * sizeof(uint64_t);  // alignment, residual barriers
template <Epi E, int BN>
constexpr int kStages = std::min<int>(kMaxStages, int((kSmemLimit - kSmemSlack - kStagingBytes<E, BN>) / (kStageBytes<BN> + 2 * sizeof(uint64_t))));
template <Epi E, int BN>
constexpr size_t kSmem = kStages<E, BN> * (kStageBytes<BN> + 2 * sizeof(uint64_t)) + kStagingBytes<E, BN> + kSmemSlack;
static_assert(kStages<Epi::kGlu, 128> == 6 && kStages<Epi::kConvDirect, 160> == 6 && kStages<Epi::kLinear, 128> == 5 &&
              kStages<Epi::kLinear, 160> == 4 && kStages<Epi::kConv, 160> == 4);
constexpr size_t kSmemMax = std::max({kSmem<Epi::kGlu, 128>, kSmem<Epi::kLinear, 128>, kSmem<Epi::kLinear, 160>, kSmem<Epi::kConv, 160>,
                                      kSmem<Epi::kConvDirect, 160>});
static_assert(kSmemMax <= kSmemLimit);
// setmaxnreg: the producer gives registers to the consumers (each a multiple of 8; 128 x 40 + 256 x 232 fits the
// 384 x 168 that __launch_bounds__(kThreads, 1) allows), as CUTLASS's warp-specialised kernels do: a consumer holds
// 128 accumulators.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * (65536 / kThreads / 8 * 8));

std::atomic<int64_t> g_glu_launches{0}, g_linear_launches{0}, g_conv_launches{0}, g_split_launches{0};

bool& glu_flag() {
  static bool on = !env_is("ATELIER_FUSED_GLU", "0");
  return on;
}
OwnLinear& linear_mode() {
  static OwnLinear mode = env_is("ATELIER_OWN_LINEAR", "1")          ? OwnLinear::kAll
                          : env_is("ATELIER_OWN_LINEAR", "residual") ? OwnLinear::kResidual
                          : env_is("ATELIER_OWN_LINEAR", "0")        ? OwnLinear::kOff
                                                                     : OwnLinear::kTimed;
  return mode;
}
// ATELIER_SPLIT_COOP=0 (an A/B switch, session 38): split-K launched plainly instead of cooperatively (its grid is at
// most one block per SM, each needing a whole SM's shared memory: resident at once on a device of its own). The
// question: whether a cooperative node costs the replayed graph a drain before it.
bool split_coop() {
  static const bool on = !env_is("ATELIER_SPLIT_COOP", "0");
  return on;
}
OwnConv& conv_mode() {
  static OwnConv mode = env_is("ATELIER_OWN_CONV", "0") ? OwnConv::kOff : env_is("ATELIER_OWN_CONV", "force") ? OwnConv::kForce : OwnConv::kAuto;
  return mode;
}

struct Params {
  CUtensorMap x, w;  // x [m][k] in 64 x kBM boxes (convolution: [N][H][W][C] in 64 x the pixel box); w [rows][k] in 64 x BN (GLU: 64) boxes
  // out [m][n] (row stride ldo), the staged tiles' destination: the GLU's in 64 x kBM boxes, the linear layer's in
  // kBoxCols x kBoxHalfRows ones, as res_map (the linear layer's residual, where there is one).
  CUtensorMap out_map, res_map;
  const __nv_bfloat16* bias;
  const __nv_bfloat16* residual;  // linear: [m, n] (row stride ldo), may be out; null for none
  __nv_bfloat16* out;
  int64_t ldo;
  int m, n;  // output rows and columns (GLU: n = h)
  int k_steps, col_tiles, tiles;
  // Convolution only: k-steps per tap (C / 64), the kernel's width, the padding, the output's height and width.
  int conv_c_steps, conv_kw, conv_ph, conv_pw, conv_ho, conv_wo;
  // Convolution of two inputs side by side along channels (a skip concatenation read where it lies): each tap's
  // first conv_c1_steps k-steps from x, the rest from x2 (its own channels, from 0). conv_c_steps: x alone.
  int conv_c1_steps;
  CUtensorMap x2;
  // A 1x1 shortcut accumulated with the convolution (a resnet's conv2 and its conv_shortcut): k-steps from
  // conv_tap_steps (kh x kw x conv_c_steps) on read the shortcut's input at the output pixels themselves, its first
  // conv_sc1_steps from x3 and the rest from x4 (two parts side by side). Without one conv_tap_steps is k_steps.
  int conv_kh, conv_tap_steps, conv_sc1_steps;
  CUtensorMap x3, x4;
  // An upsampler's four output phases as one product (OwnConvArgs::upsample_phases): columns per phase (0: not
  // such a product). Phase q = c0 / conv_phase_cols = 2a + b starts its taps a rows and b columns past the padding's
  // origin, and out_map is then 5-D (make_phase_out_map).
  int conv_phase_cols;
  // Split-K: parts per tile (1: none), work units (tiles x split), the parts' f32 slots and the tiles' flags.
  int split, units;
  float* partial;
  int* flags;
};

// Split-K's workspace: the tiles' flags (ints, zero between launches: each owner resets its own), then a slot of a
// tile's f32 sums per contributing unit, at most kSplitSlotsPerSm per SM.
constexpr size_t kSplitFlagBytes = 4096;
constexpr int kSplitMaxTiles = int(kSplitFlagBytes / sizeof(int));
constexpr int kSplitSlotsPerSm = 2;
constexpr size_t kSplitSlotBytes = size_t(kBM) * 160 * sizeof(float);
constexpr int kMaxSplit = 16;          // parts per tile
constexpr int kMinSplitSteps = 4;      // k-steps per part: fewer and the slots' traffic outweighs the products

#ifdef ATELIER_WGMMA
constexpr int kTurnBarrier = 1;  // named barriers 1 and 2: consumer c waits on 1 + c before its mainloop

// Named barriers 3 and 4: consumer c's own 128 threads (around its split flag; around its staged output tile).
constexpr int kConsumerBarrier = 3;

// Work unit i of this block (unit blockIdx.x + i gridDim.x): its tile's first row and column, and its k-steps
// (split-K: part `part` of the tile's; else all of them).
struct Unit {
  int m0, c0, tile, part, k0, steps;
};
template <Epi E, int BN, bool SK>
__device__ __forceinline__ Unit unit_of(const Params& p, int i) {
  const int u = int(blockIdx.x) + i * int(gridDim.x);
  Unit r;
  r.part = SK ? u / p.tiles : 0;
  r.tile = u - r.part * p.tiles;
  r.m0 = (r.tile / p.col_tiles) * kBM;
  r.c0 = (r.tile % p.col_tiles) * kTileCols<E, BN>;
  r.k0 = SK ? r.part * p.k_steps / p.split : 0;
  r.steps = SK ? (r.part + 1) * p.k_steps / p.split - r.k0 : p.k_steps;
  return r;
}
__device__ __forceinline__ int block_tiles(const Params& p) {
  return (p.units - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);  // >= 1: the grid has at most p.units
}

// The producer's one thread: every (tile, k-step) of this block, in the consumers' order. The GLU's w comes as two
// boxes, the value rows c0.. and the gate rows n + c0..; the others' as one box of BN rows.
template <Epi E, int BN, bool SK>
__device__ __forceinline__ void produce(const Params& p, uint8_t* ring, uint64_t* full, uint64_t* empty) {
  // The ring slot and its phase, and a convolution's (tap row, tap column, channel chunk), carried from k-step to
  // k-step: the divisions by kS and by the run-time tap counts would cost the one issuing thread ~40 instructions
  // per k-step.
  constexpr int kS = kStages<E, BN>;
  const int n = block_tiles(p);
  int s = 0;
  uint32_t phase = 1;  // the empty barriers' phase "before" the first: passes at once
  for (int i = 0; i < n; ++i) {
    const Unit u = unit_of<E, BN, SK>(p, i);
    const int m0 = u.m0, c0 = u.c0;
    int img = 0, oy = 0, ox = 0;  // convolution: the tile's first output pixel, and the k-step's tap and chunk
    int ti = 0, tj = 0, chunk = 0;
    if constexpr (is_conv(E)) {
      const int pixels = p.conv_ho * p.conv_wo, r = m0 % pixels;
      img = m0 / pixels, oy = r / p.conv_wo - p.conv_ph, ox = r % p.conv_wo - p.conv_pw;  // the taps' origin
      if (p.conv_phase_cols) {
        const int q = c0 / p.conv_phase_cols;
        oy += q >> 1, ox += q & 1;
      }
      if (u.k0 >= p.conv_tap_steps) {  // a split-K part that starts in the shortcut's k-steps
        ti = p.conv_kh, chunk = u.k0 - p.conv_tap_steps;
      } else {
        const int tap = u.k0 / p.conv_c_steps;
        chunk = u.k0 - tap * p.conv_c_steps, ti = tap / p.conv_kw, tj = tap - ti * p.conv_kw;
      }
    }
    for (int ks = u.k0; ks < u.k0 + u.steps; ++ks) {
      tma::wait(&empty[s], phase);
      tma::arrive_expect_tx(&full[s], kStageBytes<BN>);  // zero-filled parts of a box count too
      uint8_t* stage = ring + s * kStageBytes<BN>;
      if constexpr (is_conv(E)) {
        if (ti < p.conv_kh) {
          const bool second = chunk >= p.conv_c1_steps;  // never with one input
          tma::load_4d(stage, second ? &p.x2 : &p.x, (second ? chunk - p.conv_c1_steps : chunk) * kBK, ox + tj, oy + ti, img,
                       &full[s]);
          if (++chunk == p.conv_c_steps) {
            chunk = 0;
            if (++tj == p.conv_kw) tj = 0, ++ti;  // ti == conv_kh: the shortcut's k-steps follow, if any
          }
        } else {  // the shortcut's: its input at the tile's own pixels (ho == h, wo == w)
          const bool second = chunk >= p.conv_sc1_steps;  // never with one shortcut input
          tma::load_4d(stage, second ? &p.x4 : &p.x3, (second ? chunk - p.conv_sc1_steps : chunk) * kBK, ox + p.conv_pw,
                       oy + p.conv_ph, img, &full[s]);
          ++chunk;
        }
      } else {
        tma::load_2d(stage, &p.x, ks * kBK, m0, &full[s]);
      }
      tma::load_2d(stage + kABytes, &p.w, ks * kBK, c0, &full[s]);
      if constexpr (E == Epi::kGlu) tma::load_2d(stage + kABytes + kBoxBytes, &p.w, ks * kBK, p.n + c0, &full[s]);
      if (++s == kS) s = 0, phase ^= 1u;
    }
  }
}

// acc[h] (64 x BN: rows 64 h.. of the tile; w's rows as the stage holds them: the GLU's value box in columns 0..63
// and its gate box in 64..127) = those rows of x times those rows of w, over the unit's `steps` k-steps; the ring's
// slots from `it` on. Once the last k-step's products are issued the turn passes to the other consumer (when
// `hand_on`), before they finish.
template <int BN, int kS>
__device__ __forceinline__ void mainloop(float (&acc)[2][BN / 2], int steps, uint8_t* ring, uint64_t* full,
                                         uint64_t* empty, int it, bool hand_on, int other) {
  // The slot and its phase carried from k-step to k-step, and the descriptors moved by constants: a descriptor's
  // address field is the byte address / 16 (14 bits: the 227 KB of shared memory stay below its 16384), so
  // desc(addr + off) = desc(addr) + off / 16. Rebuilt per k-step (a division by kS and 12 shift-and-mask
  // descriptors), this was ~15 instructions per wgmma (session 35's profile of the k = 320 GLU); carried, the SD
  // steps took 0.44 ms less at 16 rows and ~0.08 at CFG (session 36), most of it in the convolutions' long loops.
  constexpr uint64_t kStageStep = kStageBytes<BN> >> 4, kRowStep = kRowBytes >> 4;
  const uint64_t ring_desc = wgmma::desc_sw128(smem_u32(ring), 0, wgmma::kAtomGroupBytes);
  int s = it % kS, last = s;
  uint32_t phase = uint32_t(it / kS) & 1;
  uint64_t da = ring_desc + uint64_t(s) * kStageStep;
  for (int ks = 0; ks < steps; ++ks) {
    tma::wait(&full[s], phase);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)  // k16 step kk starts 32 bytes further along the swizzled rows
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint64_t a = da + (h * 64 * kRowStep + kk * 2), b = da + (kABytes / 16 + kk * 2);
        if constexpr (BN == 160) wgmma::mma_m64n160k16_ss<0>(acc[h], a, b, ks > 0 || kk > 0);
        else wgmma::mma_m64n128k16_ss<0>(acc[h], a, b, ks > 0 || kk > 0);
      }
    wgmma::commit();
    if (hand_on && ks == steps - 1) tma::bar_arrive(kTurnBarrier + other, kConsumerThreads);
    wgmma::wait<1>();  // the previous k-step's products are done: its buffer can be refilled
    if (ks > 0) tma::arrive(&empty[last]);
    last = s;
    if (++s == kS) {
      s = 0, phase ^= 1u, da = ring_desc;
    } else {
      da += kStageStep;
    }
  }
  wgmma::wait<0>();
#pragma unroll
  for (int h = 0; h < 2; ++h) wgmma::fence_operands(acc[h]);
  tma::arrive(&empty[last]);
}

__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// This thread's accumulators hold rows row0 + 64 h + 8 ri, columns 8j + 2t (+1) of the tile in acc[h][4j + 2ri + e].
// for_rows calls fn(h, ri, row) for those of the four rows (h, ri in {0, 1}) that lie inside the output.
template <typename Fn>
__device__ __forceinline__ void for_rows(const Params& p, int row0, Fn&& fn) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int row = row0 + 64 * h + 8 * ri;
      if (row < p.m) fn(h, ri, row);
    }
}

// GLU: out[m0 + r, c0 + col] = (value + b_v) * act(gate + b_g), value in acc[h][4j + ..], gate in acc[h][4(j + 8) + ..],
// for this thread's rows r = r0 + 64 h + 8 ri (r0 = warp * 16 + lane / 4) and columns 8j + 2t (+1). The tile goes to
// the consumer's staging buffer `staged` (row r at r * 128 bytes, its 16-byte chunk j at j ^ (r % 8): the 128-byte
// swizzle of the output map, and no bank conflicts: a warp's 8 rows hit 8 chunks), then out as one bulk store by the
// consumer's first thread; rows and columns past the output are left out by the store. Each column's bias is loaded
// once for both halves.
template <UnaryOp A>
__device__ __forceinline__ void epilogue_glu(const float (&acc)[2][64], const Params& p, uint8_t* staged, int m0, int c0,
                                             int consumer, int ctid) {
  const int r0 = ctid / 32 * 16 + ctid % 32 / 4, t = ctid % 4;
  if (ctid == 0) tma::bulk_wait_read<0>();  // the previous tile's store has read the buffer
  tma::bar_sync(kConsumerBarrier + consumer, 128);
#pragma unroll
  for (int j = 0; j < kBoxRows / 8; ++j) {
    const int col = c0 + 8 * j + 2 * t;
    float2 bv = make_float2(0.0f, 0.0f), bg = bv;
    if (p.bias && col < p.n) bv = load_pair(p.bias + col), bg = load_pair(p.bias + p.n + col);  // n is even: col + 1 < n too
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        const int r = r0 + 64 * h + 8 * ri;
        const float* d = &acc[h][4 * j + 2 * ri];
        const float* g = &acc[h][4 * (j + kBoxRows / 8) + 2 * ri];
        const float y0 = (d[0] + bv.x) * apply_unary_for<__nv_bfloat16>(g[0] + bg.x, A);
        const float y1 = (d[1] + bv.y) * apply_unary_for<__nv_bfloat16>(g[1] + bg.y, A);
        const uint32_t at = smem_u32(staged) + uint32_t(r) * kRowBytes + (uint32_t(j ^ (r % 8)) << 4) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pack2<__nv_bfloat16>(y0, y1)) : "memory");
      }
  }
  wgmma::fence_async_smem();  // the writes, visible to the bulk store
  tma::bar_sync(kConsumerBarrier + consumer, 128);
  if (ctid == 0) {
    tma::store_2d(&p.out_map, c0, m0, staged);
    tma::bulk_commit();
  }
}

// Linear, convolution: out[row, c0 + col] = acc + bias (+ residual: R) over the BN / 8 column groups, kResidualBatch
// groups at a time: the batch's residual pairs are all loaded before any of its stores. (The residual may be out
// itself, accumulated in place, so each load stays before the store after it; loaded pair by pair, each paid a memory
// round trip: the residual cost the [16, 320, 64, 64] convolution 0.07 ms against cuDNN's 0.03, session 32.) Without a
// residual the kernel is its own instance: the run-time check and the batch's registers made the products without one
// 4-8% slower (session 32, call 3).
constexpr int kResidualBatch = 4;
template <int BN, bool R>
__device__ __forceinline__ void epilogue_linear(const float (&acc)[2][BN / 2], const Params& p, int row0, int c0, int t) {
  static_assert(BN / 8 % kResidualBatch == 0);
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += kResidualBatch) {
    uint32_t r[kResidualBatch][2][2];  // bf16 pairs
    if constexpr (R) {
#pragma unroll
      for (int jj = 0; jj < kResidualBatch; ++jj)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int ri = 0; ri < 2; ++ri) {
            const int col = c0 + 8 * (j0 + jj) + 2 * t, row = row0 + 64 * h + 8 * ri;
            r[jj][h][ri] = col < p.n && row < p.m ? *reinterpret_cast<const uint32_t*>(p.residual + int64_t(row) * p.ldo + col) : 0u;
          }
    }
#pragma unroll
    for (int jj = 0; jj < kResidualBatch; ++jj) {
      const int j = j0 + jj, col = c0 + 8 * j + 2 * t;
      if (col >= p.n) continue;  // n is even: col + 1 < n too
      const float2 b = p.bias ? load_pair(p.bias + col) : make_float2(0.0f, 0.0f);
      for_rows(p, row0, [&](int h, int ri, int row) {
        const float* d = &acc[h][4 * j + 2 * ri];
        float y0 = d[0] + b.x, y1 = d[1] + b.y;
        if constexpr (R) {
          const float2 rv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r[jj][h][ri]));
          y0 += rv.x, y1 += rv.y;
        }
        *reinterpret_cast<uint32_t*>(p.out + int64_t(row) * p.ldo + col) = pack2<__nv_bfloat16>(y0, y1);
      });
    }
  }
}

// The linear layer's staged tile: box b of half h (columns 32 b.. of rows 64 h..) at (h BN / 32 + b) * 4 KB, row r of
// a box at r * 64 bytes, its 16-byte chunk c at c ^ ((r / 2) % 4) (the 64-byte swizzle: a warp's 8 rows hit all 32
// banks). The byte of this thread's pair (j, r) in it:
template <int BN>
__device__ __forceinline__ uint32_t staged_pair(uint32_t base, int h, int j, int r, int t) {
  return base + uint32_t(h * (BN / kBoxCols) + j / 4) * kOutBoxBytes + uint32_t(r) * (kBoxCols * 2) +
         (uint32_t((j % 4) ^ ((r / 2) % 4)) << 4) + 4 * t;
}
// The residual's tile into the consumer's staging buffer (issued by its first thread before the mainloop, once the
// previous tile's store has read the buffer), completing on res_full.
template <int BN>
__device__ __forceinline__ void load_residual(const Params& p, uint8_t* staged, uint64_t* res_full, int m0, int c0) {
  tma::bulk_wait_read<0>();
  tma::arrive_expect_tx(res_full, kOutTileBytes<Epi::kLinear, BN>);
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int b = 0; b < BN / kBoxCols; ++b)
      tma::load_2d(staged + (h * (BN / kBoxCols) + b) * kOutBoxBytes, &p.res_map, c0 + kBoxCols * b, m0 + kBoxHalfRows * h, res_full);
}
// Linear: out[m0 + r, c0 + col] = acc + bias (+ the residual, already in `staged` once res_full's phase `parity` has
// completed), staged (staged_pair) and stored as 2 BN / 32 boxes by the consumer's first thread; rows and columns
// past the output are left out by the stores.
template <int BN, bool R>
__device__ __forceinline__ void epilogue_staged(const float (&acc)[2][BN / 2], const Params& p, uint8_t* staged, uint64_t* res_full,
                                                uint32_t parity, int m0, int c0, int consumer, int ctid) {
  const int r0 = ctid / 32 * 16 + ctid % 32 / 4, t = ctid % 4;
  if constexpr (R) {
    tma::wait(res_full, parity);
  } else {
    if (ctid == 0) tma::bulk_wait_read<0>();  // the previous tile's store has read the buffer
    tma::bar_sync(kConsumerBarrier + consumer, 128);
  }
  const uint32_t base = smem_u32(staged);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = c0 + 8 * j + 2 * t;
    const float2 b = p.bias && col < p.n ? load_pair(p.bias + col) : make_float2(0.0f, 0.0f);  // n is even
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        const float* d = &acc[h][4 * j + 2 * ri];
        const uint32_t at = staged_pair<BN>(base, h, j, r0 + 8 * ri, t);
        float y0 = d[0] + b.x, y1 = d[1] + b.y;
        if constexpr (R) {
          uint32_t v;
          asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(at) : "memory");
          const float2 rv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
          y0 += rv.x, y1 += rv.y;
        }
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pack2<__nv_bfloat16>(y0, y1)) : "memory");
      }
  }
  wgmma::fence_async_smem();  // the writes, visible to the bulk stores
  tma::bar_sync(kConsumerBarrier + consumer, 128);
  if (ctid == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < BN / kBoxCols; ++b) {
        const uint8_t* box = staged + (h * (BN / kBoxCols) + b) * kOutBoxBytes;
        if (p.conv_phase_cols) {  // phase q's rows (image row, column) land at out's (2 row + a, 2 column + b)
          const int q = c0 / p.conv_phase_cols, row = m0 + kBoxHalfRows * h;
          tma::store_5d(&p.out_map, c0 - q * p.conv_phase_cols + kBoxCols * b, q & 1, row % p.conv_wo, q >> 1, row / p.conv_wo, box);
        } else {
          tma::store_2d(&p.out_map, c0 + kBoxCols * b, m0 + kBoxHalfRows * h, box);
        }
      }
    tma::bulk_commit();
  }
}

#include "backend/cuda/cuda_gemm_split.cuh"  // split_contribute, split_gather

// Consumer c: the block's units c, c + 2, ... (unit blockIdx.x + i gridDim.x for the block's i-th), each after the
// other consumer handed it the turn; the ring's slots of unit i start after the block's earlier units' k-steps (the
// producer's order: i k_steps without split-K). Every wait on a turn barrier has one arrival: consumer 1's first,
// for unit 0, then one after each unit's mainloop where a next unit exists.
template <Epi E, UnaryOp A, int BN, bool R, bool SK>
__device__ __forceinline__ void consume(const Params& p, uint8_t* ring, uint8_t* staged, uint64_t* full, uint64_t* empty,
                                        uint64_t* res_full, int consumer, int ctid) {
  const int warp = (ctid % 128) / 32, lane = ctid % 32;
  const int n = block_tiles(p);
  if (consumer == 1) tma::bar_arrive(kTurnBarrier, kConsumerThreads);  // consumer 0 goes first
  float acc[2][BN / 2];
  int tiles_done = 0;  // this consumer's linear tiles: the parity of its residual barrier's phase
  int it = 0;  // the ring slot of unit i's first k-step (split-K: the block's earlier units' k-steps, counted)
  for (int i = SK ? 0 : consumer; i < n; i += SK ? 1 : kConsumers) {
    const Unit u = unit_of<E, BN, SK>(p, i);
    if constexpr (SK) {
      if (i % kConsumers != consumer) {
        it += u.steps;
        continue;
      }
    } else {
      it = i * p.k_steps;
    }
    if constexpr (staged_linear(E) && R)  // (split-K: only the tile's last part, which runs the epilogue)
      if (ctid % 128 == 0 && (!SK || u.part + 1 == p.split)) load_residual<BN>(p, staged, res_full, u.m0, u.c0);
    tma::bar_sync(kTurnBarrier + consumer, kConsumerThreads);
    mainloop<BN, kStages<E, BN>>(acc, u.steps, ring, full, empty, it, i + 1 < n, 1 - consumer);
    if constexpr (SK) {
      it += u.steps;
      if (u.part + 1 < p.split) {
        split_contribute<BN>(acc, p, u, consumer, ctid % 128);
        continue;
      }
      split_gather<BN>(acc, p, u, consumer, ctid % 128);
    }
    if constexpr (E == Epi::kGlu) {
      epilogue_glu<A>(acc, p, staged, u.m0, u.c0, consumer, ctid % 128);
    } else if constexpr (staged_linear(E)) {
      epilogue_staged<BN, R>(acc, p, staged, res_full, uint32_t(tiles_done & 1), u.m0, u.c0, consumer, ctid % 128);
      ++tiles_done;
    } else {
      epilogue_linear<BN, R>(acc, p, u.m0 + warp * 16 + lane / 4, u.c0, lane % 4);
    }
  }
  if constexpr (E != Epi::kConvDirect)
    if (ctid % 128 == 0) tma::bulk_wait<0>();  // the last stores done before the block's shared memory goes
}

#endif  // ATELIER_WGMMA

// R: the linear layer or convolution adds p.residual (the GLU takes none); SK: split-K (p.split parts per tile).
template <Epi E, UnaryOp A, int BN, bool R, bool SK>
__global__ void __launch_bounds__(kThreads, 1) gemm_wgmma_kernel(const __grid_constant__ Params p) {
#ifdef ATELIER_WGMMA
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  constexpr int kS = kStages<E, BN>;
  uint8_t* staging = ring + kS * kStageBytes<BN>;  // 1024-byte aligned: the stages are multiples of 1 KB
  uint64_t* full = reinterpret_cast<uint64_t*>(staging + kStagingBytes<E, BN>);
  uint64_t* empty = full + kS;
  uint64_t* res_full = empty + kS;  // a consumer's residual tile landed in its staging buffer
  const int tid = int(threadIdx.x), wg = tid / 128;
  if (tid == 0) {
    for (int i = 0; i < kS; ++i) {
      tma::mbar_init(&full[i], 1);
      tma::mbar_init(&empty[i], kConsumerThreads / kConsumers);  // the one consumer warpgroup whose tile the slot holds
    }
    for (int c = 0; c < kConsumers; ++c) tma::mbar_init(&res_full[c], 1);
    tma::fence_mbar_init();
  }
  __syncthreads();
  if (wg == 0) {
    tma::regs_dealloc<kProducerRegs>();
    if (tid == 0) produce<E, BN, SK>(p, ring, full, empty);
  } else {
    tma::regs_alloc<kConsumerRegs>();
    consume<E, A, BN, R, SK>(p, ring, staging + (wg - 1) * kOutTileBytes<E, BN>, full, empty, res_full + (wg - 1), wg - 1,
                             tid - 128);
  }
#else
  __trap();
#endif
}

#include "backend/cuda/cuda_gemm_maps.cuh"  // encode_map, make_map, make_staged_maps, conv_box, make_map_4d

// Output tiles of a product of m rows and n columns (kTileCols<E, BN> each).
template <Epi E, int BN>
int64_t tile_count(int64_t m, int64_t n) {
  return (m + kBM - 1) / kBM * ((n + kTileCols<E, BN> - 1) / kTileCols<E, BN>);
}

// The grid, the tiles and the launch, once p's maps and pointers (and split-K's p.split, p.partial, p.flags) are set.
// Split-K launches cooperatively: its owners wait on other blocks' units, so all blocks must be resident at once.
template <Epi E, UnaryOp A, int BN = 128, bool R = false, bool SK = false>
bool launch(Params& p, int64_t m, int64_t k, int sm_count, cudaStream_t stream) {
  p.k_steps = int((k + kBK - 1) / kBK);
  p.col_tiles = (p.n + kTileCols<E, BN> - 1) / kTileCols<E, BN>;
  p.tiles = int(tile_count<E, BN>(m, p.n));
  if constexpr (!SK) p.split = 1;
  p.units = p.tiles * p.split;
  const auto kernel = gemm_wgmma_kernel<E, A, BN, R, SK>;
  // Per launch: the attribute belongs to the current device's context (as the attention kernels do).
  ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem<E, BN>)));
  const unsigned blocks = unsigned(std::min<int64_t>(p.units, std::max(1, sm_count)));
  if constexpr (SK) {
    // Fewer SMs than the device reports (MPS limits, a partitioned context): decline, the caller takes another path.
    cudaError_t launched = cudaSuccess;
    if (split_coop()) {
      launched = launch_cooperative(kernel, blocks, kThreads, kSmem<E, BN>, stream, p);
    } else {
      kernel<<<blocks, kThreads, kSmem<E, BN>, stream>>>(p);
      launched = cudaGetLastError();
    }
    if (launched == cudaErrorCooperativeLaunchTooLarge) {
      (void)cudaGetLastError();
      return false;
    }
    ATELIER_CUDA_OK(launched);
    g_split_launches.fetch_add(1);
  } else {
    kernel<<<blocks, kThreads, kSmem<E, BN>, stream>>>(p);
  }
  ATELIER_CUDA_LAUNCHED();
  (E == Epi::kGlu ? g_glu_launches : E == Epi::kLinear ? g_linear_launches : g_conv_launches).fetch_add(1);
  return true;
}

// A linear layer's or convolution's instance: 128- or 160-column tiles, with or without p.residual, split-K or not.
template <Epi E, bool SK>
bool launch_tiles(Params& p, int64_t m, int64_t k, bool wide, int sm_count, cudaStream_t stream) {
  constexpr UnaryOp I = UnaryOp::kIdentity;
  if (wide)
    return p.residual ? launch<E, I, 160, true, SK>(p, m, k, sm_count, stream) : launch<E, I, 160, false, SK>(p, m, k, sm_count, stream);
  return p.residual ? launch<E, I, 128, true, SK>(p, m, k, sm_count, stream) : launch<E, I, 128, false, SK>(p, m, k, sm_count, stream);
}
// Convolutions also take split-K (p.split > 1); linear layers have no such instances.
template <Epi E>
bool launch_linear_form(Params& p, int64_t m, int64_t k, bool wide, int sm_count, cudaStream_t stream) {
  if constexpr (is_conv(E))
    if (p.split > 1) return launch_tiles<E, true>(p, m, k, wide, sm_count, stream);
  return launch_tiles<E, false>(p, m, k, wide, sm_count, stream);
}

// Whether a linear layer's or convolution's output width takes 160-column tiles: a multiple of 160 (SD's 320, 640,
// 1280: whole tiles, fewer of them, each reading x's box for more columns).
bool tile_160(int64_t n) { return n % 160 == 0; }

// What both kernels need of the shapes and the output: sm_90, 32-bit rows and columns, an even output width and row
// stride (pairs of bf16 per store), 4-byte aligned output, bias and residual.
bool takes(int cc_major, size_t max_smem, int64_t m, int64_t k, int64_t n, int64_t ldo, std::initializer_list<const void*> pairs) {
  constexpr int64_t kMaxRows = int64_t(1) << 30;  // 32-bit row and column arithmetic in the kernel
  if (cc_major != 9 || kSmemMax > max_smem || m <= 0 || k <= 0 || n <= 0 || m > kMaxRows || n > kMaxRows) return false;
  if (n % 2 != 0 || ldo % 2 != 0 || ldo < n) return false;
  for (const void* q : pairs)
    if (reinterpret_cast<uintptr_t>(q) % 4 != 0) return false;
  return true;
}

}  // namespace

bool fused_glu_enabled() { return glu_flag(); }
void set_fused_glu(bool on) { glu_flag() = on; }
OwnLinear own_linear_mode() { return linear_mode(); }
void set_own_linear(OwnLinear mode) { linear_mode() = mode; }
bool own_linear_takes(bool residual) {
  return linear_mode() == OwnLinear::kAll || (residual && linear_mode() == OwnLinear::kResidual);
}
int64_t fused_glu_launches() { return g_glu_launches.load(); }
int64_t own_linear_launches() { return g_linear_launches.load(); }
OwnConv own_conv_mode() { return conv_mode(); }
void set_own_conv(OwnConv mode) { conv_mode() = mode; }
int64_t own_conv_launches() { return g_conv_launches.load(); }
int64_t own_conv_split_launches() { return g_split_launches.load(); }
int& forced_split() {
  static int split = std::max(0, int(env_number("ATELIER_OWN_CONV_SPLIT").value_or(0)));
  return split;
}
int own_conv_split() { return forced_split(); }
void set_own_conv_split(int split) { forced_split() = std::max(0, split); }

bool launch_gemm_glu(const OwnGemmArgs& a, int cc_major, cudaStream_t stream) {
  if (!takes(cc_major, a.max_smem, a.m, a.k, a.n, a.ldo, {a.out, a.bias})) return false;
  if (a.act != UnaryOp::kGelu && a.act != UnaryOp::kGeluTanh && a.act != UnaryOp::kSilu) return false;
  Params p{};
  // (The output map needs a 16-byte aligned output and row stride; else the caller takes the two-pass path.)
  if (!make_map(p.x, a.x, a.m, a.k, a.ldx, kBM) || !make_map(p.w, a.w, 2 * a.n, a.k, a.ldw, kBoxRows) ||
      !make_map(p.out_map, a.out, a.m, a.n, a.ldo, kBM))
    return false;
  p.bias = static_cast<const __nv_bfloat16*>(a.bias);
  p.out = static_cast<__nv_bfloat16*>(a.out);
  p.ldo = a.ldo;
  p.m = int(a.m), p.n = int(a.n);
  switch (a.act) {
    case UnaryOp::kGelu: return launch<Epi::kGlu, UnaryOp::kGelu>(p, a.m, a.k, a.sm_count, stream);
    case UnaryOp::kGeluTanh: return launch<Epi::kGlu, UnaryOp::kGeluTanh>(p, a.m, a.k, a.sm_count, stream);
    default: return launch<Epi::kGlu, UnaryOp::kSilu>(p, a.m, a.k, a.sm_count, stream);
  }
}

bool launch_gemm_linear(const OwnGemmArgs& a, int cc_major, cudaStream_t stream) {
  if (!takes(cc_major, a.max_smem, a.m, a.k, a.n, a.ldo, {a.out, a.bias, a.residual})) return false;
  Params p{};
  const bool wide = tile_160(a.n);
  // (The output maps need a 16-byte aligned output, residual and row stride; else cuBLASLt takes the product.)
  if (!make_map(p.x, a.x, a.m, a.k, a.ldx, kBM) || !make_map(p.w, a.w, a.n, a.k, a.ldw, wide ? 160 : 128) ||
      !make_staged_maps(p, a.out, a.residual, a.m, a.n, a.ldo))
    return false;
  p.bias = static_cast<const __nv_bfloat16*>(a.bias);
  p.residual = static_cast<const __nv_bfloat16*>(a.residual);
  p.out = static_cast<__nv_bfloat16*>(a.out);
  p.ldo = a.ldo;
  p.m = int(a.m), p.n = int(a.n);
  return launch_linear_form<Epi::kLinear>(p, a.m, a.k, wide, a.sm_count, stream);
}

#include "backend/cuda/cuda_gemm_conv_launch.cuh"  // conv_implicit_takes, conv_implicit_splits, launch_conv_implicit

}  // namespace atelier::cuda
