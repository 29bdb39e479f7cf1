// Matrix products of our own on Hopper's warpgroup MMA and bulk tensor copies (cuda_gemm_wgmma.h).
//
// Persistent blocks (one per SM) walk output tiles of kBM rows, the tiles of one row block next to each other so
// that the blocks running at once share x's rows in L2. A block has one producer warpgroup and two consumer
// warpgroups that take the block's tiles in turns ("ping-pong", as CUTLASS's Hopper kernels): consumer 0 the
// block's tiles 0, 2, 4..., consumer 1 tiles 1, 3, 5...; each computes a whole 128-row tile (two m64 halves) and
// they hold the tensor cores in turns (a ring of two named barriers), so one's epilogue runs while the other's
// products do. (Session 26 measured the earlier form, both consumers on one tile, at 71% of cuBLASLt's mainloop:
// the tensor cores idled through every epilogue, a third of a tile's time at k = 320.) One producer thread streams,
// per k-step of 64, x's 128 x 64 box and two 64 x 64 boxes of w into a ring of kStages buffers (the 128-byte
// swizzle, cuda_wgmma.cuh), each completing on its buffer's "full" mbarrier; it refills a buffer once the consumer
// that read it arrived on its "empty" barrier, and runs ahead into the next tiles. The two w boxes sit one after the
// other, so one m64n128 product per half and k16 step covers both:
//   - GLU: the value rows c0.. and the gate rows h + c0.. of w (64 output columns per tile): value column c and
//     gate column c land in the same thread (accumulators j and j + 8), and the epilogue writes
//     (value + b_v) * act(gate + b_g) as bf16 without the [M, 2H] product ever leaving registers;
//   - linear: rows c0.. and c0 + 64.. (128 output columns per tile); the epilogue adds the bias and the residual.
// Rows past m and k past the end are the tensor maps' zero fill; columns past the output width are not stored.
#include "backend/cuda/cuda_gemm_wgmma.h"

#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <initializer_list>

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
constexpr int kBoxRows = 64;  // rows of w per box; two boxes per stage: 128 product columns
constexpr int kBK = 64;      // k per stage: one 128-byte swizzle atom of bf16
constexpr int kStages = 6;   // buffers in the ring (192 KB): the producer runs a tile ahead of the consumer computing
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr uint32_t kRowBytes = kBK * 2;                       // one swizzled row: 128 bytes
constexpr uint32_t kABytes = kBM * kRowBytes;                // x's box: 16 KB
constexpr uint32_t kBoxBytes = kBoxRows * kRowBytes;         // one w box: 8 KB
constexpr uint32_t kStageBytes = kABytes + 2 * kBoxBytes;    // 32 KB
constexpr size_t kSmem = kStages * kStageBytes + 2 * kStages * sizeof(uint64_t) + 1024;  // + barriers, alignment
// setmaxnreg: the producer gives registers to the consumers (each a multiple of 8; 128 x 40 + 256 x 232 fits the
// 384 x 168 that __launch_bounds__(kThreads, 1) allows), as CUTLASS's warp-specialised kernels do: a consumer holds
// 128 accumulators.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * (65536 / kThreads / 8 * 8));

enum class Epi { kGlu, kLinear };
// Output columns per tile: the GLU's 128 product columns make 64.
template <Epi E>
constexpr int kTileCols = E == Epi::kGlu ? kBoxRows : 2 * kBoxRows;

std::atomic<int64_t> g_glu_launches{0}, g_linear_launches{0};

bool& glu_flag() {
  static bool on = !env_is("ATELIER_FUSED_GLU", "0");
  return on;
}
OwnLinear& linear_mode() {
  static OwnLinear mode = env_is("ATELIER_OWN_LINEAR", "1")          ? OwnLinear::kAll
                          : env_is("ATELIER_OWN_LINEAR", "residual") ? OwnLinear::kResidual
                                                                     : OwnLinear::kOff;
  return mode;
}

struct Params {
  CUtensorMap x, w;  // x [m][k] in 64 x kBM boxes; w [rows][k] in 64 x kBoxRows boxes
  const __nv_bfloat16* bias;
  const __nv_bfloat16* residual;  // linear: [m, n] (row stride ldo), may be out; null for none
  __nv_bfloat16* out;
  int64_t ldo;
  int m, n;  // output rows and columns (GLU: n = h)
  int k_steps, col_tiles, tiles;
};

