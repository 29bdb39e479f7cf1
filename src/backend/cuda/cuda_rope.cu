// Rotary position embedding on the GPU: one thread per (x0, x1) pair; see Backend::rope.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_norm_common.cuh"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {

namespace {

struct RopeShape {
  int64_t a, c, half;   // dims 1 and 2 of x, pairs per row
  int64_t s0, s1, s2;   // x's strides (elements) of dims 0-2
  int seq_dim;
  FastDivU32 div_a{}, div_c{};  // by a and c (the 32-bit row arithmetic of the normalising kernels)
};

// x [B, A, C, D]'s rope shape, positions along dim seq_dim.
RopeShape rope_shape(const Tensor& x, int seq_dim) {
  RopeShape sh{x.size(1), x.size(2), x.size(3) / 2, x.strides()[0], x.strides()[1], x.strides()[2], seq_dim};
  if (fits_u32(sh.a) && fits_u32(sh.c) && sh.a > 0 && sh.c > 0) {
    sh.div_a = FastDivU32::of(uint32_t(sh.a));
    sh.div_c = FastDivU32::of(uint32_t(sh.c));
  }
  return sh;
}

template <typename T, typename Index>
__global__ void rope_kernel(T* out, const T* x, const T* cos, const T* sin, RopeShape sh, Index pairs) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += step) {
    const Index p = i % Index(sh.half), row = i / Index(sh.half);
    const Index k = row % Index(sh.c), ij = row / Index(sh.c);
    const Index j = ij % Index(sh.a), b = ij / Index(sh.a);
    const T* xr = x + int64_t(b) * sh.s0 + int64_t(j) * sh.s1 + int64_t(k) * sh.s2 + 2 * int64_t(p);
    const int64_t t = int64_t(sh.seq_dim == 1 ? j : k) * sh.half + int64_t(p);
    const float x0 = to_f32(xr[0]), x1 = to_f32(xr[1]), c = to_f32(cos[t]), s = to_f32(sin[t]);
    // Each product rounded to T first, as the reference's separate mul ops round (exact for f32).
    const auto r = [](float v) { return to_f32(from_f32<T>(v)); };
    out[2 * int64_t(i)] = from_f32<T>(r(x0 * c) - r(x1 * s));
    out[2 * int64_t(i) + 1] = from_f32<T>(r(x0 * s) + r(x1 * c));
  }
}

// The rotation of one 16-bit pair x = (x0, x1) in paired arithmetic: (x0 c - x1 s, x1 c + x0 s), each product
// and each sum rounded to T once, as the reference's separate mul and add ops round (cuda_device.cuh: the
// paired ops give those bits). Two paired products, a swap, a sign flip and a paired sum, where the per-element
// form took four products, six conversions and their unpackings.
template <typename T>
__device__ __forceinline__ pair_t<T> rotate_pair2(pair_t<T> x, T c, T s) {
  const pair_t<T> xc = __hmul2_rn(x, PairOf<T>::splat(c));                      // (x0 c, x1 c)
  const pair_t<T> xs = __hmul2_rn(__lowhigh2highlow(x), PairOf<T>::splat(s));  // (x1 s, x0 s)
  return __hadd2_rn(xc, negate_low(xs));
}

// 16-bit types: each thread takes kPairsPerThread consecutive pairs with one 16-byte load and store of x/out
// (and 8-byte loads of cos/sin). The scalar kernel above ran at about a third of the memory bandwidth.
constexpr int kPairsPerThread = 4;

