// A gated linear unit inside its product, on Hopper's warpgroup MMA and bulk tensor copies (cuda_gemm_glu.h).
//
// Persistent blocks (one per SM) walk output tiles of kBM rows x kBH columns, the tiles of one row block next to
// each other so that the blocks running at once share x's rows in L2. A block has one producer warpgroup and two
// consumer warpgroups of 64 rows each. One producer thread streams, per k-step of 64, x's 128 x 64 box and two
// 64 x 64 boxes of w (value rows h0.. and gate rows h + h0..) into a ring of kStages buffers (the 128-byte
// swizzle, cuda_wgmma.cuh), each completing on its buffer's "full" mbarrier; it refills a buffer once every
// consumer thread arrived on its "empty" barrier, and runs ahead into the next tile while the consumers finish
// this one. The two w boxes sit one after the other, so one m64n128 product per k16 step gives each consumer
// [value | gate] accumulators side by side: column c of the value half and column c of the gate half are in the
// same thread (accumulator j and j + 8), and the epilogue writes (value + b_v) * act(gate + b_g) as bf16 without
// the [M, 2H] intermediate ever leaving registers.
// Rows past m and k past the end are the tensor maps' zero fill; columns past h are not stored.
#include "backend/cuda/cuda_gemm_glu.h"

#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_nvtx.h"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

namespace atelier::cuda {
namespace {

constexpr int kBM = 128;     // output rows per tile: two consumer warpgroups of 64
constexpr int kBH = 64;      // output columns per tile (value and gate: 128 product columns)
constexpr int kBK = 64;      // k per stage: one 128-byte swizzle atom of bf16
constexpr int kStages = 4;   // buffers in the ring
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr uint32_t kRowBytes = kBK * 2;                     // one swizzled row: 128 bytes
constexpr uint32_t kABytes = kBM * kRowBytes;              // x's box: 16 KB
constexpr uint32_t kHalfBBytes = kBH * kRowBytes;          // one w box (value or gate rows): 8 KB
constexpr uint32_t kStageBytes = kABytes + 2 * kHalfBBytes;  // 32 KB
constexpr size_t kSmem = kStages * kStageBytes + 2 * kStages * sizeof(uint64_t) + 1024;  // + barriers, alignment
// setmaxnreg: the producer gives registers to the consumers (each a multiple of 8; 128 x 40 + 256 x 232 fits the
// 384 x 168 that __launch_bounds__(kThreads, 1) allows), as CUTLASS's warp-specialised kernels do.
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * (65536 / kThreads / 8 * 8));

std::atomic<int64_t> g_launches{0};

bool& enabled_flag() {
  static bool on = env_is("ATELIER_FUSED_GLU", "1");
  return on;
}

struct Params {
  CUtensorMap x, w;  // x [m][k] in 64 x kBM boxes; w [2h][k] in 64 x kBH boxes
  const __nv_bfloat16* bias;
  __nv_bfloat16* out;
  int64_t ldo;
  int m, h, k_steps, h_tiles, tiles;
};

#ifdef ATELIER_WGMMA
// The producer's one thread: every (tile, k-step) of this block, in the consumers' order.
__device__ __forceinline__ void produce(const Params& p, uint8_t* ring, uint64_t* full, uint64_t* empty) {
  int it = 0;
  for (int tile = int(blockIdx.x); tile < p.tiles; tile += int(gridDim.x)) {
    const int m0 = (tile / p.h_tiles) * kBM, h0 = (tile % p.h_tiles) * kBH;
    for (int ks = 0; ks < p.k_steps; ++ks, ++it) {
      const int s = it % kStages;
      tma::wait(&empty[s], ((it / kStages) & 1) ^ 1);
      tma::arrive_expect_tx(&full[s], kStageBytes);  // zero-filled parts of a box count too
      uint8_t* stage = ring + s * kStageBytes;
      tma::load_2d(stage, &p.x, ks * kBK, m0, &full[s]);
      tma::load_2d(stage + kABytes, &p.w, ks * kBK, h0, &full[s]);
      tma::load_2d(stage + kABytes + kHalfBBytes, &p.w, ks * kBK, p.h + h0, &full[s]);
    }
  }
}

// acc (64 x 128 per consumer: value columns 0..63, gate columns 64..127) = x_rows . [w_value; w_gate]^T over k.
__device__ __forceinline__ void mainloop(float (&acc)[64], const Params& p, uint8_t* ring, uint64_t* full,
                                         uint64_t* empty, int consumer, int& it) {
  for (int ks = 0; ks < p.k_steps; ++ks, ++it) {
    const int s = it % kStages;
    tma::wait(&full[s], (it / kStages) & 1);
    const uint32_t a = smem_u32(ring + s * kStageBytes) + consumer * 64 * kRowBytes;
    const uint32_t b = smem_u32(ring + s * kStageBytes + kABytes);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)  // k16 step kk starts 32 bytes further along the swizzled rows
      wgmma::mma_m64n128k16_ss<0>(acc, wgmma::desc_sw128(a + kk * 32, 0, wgmma::kAtomGroupBytes),
                                  wgmma::desc_sw128(b + kk * 32, 0, wgmma::kAtomGroupBytes), ks > 0 || kk > 0);
    wgmma::commit();
    wgmma::wait<1>();  // the previous k-step's products are done: its buffer can be refilled
    if (ks > 0) tma::arrive(&empty[(it - 1) % kStages]);
  }
  wgmma::wait<0>();
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma::fence_operand(acc[i]);
  tma::arrive(&empty[(it - 1) % kStages]);
}

