// Scaled dot-product attention on the CPU. AVX-512 CPUs take the fused kernel (cpu_attention_fused.cc);
// this file is the portable path: per (batch, head, block of queries) two GEMMs around a row softmax.
// Only one block of the score matrix exists per thread at a time, so memory stays bounded for long
// sequences (SD at 1024 px attends over 16k tokens).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace atelier {
namespace {

// Score-block budget per thread, in floats (2 MiB, a core's L2 here; 128 queries at 4096 keys). Larger
// blocks amortise OpenBLAS's repacking of K and V per call; 1, 2 and 4 MiB were measured, 2 was best.
constexpr int64_t kScoreBudgetFloats = int64_t(1) << 19;
constexpr int64_t kMinQueryBlock = 8;
constexpr int64_t kMaxQueryBlock = 256;

int64_t row_stride(const Tensor& t) { return t.size(2) == 1 ? t.size(3) : t.strides()[2]; }

}  // namespace

// q [B, H, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv] (unit last stride, any other strides);
// mask [B, H, Sq, Sk] broadcast view with last stride 0 or 1, or undefined; out [B, H, Sq, Dv] contiguous.
// out = softmax(q @ k^T * scale + mask) @ v; head h reads kv head h / (H / Hk).
void CpuBackend::attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) {
  const int64_t b = q.size(0), h = q.size(1), sq = q.size(2), d = q.size(3);
  const int64_t hk = k.size(1), sk = k.size(2), dv = v.size(3);
  const int64_t group = h / hk;
  if (out.numel() == 0) return;
  ATELIER_CHECK(sk > 0, "attention over an empty key sequence");
  if (!out.is_contiguous()) return attention_through_temporary(out, q, k, v, mask, scale);  // heads merged
  if (cpu::attention_fused(out, q, k, v, mask, scale)) return;

  const int threads = cpu::max_threads();
  int64_t bq = std::clamp(kScoreBudgetFloats / sk, kMinQueryBlock, kMaxQueryBlock);
  const int64_t heads_total = b * h;
  if (heads_total < threads) bq = std::min(bq, std::max<int64_t>(1, (sq * heads_total + threads - 1) / threads));
  bq = std::min(bq, sq);
  const int64_t qblocks = (sq + bq - 1) / bq;
  const int64_t tasks = heads_total * qblocks;

  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* mp = mask.defined() ? mask.data<float>() : nullptr;
  const Shape qs = q.strides(), ks = k.strides(), vs = v.strides();
  const Shape ms = mask.defined() ? mask.strides() : Shape{0, 0, 0, 0};
  const int64_t ldq = row_stride(q), ldk = row_stride(k), ldv = row_stride(v);
  float* op = out.data<float>();
  const double macs = double(b) * h * sq * sk * (d + dv);

#pragma omp parallel if (tasks > 1 && macs >= cpu::kMinParallelMacs)
  {
    std::unique_ptr<float[]> scores(new float[size_t(bq * sk)]);  // uninitialised: the GEMM writes it
    std::vector<double> sums(static_cast<size_t>(bq));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t bh = t / qblocks, qb = t % qblocks;
      const int64_t bi = bh / h, hi = bh % h, kh = hi / group;
      const int64_t q0 = qb * bq, rows = std::min(bq, sq - q0);
      const float* qt = qp + bi * qs[0] + hi * qs[1] + q0 * ldq;
      const float* kt = kp + bi * ks[0] + kh * ks[1];
      const float* vt = vp + bi * vs[0] + kh * vs[1];
      float* s = scores.get();
      cpu::sgemm_serial(false, true, rows, sk, d, scale, qt, ldq, kt, ldk, 0.0f, s, sk);
      for (int64_t r = 0; r < rows; ++r) {
        float* row = s + r * sk;
        if (mp) {
          const float* mr = mp + bi * ms[0] + hi * ms[1] + (q0 + r) * ms[2];
          if (ms[3] == 0) {
            const float m0 = mr[0];
            for (int64_t j = 0; j < sk; ++j) row[j] += m0;
          } else {
            for (int64_t j = 0; j < sk; ++j) row[j] += mr[j];
          }
        }
        float mx = cpu::max_span(row, sk);
        if (mx == -INFINITY) mx = 0.0f;  // fully masked row: NaN output, as torch gives
        sums[r] = cpu::exp_span_sum(row, sk, mx);
      }
      // Normalisation is applied to the [rows, Dv] result instead of the [rows, Sk] probabilities.
      float* ot = op + (bh * sq + q0) * dv;
      cpu::sgemm_serial(false, false, rows, dv, sk, 1.0f, s, sk, vt, ldv, 0.0f, ot, dv);
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = float(1.0 / sums[r]);
        for (int64_t j = 0; j < dv; ++j) ot[r * dv + j] *= inv;
      }
    }
  }
}

}  // namespace atelier
