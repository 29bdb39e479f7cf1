// norm_modulate on the CPU (f32): the row normalisation through layer_norm/rms_norm, then the modulation
// in the unfused ops' order (separate products and sums), so the result equals the op-by-op sequence.
#include <cstdint>

#include "backend/cpu/cpu_backend.h"

namespace atelier {

// x, out [B, T, D] contiguous; gamma [D]; m.scale/shift/gate [B, D]; m.residual [B, T, D].
void CpuBackend::norm_modulate(Tensor& out, const Tensor& x, NormKind kind, float eps, const Tensor& gamma,
                               const NormModulation& m) {
  if (kind == NormKind::kLayer) layer_norm(out, x, gamma, Tensor(), eps);
  else if (kind == NormKind::kRms) rms_norm(out, x, gamma, eps);
  else copy(out, x);
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  float* o = out.data<float>();
  const float* scale = m.scale.defined() ? m.scale.data<float>() : nullptr;
  const float* shift = m.shift.defined() ? m.shift.data<float>() : nullptr;
  const float* gate = m.gate.defined() ? m.gate.data<float>() : nullptr;
  const float* res = m.residual.defined() ? m.residual.data<float>() : nullptr;
  if (!scale && !shift && !res) return;
#pragma omp parallel for collapse(2) schedule(static) if (out.numel() > (int64_t(1) << 15))
  for (int64_t i = 0; i < b; ++i)
    for (int64_t r = 0; r < t; ++r) {
      float* row = o + (i * t + r) * d;
      const float* rr = res ? res + (i * t + r) * d : nullptr;
      for (int64_t j = 0; j < d; ++j) {
        float v = row[j];
        if (scale) v = v * (1.0f + scale[i * d + j]);
        if (shift) v = v + shift[i * d + j];
        if (gate) v = gate[i * d + j] * v;
        if (rr) v = rr[j] + v;
        row[j] = v;
      }
    }
}

}  // namespace atelier
