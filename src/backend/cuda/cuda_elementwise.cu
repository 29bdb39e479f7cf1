// Elementwise GPU ops: activations, broadcast binary ops, the fused linear combination, GLU, softmax.
// Storage in f32/bf16/f16, arithmetic in f32, one rounding per stored element.
#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {
namespace {

// Elements of T in one 16-byte access.
template <typename T> constexpr int kVec = 16 / int(sizeof(T));

template <typename T>
struct alignas(16) Pack {
  T v[kVec<T>];
};

__device__ __forceinline__ float apply_binary(float x, float y, BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return x + y;
    case BinaryOp::kSub: return x - y;
    case BinaryOp::kMul: return x * y;
    case BinaryOp::kDiv: return x / y;
    // NaN propagates from either side, as torch.maximum/minimum do.
    case BinaryOp::kMax: return (x != x || x > y) ? x : y;
    case BinaryOp::kMin: return (x != x || x < y) ? x : y;
  }
  return x;
}

// --- unary ------------------------------------------------------------------------------------------------

template <typename T>
__global__ void unary_kernel(T* out, const T* x, int64_t n, UnaryOp op, bool vec) {
  int64_t start = 0;
  if (vec) {
    constexpr int V = kVec<T>;
    const int64_t packs = n / V;
    for (int64_t i = global_thread(); i < packs; i += grid_threads()) {
      Pack<T> p = reinterpret_cast<const Pack<T>*>(x)[i];
#pragma unroll
      for (int j = 0; j < V; ++j) p.v[j] = from_f32<T>(apply_unary_for<T>(to_f32(p.v[j]), op));
      reinterpret_cast<Pack<T>*>(out)[i] = p;
    }
    start = packs * V;
  }
  for (int64_t i = start + global_thread(); i < n; i += grid_threads()) out[i] = from_f32<T>(apply_unary_for<T>(to_f32(x[i]), op));
}

// --- binary -----------------------------------------------------------------------------------------------

// All three operands one packed run.
template <typename T>
__global__ void binary_flat_kernel(T* out, const T* a, const T* b, int64_t n, BinaryOp op, bool vec) {
  int64_t start = 0;
  if (vec) {
    constexpr int V = kVec<T>;
    const int64_t packs = n / V;
    for (int64_t i = global_thread(); i < packs; i += grid_threads()) {
      const Pack<T> pa = reinterpret_cast<const Pack<T>*>(a)[i];
      const Pack<T> pb = reinterpret_cast<const Pack<T>*>(b)[i];
      Pack<T> po;
#pragma unroll
      for (int j = 0; j < V; ++j) po.v[j] = from_f32<T>(apply_binary(to_f32(pa.v[j]), to_f32(pb.v[j]), op));
      reinterpret_cast<Pack<T>*>(out)[i] = po;
    }
    start = packs * V;
  }
  for (int64_t i = start + global_thread(); i < n; i += grid_threads())
    out[i] = from_f32<T>(apply_binary(to_f32(a[i]), to_f32(b[i]), op));
}

// General broadcast: operand 0 is out, 1 is a, 2 is b (zero strides broadcast).
template <typename T, typename Index>
__global__ void binary_strided_kernel(T* out, const T* a, const T* b, StridedLayout<3> l, Index n, BinaryOp op) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[3];
    strided_offsets(l, i, off);
    out[off[0]] = from_f32<T>(apply_binary(to_f32(a[off[1]]), to_f32(b[off[2]]), op));
  }
}

// --- guidance combine -------------------------------------------------------------------------------------

constexpr int kMaxGuidanceRows = 64;  // scales per launch, passed by value (a server's batch is at most 64 rows)

struct GuidanceArgs {
  float scale[kMaxGuidanceRows];
  int64_t per_row = 0;
};

// out[s, e] = u + g_s * (c - u) for row s = blockIdx.y, each op rounded on its own (no contraction into an FMA), as
// the three elementwise ops it replaces round: the same bits as sub, mul and add.
__global__ void guidance_kernel(float* out, const float* cond, const float* uncond, GuidanceArgs a) {
  const int64_t base = int64_t(blockIdx.y) * a.per_row;
  const float g = a.scale[blockIdx.y];
  for (int64_t k = global_thread(); k < a.per_row; k += grid_threads()) {
    const float u = uncond[base + k];
    out[base + k] = __fadd_rn(u, __fmul_rn(__fsub_rn(cond[base + k], u), g));
  }
}

