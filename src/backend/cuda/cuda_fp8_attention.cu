// FP8 attention on the GPU (Backend::attention_fp8): q, k and v quantized per tensor (one amax pass over the
// three, one quantizing pass that also writes the scalars cuDNN reads), cuDNN's fused FP8 flash attention
// (cuda_sdpa_fp8.h), and its e4m3 output dequantized into `out`. Everything stays on the stream (no host
// value), so a DiT step with FP8 attention replays as a CUDA graph.
//
// Budget at FLUX 1024² (q/k/v [1, 24, 4608, 128] bf16, 28 MB each): the two passes read 170 MB and write
// 42 MB (114 MB read when the model bounds q and k: Fp8Bounds, after their RMS norms), the output pass reads
// 14 MB and writes 28 MB: ~0.05-0.07 ms at 3.5 TB/s, against the ~0.2 ms FP8 saves in the products (0.46 ms
// per attention in bf16).
#include <cuda_fp8.h>

#include <algorithm>
#include <array>
#include <cstdio>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_conv.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_norm_common.cuh"
#include "backend/cuda/cuda_nvtx.h"
#include "backend/cuda/cuda_sdpa_fp8.h"
#include "backend/cuda/cudnn_graph_api.h"

namespace atelier::cuda {
namespace {

using S = Fp8AttentionScalars;
constexpr int kOperands = 3;          // q, k, v
constexpr int kPassThreads = 256;
constexpr int kMaxPassBlocks = 1024;  // per operand: grid-stride beyond that (~8 blocks per SM on 132 SMs)
// O8 = e4m3(O * scale_o) with scale_o = kOutputHeadroom / s_v: |O| <= amax(v) = 448 s_v up to P's e4m3
// rounding (the probabilities of a row may sum to a little over 1), so half the range is kept free.
constexpr float kOutputHeadroom = 0.5f;

// One [B, H, S, D] 16-bit operand: strides in elements (unit last stride), its rows as 16-byte vectors.
struct Operand {
  const void* x = nullptr;
  uint8_t* q = nullptr;  // [B, H, S, D] contiguous e4m3
  uint32_t heads = 0, seq = 0;
  int64_t sb = 0, sh = 0, ss = 0;
  uint32_t units = 0;  // 16-byte vectors in the tensor (B * H * S * D / 8)
  float bound = 0.0f;  // > 0: |x| <= bound is known (Fp8Bounds): no amax pass, the scale is f8e4m3_scale(bound)
  FastDivU32 div_hs{}, div_seq{};  // by heads * seq and by seq
};
struct Operands {
  Operand op[kOperands];
  uint32_t vecs_per_row = 0;  // D / 8
  FastDivU32 div_row{};       // by vecs_per_row
};

// Element offset of vector u of operand o (32-bit index arithmetic with host-made divisors: the tensors have
// < 2^31 vectors, fp8_attention_takes; three runtime divisions per vector made the passes instruction-bound
// at ~2.4 TB/s, ncu in session 16).
__device__ __forceinline__ int64_t vector_offset(const Operand& o, uint32_t u, const Operands& ops) {
  const uint32_t row = ops.div_row.div(u), c = u - row * ops.vecs_per_row;
  const uint32_t b = o.div_hs.div(row), rem = row - b * (o.heads * o.seq), h = o.div_seq.div(rem), s = rem - h * o.seq;
  return int64_t(b) * o.sb + int64_t(h) * o.sh + int64_t(s) * o.ss + int64_t(c) * 8;
}

// amax[o] = max |x| over operand o = blockIdx.y; amax starts at zero (its float bits ordered as unsigned).
template <typename T>
__global__ void __launch_bounds__(kPassThreads) fp8_amax_kernel(Operands ops, float* scalars) {
  const Operand& o = ops.op[blockIdx.y];
  if (o.bound > 0.0f) return;  // its scale is known
  float amax = 0.0f;
  for (uint32_t u = blockIdx.x * blockDim.x + threadIdx.x; u < o.units; u += gridDim.x * blockDim.x) {
    const Vec<T> v = *reinterpret_cast<const Vec<T>*>(static_cast<const T*>(o.x) + vector_offset(o, u, ops));
    amax = vec_abs_max(amax, v);
  }
  __shared__ float scratch[32];
  amax = block_max(amax, scratch);  // one atomic per block: ~1000 per operand instead of one per warp
  if (threadIdx.x == 0 && amax > 0.0f)
    atomicMax(reinterpret_cast<unsigned*>(S::at(scalars, S::Slot(S::kAmaxQ + blockIdx.y))), __float_as_uint(amax));
}

// q[o] = e4m3(x / s) with s = f8e4m3_scale(amax) as quantize_rows_fp8 takes it per row (RowDivider: the IEEE quotient),
// written contiguously; the first thread also writes the scalars cuDNN's graph reads.
template <typename T>
__global__ void __launch_bounds__(kPassThreads) fp8_quantize_kernel(Operands ops, float* scalars) {
  const Operand& o = ops.op[blockIdx.y];
  const RowDivider div = fp8_row_divider(o.bound > 0.0f ? o.bound : *S::at(scalars, S::Slot(S::kAmaxQ + blockIdx.y)));
  const float s = div.s;
  for (uint32_t u = blockIdx.x * blockDim.x + threadIdx.x; u < o.units; u += gridDim.x * blockDim.x) {
    const Vec<T> v = *reinterpret_cast<const Vec<T>*>(static_cast<const T*>(o.x) + vector_offset(o, u, ops));
    store_e4m3(o.q + int64_t(u) * Vec<T>::kWidth, v, div);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *S::at(scalars, S::Slot(S::kDescaleQ + blockIdx.y)) = s;
    if (blockIdx.y == 2) {  // v: the output's scale follows from it
      *S::at(scalars, S::kDescaleS) = 1.0f / kF8E4M3Max;
      *S::at(scalars, S::kScaleS) = kF8E4M3Max;
      *S::at(scalars, S::kScaleO) = kOutputHeadroom / s;
      *S::at(scalars, S::kDescaleO) = s / kOutputHeadroom;
    }
  }
}

// out[i] = o8[i] * descale_o over n elements of one dense layout (n a multiple of 8); row_scale (optional,
// `rows` entries) filled with descale_o: the e4m3 output's rows as an FP8 GEMM reads them.
template <typename T>
__global__ void fp8_dequantize_kernel(T* out, const uint8_t* o8, int64_t vectors, const float* scalars, float* row_scale,
                                      int64_t rows) {
  const float d = *S::at(scalars, S::kDescaleO);
  for (int64_t i = global_thread(); i < rows; i += grid_threads()) row_scale[i] = d;
  for (int64_t i = global_thread(); i < vectors; i += grid_threads()) {
    const uint2 raw = reinterpret_cast<const uint2*>(o8)[i];
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
    Vec<T> v;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const __nv_fp8_e4m3 f = *reinterpret_cast<const __nv_fp8_e4m3*>(b + e);
      v.v[e] = from_f32<T>(float(f) * d);
    }
    reinterpret_cast<Vec<T>*>(out)[i] = v;
  }
}

// Whether `t` is one dense layout: a permutation of a packed one (contiguous, or heads merged).
bool dense(const Tensor& t) {
  int64_t expect = 1;
  std::array<int, 4> order{0, 1, 2, 3};
  std::sort(order.begin(), order.end(), [&](int a, int b) { return t.strides()[a] < t.strides()[b]; });
  for (int i : order) {
    if (t.size(i) != 1 && t.strides()[i] != expect) return false;
    expect *= t.size(i);
  }
  return true;
}

Operand operand_of(const Tensor& x, Tensor& q8, float bound) {
  Operand o;
  o.bound = bound;
  o.x = x.raw();
  o.q = static_cast<uint8_t*>(q8.raw());
  o.heads = uint32_t(x.size(1));
  o.seq = uint32_t(x.size(2));
  o.sb = x.strides()[0];
  o.sh = x.strides()[1];
  o.ss = x.strides()[2];
  o.units = uint32_t(x.numel() / 8);
  o.div_hs = FastDivU32::of(std::max<uint32_t>(o.heads * o.seq, 1));
  o.div_seq = FastDivU32::of(std::max<uint32_t>(o.seq, 1));
  return o;
}

}  // namespace

