// Flash attention on tensor cores (bf16/f16 inputs, f32 accumulation), and the attention op's dispatch.
//
// One block of 4 warps takes 64 queries of one (batch, head); each warp owns 16 query rows. K and V tiles
// of BN keys stream through shared memory with cp.async (double-buffered: tile t+1 loads while tile t is
// used). Per tile, S = Q K^T with mma.sync m16n8k16; the online softmax (running max and sum per row, in the
// log2 domain) turns S into P in registers, where the m16n8 accumulator layout of S is exactly the A-operand
// layout of the next product; O += P V takes V's B operand through ldmatrix.trans. The head dim is padded to
// DPAD (a multiple of 16) with zeros in shared memory, so SD's 40/80/160 run with 48/80/160 columns.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16/.f16; g = lane / 4, t = lane % 4):
//   A 16x16: a0 = (row g, cols 2t, 2t+1), a1 = (row g+8, same), a2 = (row g, cols 2t+8, 2t+9), a3 = (row g+8, same)
//   B 16x8:  b0 = (rows 2t, 2t+1, col g), b1 = (rows 2t+8, 2t+9, col g)
//   C 16x8:  c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, same)
#include <algorithm>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {
namespace {

constexpr int kFlashThreads = 128;  // 4 warps
constexpr int kBlockM = 64;         // queries per block, 16 per warp
constexpr int kMaxFlashHeadDim = 256;
constexpr float kLog2e = 1.4426950408889634f;

struct FlashParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  int64_t qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2;  // element strides (batch, head, row)
  int sq, sk, d, heads, group;
  float scale;
  AttentionMask mask;
};

// Keys per tile: 64 while the head dim leaves room for the registers, 32 for the widest heads.
template <int DPAD> constexpr int kBlockN = DPAD <= 128 ? 64 : 32;
template <int DPAD> constexpr int kPitch = DPAD + 8;  // row pitch in elements: 4 words of padding, no bank conflicts
template <typename T, int DPAD>
constexpr size_t flash_smem_bytes() {
  return size_t(kBlockM + 4 * kBlockN<DPAD>) * kPitch<DPAD> * sizeof(T);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16-byte global->shared copy that bypasses L1; zero-fills the destination when !valid.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_size) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as one register of two 16-bit values, the lower column in the low half.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem)));
}

// Starts the copy of a tile of ROWS rows x DPAD columns (row stride `stride` elements) into shared memory;
// rows >= rows_valid and columns >= d are zero-filled.
template <typename T, int DPAD, int ROWS>
__device__ __forceinline__ void load_tile(T* smem, const T* g, int64_t stride, int rows_valid, int d) {
  constexpr int kChunks = DPAD / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < ROWS * kChunks; i += kFlashThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool valid = r < rows_valid && c < d;
    cp_async16(smem + r * kPitch<DPAD> + c, valid ? g + int64_t(r) * stride + c : g, valid);
  }
}

// The A fragment of rows [row, row + 8) and [row + 8, row + 16) at columns col.. of a row-major smem tile
// (row = warp's first row + g, col = k offset + 2t).
template <int PITCH, typename T>
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const T* tile, int row, int col) {
  a[0] = *reinterpret_cast<const uint32_t*>(tile + row * PITCH + col);
  a[1] = *reinterpret_cast<const uint32_t*>(tile + (row + 8) * PITCH + col);
  a[2] = *reinterpret_cast<const uint32_t*>(tile + row * PITCH + col + 8);
  a[3] = *reinterpret_cast<const uint32_t*>(tile + (row + 8) * PITCH + col + 8);
}

