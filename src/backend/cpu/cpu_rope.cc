// Rotary position embedding on the CPU (f32): see Backend::rope.
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace atelier {

// x [B, A, C, D] strided (unit last stride), cos/sin [S, D/2] -> out [B, A, C, D] contiguous; with rms.on
// each row normalised first (cpu::rms_row, as rms_norm computes it; gamma f32 [D]).
void CpuBackend::rope(Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms) {
  const int64_t b = x.size(0), a = x.size(1), c = x.size(2), half = x.size(3) / 2;
  const int64_t s0 = x.strides()[0], s1 = x.strides()[1], s2 = x.strides()[2];
  const float* xp = x.data<float>();
  const float* cp = cos.data<float>();
  const float* sp = sin.data<float>();
  const float* g = rms.on && rms.gamma.defined() ? rms.gamma.data<float>() : nullptr;
  float* op = out.data<float>();
#pragma omp parallel if (x.numel() > (int64_t(1) << 15))
  {
    std::vector<float> normed(rms.on ? size_t(2 * half) : 0);  // one row after the norm (per thread)
#pragma omp for collapse(2) schedule(static)
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < a; ++j)
        for (int64_t k = 0; k < c; ++k) {
          const float* xr = xp + i * s0 + j * s1 + k * s2;
          if (rms.on) {
            cpu::rms_row(normed.data(), xr, 2 * half, rms.eps, g);
            xr = normed.data();
          }
          float* o = op + ((i * a + j) * c + k) * 2 * half;
          const int64_t pos = seq_dim == 1 ? j : k;
          const float* cr = cp + pos * half;
          const float* sr = sp + pos * half;
          for (int64_t p = 0; p < half; ++p) {
            const float x0 = xr[2 * p], x1 = xr[2 * p + 1];
            // Separate products and sums (no fused multiply-add): the reference rounds each product.
            const float x0c = x0 * cr[p], x1s = x1 * sr[p], x0s = x0 * sr[p], x1c = x1 * cr[p];
            o[2 * p] = x0c - x1s;
            o[2 * p + 1] = x0s + x1c;
          }
        }
  }
}

}  // namespace atelier