bool CudaBackend::fp8_attention_takes(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, std::string* why) {
  const auto no = [&](const char* reason) {
    if (why) *why = reason;
    return false;
  };
  if (!fp8_attention_) return no("FP8 attention is off (CudaBackend::set_fp8_attention, ATELIER_FP8_ATTENTION=1)");
  if (cc_major_ < 9) return no("FP8 attention needs Hopper (sm_90) or newer");
  const DType dt = q.dtype();
  if ((dt != DType::BF16 && dt != DType::F16) || k.dtype() != dt || v.dtype() != dt || out.dtype() != dt)
    return no("FP8 attention takes bf16/f16 q, k, v and output of one dtype");
  const int64_t d = q.size(3);
  if (k.size(1) != q.size(1) || k.size(3) != d || v.size(3) != d || d % 16 != 0 || d > 256)
    return no("FP8 attention takes equal q/k/v heads and head dims, a multiple of 16 up to 256");
  for (const Tensor* t : {&out, &q, &k, &v}) {
    if (t->strides()[3] != 1 || !aligned16(t->raw())) return no("FP8 attention needs unit last strides, 16-byte aligned");
    for (int i = 0; i < 3; ++i)
      if (t->strides()[i] % 8 != 0) return no("FP8 attention needs rows of whole 16-byte vectors");
    if (t->numel() / 8 >= (int64_t(1) << 31)) return no("FP8 attention operands over 2^31 vectors");
  }
  if (!dense(out)) return no("FP8 attention writes a dense output (contiguous or heads merged)");
  std::string reason;
  if (!cudnn_sdpa_fp8(&reason)) {
    if (why) *why = reason;
    return false;
  }
  if (sdpa_fp8_->declined_before(q, k)) return no("cuDNN declined this shape before");
  return true;
}