#ifdef ATELIER_WGMMA
constexpr int kTurnBarrier = 1;  // named barriers 1 and 2: consumer c waits on 1 + c before its mainloop

// Tile i of this block (tile blockIdx.x + i gridDim.x): its first row and column.
template <Epi E>
__device__ __forceinline__ void tile_origin(const Params& p, int i, int& m0, int& c0) {
  const int tile = int(blockIdx.x) + i * int(gridDim.x);
  m0 = (tile / p.col_tiles) * kBM;
  c0 = (tile % p.col_tiles) * kTileCols<E>;
}
__device__ __forceinline__ int block_tiles(const Params& p) {
  return (p.tiles - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);  // >= 1: the grid has at most p.tiles
}

// The producer's one thread: every (tile, k-step) of this block, in the consumers' order. A tile's second box of w
// starts at the gate rows n + c0 (GLU) or 64 rows past its first (linear).
template <Epi E>
__device__ __forceinline__ void produce(const Params& p, uint8_t* ring, uint64_t* full, uint64_t* empty) {
  const int second_box = E == Epi::kGlu ? p.n : kBoxRows;
  const int n = block_tiles(p);
  int it = 0;
  for (int i = 0; i < n; ++i) {
    int m0, c0;
    tile_origin<E>(p, i, m0, c0);
    for (int ks = 0; ks < p.k_steps; ++ks, ++it) {
      const int s = it % kStages;
      tma::wait(&empty[s], ((it / kStages) & 1) ^ 1);
      tma::arrive_expect_tx(&full[s], kStageBytes);  // zero-filled parts of a box count too
      uint8_t* stage = ring + s * kStageBytes;
      tma::load_2d(stage, &p.x, ks * kBK, m0, &full[s]);
      tma::load_2d(stage + kABytes, &p.w, ks * kBK, c0, &full[s]);
      tma::load_2d(stage + kABytes + kBoxBytes, &p.w, ks * kBK, c0 + second_box, &full[s]);
    }
  }
}

// acc[h] (64 x 128: rows 64 h.. of the tile; the first box's rows of w in columns 0..63, the second's in
// 64..127) = those rows of x times those rows of w, over k; the ring's slots from `it` on. Once the last k-step's
// products are issued the turn passes to the other consumer (when `hand_on`), before they finish.
__device__ __forceinline__ void mainloop(float (&acc)[2][64], const Params& p, uint8_t* ring, uint64_t* full,
                                         uint64_t* empty, int it, bool hand_on, int other) {
  for (int ks = 0; ks < p.k_steps; ++ks, ++it) {
    const int s = it % kStages;
    tma::wait(&full[s], (it / kStages) & 1);
    const uint32_t a = smem_u32(ring + s * kStageBytes);
    const uint32_t b = a + kABytes;
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)  // k16 step kk starts 32 bytes further along the swizzled rows
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wgmma::mma_m64n128k16_ss<0>(acc[h], wgmma::desc_sw128(a + h * 64 * kRowBytes + kk * 32, 0, wgmma::kAtomGroupBytes),
                                    wgmma::desc_sw128(b + kk * 32, 0, wgmma::kAtomGroupBytes), ks > 0 || kk > 0);
    wgmma::commit();
    if (hand_on && ks == p.k_steps - 1) tma::bar_arrive(kTurnBarrier + other, kConsumerThreads);
    wgmma::wait<1>();  // the previous k-step's products are done: its buffer can be refilled
    if (ks > 0) tma::arrive(&empty[(it - 1) % kStages]);
  }
  wgmma::wait<0>();
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) wgmma::fence_operand(acc[h][i]);
  tma::arrive(&empty[(it - 1) % kStages]);
}

__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}

