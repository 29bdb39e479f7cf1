// The general attention path: for each batch entry and block of queries, S = scale * Q K^T (one batched
// GEMM over heads into an f32 buffer), S + mask -> softmax -> P (rounded to the inputs' dtype, as torch's
// math path does for 16-bit inputs), O = P V (a second batched GEMM straight into the output). Any dtype,
// head dims and GQA; the query block keeps S within a memory budget. f32 inputs stay f32 throughout (no TF32
// unless allowed), so this path matches the CPU backend to f32 rounding.
#include <algorithm>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {
namespace {

constexpr int64_t kScoreBudgetBytes = int64_t(256) << 20;

// Rows of S [heads, qc, sk] (f32): add the mask, softmax, write P [heads, qc, sk] in P's dtype (may alias S
// when P is f32: every element is read before it is written, by the same thread).
template <typename P>
__global__ void attention_softmax_kernel(P* out, float* s, int64_t qc, int64_t sk, AttentionMask mask, int64_t batch, int64_t head0,
                                         int64_t query0) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float* sr = s + row * sk;
  P* o = out + row * sk;
  float mx = -INFINITY;
  if (mask.ptr) {
    const int64_t hb = row / qc, qi = row % qc;
    const int64_t base = batch * mask.s0 + (head0 + hb) * mask.s1 + (query0 + qi) * mask.s2;
    for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) {
      const float v = sr[j] + load_any(mask.ptr, mask.dtype, base + j * mask.s3);
      sr[j] = v;
      mx = fmaxf(mx, v);
    }
  } else {
    for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) mx = fmaxf(mx, sr[j]);
  }
  mx = block_max(mx, scratch);
  if (mx == -INFINITY) mx = 0.0f;  // fully masked row: NaN output, as torch and the CPU backend give
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) sum += expf(sr[j] - mx);
  const float inv = 1.0f / block_sum(sum, scratch);
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) o[j] = from_f32<P>(expf(sr[j] - mx) * inv);
}

int softmax_block(int64_t sk) { return sk <= 128 ? 32 : sk <= 1024 ? 128 : 256; }

int64_t row_stride(const Tensor& t) { return t.size(2) == 1 ? t.size(3) : t.strides()[2]; }

}  // namespace

// q [B, H, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv] (unit last stride), mask view or undefined,
// out [B, H, Sq, Dv] contiguous in q's dtype. k and v in another dtype than q are cast to it.
void CudaBackend::attention_gemm(Tensor& out, const Tensor& q, const Tensor& k_in, const Tensor& v_in, const Tensor& mask, float scale) {
  NvtxRange range("attention_gemm");
  const DType dt = q.dtype();
  const Tensor k = as_dtype(k_in, dt), v = as_dtype(v_in, dt);
  const int64_t b = q.size(0), h = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t hk = k.size(1), sk = k.size(2), dv = v.size(3);
  const int64_t group = h / hk;
  const size_t elem = dtype_size(dt);
  // One unit of work: `heads` consecutive query heads sharing K/V strides.
  const bool all_heads = group == 1 || hk == 1;
  const int64_t heads = all_heads ? h : group;
  const int64_t k_head_stride = hk == 1 ? 0 : k.strides()[1], v_head_stride = hk == 1 ? 0 : v.strides()[1];
  const int64_t qc = std::clamp<int64_t>(kScoreBudgetBytes / (heads * sk * int64_t(sizeof(float))), 1, sq);
  std::shared_ptr<Buffer> s_buf = alloc_.allocate(size_t(heads * qc * sk) * sizeof(float));
  std::shared_ptr<Buffer> p_buf = dt == DType::F32 ? s_buf : alloc_.allocate(size_t(heads * qc * sk) * elem);
  const AttentionMask m = attention_mask_of(mask);
  const int64_t ldq = row_stride(q), ldk = row_stride(k), ldv = row_stride(v);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t unit = 0; unit < (all_heads ? 1 : hk); ++unit) {
      const int64_t h0 = all_heads ? 0 : unit * group;
      const int64_t kh0 = all_heads ? 0 : unit;
      const char* kp = static_cast<const char*>(k.raw()) + size_t(bi * k.strides()[0] + kh0 * k.strides()[1]) * elem;
      const char* vp = static_cast<const char*>(v.raw()) + size_t(bi * v.strides()[0] + kh0 * v.strides()[1]) * elem;
      for (int64_t q0 = 0; q0 < sq; q0 += qc) {
        const int64_t rows = std::min(qc, sq - q0);
        GemmCall s;
        s.m = rows;
        s.n = sk;
        s.k = d;
        s.batch = heads;
        s.a = {static_cast<const char*>(q.raw()) + size_t(bi * q.strides()[0] + h0 * q.strides()[1] + q0 * ldq) * elem, dt, ldq,
               q.strides()[1], false};
        s.b = {kp, dt, ldk, all_heads ? k_head_stride : 0, true};
        s.c = s_buf->data();
        s.c_dtype = DType::F32;
        s.ldc = sk;
        s.c_batch_stride = rows * sk;
        s.alpha = scale;
        run_gemm(s);
        const unsigned softmax_rows = unsigned(heads * rows);
        auto softmax = [&](auto tag) {
          using P = decltype(tag);
          attention_softmax_kernel<P><<<softmax_rows, softmax_block(sk), 0, stream_>>>(
              static_cast<P*>(p_buf->data()), static_cast<float*>(s_buf->data()), rows, sk, m, bi, h0, q0);
        };
        if (dt == DType::F32) softmax(float{});
        else if (dt == DType::BF16) softmax(__nv_bfloat16{});
        else softmax(__half{});
        ATELIER_CUDA_LAUNCHED();
        GemmCall o;
        o.m = rows;
        o.n = dv;
        o.k = sk;
        o.batch = heads;
        o.a = {p_buf->data(), dt, sk, rows * sk, false};
        o.b = {vp, dt, ldv, all_heads ? v_head_stride : 0, false};
        o.c = static_cast<char*>(out.raw()) + size_t(((bi * h + h0) * sq + q0) * dv) * elem;
        o.c_dtype = dt;
        o.ldc = dv;
        o.c_batch_stride = sq * dv;
        run_gemm(o);
      }
    }
  }
}

}  // namespace atelier::cuda