// q [B, H, Sq, D], k/v [B, H, Sk, D] 16-bit (unit last stride), out [B, H, Sq, D] dense (contiguous or heads
// merged). cuDNN's FP8 attention where it takes the case, else attention() on q, k, v. q and k with a bound
// (Fp8Bounds) skip the amax pass.
void CudaBackend::attention_fp8(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                const Fp8Bounds& bounds) {
  run_fp8_attention(out, q, k, v, scale, bounds, nullptr, nullptr);
}

// The same with rows8 [B*Sq, H*D] e4m3 and row_scale [B*Sq]: out must be heads-merged ([B, Sq, H, D] memory).
namespace {
// Whether cuDNN's e4m3 output can be handed over as rows8 [B*Sq, H*D] / row_scale [B*Sq]: out [B, H, Sq, D]
// heads-merged ([B, Sq, H, D] memory, the rows' layout) and the row buffers of that size.
bool fp8_rows_fit(const Tensor& out, const Tensor& rows8, const Tensor& row_scale) {
  const int64_t b = out.size(0), h = out.size(1), sq = out.size(2), d = out.size(3);
  const bool merged = out.strides()[0] == sq * h * d && out.strides()[1] == d && out.strides()[2] == h * d && out.strides()[3] == 1;
  return merged && rows8.is_contiguous() && rows8.numel() == b * sq * h * d && row_scale.numel() == b * sq;
}
}  // namespace

bool CudaBackend::attention_fp8_rows(Tensor& out, Tensor& rows8, Tensor& row_scale, const Tensor& q, const Tensor& k,
                                     const Tensor& v, float scale, const Fp8Bounds& bounds, bool write_out) {
  const bool fits = fp8_rows_fit(out, rows8, row_scale);
  return run_fp8_attention(out, q, k, v, scale, bounds, fits ? &rows8 : nullptr, fits ? &row_scale : nullptr, write_out || !fits) &&
         fits;
}