template <typename T, int DPAD>
__global__ void __launch_bounds__(kFlashThreads) flash_attention_kernel(const FlashParams p) {
  constexpr int BN = kBlockN<DPAD>;
  constexpr int PITCH = kPitch<DPAD>;
  constexpr bool kQInRegs = DPAD <= 128;  // wider heads re-read Q fragments from shared memory (registers)
  constexpr int kKSteps = DPAD / 16;      // k-steps of Q K^T
  constexpr int kSTiles = BN / 8;         // n-tiles of S
  constexpr int kOTiles = DPAD / 8;       // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* qs = reinterpret_cast<T*>(smem_raw);  // [kBlockM][PITCH]
  T* ks = qs + kBlockM * PITCH;            // [2][BN][PITCH]
  T* vs = ks + 2 * BN * PITCH;             // [2][BN][PITCH]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tig = lane & 3;
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kBlockM;
  const int kvh = h / p.group;
  const T* qg = static_cast<const T*>(p.q) + b * p.qs0 + h * p.qs1 + int64_t(q0) * p.qs2;
  const T* kg = static_cast<const T*>(p.k) + b * p.ks0 + kvh * p.ks1;
  const T* vg = static_cast<const T*>(p.v) + b * p.vs0 + kvh * p.vs1;
  const int n_tiles = (p.sk + BN - 1) / BN;

  load_tile<T, DPAD, kBlockM>(qs, qg, p.qs2, p.sq - q0, p.d);
  load_tile<T, DPAD, BN>(ks, kg, p.ks2, min(BN, p.sk), p.d);
  load_tile<T, DPAD, BN>(vs, vg, p.vs2, min(BN, p.sk), p.d);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  const int row0 = warp * 16 + g;  // this thread's rows in the block tile: row0 and row0 + 8
  const int query[2] = {q0 + row0, q0 + row0 + 8};
  uint32_t qf[kQInRegs ? kKSteps : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) load_a_frag<PITCH>(qf[kk], qs, row0, kk * 16 + tig * 2);
  }
  float acc[kOTiles][4];
