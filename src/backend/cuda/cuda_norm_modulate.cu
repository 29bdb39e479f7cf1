// adaLN modulation on the GPU (Backend::norm_modulate / norm_modulate_fp8): a row's layer or RMS norm (or
// none), then (1 + scale), shift, gate and residual, each step rounded as the unfused ops round; with FP8
// readers the output rows quantized in the same pass. Two kernels: one block per row with the row in
// registers (16-byte aligned rows of up to 1024 vectors: FLUX's 3072 and Z-Image's 3840 channels), and a
// scalar one (unaligned or odd widths).
//
// Measured on the H200 (docs/performance.md, session 12): the register kernel is instruction-bound, not
// memory-bound, on FLUX's layer-norm rows (~1 TB/s; ncu: SM throughput 71%, ~850 instructions per thread for
// its 8 elements, of which the per-row statistics and indexing are about half). A warp-per-row variant (the
// row as 12 vectors per lane, shuffles only) was no faster: 166 registers, 12.5% occupancy.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_norm_common.cuh"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {
namespace {

// The per-sample vectors and residual of norm_modulate, as raw pointers (null: not applied).
template <typename T>
struct ModulationPtrs {
  const T *scale = nullptr, *shift = nullptr, *gate = nullptr, *residual = nullptr;
};

// A layer norm's correction and 1 / std from this thread's sums of deviations from the mean and of their
// squares (reduced over the block here; scratch: 64 floats): the refined mean is mean + corr, the variance
// sq / d - corr^2 (cuda_norm.cu's header says why).
__device__ __forceinline__ void layer_norm_finish(float dev, float sq, int64_t d, float eps, float* scratch, float& corr, float& rstd) {
  block_sum2(dev, sq, scratch);
  corr = dev / float(d);
  rstd = 1.0f / sqrtf(fmaxf(sq / float(d) - corr * corr, 0.0f) + eps);
}

// One block per row of d elements (row r of sample r / t): the row statistics of layer_norm_kernel or
// rms_norm_kernel (the same formulas and block reductions), then the modulation with
// a rounding after every step, as the unfused ops round.
template <typename T, NormKind KIND>
__global__ void norm_modulate_kernel(T* y, const T* x, NormAffine aff, ModulationPtrs<T> m, int64_t t, int64_t d, float eps) {
  __shared__ float scratch[64];  // block_sum2's two halves
  const int64_t row = blockIdx.x, sample = row / t;
  const T* xr = x + row * d;
  T* yr = y + row * d;
  float mean = 0.0f, corr = 0.0f, rstd = 1.0f;
  if constexpr (KIND == NormKind::kLayer) {
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += to_f32(xr[j]);
    mean = block_sum(s, scratch) / float(d);
    float dev = 0.0f, sq = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float v = to_f32(xr[j]) - mean;
      dev += v;
      sq += v * v;
    }
    layer_norm_finish(dev, sq, d, eps, scratch, corr, rstd);
  } else if constexpr (KIND == NormKind::kRms) {
    float q = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float v = to_f32(xr[j]);
      q += v * v;
    }
    rstd = 1.0f / sqrtf(block_sum(q, scratch) / float(d) + eps);
  }
  const auto r = [](float v) { return to_f32(from_f32<T>(v)); };
  const int64_t vec = sample * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = aff.gamma ? load_any(aff.gamma, aff.gamma_dtype, j) : 1.0f;
    float v;
    if constexpr (KIND == NormKind::kLayer) v = r(((to_f32(xr[j]) - mean) - corr) * rstd * g);
    else if constexpr (KIND == NormKind::kRms) v = r(to_f32(xr[j]) * rstd * g);
    else v = to_f32(xr[j]);
    if (m.scale) v = r(v * r(1.0f + to_f32(m.scale[vec + j])));
    if (m.shift) v = r(v + to_f32(m.shift[vec + j]));
    if (m.gate) v = r(to_f32(m.gate[vec + j]) * v);
    if (m.residual) v = to_f32(m.residual[row * d + j]) + v;
    yr[j] = from_f32<T>(v);
  }
}

// One thread's modulation operands for one vector of a row: the per-sample vectors and the residual (zero
// where absent). They are loaded after the row's statistics: loading them with the row (before the block
// reductions) doubled the kernel's registers and measured 10-15% slower on the H200 (session 15).
// Kept as raw 16-byte words (zero where absent): held as Vec<T> (16-bit elements), the conditional loads
// compiled to ~40 byte permutes per vector, merging each half-word into a zeroed register (SASS, session 16).
struct ModVecs {
  uint4 sc, sh, gt, rs;
};

