// adaLN modulation on the GPU (Backend::norm_modulate / norm_modulate_fp8): a row's layer or RMS norm (or
// none), then (1 + scale), shift, gate and residual, each step rounded as the unfused ops round; with FP8
// readers the output rows quantized in the same pass. Two kernels: one block per row with the row in
// registers (16-byte aligned rows of up to 1024 vectors: FLUX's 3072 and Z-Image's 3840 channels), and a
// scalar one (unaligned or odd widths).
//
// Measured on the H200 (docs/performance.md, session 12): the register kernel is instruction-bound, not
// memory-bound, on FLUX's layer-norm rows (~1 TB/s; ncu: SM throughput 71%, ~850 instructions per thread for
// its 8 elements, of which the per-row statistics and indexing are about half). A warp-per-row variant (the
// row as 12 vectors per lane, shuffles only) was no faster: 166 registers, 12.5% occupancy; nor in session 17
// with the rows as raw words (94 registers, 2.21 against 1.78 ms a FLUX FP8 step, though 30% fewer
// instructions). Session 17's kernels, specialised per operand combination (ModBits), run at ~1.8 TB/s.
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

// Which modulation operands a call of the vector kernel has, as bits of a compile-time mask: the combinations
// the models use get kernels of their own, in which absent operands cost nothing (no pointer tests, no
// predicated loads or paired ops, no product by a gamma of ones); kModRuntime tests the pointers at run time
// (every other combination). SASS of the run-time form (session 17): about a third of the FP8 FLUX
// norm_modulate's instructions per vector went to those tests and to operands that were absent.
enum ModBits : unsigned { kModGamma = 1, kModScale = 2, kModShift = 4, kModGate = 8, kModResidual = 16, kModRuntime = 32 };

template <unsigned BITS>
struct ModPresence {
  static constexpr bool kRuntime = (BITS & kModRuntime) != 0;
  // Whether the operand of `bit` (pointer p) is applied.
  static __device__ __forceinline__ bool has(unsigned bit, const void* p) {
    if constexpr (kRuntime) return p != nullptr;
    else return (BITS & bit) != 0;
  }
  // Whether the normalised values are multiplied by gamma (at run time by ones where gamma is absent: a
  // product by 1 is exact).
  static constexpr bool kMulGamma = kRuntime || (BITS & kModGamma) != 0;
};

// The mask of a call's operands.
inline unsigned mod_bits(const NormAffine& aff, const void* scale, const void* shift, const void* gate, const void* residual) {
  return (aff.gamma ? kModGamma : 0u) | (scale ? kModScale : 0u) | (shift ? kModShift : 0u) | (gate ? kModGate : 0u) |
         (residual ? kModResidual : 0u);
}

// One thread's modulation operands for one vector of a row: the per-sample vectors and the residual (zero
// where absent). They are loaded after the row's statistics: loading them with the row (before the block
// reductions) doubled the kernel's registers and measured 10-15% slower on the H200 (session 15).
// Kept as raw 16-byte words (zero where absent): held as Vec<T> (16-bit elements), the conditional loads
// compiled to ~40 byte permutes per vector, merging each half-word into a zeroed register (SASS, session 16).
struct ModVecs {
  uint4 sc, sh, gt, rs;
};

template <typename T, unsigned BITS>
__device__ __forceinline__ ModVecs load_mod_vecs(const ModulationPtrs<T>& m, int64_t vec, int64_t res) {
  using Has = ModPresence<BITS>;
  const auto word_at = [](unsigned bit, const T* p, int64_t at) {
    return Has::has(bit, p) ? *reinterpret_cast<const uint4*>(p + at) : make_uint4(0, 0, 0, 0);
  };
  return {word_at(kModScale, m.scale, vec), word_at(kModShift, m.shift, vec), word_at(kModGate, m.gate, vec),
          word_at(kModResidual, m.residual, res)};
}

// Component i (0-3, a compile-time constant once unrolled) of a 16-byte word: a pair of 16-bit values, or one f32.
__device__ __forceinline__ uint32_t word_part(const uint4& w, int i) { return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w; }
template <typename T>
__device__ __forceinline__ pair_t<T> word_pair(const uint4& w, int p) {
  const uint32_t bits = word_part(w, p);
  return *reinterpret_cast<const pair_t<T>*>(&bits);
}
__device__ __forceinline__ float word_f32(const uint4& w, int e) { return __uint_as_float(word_part(w, e)); }

// Element e (0 .. W - 1, a compile-time constant once unrolled) of a 16-byte word of T values, as f32: for bf16
// one shift or mask (its bits are the f32's high half), for f16 one conversion. The rows are held as such
// words: held as Vec<T>, each 16-bit value took a register of its own, zeroed and merged by byte permutes.
template <typename T>
__device__ __forceinline__ float word_elem_f32(const uint4& w, int e) {
  if constexpr (std::is_same_v<T, float>) {
    return word_f32(w, e);
  } else {
    const uint32_t bits = word_part(w, e / 2);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) return __uint_as_float(e % 2 == 0 ? bits << 16 : bits & 0xffff0000u);
    else return __half2float(__ushort_as_half(uint16_t(e % 2 == 0 ? bits & 0xffffu : bits >> 16)));
  }
}