// out[row, col] = (value + b_v) * act(gate + b_g) for this thread's accumulators: rows row0 and row0 + 8,
// columns h0 + 8j + 2t (+1) with the value in acc[4j + e] and the gate in acc[4(j + 8) + e].
template <UnaryOp A>
__device__ __forceinline__ void epilogue(const float (&acc)[64], const Params& p, int row0, int h0, int t) {
#pragma unroll
  for (int j = 0; j < kBH / 8; ++j) {
    const int col = h0 + 8 * j + 2 * t;
    if (col >= p.h) continue;  // h is even: col + 1 < h too
    float bv[2] = {0.0f, 0.0f}, bg[2] = {0.0f, 0.0f};
    if (p.bias) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        bv[e] = __bfloat162float(p.bias[col + e]);
        bg[e] = __bfloat162float(p.bias[p.h + col + e]);
      }
    }
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      const int row = row0 + 8 * ri;
      if (row >= p.m) continue;
      float y[2];
#pragma unroll
      for (int e = 0; e < 2; ++e)
        y[e] = (acc[4 * j + 2 * ri + e] + bv[e]) *
               apply_unary_for<__nv_bfloat16>(acc[4 * (j + kBH / 8) + 2 * ri + e] + bg[e], A);
      *reinterpret_cast<uint32_t*>(p.out + int64_t(row) * p.ldo + col) = pack2<__nv_bfloat16>(y[0], y[1]);
    }
  }
}

template <UnaryOp A>
__device__ __forceinline__ void consume(const Params& p, uint8_t* ring, uint64_t* full, uint64_t* empty, int consumer,
                                        int ctid) {
  const int warp = (ctid % 128) / 32, lane = ctid % 32;
  float acc[64];
  int it = 0;
  for (int tile = int(blockIdx.x); tile < p.tiles; tile += int(gridDim.x)) {
    const int m0 = (tile / p.h_tiles) * kBM, h0 = (tile % p.h_tiles) * kBH;
    mainloop(acc, p, ring, full, empty, consumer, it);
    epilogue<A>(acc, p, m0 + consumer * 64 + warp * 16 + lane / 4, h0, lane % 4);
  }
}
#endif  // ATELIER_WGMMA