template <typename T>
__device__ __forceinline__ ModVecs load_mod_vecs(const ModulationPtrs<T>& m, int64_t vec, int64_t res) {
  const auto word_at = [](const T* p, int64_t at) { return p ? *reinterpret_cast<const uint4*>(p + at) : make_uint4(0, 0, 0, 0); };
  return {word_at(m.scale, vec), word_at(m.shift, vec), word_at(m.gate, vec), word_at(m.residual, res)};
}

// Component i (0-3, a compile-time constant once unrolled) of a 16-byte word: a pair of 16-bit values, or one f32.
__device__ __forceinline__ uint32_t word_part(const uint4& w, int i) { return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w; }
template <typename T>
__device__ __forceinline__ pair_t<T> word_pair(const uint4& w, int p) {
  const uint32_t bits = word_part(w, p);
  return *reinterpret_cast<const pair_t<T>*>(&bits);
}
__device__ __forceinline__ float word_f32(const uint4& w, int e) { return __uint_as_float(word_part(w, e)); }

// One thread's vector of a norm_modulate row: the normalised x (statistics and gamma's values g given), then
// the modulation (mv, present where m's pointers are), every step rounded to T as the unfused ops round.
// 16-bit T: the same values in pairs. The normalised pair is rounded by one paired conversion, and the
// modulation steps are paired adds and products (cuda_device.cuh: the same bits as each f32 step rounded to T).
// The per-element form ran ~5 conversions per element and made the kernel instruction-bound.
template <typename T, NormKind KIND>
__device__ __forceinline__ Vec<T> modulate_vec_paired(const Vec<T>& xv, const float (&g)[Vec<T>::kWidth], const ModulationPtrs<T>& m,
                                                      const ModVecs& mv, float mean, float corr, float rstd) {
  using P = pair_t<T>;
  constexpr int kPairs = Vec<T>::kWidth / 2;
  Vec<T> out;
  const P one = PairOf<T>::from_floats(1.0f, 1.0f);
#pragma unroll
  for (int p = 0; p < kPairs; ++p) {
    const float x0 = to_f32(xv.v[2 * p]), x1 = to_f32(xv.v[2 * p + 1]);
    P v;
    if constexpr (KIND == NormKind::kLayer)
      v = PairOf<T>::from_floats(((x0 - mean) - corr) * rstd * g[2 * p], ((x1 - mean) - corr) * rstd * g[2 * p + 1]);
    else if constexpr (KIND == NormKind::kRms) v = PairOf<T>::from_floats(x0 * rstd * g[2 * p], x1 * rstd * g[2 * p + 1]);
    else v = pair_at(xv.v, p);
    if (m.scale) v = __hmul2_rn(v, __hadd2_rn(one, word_pair<T>(mv.sc, p)));
    if (m.shift) v = __hadd2_rn(v, word_pair<T>(mv.sh, p));
    if (m.gate) v = __hmul2_rn(word_pair<T>(mv.gt, p), v);
    if (m.residual) v = __hadd2_rn(word_pair<T>(mv.rs, p), v);
    pair_at(out.v, p) = v;
  }
  return out;
}

template <typename T, NormKind KIND>
__device__ __forceinline__ Vec<T> modulate_vec(const Vec<T>& xv, const float (&g)[Vec<T>::kWidth], const ModulationPtrs<T>& m,
                                               const ModVecs& mv, float mean, float corr, float rstd) {
  if constexpr (sizeof(T) == 2) {
    return modulate_vec_paired<T, KIND>(xv, g, m, mv, mean, corr, rstd);
  } else {
    constexpr int W = Vec<T>::kWidth;
    const auto r = [](float v) { return to_f32(from_f32<T>(v)); };
    Vec<T> out;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      float v;
      if constexpr (KIND == NormKind::kLayer) v = r(((to_f32(xv.v[e]) - mean) - corr) * rstd * g[e]);
      else if constexpr (KIND == NormKind::kRms) v = r(to_f32(xv.v[e]) * rstd * g[e]);
      else v = to_f32(xv.v[e]);
      if (m.scale) v = r(v * r(1.0f + word_f32(mv.sc, e)));
      if (m.shift) v = r(v + word_f32(mv.sh, e));
      if (m.gate) v = r(word_f32(mv.gt, e) * v);
      if (m.residual) v = word_f32(mv.rs, e) + v;
      out.v[e] = from_f32<T>(v);
    }
    return out;
  }
}

// Where norm_modulate_vec_kernel also quantizes its output rows to FP8 (null: it does not): q [rows, d] e4m3,
// scale [rows] f32, as quantize_rows_fp8 makes them.
struct Fp8RowsOut {
  uint8_t* q = nullptr;
  float* scale = nullptr;
};