// This thread's accumulators hold rows row0 + 64 h + 8 ri, columns 8j + 2t (+1) of the tile in acc[h][4j + 2ri + e].
// GLU: out[row, c0 + col] = (value + b_v) * act(gate + b_g), value in acc[h][4j + ..], gate in acc[h][4(j + 8) + ..].
// Linear: out[row, c0 + col] = acc + bias + residual, j over all 16 column groups. Each column's bias is loaded
// once for both halves.
template <Epi E, UnaryOp A>
__device__ __forceinline__ void epilogue(const float (&acc)[2][64], const Params& p, int row0, int c0, int t) {
#pragma unroll
  for (int j = 0; j < kTileCols<E> / 8; ++j) {
    const int col = c0 + 8 * j + 2 * t;
    if (col >= p.n) continue;  // n is even: col + 1 < n too
    float2 b0 = make_float2(0.0f, 0.0f), b1 = b0;  // GLU: value and gate biases; linear: the bias
    if (p.bias) {
      b0 = load_pair(p.bias + col);
      if constexpr (E == Epi::kGlu) b1 = load_pair(p.bias + p.n + col);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        const int row = row0 + 64 * h + 8 * ri;
        if (row >= p.m) continue;
        const float* d = &acc[h][4 * j + 2 * ri];
        __nv_bfloat16* o = p.out + int64_t(row) * p.ldo + col;
        float y0, y1;
        if constexpr (E == Epi::kGlu) {
          const float* g = &acc[h][4 * (j + kBoxRows / 8) + 2 * ri];
          y0 = (d[0] + b0.x) * apply_unary_for<__nv_bfloat16>(g[0] + b1.x, A);
          y1 = (d[1] + b0.y) * apply_unary_for<__nv_bfloat16>(g[1] + b1.y, A);
        } else {
          const float2 r = p.residual ? load_pair(p.residual + int64_t(row) * p.ldo + col) : make_float2(0.0f, 0.0f);
          y0 = d[0] + b0.x + r.x;
          y1 = d[1] + b0.y + r.y;
        }
        *reinterpret_cast<uint32_t*>(o) = pack2<__nv_bfloat16>(y0, y1);
      }
  }
}

// Consumer c: the block's tiles c, c + 2, ... (tile blockIdx.x + i gridDim.x for the block's i-th), each after the
// other consumer handed it the turn; the ring's slots of tile i start at i k_steps (the producer's order). Every
// wait on a turn barrier has one arrival: consumer 1's first, for tile 0, then one after each tile's mainloop
// where a next tile exists.
template <Epi E, UnaryOp A>
__device__ __forceinline__ void consume(const Params& p, uint8_t* ring, uint64_t* full, uint64_t* empty, int consumer,
                                        int ctid) {
  const int warp = (ctid % 128) / 32, lane = ctid % 32;
  const int n = block_tiles(p);
  if (consumer == 1) tma::bar_arrive(kTurnBarrier, kConsumerThreads);  // consumer 0 goes first
  float acc[2][64];
  for (int i = consumer; i < n; i += kConsumers) {
    int m0, c0;
    tile_origin<E>(p, i, m0, c0);
    tma::bar_sync(kTurnBarrier + consumer, kConsumerThreads);
    mainloop(acc, p, ring, full, empty, i * p.k_steps, i + 1 < n, 1 - consumer);
    epilogue<E, A>(acc, p, m0 + warp * 16 + lane / 4, c0, lane % 4);
  }
}

#endif  // ATELIER_WGMMA

template <Epi E, UnaryOp A>
__global__ void __launch_bounds__(kThreads, 1) gemm_wgmma_kernel(const __grid_constant__ Params p) {
#ifdef ATELIER_WGMMA
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int tid = int(threadIdx.x), wg = tid / 128;
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      tma::mbar_init(&full[i], 1);
      tma::mbar_init(&empty[i], kConsumerThreads / kConsumers);  // the one consumer warpgroup whose tile the slot holds
    }
    tma::fence_mbar_init();
  }
  __syncthreads();
  if (wg == 0) {
    tma::regs_dealloc<kProducerRegs>();
    if (tid == 0) produce<E>(p, ring, full, empty);
  } else {
    tma::regs_alloc<kConsumerRegs>();
    consume<E, A>(p, ring, full, empty, wg - 1, tid - 128);
  }
#else
  __trap();
#endif
}