bool CudaBackend::run_fp8_attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                                    const Fp8Bounds& bounds, Tensor* rows8, Tensor* row_scale, bool write_out,
                                    const Tensor* q8_given, const Tensor* k8_given, const std::function<void()>& fallback16) {
  if (out.numel() == 0) return false;
  DeviceGuard guard(index_);
  const auto attention16 = [&] {
    if (fallback16) fallback16();
    else attention(out, q, k, v, Tensor(), scale);
  };
  if (!fp8_attention_takes(out, q, k, v, nullptr)) {
    attention16();
    return false;
  }
  NvtxRange range("attention_fp8");
  Tensor scalars = Tensor::empty({int64_t(S::bytes() / sizeof(float))}, DType::F32, device());
  ATELIER_CUDA_OK(cudaMemsetAsync(scalars.raw(), 0, S::bytes(), stream_));
  Tensor q8 = q8_given ? *q8_given : Tensor::empty(q.shape(), DType::F8E4M3, device());
  Tensor k8 = k8_given ? *k8_given : Tensor::empty(k.shape(), DType::F8E4M3, device());
  Tensor v8 = Tensor::empty(v.shape(), DType::F8E4M3, device());
  Operands ops;
  ops.op[0] = operand_of(q, q8, bounds.q);
  ops.op[1] = operand_of(k, k8, bounds.k);
  ops.op[2] = operand_of(v, v8, 0.0f);
  // Operands made already: no vectors to quantize (the pass still writes their descales from the bounds).
  if (q8_given) ops.op[0].units = 0;
  if (k8_given) ops.op[1].units = 0;
  ops.vecs_per_row = uint32_t(q.size(3) / 8);
  ops.div_row = FastDivU32::of(ops.vecs_per_row);
  uint32_t most = 0;
  for (const Operand& o : ops.op) most = std::max(most, o.units);
  const dim3 grid(std::min<unsigned>(grid_for(most, kPassThreads), kMaxPassBlocks), kOperands);
  float* sc = scalars.data<float>();
  if (q.dtype() == DType::BF16) {
    fp8_amax_kernel<__nv_bfloat16><<<grid, kPassThreads, 0, stream_>>>(ops, sc);
    fp8_quantize_kernel<__nv_bfloat16><<<grid, kPassThreads, 0, stream_>>>(ops, sc);
  } else {
    fp8_amax_kernel<__half><<<grid, kPassThreads, 0, stream_>>>(ops, sc);
    fp8_quantize_kernel<__half><<<grid, kPassThreads, 0, stream_>>>(ops, sc);
  }
  ATELIER_CUDA_LAUNCHED();
  // The e4m3 output in out's layout (in rows8's bytes when given: [B, Sq, H, D] memory is [B*Sq, H*D] rows), so
  // that the dequantization is one flat pass.
  const std::shared_ptr<Buffer> o8_bytes = rows8 ? rows8->buffer() : Tensor::empty({out.numel()}, DType::F8E4M3, device()).buffer();
  Tensor o8(o8_bytes, out.shape(), out.strides(), DType::F8E4M3, rows8 ? rows8->offset() : 0);
  std::string why;
  if (!sdpa_fp8_->forward(o8, q8, k8, v8, scale, sc, alloc_, &why)) {
    if (cudnn_graph::log_enabled()) std::fprintf(stderr, "[cudnn sdpa fp8] 16-bit attention instead: %s\n", why.c_str());
    attention16();
    return false;
  }
  // Without write_out (the rows handed over are all that is read) only the row scales are written.
  const int64_t vectors = write_out || !rows8 ? out.numel() / 8 : 0, rows = row_scale ? row_scale->numel() : 0;
  float* rs = row_scale ? row_scale->data<float>() : nullptr;
  const auto* o8p = static_cast<const uint8_t*>(o8.raw());
  if (out.dtype() == DType::BF16)
    fp8_dequantize_kernel<__nv_bfloat16><<<grid_for(std::max(vectors, rows)), kThreads, 0, stream_>>>(
        out.data<__nv_bfloat16>(), o8p, vectors, sc, rs, rows);
  else
    fp8_dequantize_kernel<__half><<<grid_for(std::max(vectors, rows)), kThreads, 0, stream_>>>(out.data<__half>(), o8p, vectors,
                                                                                              sc, rs, rows);
  ATELIER_CUDA_LAUNCHED();
  return true;
}

namespace {
// Whether every run of positions has its RMS norm (the e4m3 rope kernel normalises; the bounds assume it).
bool all_normed(const std::vector<RopeRmsRun>& runs) {
  for (const RopeRmsRun& r : runs)
    if (!r.rms.on) return false;
  return !runs.empty();
}
}  // namespace

