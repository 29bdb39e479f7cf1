// Diffusion glue as ops: classifier-free guidance's combine and a UNet's sinusoidal timestep features. Each is a
// few elementwise ops a device may fuse into one kernel (Backend::guidance_combine, Backend::timestep_features) with
// the same bits; where it does not, the ops below run them one by one.
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/ops_internal.h"
#include "core/trace.h"

namespace atelier::ops {
using namespace detail;  // NOLINT: the op API's own helpers
using trace::Category;

Tensor guidance_combine(const Tensor& cond, const Tensor& uncond, const std::vector<float>& scales) {
  trace::Scope range("guidance_combine", Category::kOp);
  require_defined(cond, "guidance_combine", "cond");
  require_defined(uncond, "guidance_combine", "uncond");
  require_same_device(cond, uncond, "guidance_combine");
  require(cond.dtype() == DType::F32 && uncond.dtype() == DType::F32, "guidance_combine", "cond and uncond must be f32");
  require(cond.dim() >= 1 && cond.shape() == uncond.shape(), "guidance_combine",
          "cond and uncond must have one shape [S, ...], got " + shape_str(cond.shape()) + " and " + shape_str(uncond.shape()));
  require(int64_t(scales.size()) == cond.size(0), "guidance_combine",
          std::to_string(scales.size()) + " scales for " + std::to_string(cond.size(0)) + " rows");
  // Both packed alike (contiguous, or both channels-last: a UNet's output may be), so that row s is one block of
  // memory in all three and the device may combine them element by element as they lie.
  const bool packed = cond.is_contiguous() && uncond.is_contiguous();
  if (packed || (cond.is_channels_last() && uncond.is_channels_last())) {
    Tensor out = packed ? Tensor::empty(cond.shape(), DType::F32, cond.device())
                        : Tensor::empty_channels_last(cond.shape(), DType::F32, cond.device());
    if (backend_of(cond).guidance_combine(out, cond, uncond, scales)) return out;
  }
  Shape per_row(size_t(cond.dim()), 1);
  per_row[0] = cond.size(0);
  const Tensor g = Tensor::from_vector(scales, per_row).to(cond.device());
  return add(uncond, mul(sub(cond, uncond), g));
}

Tensor timestep_features(const Tensor& t, const Tensor& freqs, bool flip_sin_to_cos, int64_t dim, int64_t rows, DType dtype) {
  trace::Scope range("timestep_features", Category::kOp);
  require_defined(t, "timestep_features", "t");
  require_defined(freqs, "timestep_features", "freqs");
  require_same_device(t, freqs, "timestep_features");
  require(t.dtype() == DType::F32 && freqs.dtype() == DType::F32, "timestep_features", "t and freqs must be f32");
  require(t.dim() == 1 && (t.size(0) == rows || t.size(0) == 1), "timestep_features",
          "t must be [" + std::to_string(rows) + "] or [1], got " + shape_str(t.shape()));
  const int64_t half = freqs.numel();
  require(half >= 1 && dim >= 2 * half, "timestep_features",
          std::to_string(half) + " frequencies do not fit " + std::to_string(dim) + " features");
  const Tensor tc = contiguous(t), fc = contiguous(freqs).reshape({1, half});
  Tensor out = Tensor::empty({rows, dim}, dtype, t.device());
  if (backend_of(t).timestep_features(out, tc, fc, flip_sin_to_cos)) return out;
  const Tensor tr = tc.size(0) == rows ? tc : concat(std::vector<Tensor>(size_t(rows), tc), 0);
  const Tensor args = mul(tr.view({rows, 1}), fc);  // [rows, half]
  const Tensor sin = unary(args, UnaryOp::kSin), cos = unary(args, UnaryOp::kCos);
  Tensor features = flip_sin_to_cos ? concat({cos, sin}, 1) : concat({sin, cos}, 1);
  if (dim > 2 * half) features = concat({features, Tensor::zeros({rows, dim - 2 * half}, DType::F32, t.device())}, 1);
  return dtype == DType::F32 ? features : cast(features, dtype);
}

}  // namespace atelier::ops