template <UnaryOp A>
__global__ void __launch_bounds__(kThreads, 1) gemm_glu_kernel(const __grid_constant__ Params p) {
#ifdef ATELIER_WGMMA
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int tid = int(threadIdx.x), wg = tid / 128;
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      tma::mbar_init(&full[i], 1);
      tma::mbar_init(&empty[i], kConsumerThreads);
    }
    tma::fence_mbar_init();
  }
  __syncthreads();
  if (wg == 0) {
    tma::regs_dealloc<kProducerRegs>();
    if (tid == 0) produce(p, ring, full, empty);
  } else {
    tma::regs_alloc<kConsumerRegs>();
    consume<A>(p, ring, full, empty, wg - 1, tid - 128);
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

template <UnaryOp A>
bool launch(const GluGemmArgs& a, cudaStream_t stream) {
  Params p{};
  if (!make_map(p.x, a.x, a.m, a.k, a.ldx, kBM) || !make_map(p.w, a.w, 2 * a.h, a.k, a.ldw, kBH)) return false;
  p.bias = static_cast<const __nv_bfloat16*>(a.bias);
  p.out = static_cast<__nv_bfloat16*>(a.out);
  p.ldo = a.ldo;
  p.m = int(a.m), p.h = int(a.h);
  p.k_steps = int((a.k + kBK - 1) / kBK);
  p.h_tiles = int((a.h + kBH - 1) / kBH);
  p.tiles = int((a.m + kBM - 1) / kBM) * p.h_tiles;
  const auto kernel = gemm_glu_kernel<A>;
  // Per launch: the attribute belongs to the current device's context (as the attention kernels do).
  ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  const unsigned blocks = unsigned(std::min<int64_t>(p.tiles, std::max(1, a.sm_count)));
  kernel<<<blocks, kThreads, kSmem, stream>>>(p);
  ATELIER_CUDA_LAUNCHED();
  g_launches.fetch_add(1);
  return true;
}

}  // namespace

bool fused_glu_enabled() { return enabled_flag(); }
void set_fused_glu(bool on) { enabled_flag() = on; }
int64_t fused_glu_launches() { return g_launches.load(); }

bool launch_gemm_glu(const GluGemmArgs& a, int cc_major, cudaStream_t stream) {
  constexpr int64_t kMaxRows = int64_t(1) << 30;  // 32-bit row and column arithmetic in the kernel
  if (cc_major != 9 || kSmem > a.max_smem || a.m <= 0 || a.k <= 0 || a.h <= 0 || a.m > kMaxRows || a.h > kMaxRows)
    return false;
  if (a.h % 2 != 0 || a.ldo % 2 != 0 || a.ldo < a.h || reinterpret_cast<uintptr_t>(a.out) % 4 != 0) return false;
  if (a.bias && reinterpret_cast<uintptr_t>(a.bias) % 2 != 0) return false;
  switch (a.act) {
    case UnaryOp::kGelu: return launch<UnaryOp::kGelu>(a, stream);
    case UnaryOp::kGeluTanh: return launch<UnaryOp::kGeluTanh>(a, stream);
    case UnaryOp::kSilu: return launch<UnaryOp::kSilu>(a, stream);
    default: return false;
  }
}

// --- the backend's op -------------------------------------------------------------------------------------

bool CudaBackend::linear_glu(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, UnaryOp act) {
  if (!fused_glu_enabled() || x.dtype() != DType::BF16 || w.dtype() != DType::BF16 || out.dtype() != DType::BF16) return false;
  if (bias.defined() && (bias.dtype() != DType::BF16 || !bias.is_contiguous())) return false;
  if (!x.is_contiguous() || !w.is_contiguous() || !out.is_contiguous() || x.dim() != 2 || w.dim() != 2) return false;
  NvtxRange range("linear_glu");
  DeviceGuard guard(index_);
  GluGemmArgs a;
  a.x = x.data<__nv_bfloat16>();
  a.w = w.data<__nv_bfloat16>();
  a.bias = bias.defined() ? bias.data<__nv_bfloat16>() : nullptr;
  a.out = out.data<__nv_bfloat16>();
  a.m = x.size(0), a.k = x.size(1), a.h = w.size(0) / 2;
  a.ldx = a.k, a.ldw = a.k, a.ldo = a.h;
  a.act = act;
  a.sm_count = sm_count_;
  a.max_smem = max_smem_optin_;
  return launch_gemm_glu(a, cc_major_, stream_);
}

}  // namespace atelier::cuda