bool CudaBackend::rope_attention_fp8_rows(Tensor& out, Tensor& rows8, Tensor& row_scale, const Tensor& qx, const Tensor& kx,
                                          const Tensor& v, const Tensor& cos, const Tensor& sin,
                                          const std::vector<RopeRmsRun>& q_runs, const std::vector<RopeRmsRun>& k_runs,
                                          float scale, const Fp8Bounds& bounds, bool write_out) {
  // ATELIER_FP8_ROPE_ATTENTION=0: the unfused sequence (rope, rope, then the quantization passes), to compare.
  static const bool fused = !env_is("ATELIER_FP8_ROPE_ATTENTION", "0");
  if (!fused || bounds.q <= 0.0f || bounds.k <= 0.0f || !all_normed(q_runs) || !all_normed(k_runs) || out.numel() == 0)
    return false;
  // qx and kx stand for the rope's q and k in the checks (the same shapes and dtype; their strides are checked
  // as the rope's input here, the e4m3 q/k being contiguous).
  if (!fp8_attention_takes(out, qx, kx, v, nullptr) || !fp8_rows_fit(out, rows8, row_scale)) return false;
  Tensor q8 = Tensor::empty(qx.shape(), DType::F8E4M3, device()), k8 = Tensor::empty(kx.shape(), DType::F8E4M3, device());
  // Each run's rows of q8 / k8 from its own rope pass. A run the kernel cannot take returns false with nothing
  // the caller sees written (q8 and k8 are temporaries).
  const auto rope_runs_e4m3 = [&](Tensor& x8, const Tensor& x, const std::vector<RopeRmsRun>& runs, float bound) {
    int64_t start = 0;
    for (const RopeRmsRun& r : runs) {
      Tensor rows = x8.narrow(2, start, r.positions);
      if (!rope_e4m3(rows, x.narrow(2, start, r.positions), cos.narrow(0, start, r.positions), sin.narrow(0, start, r.positions),
                     r.rms, bound))
        return false;
      start += r.positions;
    }
    return true;
  };
  if (!rope_runs_e4m3(q8, qx, q_runs, bounds.q) || !rope_runs_e4m3(k8, kx, k_runs, bounds.k)) return false;
  // Where cuDNN declines (at the first call of a shape; run_fp8_attention then returns false after fallback16),
  // the 16-bit q and k are made after all and the rows quantized from the 16-bit output, as
  // attention_merged_fp8_rows does.
  const auto fallback16 = [&] {
    const auto rope16 = [&](const Tensor& x, const std::vector<RopeRmsRun>& runs) {
      Tensor x16 = Tensor::empty(x.shape(), x.dtype(), device());
      if (runs.size() == 1) {
        rope(x16, x, cos, sin, 2, runs[0].rms);
        return x16;
      }
      int64_t start = 0;  // a run's rows of x16 are strided (across heads): each run roped apart, then copied in
      for (const RopeRmsRun& r : runs) {
        Tensor part = Tensor::empty(x.narrow(2, start, r.positions).shape(), x.dtype(), device());
        rope(part, x.narrow(2, start, r.positions), cos.narrow(0, start, r.positions), sin.narrow(0, start, r.positions), 2, r.rms);
        Tensor rows = x16.narrow(2, start, r.positions);
        copy(rows, part);
        start += r.positions;
      }
      return x16;
    };
    attention(out, rope16(qx, q_runs), rope16(kx, k_runs), v, Tensor(), scale);
  };
  if (!run_fp8_attention(out, qx, kx, v, scale, bounds, &rows8, &row_scale, write_out, &q8, &k8, fallback16)) {
    const int64_t rows = row_scale.numel(), cols = rows8.numel() / rows;  // out is [B, Sq, H, D] memory: the rows
    quantize_rows_fp8(rows8, row_scale, Tensor(out.buffer(), {rows, cols}, {cols, 1}, out.dtype(), out.offset()));
  }
  return true;
}

bool CudaBackend::cudnn_sdpa_fp8(std::string* why) {
  {
    std::lock_guard<std::mutex> lock(engines_mu_);
    const ConvEngine& conv = conv_engine_locked();
    if (!sdpa_fp8_) sdpa_fp8_ = std::make_unique<CudnnSdpaFp8>(conv.library(), conv.handle(), stream_);
  }
  if (!sdpa_fp8_->available() && why)
    *why = conv_->available() ? sdpa_fp8_->why_unavailable() : "cuDNN not loaded: " + conv_->why_unavailable();
  return sdpa_fp8_->available();
}

}  // namespace atelier::cuda