// The same with the row held in registers: VPT 16-byte vectors of x per thread (vector c of the row in
// thread c % blockDim, d / width / VPT threads rounded up to whole warps), read once from memory; the
// modulation vectors and the residual are read as vectors too. Taken when d is a multiple of the vector
// width, the row fits (at most 1024 threads) and every buffer is 16-byte aligned (FLUX's 3072 and Z-Image's
// 3840 channels). The scalar kernel reads each row three times, element by element. With f8.q set, the
// rounded output row, still in registers, is quantized too (norm_modulate_fp8): its amax, the row scale and
// the e4m3 bytes of quantize_rows_fp8 (cuda_fp8.cu: RowDivider, paired conversions), without reading the row
// again; y null (FP8 readers only) leaves the 16-bit rows unwritten.
//
// Why several vectors per thread: the kernel is instruction-bound, not memory-bound, and about half of a
// one-vector thread's instructions were per row (block reductions, the statistics' divisions, indexing):
// ~850 per thread for 8 elements (ncu, FLUX's [4096, 3072] layer-norm rows at ~1 TB/s). Four vectors per
// thread run those once per 32 elements.
template <typename T, NormKind KIND, int VPT>
__global__ void norm_modulate_vec_kernel(T* y, const T* x, NormAffine aff, ModulationPtrs<T> m, int64_t t, int64_t d, float eps,
                                         Fp8RowsOut f8) {
  constexpr int W = Vec<T>::kWidth;
  __shared__ float scratch[64];  // block_sum2's two halves
  // 32-bit division (rows < 2^31): the 64-bit one is a long software sequence run by every thread.
  const int64_t row = blockIdx.x, sample = uint32_t(blockIdx.x) / uint32_t(t);
  const int nvec = int(d / W);
  const auto col = [&](int i) { return int(threadIdx.x) + i * int(blockDim.x); };  // this thread's vector i
  Vec<T> xv[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) xv[i] = col(i) < nvec ? *reinterpret_cast<const Vec<T>*>(x + row * d + int64_t(col(i)) * W) : Vec<T>{};
  float mean = 0.0f, corr = 0.0f, rstd = 1.0f;
  if constexpr (KIND == NormKind::kLayer) {
    // (Tried in session 15: the statistics with one barrier, each warp's mean and squared deviations combined
    // across warps (Chan et al.). Slower on the H200 (33 against 30 us for FLUX's rows) and, with the mean a
    // single f32, off by ~3e-5 on rows of mean 1000: the correction term below carries what the f32 mean
    // cannot hold.)
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
#pragma unroll
      for (int e = 0; e < W; ++e) s += to_f32(xv[i].v[e]);
    mean = block_sum(s, scratch) / float(d);
    float dev = 0.0f, sq = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (col(i) >= nvec) continue;
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const float v = to_f32(xv[i].v[e]) - mean;
        dev += v;
        sq += v * v;
      }
    }
    layer_norm_finish(dev, sq, d, eps, scratch, corr, rstd);
  } else if constexpr (KIND == NormKind::kRms) {
    float q = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
#pragma unroll
      for (int e = 0; e < W; ++e) q += to_f32(xv[i].v[e]) * to_f32(xv[i].v[e]);
    rstd = 1.0f / sqrtf(block_sum(q, scratch) / float(d) + eps);
  }
  if (col(0) >= nvec && !f8.q) return;  // after the last block reduction (they synchronise the whole block)
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (col(i) >= nvec) continue;
    const int64_t j0 = int64_t(col(i)) * W;
    float g[W];
    load_param_run<T>(g, aff.gamma, aff.gamma_dtype, j0, 1.0f);
    xv[i] = modulate_vec<T, KIND>(xv[i], g, m, load_mod_vecs(m, sample * d + j0, row * d + j0), mean, corr, rstd);  // now the output
    if (y) *reinterpret_cast<Vec<T>*>(y + row * d + j0) = xv[i];
    if (f8.q) amax = vec_abs_max(amax, xv[i]);
  }
  if (!f8.q) return;
  const float qs = fp8_row_scale(block_max(amax, scratch));  // every thread takes part in the reduction
  if (threadIdx.x == 0) f8.scale[row] = qs;
  const RowDivider div = row_divider(qs);
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    if (col(i) < nvec) store_e4m3(f8.q + row * d + int64_t(col(i)) * W, xv[i], div);
}

// Vectors per thread of norm_modulate_vec_kernel: kModVecsPerThread for rows of at least kModWideRowVecs
// vectors (FLUX's 384, Z-Image's 480), one below (fewer threads would leave short rows' blocks nearly empty).
constexpr int kModVecsPerThread = 4;
constexpr int64_t kModWideRowVecs = 128;

// Calls fn(std::integral_constant<NormKind, K>{}) for the runtime `kind`: the kernels take it as a template
// argument so that each kind's unused statistics are compiled out.
template <typename Fn>
void dispatch_norm_kind(NormKind kind, Fn&& fn) {
  switch (kind) {
    case NormKind::kLayer: fn(std::integral_constant<NormKind, NormKind::kLayer>{}); return;
    case NormKind::kRms: fn(std::integral_constant<NormKind, NormKind::kRms>{}); return;
    case NormKind::kNone: fn(std::integral_constant<NormKind, NormKind::kNone>{}); return;
  }
}