template <typename T, typename Index>
__global__ void rope_vec_kernel(T* out, const T* x, const T* cos, const T* sin, RopeShape sh, Index groups) {
  static_assert(sizeof(T) == 2, "16-bit types only");
  const Index per_row = Index(sh.half / kPairsPerThread);
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < groups; i += step) {
    const Index p = (i % per_row) * kPairsPerThread, row = i / per_row;
    const Index k = row % Index(sh.c), ij = row / Index(sh.c);
    const Index j = ij % Index(sh.a), b = ij / Index(sh.a);
    const T* xr = x + int64_t(b) * sh.s0 + int64_t(j) * sh.s1 + int64_t(k) * sh.s2 + 2 * int64_t(p);
    const int64_t t = int64_t(sh.seq_dim == 1 ? j : k) * sh.half + int64_t(p);
    union {
      uint4 u;
      T v[2 * kPairsPerThread];
    } in, res;
    union {
      uint2 u;
      T v[kPairsPerThread];
    } c, s;
    in.u = *reinterpret_cast<const uint4*>(xr);
    c.u = *reinterpret_cast<const uint2*>(cos + t);
    s.u = *reinterpret_cast<const uint2*>(sin + t);
#pragma unroll
    for (int e = 0; e < kPairsPerThread; ++e) pair_at(res.v, e) = rotate_pair2<T>(pair_at(in.v, e), c.v[e], s.v[e]);
    *reinterpret_cast<uint4*>(out + 2 * int64_t(i) * kPairsPerThread) = res.u;
  }
}


// x's row `row` of the output order (b, j, k): its first element, and the row's position in the tables.
// The divisions run in 32 bits where the row count allows (every model's): a 64-bit division or remainder
// is a long software sequence, and every thread of the normalising kernels makes two to four of them for
// its 8 elements.
struct RopeRow {
  int64_t offset, position;
  int64_t b, j, k;  // the row's indices along dims 0-2
};

template <typename Index>
__device__ __forceinline__ RopeRow rope_row(const RopeShape& sh, int64_t row64) {
  const Index row = Index(row64), c = Index(sh.c), a = Index(sh.a);
  Index ij, b;
  if constexpr (sizeof(Index) == 4) {  // rows < 2^31 (fits_u32): the host-made divisors
    ij = sh.div_c.div(row);
    b = sh.div_a.div(ij);
  } else {
    ij = row / c;
    b = ij / a;
  }
  const Index k = row - ij * c, j = ij - b * a;
  return {int64_t(b) * sh.s0 + int64_t(j) * sh.s1 + int64_t(k) * sh.s2, int64_t(sh.seq_dim == 1 ? j : k), int64_t(b),
          int64_t(j), int64_t(k)};
}

// The rotation of one pair read after the RMS norm: x0, x1 normalised values already rounded to T.
template <typename T>
__device__ __forceinline__ void rotate_pair(T* o, float x0, float x1, float c, float s) {
  const auto r = [](float v) { return to_f32(from_f32<T>(v)); };
  o[0] = from_f32<T>(r(x0 * c) - r(x1 * s));
  o[1] = from_f32<T>(r(x0 * s) + r(x1 * c));
}

// RMS norm then rotation, 16-bit rows of 16-byte vectors (FLUX's and Z-Image's heads of 128: 8 lanes of two
// vectors, rope_rms_vec_kernel below): the lanes of a row share the sum of squares by shuffles (with one vector
// per lane in rms_norm_vec_kernel's order; with two the sums differ from it in the last bits, within the
// tolerance the parity tests hold both to). Every lane takes part in the shuffles.
constexpr int kRopeRmsThreads = 256;

// With e4m3.q set the rotated rows go to e4m3 instead (FP8 attention's q or k: e4m3(v / s), s = f8e4m3_scale(bound) as
// fp8_quantize_kernel takes a bounded operand, so the same bytes), and `out` is not written. The e4m3 rows may
// lie strided (a joint sequence's run of positions: FLUX's text or image tokens of a double block's q).
struct RopeE4m3Out {
  uint8_t* q = nullptr;
  RowDivider div{};         // made on the host (fp8_row_divider): no divisions per thread
  int64_t s0 = 0, s1 = 0, s2 = 0;  // q's strides (elements) of dims 0-2; its last is 1
};