template <typename P>
__device__ __forceinline__ uint32_t pair_bits(const P& v) {
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

template <typename T>
__device__ __forceinline__ Vec<T> as_vec(const uint4& w) {
  Vec<T> v;
  memcpy(&v, &w, sizeof(v));
  return v;
}

// One thread's vector of a norm_modulate row (a 16-byte word xw): the normalised x (statistics and gamma's
// values g given; g is read only where ModPresence<BITS>::kMulGamma), then the modulation (mv, applied where
// ModPresence<BITS> says), every step rounded to T as the unfused ops round. 16-bit T: the same values in pairs.
// The normalised pair is rounded by one paired conversion, and the modulation steps are paired adds and
// products (cuda_device.cuh: the same bits as each f32 step rounded to T). The per-element form ran ~5
// conversions per element and made the kernel instruction-bound.
template <typename T, NormKind KIND, unsigned BITS>
__device__ __forceinline__ uint4 modulate_word(const uint4& xw, const float (&g)[Vec<T>::kWidth], const ModulationPtrs<T>& m,
                                               const ModVecs& mv, float mean, float corr, float rstd) {
  using Has = ModPresence<BITS>;
  uint32_t out[4];
  if constexpr (sizeof(T) == 2) {
    using P = pair_t<T>;
    const P one = PairOf<T>::from_floats(1.0f, 1.0f);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float x0 = word_elem_f32<T>(xw, 2 * p), x1 = word_elem_f32<T>(xw, 2 * p + 1);
      P v;
      if constexpr (KIND == NormKind::kNone) {
        v = word_pair<T>(xw, p);
      } else {
        float a0 = KIND == NormKind::kLayer ? ((x0 - mean) - corr) * rstd : x0 * rstd;
        float a1 = KIND == NormKind::kLayer ? ((x1 - mean) - corr) * rstd : x1 * rstd;
        if constexpr (Has::kMulGamma) {
          a0 *= g[2 * p];
          a1 *= g[2 * p + 1];
        }
        v = PairOf<T>::from_floats(a0, a1);
      }
      if (Has::has(kModScale, m.scale)) v = __hmul2_rn(v, __hadd2_rn(one, word_pair<T>(mv.sc, p)));
      if (Has::has(kModShift, m.shift)) v = __hadd2_rn(v, word_pair<T>(mv.sh, p));
      if (Has::has(kModGate, m.gate)) v = __hmul2_rn(word_pair<T>(mv.gt, p), v);
      if (Has::has(kModResidual, m.residual)) v = __hadd2_rn(word_pair<T>(mv.rs, p), v);
      out[p] = pair_bits(v);
    }
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float xe = word_f32(xw, e);
      float v = KIND == NormKind::kLayer ? ((xe - mean) - corr) * rstd : KIND == NormKind::kRms ? xe * rstd : xe;
      if constexpr (KIND != NormKind::kNone && Has::kMulGamma) v *= g[e];
      if (Has::has(kModScale, m.scale)) v = v * (1.0f + word_f32(mv.sc, e));
      if (Has::has(kModShift, m.shift)) v = v + word_f32(mv.sh, e);
      if (Has::has(kModGate, m.gate)) v = word_f32(mv.gt, e) * v;
      if (Has::has(kModResidual, m.residual)) v = word_f32(mv.rs, e) + v;
      out[e] = __float_as_uint(v);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Where norm_modulate_vec_kernel also quantizes its output rows to FP8 (null: it does not): q [rows, d] e4m3,
// scale [rows] f32, as quantize_rows_fp8 makes them.
struct Fp8RowsOut {
  uint8_t* q = nullptr;
  float* scale = nullptr;
};

// The same with the row held in registers (raw 16-byte words): VPT vectors of x per thread (vector c of the row
// in thread c % blockDim, d / width / VPT threads rounded up to whole warps), read once from memory; the
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
template <typename T, NormKind KIND, int VPT, unsigned BITS>
__global__ void norm_modulate_vec_kernel(T* y, const T* x, NormAffine aff, ModulationPtrs<T> m, int64_t t, int64_t d, float eps,
                                         Fp8RowsOut f8) {
  constexpr int W = Vec<T>::kWidth;
  __shared__ float scratch[64];  // block_sum2's two halves
  // 32-bit division (rows < 2^31): the 64-bit one is a long software sequence run by every thread.
  const int64_t row = blockIdx.x, sample = uint32_t(blockIdx.x) / uint32_t(t);
  const int nvec = int(d / W);
  const auto col = [&](int i) { return int(threadIdx.x) + i * int(blockDim.x); };  // this thread's vector i
  uint4 xw[VPT];  // the row's vectors as raw words (zero past its end)
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    xw[i] = col(i) < nvec ? *reinterpret_cast<const uint4*>(x + row * d + int64_t(col(i)) * W) : make_uint4(0, 0, 0, 0);
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
      for (int e = 0; e < W; ++e) s += word_elem_f32<T>(xw[i], e);
    mean = block_sum(s, scratch) / float(d);
    float dev = 0.0f, sq = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      if (col(i) >= nvec) continue;
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const float v = word_elem_f32<T>(xw[i], e) - mean;
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
      for (int e = 0; e < W; ++e) {
        const float v = word_elem_f32<T>(xw[i], e);
        q += v * v;
      }
    rstd = 1.0f / sqrtf(block_sum(q, scratch) / float(d) + eps);
  }
  if (col(0) >= nvec && !f8.q) return;  // after the last block reduction (they synchronise the whole block)
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (col(i) >= nvec) continue;
    const int64_t j0 = int64_t(col(i)) * W;
    float g[W];
    if constexpr (ModPresence<BITS>::kMulGamma) load_param_run<T>(g, aff.gamma, aff.gamma_dtype, j0, 1.0f);
    xw[i] = modulate_word<T, KIND, BITS>(xw[i], g, m, load_mod_vecs<T, BITS>(m, sample * d + j0, row * d + j0), mean, corr, rstd);
    if (y) *reinterpret_cast<uint4*>(y + row * d + j0) = xw[i];  // now the output
    if (f8.q) amax = vec_abs_max(amax, as_vec<T>(xw[i]));
  }
  if (!f8.q) return;
  const RowDivider div = fp8_row_divider(block_max(amax, scratch));  // every thread takes part in the reduction
  if (threadIdx.x == 0) f8.scale[row] = div.s;
#pragma unroll
  for (int i = 0; i < VPT; ++i)
    if (col(i) < nvec) store_e4m3(f8.q + row * d + int64_t(col(i)) * W, as_vec<T>(xw[i]), div);
}