// --- timestep features ------------------------------------------------------------------------------------

// out [rows, dim]: column j < half is sin(t * freq_j), half <= j < 2 half cos(t * freq_{j - half}) (swapped with
// flip), zeros past; t [rows] or [1] (t_stride 0). The product rounded on its own and sinf / cosf as the unary
// kernel calls them: the bits of ops::mul, ops::unary and the concatenations they replace, then one rounding to T.
template <typename T>
__global__ void timestep_features_kernel(T* out, const float* t, int64_t t_stride, const float* freqs, int64_t half,
                                         int64_t dim, int64_t n, bool flip) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const int64_t r = i / dim, j = i - r * dim;
    float v = 0.0f;
    if (j < 2 * half) {
      const bool first = j < half;
      const float arg = __fmul_rn(t[r * t_stride], freqs[first ? j : j - half]);
      v = first != flip ? sinf(arg) : cosf(arg);
    }
    out[i] = from_f32<T>(v);
  }
}

// --- lincomb ----------------------------------------------------------------------------------------------

constexpr int kLincombInputs = 8;     // inputs per launch (more are accumulated by further launches)
constexpr int kLincombCoeffs = 256;   // coefficients per launch (sample rows x inputs), passed by value

// One launch: out[s, e] (=|+=) sum_i coeff[s * n_in + i] * in[i][s, e] for the launch's samples
// (blockIdx.y) and elements e < per_sample. Coefficients travel in the kernel's arguments, so a call never
// waits for a host-to-device copy.
struct LincombArgs {
  const void* in[kLincombInputs];
  float coeff[kLincombCoeffs];
  int n_in = 0;
  bool shared_coeffs = false;  // one coefficient row for every sample
  bool accumulate = false;     // add onto out (inputs beyond the first kLincombInputs)
  int64_t per_sample = 0;
};

template <typename T>
__global__ void lincomb_kernel(T* out, LincombArgs args, bool vec) {
  const int s = blockIdx.y;
  const int64_t base = int64_t(s) * args.per_sample;
  const float* c = args.coeff + (args.shared_coeffs ? 0 : s * args.n_in);
  int64_t start = 0;
  if (vec) {
    constexpr int V = kVec<T>;
    const int64_t packs = args.per_sample / V;
    for (int64_t p = global_thread(); p < packs; p += grid_threads()) {
      float acc[V];
      const int64_t e = base + p * V;
      if (args.accumulate) {
        const Pack<T> o = *reinterpret_cast<const Pack<T>*>(out + e);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = to_f32(o.v[j]);
      }
      for (int i = 0; i < args.n_in; ++i) {
        const Pack<T> x = *reinterpret_cast<const Pack<T>*>(static_cast<const T*>(args.in[i]) + e);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = (i == 0 && !args.accumulate) ? c[i] * to_f32(x.v[j]) : acc[j] + c[i] * to_f32(x.v[j]);
      }
      Pack<T> o;
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = from_f32<T>(acc[j]);
      *reinterpret_cast<Pack<T>*>(out + e) = o;
    }
    start = packs * V;
  }
  for (int64_t k = start + global_thread(); k < args.per_sample; k += grid_threads()) {
    const int64_t e = base + k;
    float acc = args.accumulate ? to_f32(out[e]) : c[0] * to_f32(static_cast<const T*>(args.in[0])[e]);
    for (int i = args.accumulate ? 0 : 1; i < args.n_in; ++i) acc += c[i] * to_f32(static_cast<const T*>(args.in[i])[e]);
    out[e] = from_f32<T>(acc);
  }
}

// --- glu --------------------------------------------------------------------------------------------------

template <typename T, typename Index>
__global__ void glu_kernel(T* out, const T* x, Index rows, Index h, UnaryOp act) {
  const Index n = rows * h;
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Index r = i / h, c = i % h;
    const T* xr = x + int64_t(r) * 2 * h;
    out[i] = from_f32<T>(to_f32(xr[c]) * apply_unary_for<T>(to_f32(xr[h + c]), act));
  }
}