// LANES lanes per row, VPL vectors per lane (vector lane + i * LANES: each of the row's loads is coalesced).
// Two vectors per lane for FLUX's and Z-Image's heads of 128 (8 lanes): the per-row work (indices, the
// statistics' square root and division, gamma and table loads) once per 16 elements instead of 8 made the
// kernel ~35 instructions per element (ncu, session 16).
template <typename T, int LANES, int VPL, typename Index>
__global__ void rope_rms_vec_kernel(T* out, const T* x, const T* cos, const T* sin, RopeShape sh, NormAffine aff,
                                    float eps, int64_t rows, RopeE4m3Out e4m3) {
  constexpr int V = Vec<T>::kWidth, P = V / 2;
  const int64_t row = int64_t(blockIdx.x) * (kRopeRmsThreads / LANES) + threadIdx.x / LANES;
  const int lane = int(threadIdx.x) % LANES;
  const bool live = row < rows;  // every lane takes part in the shuffles of lanes_row_rstd
  const RopeRow rr = rope_row<Index>(sh, live ? row : 0);
  const auto col = [&](int i) { return lane + i * LANES; };  // this lane's vector i of the row
  Vec<T> v[VPL];
#pragma unroll
  for (int i = 0; i < VPL; ++i) v[i] = live ? reinterpret_cast<const Vec<T>*>(x + rr.offset)[col(i)] : Vec<T>{};
  float f[VPL][V];
  const float rstd = lanes_row_rstd<T, LANES, VPL>(v, f, eps);
  if (!live) return;
#pragma unroll
  for (int i = 0; i < VPL; ++i) {
    float g[V];
    load_param_run<T>(g, aff.gamma, aff.gamma_dtype, int64_t(col(i)) * V, 1.0f);
    const int64_t t = rr.position * sh.half + int64_t(col(i)) * P;
    union {
      uint2 u;
      T v[P];
    } c, s;
    c.u = *reinterpret_cast<const uint2*>(cos + t);
    s.u = *reinterpret_cast<const uint2*>(sin + t);
    Vec<T> o;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const pair_t<T> xn = PairOf<T>::from_floats(f[i][2 * e] * rstd * g[2 * e], f[i][2 * e + 1] * rstd * g[2 * e + 1]);
      pair_at(o.v, e) = rotate_pair2<T>(xn, c.v[e], s.v[e]);
    }
    if (e4m3.q) store_e4m3(e4m3.q + (rr.b * e4m3.s0 + rr.j * e4m3.s1 + rr.k * e4m3.s2 + int64_t(col(i)) * V), o, e4m3.div);
    else reinterpret_cast<Vec<T>*>(out + row * 2 * sh.half)[col(i)] = o;
  }
}

// Any row width and dtype: one warp per row (the sum of squares as rms_norm_warp_kernel takes it).
constexpr int kRopeRmsWarps = 8;

template <typename T, typename Index>
__global__ void rope_rms_warp_kernel(T* out, const T* x, const T* cos, const T* sin, RopeShape sh, NormAffine aff,
                                     float eps, int64_t rows) {
  const int64_t row = int64_t(blockIdx.x) * kRopeRmsWarps + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  if (row >= rows) return;  // the whole warp: its lanes share the row
  const RopeRow rr = rope_row<Index>(sh, row);
  const T* xr = x + rr.offset;
  const int64_t d = 2 * sh.half;
  float q = 0.0f;
  for (int64_t j = lane; j < d; j += 32) {
    const float v = to_f32(xr[j]);
    q += v * v;
  }
  const float rstd = 1.0f / sqrtf(warp_sum(q) / float(d) + eps);
  const auto norm = [&](int64_t j) {
    const float g = aff.gamma ? load_any(aff.gamma, aff.gamma_dtype, j) : 1.0f;
    return to_f32(from_f32<T>(to_f32(xr[j]) * rstd * g));
  };
  const int64_t t0 = rr.position * sh.half;
  T* o = out + row * d;
  for (int64_t p = lane; p < sh.half; p += 32)
    rotate_pair<T>(o + 2 * p, norm(2 * p), norm(2 * p + 1), to_f32(cos[t0 + p]), to_f32(sin[t0 + p]));
}