// Vectors per thread of norm_modulate_vec_kernel: kModVecsPerThread for rows of at least kModWideRowVecs
// vectors (FLUX's 384, Z-Image's 480), one below (fewer threads would leave short rows' blocks nearly empty).
constexpr int kModVecsPerThread = 4;
constexpr int64_t kModWideRowVecs = 128;

// Calls fn(std::integral_constant<unsigned, BITS>{}) with the ModBits of the vector kernel for a call of kind
// K whose operands are `bits` (mod_bits): the combinations the models use (FLUX: layer norm + scale + shift,
// and the gated residual; Z-Image: RMS norm with gamma + scale, + gate + residual, + residual; the final layer
// norm + scale) have kernels of their own in 16 bits; the rest, and f32, the run-time form.
template <typename T, NormKind K, typename Fn>
void dispatch_mod_bits(unsigned bits, Fn&& fn) {
  using std::integral_constant;
  if constexpr (sizeof(T) == 2) {
    if constexpr (K == NormKind::kLayer) {
      if (bits == (kModScale | kModShift)) return fn(integral_constant<unsigned, kModScale | kModShift>{});
      if (bits == kModScale) return fn(integral_constant<unsigned, kModScale>{});
    } else if constexpr (K == NormKind::kRms) {
      if (bits == (kModGamma | kModScale)) return fn(integral_constant<unsigned, kModGamma | kModScale>{});
      if (bits == (kModGamma | kModGate | kModResidual)) return fn(integral_constant<unsigned, kModGamma | kModGate | kModResidual>{});
      if (bits == (kModGamma | kModResidual)) return fn(integral_constant<unsigned, kModGamma | kModResidual>{});
    } else {
      if (bits == (kModGate | kModResidual)) return fn(integral_constant<unsigned, kModGate | kModResidual>{});
    }
  }
  fn(integral_constant<unsigned, kModRuntime>{});
}

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
// specialized false: the vector kernel's run-time form whatever the operands (CudaBackend::set_specialized_norm_modulate).
bool launch_norm_modulate(cudaStream_t stream, int device, Tensor& out, const Tensor& x, NormKind kind, float eps,
                          const Tensor& gamma, const NormModulation& m, const Fp8RowsOut& f8, bool specialized,
                          bool out_needed = true) {
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
          const unsigned have = specialized ? mod_bits(aff, p.scale, p.shift, p.gate, p.residual) : kModRuntime;
          dispatch_mod_bits<T, K>(have, [&](auto bits) {
            constexpr unsigned kBits = decltype(bits)::value;
            norm_modulate_vec_kernel<T, K, kVpt, kBits><<<unsigned(rows), threads, 0, stream>>>(y, x.data<T>(), aff, p, t, d, eps, f8);
          });
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
  launch_norm_modulate(stream_, index_, out, x, kind, eps, gamma, m, Fp8RowsOut{}, specialized_norm_modulate_);
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
                            Fp8RowsOut{static_cast<uint8_t*>(q.raw()), scale.data<float>()}, specialized_norm_modulate_, out_needed))
    Backend::norm_modulate_fp8(out, q, scale, x, kind, eps, gamma, m, out_needed);
}

}  // namespace atelier::cuda