// Vectorised: each thread writes kVec<T> consecutive outputs from two 16-byte loads (h % kVec == 0, aligned
// rows). The scalar kernel's per-element divisions and 2-byte accesses ran SD's GEGLU at about a third of the
// memory bandwidth (3.6 ms of a batch-16 UNet step on the H200).
template <typename T, typename Index>
__global__ void glu_vec_kernel(T* out, const T* x, Index rows, Index hv, UnaryOp act) {
  constexpr int V = kVec<T>;
  const Index n = rows * hv;
  const Index step = Index(gridDim.x) * blockDim.x;
  const auto* xv = reinterpret_cast<const Pack<T>*>(x);
  auto* ov = reinterpret_cast<Pack<T>*>(out);
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Index r = i / hv, c = i - r * hv;
    const Pack<T> a = xv[int64_t(r) * 2 * hv + c], g = xv[int64_t(r) * 2 * hv + hv + c];
    Pack<T> o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = from_f32<T>(to_f32(a.v[e]) * apply_unary_for<T>(to_f32(g.v[e]), act));
    ov[i] = o;
  }
}

// --- softmax ----------------------------------------------------------------------------------------------

// One block per row: max, sum of exponentials, scaled write (the CPU backend's order of operations).
template <typename T>
__global__ void softmax_kernel(T* out, const T* x, int64_t d) {
  __shared__ float scratch[32];
  const T* xr = x + int64_t(blockIdx.x) * d;
  T* o = out + int64_t(blockIdx.x) * d;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) mx = fmaxf(mx, to_f32(xr[j]));
  mx = block_max(mx, scratch);
  if (mx == -INFINITY) mx = 0.0f;  // fully masked row: every exp is 0 and the row becomes NaN, as in torch
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += expf(to_f32(xr[j]) - mx);
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = from_f32<T>(expf(to_f32(xr[j]) - mx) * inv);
}

int softmax_threads(int64_t d) { return d <= 128 ? 32 : d <= 512 ? 128 : d <= 2048 ? 256 : 512; }

// Launches of the fused diffusion kernels so far (tests: the fused path ran, not the unfused ops' fallback).
std::atomic<int64_t> g_guidance_launches{0}, g_timestep_features_launches{0};

}  // namespace

// out = op(x); x and out contiguous, same shape and dtype.
void CudaBackend::unary(Tensor& out, const Tensor& x, UnaryOp op) {
  const int64_t n = x.numel();
  if (n == 0) return;
  ATELIER_CHECK(x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype(), "unary: contiguous tensors of one dtype expected");
  NvtxRange range("unary");
  DeviceGuard guard(index_);
  dispatch_float(x.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    const bool vec = aligned16(x.raw()) && aligned16(out.raw());
    unary_kernel<T><<<grid_for(vec ? n / kVec<T> + 1 : n), kThreads, 0, stream_>>>(out.data<T>(), x.data<T>(), n, op, vec);
  });
  ATELIER_CUDA_LAUNCHED();
}

// out = a op b; a and b are views with out's shape (zero strides broadcast); out contiguous.
void CudaBackend::binary(Tensor& out, const Tensor& a, const Tensor& b, BinaryOp op) {
  ATELIER_CHECK(a.shape() == out.shape() && b.shape() == out.shape(), "binary: operands must be broadcast to the output shape");
  const int64_t n = out.numel();
  if (n == 0) return;
  ATELIER_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), "binary: operands and output must share a dtype");
  NvtxRange range("binary");
  DeviceGuard guard(index_);
  const StridedLayout<3> l = collapse<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()});
  dispatch_float(out.dtype(), "binary", [&](auto tag) {
    using T = decltype(tag);
    if (is_flat(l, 0) && is_flat(l, 1) && is_flat(l, 2)) {
      const bool vec = aligned16(out.raw()) && aligned16(a.raw()) && aligned16(b.raw());
      binary_flat_kernel<T><<<grid_for(vec ? n / kVec<T> + 1 : n), kThreads, 0, stream_>>>(out.data<T>(), a.data<T>(), b.data<T>(), n, op, vec);
    } else if (fits_u32(n)) {
      binary_strided_kernel<T, uint32_t><<<grid_for(n), kThreads, 0, stream_>>>(out.data<T>(), a.data<T>(), b.data<T>(), l, uint32_t(n), op);
    } else {
      binary_strided_kernel<T, uint64_t><<<grid_for(n), kThreads, 0, stream_>>>(out.data<T>(), a.data<T>(), b.data<T>(), l, uint64_t(n), op);
    }
  });
  ATELIER_CUDA_LAUNCHED();
}