// Whether rope_rms_vec_kernel takes rows of a 16-bit T with these strides and pointers: 8, 16 or 32 aligned
// 16-byte vectors.
template <typename T>
bool rope_rms_vec_takes(const void* out, const T* x, const T* cos, const T* sin, const RopeShape& sh) {
  constexpr int V = Vec<T>::kWidth;
  const int64_t lanes = 2 * sh.half / V;
  return sizeof(T) == 2 && 2 * sh.half == lanes * V && (lanes == 8 || lanes == 16 || lanes == 32) && sh.s0 % V == 0 &&
         sh.s1 % V == 0 && sh.s2 % V == 0 && aligned16(x) && aligned16(out) && aligned_to(cos, 8) && aligned_to(sin, 8);
}

// rope with the RMS norm first (rms.on): the vector kernel where it takes the rows, the warp kernel otherwise;
// with e4m3.q the vector kernel only (the caller asked rope_rms_vec_takes).
template <typename T>
void launch_rope_rms(cudaStream_t stream, T* out, const T* x, const T* cos, const T* sin, const RopeShape& sh,
                     const RopeRms& rms, int64_t rows, const RopeE4m3Out& e4m3 = {}) {
  constexpr int V = Vec<T>::kWidth;
  const NormAffine aff = affine_of(rms.gamma, Tensor());
  const int64_t lanes = 2 * sh.half / V;
  const bool vec = rope_rms_vec_takes<T>(e4m3.q ? static_cast<const void*>(e4m3.q) : out, x, cos, sin, sh);
  if (e4m3.q && !vec) return;  // (CudaBackend::rope_e4m3 asks rope_rms_vec_takes first)
  const auto with_index = [&](auto index) {
    using Index = decltype(index);
    if constexpr (sizeof(T) == 2) {
      if (vec) {
        // Rows of 16 or 32 vectors: two per lane (8 or 16 lanes); rows of 8: one per lane. On FLUX's FP8 step
        // (ncu, session 16): 2.59 -> 2.42 ms, 1759 -> 1488 M instructions over its 152 ropes.
        const int vpl = lanes >= 16 ? 2 : 1;
        const unsigned blocks = unsigned((rows * (lanes / vpl) + kRopeRmsThreads - 1) / kRopeRmsThreads);
        const auto launch = [&](auto l, auto per_lane) {
          rope_rms_vec_kernel<T, decltype(l)::value, decltype(per_lane)::value, Index>
              <<<blocks, kRopeRmsThreads, 0, stream>>>(out, x, cos, sin, sh, aff, rms.eps, rows, e4m3);
        };
        using One = std::integral_constant<int, 1>;
        using Two = std::integral_constant<int, 2>;
        if (lanes == 8) launch(std::integral_constant<int, 8>{}, One{});
        else if (lanes == 16 && vpl == 2) launch(std::integral_constant<int, 8>{}, Two{});
        else if (lanes == 16) launch(std::integral_constant<int, 16>{}, One{});
        else if (vpl == 2) launch(std::integral_constant<int, 16>{}, Two{});
        else launch(std::integral_constant<int, 32>{}, One{});
        return;
      }
    }
    const unsigned blocks = unsigned((rows + kRopeRmsWarps - 1) / kRopeRmsWarps);
    rope_rms_warp_kernel<T, Index><<<blocks, 32 * kRopeRmsWarps, 0, stream>>>(out, x, cos, sin, sh, aff, rms.eps, rows);
  };
  if (fits_u32(rows)) with_index(uint32_t{});
  else with_index(uint64_t{});
}

}  // namespace

