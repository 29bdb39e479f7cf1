// Rotary position embedding on the GPU: one thread per (x0, x1) pair; see Backend::rope.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {

namespace {

struct RopeShape {
  int64_t a, c, half;   // dims 1 and 2 of x, pairs per row
  int64_t s0, s1, s2;   // x's strides (elements) of dims 0-2
  int seq_dim;
};

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
    const auto r = [](float v) { return to_f32(from_f32<T>(v)); };
#pragma unroll
    for (int e = 0; e < kPairsPerThread; ++e) {
      const float x0 = to_f32(in.v[2 * e]), x1 = to_f32(in.v[2 * e + 1]), ce = to_f32(c.v[e]), se = to_f32(s.v[e]);
      res.v[2 * e] = from_f32<T>(r(x0 * ce) - r(x1 * se));
      res.v[2 * e + 1] = from_f32<T>(r(x0 * se) + r(x1 * ce));
    }
    *reinterpret_cast<uint4*>(out + 2 * int64_t(i) * kPairsPerThread) = res.u;
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

// x [B, A, C, D] strided (unit last stride), cos/sin [S, D/2] contiguous -> out [B, A, C, D] contiguous.
void CudaBackend::rope(Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim) {
  const int64_t pairs = out.numel() / 2;
  if (pairs == 0) return;
  ATELIER_CHECK(out.is_contiguous() && x.strides()[3] == 1 && cos.is_contiguous() && sin.is_contiguous() &&
                    x.dtype() == out.dtype() && cos.dtype() == out.dtype() && sin.dtype() == out.dtype(),
                "rope: unit-stride x, contiguous out/cos/sin of one dtype expected");
  NvtxRange range("rope");
  DeviceGuard guard(index_);
  const RopeShape sh{x.size(1), x.size(2), x.size(3) / 2, x.strides()[0], x.strides()[1], x.strides()[2], seq_dim};
  // The vector kernel's loads: 8 elements of x at a 16-byte boundary, 4 of cos/sin at an 8-byte one.
  const bool vec = dtype_size(out.dtype()) == 2 && sh.half % kPairsPerThread == 0 && sh.s0 % 8 == 0 && sh.s1 % 8 == 0 &&
                   sh.s2 % 8 == 0 && aligned(x.raw(), 16) && aligned(out.raw(), 16) && aligned(cos.raw(), 8) && aligned(sin.raw(), 8);
  dispatch_float(out.dtype(), "rope", [&](auto tag) {
    using T = decltype(tag);
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