// x, out [B, T, D] contiguous; gamma [D]; m.scale/shift/gate [B, D]; m.residual [B, T, D] (Backend::norm_modulate).
// With f8.q set, only the vector kernel runs (it quantizes the rows too); returns false, launching nothing,
// where it cannot take the call.
bool launch_norm_modulate(cudaStream_t stream, int device, Tensor& out, const Tensor& x, NormKind kind, float eps,
                          const Tensor& gamma, const NormModulation& m, const Fp8RowsOut& f8, bool out_needed = true) {
  const int64_t t = x.size(1), d = x.size(2), rows = x.size(0) * t;
  if (rows == 0 || d == 0) return true;
  ATELIER_CHECK(x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype(), "norm_modulate: contiguous tensors of one dtype expected");
  ATELIER_CHECK(rows < (int64_t(1) << 31), "norm_modulate: too many rows");
  NvtxRange range(f8.q ? "norm_modulate_fp8" : "norm_modulate");
  DeviceGuard guard(device);
  bool launched = false;
  dispatch_float(x.dtype(), "norm_modulate", [&](auto tag) {
    using T = decltype(tag);
    ModulationPtrs<T> p;
    if (m.scale.defined()) p.scale = m.scale.data<T>();
    if (m.shift.defined()) p.shift = m.shift.data<T>();
    if (m.gate.defined()) p.gate = m.gate.data<T>();
    if (m.residual.defined()) p.residual = m.residual.data<T>();
    const NormAffine aff = affine_of(gamma, Tensor());
    constexpr int W = Vec<T>::kWidth;
    const auto al = [](const void* q) { return q == nullptr || reinterpret_cast<uintptr_t>(q) % kVecBytes == 0; };
    const bool vec = d % W == 0 && d / W <= 1024 && al(x.raw()) && al(out.raw()) && al(p.scale) && al(p.shift) && al(p.gate) &&
                     al(p.residual) && reinterpret_cast<uintptr_t>(f8.q) % W == 0;
    if (!vec && f8.q) return;
    launched = true;
    dispatch_norm_kind(kind, [&](auto k) {
      constexpr NormKind K = decltype(k)::value;
      if (vec) {
        const int64_t nvec = d / W;
        const auto launch = [&](auto vpt) {
          constexpr int kVpt = decltype(vpt)::value;
          const int threads = int((nvec + kVpt - 1) / kVpt + 31) / 32 * 32;
          T* y = out_needed || !f8.q ? out.data<T>() : nullptr;
          norm_modulate_vec_kernel<T, K, kVpt><<<unsigned(rows), threads, 0, stream>>>(y, x.data<T>(), aff, p, t, d, eps, f8);
        };
        if (nvec >= kModWideRowVecs) launch(std::integral_constant<int, kModVecsPerThread>{});
        else launch(std::integral_constant<int, 1>{});
      } else {
        norm_modulate_kernel<T, K><<<unsigned(rows), row_threads(d), 0, stream>>>(out.data<T>(), x.data<T>(), aff, p, t, d, eps);
      }
    });
  });
  ATELIER_CUDA_LAUNCHED();
  return launched;
}

}  // namespace

void CudaBackend::norm_modulate(Tensor& out, const Tensor& x, NormKind kind, float eps, const Tensor& gamma,
                                const NormModulation& m) {
  launch_norm_modulate(stream_, index_, out, x, kind, eps, gamma, m, Fp8RowsOut{});
}

// The output rows quantized in the same pass where a vector kernel takes the call (rows in registers);
// elsewhere the two passes of Backend's default.
// out_needed false: the 16-bit rows are not written (the vector kernel only).
void CudaBackend::norm_modulate_fp8(Tensor& out, Tensor& q, Tensor& scale, const Tensor& x, NormKind kind, float eps,
                                    const Tensor& gamma, const NormModulation& m, bool out_needed) {
  ATELIER_CHECK(q.is_contiguous() && scale.is_contiguous() && q.numel() == x.numel() && scale.numel() * x.size(2) == x.numel(),
                "norm_modulate_fp8: q [rows, D] and scale [rows] contiguous expected");
  if (!fused_fp8_norm_modulate_ ||
      !launch_norm_modulate(stream_, index_, out, x, kind, eps, gamma, m,
                            Fp8RowsOut{static_cast<uint8_t*>(q.raw()), scale.data<float>()}, out_needed))
    Backend::norm_modulate_fp8(out, q, scale, x, kind, eps, gamma, m, out_needed);
}

}  // namespace atelier::cuda