#pragma unroll
  for (int i = 0; i < kOTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max (log2 units) of rows row0, row0 + 8
  float l_run[2] = {0.0f, 0.0f};            // this thread's part of the running sums
  const float scale_log2 = p.scale * kLog2e;

  for (int t = 0; t < n_tiles; ++t) {
    const int buf = t & 1;
    const int kv0 = t * BN;
    if (t + 1 < n_tiles) {  // prefetch the next tile into the other buffer (freed by the last barrier)
      const int next = kv0 + BN;
      load_tile<T, DPAD, BN>(ks + (buf ^ 1) * BN * PITCH, kg + int64_t(next) * p.ks2, p.ks2, min(BN, p.sk - next), p.d);
      load_tile<T, DPAD, BN>(vs + (buf ^ 1) * BN * PITCH, vg + int64_t(next) * p.vs2, p.vs2, min(BN, p.sk - next), p.d);
    }
    cp_async_commit();
    const T* kt = ks + buf * BN * PITCH;
    const T* vt = vs + buf * BN * PITCH;

    // S = Q K^T for 16 rows x BN keys.
    float s[kSTiles][4];
#pragma unroll
    for (int i = 0; i < kSTiles; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t a[4];
      if constexpr (kQInRegs) {
        a[0] = qf[kk][0];
        a[1] = qf[kk][1];
        a[2] = qf[kk][2];
        a[3] = qf[kk][3];
      } else {
        load_a_frag<PITCH>(a, qs, row0, kk * 16 + tig * 2);
      }
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt) {
        const T* kr = kt + (nt * 8 + g) * PITCH + kk * 16 + tig * 2;
        mma16816<T>(s[nt], a, *reinterpret_cast<const uint32_t*>(kr), *reinterpret_cast<const uint32_t*>(kr + 8));
      }
    }

    // Scale, mask, bounds; scores to log2 units; the tile's row maxima.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ri = e >> 1;
        const int key = kv0 + nt * 8 + tig * 2 + (e & 1);
        float x;
        if (key >= p.sk) {
          x = -INFINITY;
        } else if (p.mask.ptr) {
          const int qr = query[ri];
          const float mv = qr < p.sq ? load_any(p.mask.ptr, p.mask.dtype,
                                                b * p.mask.s0 + h * p.mask.s1 + int64_t(qr) * p.mask.s2 + int64_t(key) * p.mask.s3)
                                     : 0.0f;
          x = (s[nt][e] * p.scale + mv) * kLog2e;
        } else {
          x = s[nt][e] * scale_log2;
        }
        s[nt][e] = x;
        tile_max[ri] = fmaxf(tile_max[ri], x);
      }
    }
    float m_use[2], alpha[2], row_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      // The four threads of a quad hold the same two rows.
      tile_max[ri] = fmaxf(tile_max[ri], __shfl_xor_sync(0xffffffffu, tile_max[ri], 1));
      tile_max[ri] = fmaxf(tile_max[ri], __shfl_xor_sync(0xffffffffu, tile_max[ri], 2));
      const float m_new = fmaxf(m_run[ri], tile_max[ri]);
      m_use[ri] = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: exps of -inf are 0, not NaN
      alpha[ri] = exp2f(m_run[ri] - m_use[ri]);
      m_run[ri] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - m_use[e >> 1]);
        row_sum[e >> 1] += s[nt][e];
      }
    }
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) l_run[ri] = l_run[ri] * alpha[ri] + row_sum[ri];
#pragma unroll
    for (int ot = 0; ot < kOTiles; ++ot) {
      acc[ot][0] *= alpha[0];
      acc[ot][1] *= alpha[0];
      acc[ot][2] *= alpha[1];
      acc[ot][3] *= alpha[1];
    }

    // O += P V: P's A fragments come straight from the S accumulators.
    const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: matrix index and row of this lane's address
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n2 = 0; n2 < DPAD / 16; ++n2) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, vt + (kk * 16 + mr + (mi & 1) * 8) * PITCH + n2 * 16 + (mi >> 1) * 8);
        mma16816<T>(acc[2 * n2], a, bv[0], bv[1]);
        mma16816<T>(acc[2 * n2 + 1], a, bv[2], bv[3]);
      }
    }
    cp_async_wait_all();  // the next tile has landed
    __syncthreads();      // and every warp is done with this one
  }

  float inv[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float l = l_run[ri];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[ri] = 1.0f / l;  // 0 for a fully masked row: NaN output, as the CPU backend gives
  }
  T* og = static_cast<T*>(p.out) + (int64_t(b) * p.heads + h) * int64_t(p.sq) * p.d;
#pragma unroll
  for (int ot = 0; ot < kOTiles; ++ot) {
    const int col = ot * 8 + tig * 2;
    if (col >= p.d) continue;
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      if (query[ri] >= p.sq) continue;
      *reinterpret_cast<uint32_t*>(og + int64_t(query[ri]) * p.d + col) = pack2<T>(acc[ot][2 * ri] * inv[ri], acc[ot][2 * ri + 1] * inv[ri]);
    }
  }
}

template <typename T, int DPAD>
bool launch_flash(const FlashParams& p, int batch, size_t max_smem, cudaStream_t stream) {
  constexpr size_t smem = flash_smem_bytes<T, DPAD>();
  if (smem > max_smem) return false;
  const auto kernel = flash_attention_kernel<T, DPAD>;
  if (smem > 48 * 1024) ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((p.sq + kBlockM - 1) / kBlockM), unsigned(p.heads), unsigned(batch));
  kernel<<<grid, kFlashThreads, smem, stream>>>(p);
  ATELIER_CUDA_LAUNCHED();
  return true;
}