// A UNet's timestep features in one kernel (the product, sin, cos, two concatenations and a cast before).
bool CudaBackend::timestep_features(Tensor& out, const Tensor& t, const Tensor& freqs, bool flip_sin_to_cos) {
  const int64_t n = out.numel();
  if (n == 0) return true;
  const DType dt = out.dtype();
  if (dt != DType::F32 && dt != DType::BF16 && dt != DType::F16) return false;  // the unfused ops take the rest
  NvtxRange range("timestep_features");
  DeviceGuard guard(index_);
  const int64_t t_stride = t.size(0) == 1 ? 0 : 1;
  dispatch_float(out.dtype(), "timestep_features", [&](auto tag) {
    using T = decltype(tag);
    timestep_features_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(out.data<T>(), t.data<float>(), t_stride, freqs.data<float>(),
                                                                       freqs.numel(), out.size(1), n, flip_sin_to_cos);
  });
  ATELIER_CUDA_LAUNCHED();
  g_timestep_features_launches.fetch_add(1);
  return true;
}

// One kernel for classifier-free guidance's sub, mul and add, the scales in its arguments (no upload per step).
bool CudaBackend::guidance_combine(Tensor& out, const Tensor& cond, const Tensor& uncond, const std::vector<float>& scales) {
  const int64_t rows = cond.size(0);
  if (rows < 1 || rows > kMaxGuidanceRows || out.numel() == 0) return false;
  ATELIER_CHECK(int64_t(scales.size()) == rows, "guidance_combine: one scale per row expected");
  GuidanceArgs a;
  for (int64_t s = 0; s < rows; ++s) a.scale[s] = scales[size_t(s)];
  a.per_row = out.numel() / rows;
  NvtxRange range("guidance_combine");
  DeviceGuard guard(index_);
  const dim3 grid(grid_for(a.per_row), unsigned(rows));
  guidance_kernel<<<grid, kThreads, 0, stream_>>>(out.data<float>(), cond.data<float>(), uncond.data<float>(), a);
  ATELIER_CUDA_LAUNCHED();
  g_guidance_launches.fetch_add(1);
  return true;
}

int64_t guidance_combine_launches() { return g_guidance_launches.load(); }
int64_t timestep_features_launches() { return g_timestep_features_launches.load(); }

