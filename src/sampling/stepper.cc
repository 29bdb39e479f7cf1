#include "sampling/stepper.h"

#include <cfloat>

#include "backend/ops.h"

namespace atelier::sampling {
namespace {

using Exprs = std::vector<LinearExpr>;  // one per sample

Shape per_sample_shape(const Tensor& x) {
  Shape s = x.shape();
  s[0] = 1;
  return s;
}

// Zero-copy batch of per-sample [1, ...] tensors when they are consecutive rows of one buffer (the
// steady state: the previous step's batched result, in the same order); otherwise a concat.
Tensor batch_of(const std::vector<Tensor>& rows) {
  const Tensor& first = rows.front();
  const int64_t per = first.numel();
  bool consecutive = true;
  for (size_t s = 0; s < rows.size() && consecutive; ++s) {
    const Tensor& r = rows[s];
    consecutive = r.buffer() == first.buffer() && r.is_contiguous() && r.shape() == first.shape() &&
                  r.dtype() == first.dtype() && r.offset() == first.offset() + int64_t(s) * per;
  }
  if (consecutive) {
    Shape shape = first.shape();
    shape[0] = int64_t(rows.size());
    return Tensor(first.buffer(), shape, first.dtype(), first.offset());
  }
  return rows.size() == 1 ? rows.front() : ops::concat(rows, 0);
}

// One lincomb_per_sample over the operands that some row uses.
Tensor combine(const Exprs& exprs, const std::array<Tensor, kNumOperands>& operands) {
  std::vector<Tensor> xs;
  std::vector<int> used;
  for (int o = 0; o < kNumOperands; ++o) {
    for (const LinearExpr& e : exprs) {
      if (e.coeff[size_t(o)] != 0.0) {
        ATELIER_CHECK(operands[size_t(o)].defined(), "sampler update uses an operand that is not available");
        used.push_back(o);
        xs.push_back(operands[size_t(o)]);
        break;
      }
    }
  }
  if (used.empty()) {  // all-zero combination (cannot happen for a sample update, kept total for safety)
    used.push_back(int(Operand::kSample));
    xs.push_back(operands[size_t(Operand::kSample)]);
  }
  std::vector<float> coeffs;
  coeffs.reserve(exprs.size() * used.size());
  for (const LinearExpr& e : exprs) {
    for (int o : used) coeffs.push_back(float(e.coeff[size_t(o)]));
  }
  return ops::lincomb_per_sample(xs, coeffs);
}

Tensor draw_noise(const Sampler& s, const Shape& noise_shape, const Tensor& like_row) {
  ATELIER_CHECK(bool(s.noise_source()), std::string(sampler_name(s.kind())) +
                                            " draws noise during sampling but has no noise source");
  Tensor n = s.noise_source()(noise_shape);
  ATELIER_CHECK(n.numel() == like_row.numel(), "noise source returned " + shape_str(n.shape()) +
                                                   " for a request of " + shape_str(noise_shape));
  n = ops::contiguous(n).reshape(like_row.shape());
  if (n.dtype() != like_row.dtype()) n = ops::cast(n, like_row.dtype());
  if (!(n.device() == like_row.device())) n = ops::to_device(n, like_row.device());
  return n;
}

// kClamped = clamp(source, -range, range) per sample; samples that do not clamp get an unbounded range.
Tensor clamped(std::span<Sampler* const> samplers, const std::vector<StepUpdate>& updates,
               const std::array<Tensor, kNumOperands>& operands, const Tensor& x) {
  Exprs sources;
  std::vector<float> ranges;
  for (const StepUpdate& u : updates) {
    sources.push_back(u.clamp ? u.clamp->source : LinearExpr{});
    ranges.push_back(u.clamp ? u.clamp->range : FLT_MAX);
  }
  Tensor pre = combine(sources, operands);
  Shape rshape(size_t(x.dim()), 1);
  rshape[0] = int64_t(samplers.size());
  std::vector<float> neg(ranges);
  for (float& v : neg) v = -v;
  auto on_device = [&](const std::vector<float>& v) {
    Tensor t = Tensor::from_vector(v, rshape);
    if (t.dtype() != x.dtype()) t = ops::cast(t, x.dtype());
    return x.device() == t.device() ? t : ops::to_device(t, x.device());
  };
  return ops::binary(ops::binary(pre, on_device(neg), BinaryOp::kMax), on_device(ranges), BinaryOp::kMin);
}

}  // namespace

Tensor scale_model_inputs(std::span<Sampler* const> samplers, const Tensor& x) {
  ATELIER_CHECK(x.dim() >= 1 && x.size(0) == int64_t(samplers.size()), "scale_model_inputs: batch mismatch");
  std::vector<float> coeffs;
  for (Sampler* s : samplers) coeffs.push_back(s->next_call().input_scale);
  return ops::lincomb_per_sample({x}, coeffs);
}

std::vector<float> model_timesteps(std::span<Sampler* const> samplers) {
  std::vector<float> out;
  for (Sampler* s : samplers) out.push_back(s->next_call().timestep);
  return out;
}

Tensor apply_step(std::span<Sampler* const> samplers, const Tensor& x, const Tensor& model_output,
                  Tensor* denoised) {
  return detail::apply_step_with_shape(samplers, x, model_output, per_sample_shape(x), denoised);
}

namespace detail {

Tensor apply_step_with_shape(std::span<Sampler* const> samplers, const Tensor& x, const Tensor& model_output,
                             const Shape& noise_shape, Tensor* denoised) {
  const size_t S = samplers.size();
  ATELIER_CHECK(S > 0 && x.dim() >= 1 && x.size(0) == int64_t(S), "apply_step: x must be [samplers, ...]");
  ATELIER_CHECK(model_output.shape() == x.shape(), "apply_step: model_output must have x's shape, got " +
                                                       shape_str(model_output.shape()) + " vs " + shape_str(x.shape()));
  std::vector<StepUpdate> updates;
  for (Sampler* s : samplers) updates.push_back(s->update());

  std::array<Tensor, kNumOperands> operands;
  operands[size_t(Operand::kSample)] = x;
  operands[size_t(Operand::kModelOutput)] = model_output;
  bool any_noise = false, any_clamp = false;
  for (const StepUpdate& u : updates) {
    any_noise |= u.draws_noise;
    any_clamp |= u.clamp.has_value();
  }
  // Placeholders for samples that lack an operand: their own row of x, always with coefficient 0.
  if (any_noise) {
    std::vector<Tensor> rows;
    for (size_t s = 0; s < S; ++s) {
      const Tensor row = x.narrow(0, int64_t(s), 1);
      rows.push_back(updates[s].draws_noise ? draw_noise(*samplers[s], noise_shape, row) : row);
    }
    operands[size_t(Operand::kNoise)] = rows.size() == 1 ? rows.front() : ops::concat(rows, 0);
  }
  for (int slot = 0; slot < kNumSavedSlots; ++slot) {
    std::vector<Tensor> rows;
    bool any = false;
    for (size_t s = 0; s < S; ++s) {
      const Tensor& t = samplers[s]->saved(slot);
      any |= t.defined();
      rows.push_back(t.defined() ? t : x.narrow(0, int64_t(s), 1));
    }
    if (any) operands[size_t(Operand::kSaved0) + size_t(slot)] = batch_of(rows);
  }
  if (any_clamp) operands[size_t(Operand::kClamped)] = clamped(samplers, updates, operands, x);

  Exprs next;
  for (const StepUpdate& u : updates) next.push_back(u.next_sample);
  Tensor out = combine(next, operands);

  std::vector<std::array<std::optional<Tensor>, kNumSavedSlots>> saves(S);
  for (int slot = 0; slot < kNumSavedSlots; ++slot) {
    Exprs values;
    bool any_set = false;
    for (size_t s = 0; s < S; ++s) {
      const SlotWrite& w = updates[s].saves[size_t(slot)];
      any_set |= w.action == SlotWrite::Action::kSet;
      values.push_back(w.action == SlotWrite::Action::kSet ? w.value : LinearExpr{});
      if (w.action == SlotWrite::Action::kClear) saves[s][size_t(slot)] = Tensor{};
    }
    if (!any_set) continue;
    const Tensor batch = combine(values, operands);
    for (size_t s = 0; s < S; ++s) {
      if (updates[s].saves[size_t(slot)].action == SlotWrite::Action::kSet) {
        saves[s][size_t(slot)] = batch.narrow(0, int64_t(s), 1);
      }
    }
  }
  if (denoised) {
    Exprs d;
    for (const StepUpdate& u : updates) d.push_back(u.denoised);
    *denoised = combine(d, operands);
  }
  for (size_t s = 0; s < S; ++s) samplers[s]->advance(saves[s]);
  return out;
}

}  // namespace detail
}  // namespace atelier::sampling