// Padded head dims with a compiled kernel: the smallest bucket >= the head dim is used.
template <typename T>
bool launch_flash_bucket(const FlashParams& p, int batch, size_t max_smem, cudaStream_t stream) {
  if (p.d <= 32) return launch_flash<T, 32>(p, batch, max_smem, stream);
  if (p.d <= 48) return launch_flash<T, 48>(p, batch, max_smem, stream);
  if (p.d <= 64) return launch_flash<T, 64>(p, batch, max_smem, stream);
  if (p.d <= 80) return launch_flash<T, 80>(p, batch, max_smem, stream);
  if (p.d <= 96) return launch_flash<T, 96>(p, batch, max_smem, stream);
  if (p.d <= 128) return launch_flash<T, 128>(p, batch, max_smem, stream);
  if (p.d <= 160) return launch_flash<T, 160>(p, batch, max_smem, stream);
  return launch_flash<T, 256>(p, batch, max_smem, stream);
}

int64_t row_stride(const Tensor& t) { return t.size(2) == 1 ? t.size(3) : t.strides()[2]; }
int64_t dim_stride(const Tensor& t, int d) { return t.size(d) == 1 ? 0 : t.strides()[d]; }

// 16-byte aligned rows: what cp.async needs.
bool flash_aligned(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.raw()) % 16 != 0) return false;
  return dim_stride(t, 0) % 8 == 0 && dim_stride(t, 1) % 8 == 0 && row_stride(t) % 8 == 0;
}

}  // namespace

bool CudaBackend::attention_flash(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) {
  const DType dt = q.dtype();
  if (dt != DType::BF16 && dt != DType::F16) return false;
  if (k.dtype() != dt || v.dtype() != dt || out.dtype() != dt) return false;
  const int64_t b = q.size(0), h = q.size(1), sq = q.size(2), d = q.size(3), hk = k.size(1), sk = k.size(2);
  if (v.size(3) != d || d % 8 != 0 || d > kMaxFlashHeadDim) return false;
  if (b > 65535 || h > 65535 || sq >= (int64_t(1) << 30) || sk >= (int64_t(1) << 30)) return false;
  if (!flash_aligned(q) || !flash_aligned(k) || !flash_aligned(v) || !out.is_contiguous()) return false;
  FlashParams p{};
  p.q = q.raw();
  p.k = k.raw();
  p.v = v.raw();
  p.out = out.raw();
  p.qs0 = dim_stride(q, 0), p.qs1 = dim_stride(q, 1), p.qs2 = row_stride(q);
  p.ks0 = dim_stride(k, 0), p.ks1 = dim_stride(k, 1), p.ks2 = row_stride(k);
  p.vs0 = dim_stride(v, 0), p.vs1 = dim_stride(v, 1), p.vs2 = row_stride(v);
  p.sq = int(sq);
  p.sk = int(sk);
  p.d = int(d);
  p.heads = int(h);
  p.group = int(h / hk);
  p.scale = scale;
  p.mask = attention_mask_of(mask);
  NvtxRange range("attention_flash");
  if (dt == DType::BF16) return launch_flash_bucket<__nv_bfloat16>(p, int(b), max_smem_optin_, stream_);
  return launch_flash_bucket<__half>(p, int(b), max_smem_optin_, stream_);
}

// q [B, H, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv] (unit last stride, any other strides); mask a
// [B, H, Sq, Sk] broadcast view (last stride 0 or 1) or undefined; out [B, H, Sq, Dv] contiguous.
void CudaBackend::attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) {
  if (out.numel() == 0) return;
  ATELIER_CHECK(k.size(2) > 0, "attention over an empty key sequence");
  DeviceGuard guard(index_);
  if (attention_impl_ != AttentionImpl::kGemm && attention_flash(out, q, k, v, mask, scale)) return;
  if (attention_impl_ == AttentionImpl::kFlash)
    throw Error(unsupported("attention: the flash kernel takes bf16/f16 q, k, v of one dtype, equal q/v head dims that are a "
                            "multiple of 8 and at most 256, and 16-byte aligned rows; got " +
                            std::string(dtype_name(q.dtype())) + " " + shape_str(q.shape()) + " / " + shape_str(v.shape())));
  attention_gemm(out, q, k, v, mask, scale);
}

}  // namespace atelier::cuda