// out[s, ...] = sum_i coeffs[s * n + i] * inputs[i][s, ...] (coeff_rows == 1: one row for all samples).
// All tensors contiguous with out's shape and dtype. Launches cover at most kLincombInputs inputs and
// kLincombCoeffs coefficients each: further inputs accumulate onto out, further samples get their own launch.
void CudaBackend::lincomb(Tensor& out, const std::vector<Tensor>& inputs, const std::vector<float>& coeffs, int coeff_rows) {
  const int n_in = int(inputs.size());
  ATELIER_CHECK(n_in >= 1 && int64_t(coeffs.size()) == int64_t(n_in) * coeff_rows, "lincomb: coefficient count");
  const int64_t total = out.numel();
  if (total == 0) return;
  for (const Tensor& t : inputs)
    ATELIER_CHECK(t.is_contiguous() && t.numel() == total && t.dtype() == out.dtype(), "lincomb: inputs must be contiguous with out's shape and dtype");
  NvtxRange range("lincomb");
  DeviceGuard guard(index_);
  const bool shared = coeff_rows == 1;
  const int64_t samples = shared ? 1 : out.size(0);
  const int64_t per_sample = total / samples;
  dispatch_float(out.dtype(), "lincomb", [&](auto tag) {
    using T = decltype(tag);
    const size_t elem = sizeof(T);
    for (int i0 = 0; i0 < n_in; i0 += kLincombInputs) {
      const int i1 = std::min(n_in, i0 + kLincombInputs);
      const int chunk = i1 - i0;
      const int64_t rows_per_launch = shared ? 1 : std::max<int64_t>(1, kLincombCoeffs / chunk);
      for (int64_t s0 = 0; s0 < samples; s0 += rows_per_launch) {
        const int64_t s1 = std::min(samples, s0 + rows_per_launch);
        LincombArgs args;
        args.n_in = chunk;
        args.shared_coeffs = shared;
        args.accumulate = i0 > 0;
        args.per_sample = per_sample;
        bool vec = per_sample % kVec<T> == 0;
        T* o = out.data<T>() + s0 * per_sample;
        vec = vec && aligned16(o);
        for (int i = 0; i < chunk; ++i) {
          args.in[i] = static_cast<const char*>(inputs[i0 + i].raw()) + size_t(s0 * per_sample) * elem;
          vec = vec && aligned16(args.in[i]);
        }
        for (int64_t s = s0; s < s1; ++s)
          for (int i = 0; i < chunk; ++i) args.coeff[(s - s0) * chunk + i] = coeffs[size_t(shared ? 0 : s * n_in) + i0 + i];
        const dim3 grid(std::min<unsigned>(grid_for(vec ? per_sample / kVec<T> + 1 : per_sample), 1u << 16), unsigned(s1 - s0));
        lincomb_kernel<T><<<grid, kThreads, 0, stream_>>>(o, args, vec);
      }
    }
  });
  ATELIER_CUDA_LAUNCHED();
}

// x [R, 2H] -> out [R, H] = x[:, :H] * act(x[:, H:]); both contiguous.
void CudaBackend::glu(Tensor& out, const Tensor& x, UnaryOp act) {
  const int64_t h = out.size(-1);
  const int64_t rows = h ? out.numel() / h : 0;
  if (rows == 0 || h == 0) return;
  ATELIER_CHECK(x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype(), "glu: contiguous tensors of one dtype expected");
  NvtxRange range("glu");
  DeviceGuard guard(index_);
  const int64_t n = rows * h;
  dispatch_float(out.dtype(), "glu", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec<T>;
    if (aligned16(x.data<T>()) && aligned16(out.data<T>()) && h % V == 0 && fits_u32(2 * n)) {
      const uint32_t hv = uint32_t(h / V);
      glu_vec_kernel<T, uint32_t><<<grid_for(n / V), kThreads, 0, stream_>>>(out.data<T>(), x.data<T>(), uint32_t(rows), hv, act);
    } else if (fits_u32(2 * n))
      glu_kernel<T, uint32_t><<<grid_for(n), kThreads, 0, stream_>>>(out.data<T>(), x.data<T>(), uint32_t(rows), uint32_t(h), act);
    else
      glu_kernel<T, uint64_t><<<grid_for(n), kThreads, 0, stream_>>>(out.data<T>(), x.data<T>(), uint64_t(rows), uint64_t(h), act);
  });
  ATELIER_CUDA_LAUNCHED();
}

// Softmax over the last dim of contiguous x; out may alias x (each element is read before it is written, by
// the same thread).
void CudaBackend::softmax(Tensor& out, const Tensor& x) {
  const int64_t d = x.size(-1);
  const int64_t rows = d ? x.numel() / d : 0;
  if (rows == 0) return;
  ATELIER_CHECK(x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype(), "softmax: contiguous tensors of one dtype expected");
  ATELIER_CHECK(rows < (int64_t(1) << 31), "softmax: too many rows for one launch");
  NvtxRange range("softmax");
  DeviceGuard guard(index_);
  dispatch_float(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    softmax_kernel<T><<<unsigned(rows), softmax_threads(d), 0, stream_>>>(out.data<T>(), x.data<T>(), d);
  });
  ATELIER_CUDA_LAUNCHED();
}

}  // namespace atelier::cuda
