#include "pipeline/sd_batch.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/ops.h"
#include "core/trace.h"
#include "pipeline/inpaint.h"
#include "pipeline/stage_names.h"
#include "sampling/stepper.h"

namespace atelier {
namespace {

// [1, ...] rows -> [S, ...]. Zero-copy when they are consecutive rows of one buffer, which is the steady
// state of a batch whose membership did not change since the previous call; a concat otherwise.
Tensor stack_rows(const std::vector<Tensor>& rows) {
  const Tensor& first = rows.front();
  const int64_t per = first.numel();
  bool consecutive = first.is_contiguous();
  for (size_t s = 1; s < rows.size() && consecutive; ++s) {
    const Tensor& r = rows[s];
    consecutive = r.buffer() == first.buffer() && r.is_contiguous() && r.shape() == first.shape() &&
                  r.dtype() == first.dtype() && r.offset() == first.offset() + int64_t(s) * per;
  }
  if (rows.size() == 1) return first;
  if (!consecutive) return ops::concat(rows, 0);
  Shape shape = first.shape();
  shape[0] = int64_t(rows.size());
  return Tensor(first.buffer(), shape, first.dtype(), first.offset());
}

// The x0 estimate of the sample's next update as a * sample + b * model output: what holding it to the kept latents
// needs (every sampler here estimates x0 so, unless clip_sample clamps it).
Expected<std::pair<double, double>> x0_coefficients(const sampling::Sampler& sampler) {
  using sampling::Operand;
  const sampling::LinearExpr d = sampler.update().denoised;
  bool linear = d.uses(Operand::kModelOutput);
  for (Operand o : {Operand::kNoise, Operand::kClamped, Operand::kSaved0, Operand::kSaved1}) linear = linear && !d.uses(o);
  if (!linear)
    return invalid_argument(std::string("inpainting: the ") + std::string(sampling::sampler_name(sampler.kind())) +
                            " sampler's x0 estimate is not linear in the sample and the model output here "
                            "(clip_sample); use another sampler");
  return std::pair<double, double>{d[Operand::kSample], d[Operand::kModelOutput]};
}

Status check_kept(const DenoiseSample& s) {
  const KeptRegion& k = s.kept;
  if (k.keep.shape() != s.x.shape() || k.inpainted.shape() != s.x.shape() || k.latents.shape() != s.x.shape())
    return invalid_argument("denoise_batch_step: an inpainting mask or its latents differ from the sample's shape");
  return x0_coefficients(*s.sampler).status();
}

// eps [S, C, h, w] (the guided predictions), x [S, C, h, w] -> the predictions with each inpainted sample's held where it
// is kept to the one whose x0 estimate a x + b eps is the init latents z: (z - a x) / b. Its other rows as they are.
Tensor hold_kept(std::span<DenoiseSample* const> samples, const Tensor& x, const Tensor& eps) {
  if (std::none_of(samples.begin(), samples.end(), [](const DenoiseSample* s) { return s->kept.defined(); })) return eps;
  std::vector<Tensor> rows;
  for (size_t s = 0; s < samples.size(); ++s) {
    const DenoiseSample& d = *samples[s];
    Tensor row = eps.narrow(0, int64_t(s), 1);
    if (d.kept.defined()) {
      row = ops::contiguous(row);  // the UNet's output may be channels-last; the masks are packed NCHW
      const auto [a, b] = x0_coefficients(*d.sampler).value();  // checked by check_samples
      const Tensor target = ops::lincomb({d.kept.latents, x.narrow(0, int64_t(s), 1)}, {float(1.0 / b), float(-a / b)});
      row = masked_blend(row, d.kept.inpainted, target, d.kept.keep);
    }
    rows.push_back(row);
  }
  return rows.size() == 1 ? rows.front() : ops::concat(rows, 0);
}

Status check_samples(const UNet& unet, std::span<DenoiseSample* const> samples) {
  if (samples.empty()) return invalid_argument("denoise_batch_step: no samples");
  const DenoiseSample& first = *samples.front();
  for (const DenoiseSample* s : samples) {
    if (!s->sampler || s->sampler->done()) return invalid_argument("denoise_batch_step: a sample has no call left");
    if (!s->x.defined() || s->x.dim() != 4 || s->x.size(0) != 1)
      return invalid_argument("denoise_batch_step: latents must be [1, C, h, w]");
    if (!s->cond.defined() || (s->guided() && !s->uncond.defined()))
      return invalid_argument("denoise_batch_step: a guided sample needs cond and uncond rows");
    if (!batch_compatible(first, *s))
      return invalid_argument("denoise_batch_step: samples of different latent or conditioning shapes (" +
                              shape_str(first.x.shape()) + " vs " + shape_str(s->x.shape()) + ")");
    if (!(s->x.device() == unet.device())) return invalid_argument("denoise_batch_step: latents on another device");
    if (s->kept.defined()) ATELIER_RETURN_IF_ERROR(check_kept(*s));
  }
  return Status::ok();
}

// A batch step's model call: the S samples' latents x [S, C, h, w]; model_in, x scaled for the model with the
// guided samples' rows again after the S rows [S + G, C, h, w]; their timesteps t [S + G]; and context, the S
// cond rows then the G uncond rows [S + G, T, D].
struct CallInputs {
  Tensor x, model_in, t, context;
};

// x [S, C, h, w], contexts [S + G] rows of [1, T, D], guided: the G guided samples' indices -> the call's inputs.
CallInputs call_inputs(std::span<sampling::Sampler* const> span, const Tensor& x, const std::vector<Tensor>& contexts,
                       const std::vector<int64_t>& guided) {
  CallInputs in;
  in.x = x;
  const Tensor x_in = sampling::scale_model_inputs(span, x);
  std::vector<float> ts = sampling::model_timesteps(span);
  std::vector<Tensor> in_rows = {x_in};
  for (int64_t g : guided) {
    in_rows.push_back(x_in.narrow(0, g, 1));
    ts.push_back(ts[size_t(g)]);
  }
  in.model_in = in_rows.size() == 1 ? x_in : ops::concat(in_rows, 0);
  in.context = stack_rows(contexts);
  in.t = Tensor::from_vector(ts, {int64_t(ts.size())}).to(x.device());
  return in;
}

// out [S + G, C, h, w] (the call's prediction, rows as CallInputs) -> the S samples' guided predictions [S, C, h, w].
Tensor guided_prediction(const Tensor& out, std::span<DenoiseSample* const> samples, const std::vector<int64_t>& guided) {
  const int64_t S = int64_t(samples.size());
  const Tensor eps = out.narrow(0, 0, S);
  if (guided.empty()) return eps;
  // u row per sample: the uncond output for guided samples, the cond output itself otherwise, so that
  // u + g * (c - u) is exactly c for unguided ones (c - c = 0) and diffusers' formula for guided ones.
  std::vector<Tensor> u_rows;
  std::vector<float> scales;
  size_t next_guided = 0;
  for (int64_t s = 0; s < S; ++s) {
    const bool g = next_guided < guided.size() && guided[next_guided] == s;
    u_rows.push_back(g ? out.narrow(0, S + int64_t(next_guided), 1) : out.narrow(0, s, 1));
    scales.push_back(g ? samples[size_t(s)]->cfg_scale : 1.0f);
    if (g) ++next_guided;
  }
  return ops::guidance_combine(eps, stack_rows(u_rows), scales);
}

}  // namespace

bool sync_each_call() {
  static const bool on = [] {
    const char* v = std::getenv("ATELIER_SYNC_EACH_CALL");
    return v && std::string_view(v) == "1";
  }();
  return on;
}

Tensor final_latents(const DenoiseSample& sample) {
  const KeptRegion& k = sample.kept;
  if (!k.defined()) return sample.x;
  return masked_blend(sample.x, k.inpainted, k.latents, k.keep);
}

bool batch_compatible(const DenoiseSample& a, const DenoiseSample& b) {
  return a.x.shape() == b.x.shape() && a.cond.shape() == b.cond.shape() && a.x.dtype() == b.x.dtype();
}

Expected<BatchStepOutput> denoise_batch_step(const UNet& unet, std::span<DenoiseSample* const> samples,
                                             bool want_denoised) {
  ATELIER_RETURN_IF_ERROR(check_samples(unet, samples));
  const int64_t S = int64_t(samples.size());
  std::vector<sampling::Sampler*> samplers;
  std::vector<Tensor> xs, contexts, uncond_ctx;
  std::vector<int64_t> guided;  // indices of guided samples: their uncond rows follow the S cond rows
  for (int64_t s = 0; s < S; ++s) {
    DenoiseSample& d = *samples[size_t(s)];
    samplers.push_back(d.sampler);
    xs.push_back(d.x);
    contexts.push_back(d.cond);
    if (d.guided()) {
      guided.push_back(s);
      uncond_ctx.push_back(d.uncond);
    }
  }
  std::span<sampling::Sampler* const> span(samplers.data(), samplers.size());
  contexts.insert(contexts.end(), uncond_ctx.begin(), uncond_ctx.end());
  // Each side of the UNet's replayed recording is a handful of small kernels (the next inputs; the combine and
  // the sampler's update): the device launches each side as one (Backend::run_batched).
  Backend& backend = backend_for(unet.device());
  CallInputs in;
  backend.run_batched([&] { in = call_inputs(span, stack_rows(xs), contexts, guided); });
  // Borrowed: `out` is read by the combine and the sampler update below, enqueued before the next call, and every
  // tensor they leave behind (the next latents, saved history, the denoised preview) is a fresh one.
  ATELIER_ASSIGN_OR_RETURN(const Tensor out, unet.forward(in.model_in, in.t, in.context, GraphRunner::Result::kBorrowed));
  trace::Scope step_range(stage::kSamplerStep, trace::Category::kCall);  // CFG combine + sampler update
  BatchStepOutput result;
  backend.run_batched([&] {
    const Tensor eps = hold_kept(samples, in.x, guided_prediction(out, samples, guided));
    result.x = sampling::apply_step(span, in.x, eps, want_denoised ? &result.denoised : nullptr);
  });
  for (int64_t s = 0; s < S; ++s) {
    DenoiseSample& d = *samples[size_t(s)];
    d.x = result.x.narrow(0, s, 1);
    if (want_denoised) d.denoised = result.denoised.narrow(0, s, 1);
  }
  return result;
}

}  // namespace atelier