// A row-major bf16 matrix [rows][cols] (row stride ld elements) as a tensor map of 64-column x box_rows boxes in
// the 128-byte swizzle; false where it breaks TMA's rules (16-byte aligned base and row stride).
bool make_map(CUtensorMap& map, const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
  const tma::EncodeTiled encode = tma::encode_tiled();
  if (!encode || reinterpret_cast<uintptr_t>(base) % 16 != 0 || ld % 8 != 0 || ld < cols) return false;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kBK), cuuint32_t(box_rows)};
  const cuuint32_t unit[2] = {1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The grid, the tiles and the launch, once p's maps and pointers are set.
template <Epi E, UnaryOp A>
bool launch(Params& p, int64_t m, int64_t k, int sm_count, cudaStream_t stream) {
  p.k_steps = int((k + kBK - 1) / kBK);
  p.col_tiles = (p.n + kTileCols<E> - 1) / kTileCols<E>;
  p.tiles = int((m + kBM - 1) / kBM) * p.col_tiles;
  const auto kernel = gemm_wgmma_kernel<E, A>;
  // Per launch: the attribute belongs to the current device's context (as the attention kernels do).
  ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  const unsigned blocks = unsigned(std::min<int64_t>(p.tiles, std::max(1, sm_count)));
  kernel<<<blocks, kThreads, kSmem, stream>>>(p);
  ATELIER_CUDA_LAUNCHED();
  (E == Epi::kGlu ? g_glu_launches : g_linear_launches).fetch_add(1);
  return true;
}

// What both kernels need of the shapes and the output: sm_90, 32-bit rows and columns, an even output width and row
// stride (pairs of bf16 per store), 4-byte aligned output, bias and residual.
bool takes(int cc_major, size_t max_smem, int64_t m, int64_t k, int64_t n, int64_t ldo, std::initializer_list<const void*> pairs) {
  constexpr int64_t kMaxRows = int64_t(1) << 30;  // 32-bit row and column arithmetic in the kernel
  if (cc_major != 9 || kSmem > max_smem || m <= 0 || k <= 0 || n <= 0 || m > kMaxRows || n > kMaxRows) return false;
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

bool launch_gemm_glu(const OwnGemmArgs& a, int cc_major, cudaStream_t stream) {
  if (!takes(cc_major, a.max_smem, a.m, a.k, a.n, a.ldo, {a.out, a.bias})) return false;
  if (a.act != UnaryOp::kGelu && a.act != UnaryOp::kGeluTanh && a.act != UnaryOp::kSilu) return false;
  Params p{};
  if (!make_map(p.x, a.x, a.m, a.k, a.ldx, kBM) || !make_map(p.w, a.w, 2 * a.n, a.k, a.ldw, kBoxRows)) return false;
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
  if (!make_map(p.x, a.x, a.m, a.k, a.ldx, kBM) || !make_map(p.w, a.w, a.n, a.k, a.ldw, kBoxRows)) return false;
  p.bias = static_cast<const __nv_bfloat16*>(a.bias);
  p.residual = static_cast<const __nv_bfloat16*>(a.residual);
  p.out = static_cast<__nv_bfloat16*>(a.out);
  p.ldo = a.ldo;
  p.m = int(a.m), p.n = int(a.n);
  return launch<Epi::kLinear, UnaryOp::kIdentity>(p, a.m, a.k, a.sm_count, stream);
}

// --- the backend's op -------------------------------------------------------------------------------------

Tensor CudaBackend::linear_glu(const Tensor& x, const Tensor& w, const Tensor& bias, UnaryOp act) {
  if (!fused_glu_enabled() || x.dtype() != DType::BF16 || w.dtype() != DType::BF16 || !x.is_contiguous() || !w.is_contiguous() ||
      (bias.defined() && (bias.dtype() != DType::BF16 || !bias.is_contiguous())))
    return Tensor();
  NvtxRange range("linear_glu");
  DeviceGuard guard(index_);
  Shape shape = x.shape();
  shape.back() = w.size(0) / 2;
  Tensor out = Tensor::empty(shape, DType::BF16, device());
  OwnGemmArgs a;
  a.x = x.data<__nv_bfloat16>();
  a.w = w.data<__nv_bfloat16>();
  a.bias = bias.defined() ? bias.data<__nv_bfloat16>() : nullptr;
  a.out = out.data<__nv_bfloat16>();
  a.m = x.numel() / x.size(-1), a.k = x.size(-1), a.n = shape.back();
  a.ldx = a.k, a.ldw = a.k, a.ldo = a.n;
  a.act = act;
  a.sm_count = sm_count_;
  a.max_smem = max_smem_optin_;
  return launch_gemm_glu(a, cc_major_, stream_) ? out : Tensor();
}

}  // namespace atelier::cuda