// rope of x [B, A, C, D] (positions along dim 2, with its RMS norm) written as e4m3 into q8 (x's shape, unit
// last stride, the others whole 8-byte vectors: a contiguous tensor or a run of positions of one) over the
// scale f8e4m3_scale(bound): false (nothing launched) where the register kernel cannot take x.
bool CudaBackend::rope_e4m3(Tensor& q8, const Tensor& x, const Tensor& cos, const Tensor& sin, const RopeRms& rms, float bound) {
  constexpr int64_t kStoreElems = 8;  // store_e4m3 writes a 16-bit vector's 8 elements as one 8-byte store
  if (!rms.on || q8.numel() == 0 || q8.shape() != x.shape() || x.strides()[3] != 1 || q8.strides()[3] != 1) return false;
  for (int i = 0; i < 3; ++i)
    if (q8.strides()[i] % kStoreElems != 0) return false;
  if (!aligned_to(q8.raw(), kStoreElems)) return false;
  const RopeShape sh = rope_shape(x, 2);
  bool taken = false;
  dispatch_float(x.dtype(), "rope", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) {
      // (the 16-byte check of q8 there is stricter than its 8-byte stores need: the runs' starts are whole rows)
      if (!rope_rms_vec_takes<T>(q8.raw(), x.data<T>(), cos.data<T>(), sin.data<T>(), sh)) return;
      NvtxRange range("rope_e4m3");
      DeviceGuard guard(index_);
      launch_rope_rms<T>(stream_, nullptr, x.data<T>(), cos.data<T>(), sin.data<T>(), sh, rms, x.numel() / x.size(3),
                         RopeE4m3Out{static_cast<uint8_t*>(q8.raw()), fp8_row_divider(bound), q8.strides()[0],
                                     q8.strides()[1], q8.strides()[2]});
      ATELIER_CUDA_LAUNCHED();
      taken = true;
    }
  });
  return taken;
}

// x [B, A, C, D] strided (unit last stride), cos/sin [S, D/2] contiguous -> out [B, A, C, D] contiguous;
// rms.on: each row RMS-normalised first (gamma [D] optional).
void CudaBackend::rope(Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms) {
  const int64_t pairs = out.numel() / 2;
  if (pairs == 0) return;
  ATELIER_CHECK(out.is_contiguous() && x.strides()[3] == 1 && cos.is_contiguous() && sin.is_contiguous() &&
                    x.dtype() == out.dtype() && cos.dtype() == out.dtype() && sin.dtype() == out.dtype(),
                "rope: unit-stride x, contiguous out/cos/sin of one dtype expected");
  NvtxRange range("rope");
  DeviceGuard guard(index_);
  const RopeShape sh = rope_shape(x, seq_dim);
  // The vector kernel's loads: 8 elements of x at a 16-byte boundary, 4 of cos/sin at an 8-byte one.
  const bool vec = dtype_size(out.dtype()) == 2 && sh.half % kPairsPerThread == 0 && sh.s0 % 8 == 0 && sh.s1 % 8 == 0 &&
                   sh.s2 % 8 == 0 && aligned16(x.raw()) && aligned16(out.raw()) && aligned_to(cos.raw(), 8) && aligned_to(sin.raw(), 8);
  dispatch_float(out.dtype(), "rope", [&](auto tag) {
    using T = decltype(tag);
    if (rms.on) {
      launch_rope_rms<T>(stream_, out.data<T>(), x.data<T>(), cos.data<T>(), sin.data<T>(), sh, rms, pairs * 2 / x.size(3));
      return;
    }
    if constexpr (sizeof(T) == 2) {
      if (vec) {
        const int64_t groups = pairs / kPairsPerThread;
        if (fits_u32(groups))
          rope_vec_kernel<T, uint32_t><<<grid_for(groups), kThreads, 0, stream_>>>(out.data<T>(), x.data<T>(), cos.data<T>(),
                                                                                   sin.data<T>(), sh, uint32_t(groups));
        else
          rope_vec_kernel<T, uint64_t><<<grid_for(groups), kThreads, 0, stream_>>>(out.data<T>(), x.data<T>(), cos.data<T>(),
                                                                                   sin.data<T>(), sh, uint64_t(groups));
        return;
      }
    }
    if (fits_u32(pairs))
      rope_kernel<T, uint32_t><<<grid_for(pairs), kThreads, 0, stream_>>>(out.data<T>(), x.data<T>(), cos.data<T>(),
                                                                           sin.data<T>(), sh, uint32_t(pairs));
    else
      rope_kernel<T, uint64_t><<<grid_for(pairs), kThreads, 0, stream_>>>(out.data<T>(), x.data<T>(), cos.data<T>(),
                                                                           sin.data<T>(), sh, uint64_t(pairs));
  });
  ATELIER_CUDA_LAUNCHED();
}

}  // namespace atelier::cuda
