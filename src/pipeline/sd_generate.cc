// SdPipeline::generate: a whole request (batch_count batches of batch_size images) through the stages.
#include <random>

#include "backend/ops.h"
#include "io/infotext.h"
#include "pipeline/init_image.h"
#include "pipeline/sd_pipeline.h"
#include "sampling/sampler_names.h"

namespace atelier {
namespace {

using trace::Category;

constexpr uint32_t kMaxRandomSeed = 0xffffffffu;  // A1111 draws random seeds below 2^32

std::string trim_float(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

InfotextParams infotext_params(const SdModel& m, const GenerationPlan& p, int64_t seed) {
  const GenerateRequest& r = p.request;
  InfotextParams kv = {{"Steps", std::to_string(r.steps)},
                       {"Sampler", a1111_sampler_name(p.sampler_name)},
                       {"Schedule type", a1111_schedule_name(p.schedule_name)},
                       {"CFG scale", trim_float(r.cfg_scale)},
                       {"Seed", std::to_string(seed)},
                       {"Size", std::to_string(r.width) + "x" + std::to_string(r.height)}};
  if (!m.hash.empty()) kv.push_back({"Model hash", m.hash});
  kv.push_back({"Model", m.name});
  if (p.init_image.defined()) kv.push_back({"Denoising strength", trim_float(r.strength)});
  if (p.inpaint) {  // A1111's extra generation parameters of an inpainting
    if (r.mask_invert) kv.push_back({"Mask mode", "Inpaint not masked"});
    if (r.mask_blur_x != r.mask_blur_y) {
      kv.push_back({"Mask blur x", std::to_string(r.mask_blur_x)});
      kv.push_back({"Mask blur y", std::to_string(r.mask_blur_y)});
    } else if (r.mask_blur_x > 0) {
      kv.push_back({"Mask blur", std::to_string(r.mask_blur_x)});
    }
    if (p.inpaint->paste_to) {
      kv.push_back({"Inpaint area", "Only masked"});
      kv.push_back({"Masked area padding", std::to_string(r.inpaint_padding)});
    }
    if (p.inpaint->fill != InpaintFill::kOriginal) kv.push_back({"Masked content", a1111_inpaint_fill_name(p.inpaint->fill)});
  }
  if (r.clip_skip > 1) kv.push_back({"Clip skip", std::to_string(r.clip_skip)});
  if (p.rng == RngKind::kCpu) kv.push_back({"RNG", "CPU"});
  kv.push_back({"Version", std::string("atelier ") + ATELIER_VERSION});
  return kv;
}

}  // namespace

Expected<GenerationPlan> SdPipeline::plan(const GenerateRequest& r, const Image* init_image, const Image* mask) const {
  const SdModel& m = *model_;
  ATELIER_RETURN_IF_ERROR(r.validate());
  GenerationPlan p;
  p.request = r;
  ATELIER_ASSIGN_OR_RETURN(auto spec, sampling::parse_sampler(r.sampler));
  ATELIER_ASSIGN_OR_RETURN(auto sched, sampling::parse_schedule(r.schedule));
  ATELIER_ASSIGN_OR_RETURN(p.spec, sampling::with_schedule(spec, sched));
  p.sampler_name = std::string(sampling::sampler_name(p.spec.kind));
  p.schedule_name = std::string(sampling::schedule_name(p.spec.schedule));
  ATELIER_ASSIGN_OR_RETURN(p.rng, parse_rng_kind(r.rng));
  const int f = m.vae->config().downscale_factor();
  ATELIER_ASSIGN_OR_RETURN(p.inpaint, request_inpaint(p.request, init_image, mask, kLatentFactor, f));
  if (p.inpaint) {
    p.init_image = tensor_from_image(p.inpaint->model_image);
  } else {
    ATELIER_ASSIGN_OR_RETURN(p.init_image, request_init_image(p.request, init_image, kLatentFactor));  // size: the image's
  }
  if (p.request.width == 0) p.request.width = m.default_size;
  if (p.request.height == 0) p.request.height = m.default_size;
  if (p.request.seed < 0) p.request.seed = int64_t(std::random_device{}() % kMaxRandomSeed);
  if (p.request.clip_skip > m.text_encoder->max_clip_skip())
    return invalid_argument("clip skip " + std::to_string(p.request.clip_skip) + " is not supported by this model (at most " +
                            std::to_string(m.text_encoder->max_clip_skip()) + ")");
  return p;
}

Expected<PreparedSample> SdPipeline::prepare_sample(const GenerationPlan& p, int index) const {
  const SdModel& m = *model_;
  const Device dev = m.unet->device();
  const GenerateRequest& r = p.request;
  const int f = m.vae->config().downscale_factor();
  const Shape latent_shape = {1, m.unet->config().in_channels, r.height / f, r.width / f};
  const nlohmann::json overrides = {{"prediction_type", m.prediction == Prediction::kV ? "v_prediction" : "epsilon"}};
  PreparedSample out;
  out.seed = p.seed_of(index);
  std::shared_ptr<NoiseGenerator> gen = make_generator(p.rng, uint64_t(out.seed));
  ATELIER_ASSIGN_OR_RETURN(out.sampler, sampling::make_sampler(m.scheduler_config, p.spec, r.steps, overrides));
  out.sampler->set_noise_source([gen, dev](const Shape& shape) { return randn_tensor(*gen, shape).to(dev); });
  if (p.init_image.defined()) {  // img2img: VAE sample, then the noise, from the same generator
    ATELIER_RETURN_IF_ERROR(out.sampler->set_strength(r.strength));
    Tensor lat = encode_image(p.init_image, *gen);
    if (p.inpaint) {
      Tensor keep = p.inpaint->keep_mask(int(lat.size(1)), dev);
      if (keep.dtype() != lat.dtype()) keep = ops::cast(keep, lat.dtype());
      const Tensor inpainted = ops::affine(keep, -1.0f, 1.0f);
      lat = fill_masked_latents(p.inpaint->fill, lat, keep, inpainted, p.rng, out.seed);
      out.kept = {keep, inpainted, lat};
    }
    const Tensor noise = randn_tensor(*gen, latent_shape).to(dev);
    const sampling::NoiseRule rule = out.sampler->noise_rule();
    out.latents = ops::lincomb({lat, noise}, {rule.x0, rule.noise});
  } else {
    out.latents = ops::affine(randn_tensor(*gen, latent_shape).to(dev), out.sampler->init_noise_sigma());
  }
  out.generator = std::move(gen);
  return out;
}

GeneratedImage SdPipeline::finish_image(const GenerationPlan& p, const Tensor& images01, int row, int64_t seed) const {
  const SdModel& m = *model_;
  const GenerateRequest& r = p.request;
  GeneratedImage g;
  g.seed = seed;
  g.image = image_from_tensor(images01, row);
  if (p.inpaint) g.image = p.inpaint->composite(g.image);
  g.infotext = build_infotext(r.prompt, r.negative_prompt, infotext_params(m, p, seed));
  GenerateRequest per_image = r;
  per_image.seed = seed;
  nlohmann::json settings = per_image.to_json();
  if (p.inpaint && r.mask.empty()) r.add_inpaint_settings(settings);  // an uploaded mask: no path to_json would show
  g.info = {{"settings", settings}, {"sampler", p.sampler_name}, {"schedule", p.schedule_name},
            {"model", {{"name", m.name}, {"hash", m.hash}, {"path", m.path}, {"family", sd_family_name(m.family)},
                       {"prediction", prediction_name(m.prediction)}}},
            {"device", m.unet->device().str()}, {"infotext", g.infotext}};
  return g;
}

Expected<GenerateResult> SdPipeline::generate(const GenerateRequest& request, const ProgressCallback& progress) const {
  // This request's StageTimes come from its own ranges, recorded on this thread.
  GenerateResult result;
  const Expected<StageTimes> times = timed_stages([&]() -> Status {
    ATELIER_ASSIGN_OR_RETURN(GenerationPlan p, plan(request));
    const GenerateRequest& r = p.request;
    ATELIER_ASSIGN_OR_RETURN(Tensor cond1, encode_prompt(r.prompt, r.clip_skip, r.emphasis));
    Tensor uncond1;
    if (p.guided()) {
      ATELIER_ASSIGN_OR_RETURN(uncond1, encode_prompt(r.negative_prompt, r.clip_skip, r.emphasis));
    }
    const int bs = r.batch_size;
    const Tensor cond = ops::concat(std::vector<Tensor>(size_t(bs), cond1), 0);
    const Tensor uncond = uncond1.defined() ? ops::concat(std::vector<Tensor>(size_t(bs), uncond1), 0) : Tensor();
    for (int batch = 0; batch < r.batch_count; ++batch) {
      std::vector<PreparedSample> prepared;
      std::vector<sampling::Sampler*> samplers;
      std::vector<Tensor> rows;
      std::vector<KeptRegion> kept;
      for (int i = 0; i < bs; ++i) {
        ATELIER_ASSIGN_OR_RETURN(PreparedSample s, prepare_sample(p, batch * bs + i));
        samplers.push_back(s.sampler.get());
        rows.push_back(s.latents);
        if (p.inpaint) kept.push_back(s.kept);
        prepared.push_back(std::move(s));
      }
      Tensor x = ops::concat(rows, 0);
      {
        trace::Scope denoise_range(stage::kDenoise, Category::kStage, batch);
        ATELIER_ASSIGN_OR_RETURN(x, denoise(samplers, x, cond, uncond, r.cfg_scale, batch, progress, nullptr, kept));
      }
      const Tensor images = decode(x);
      trace::Scope encode_range(stage::kImageEncode, Category::kStage, batch);
      for (int i = 0; i < bs; ++i) result.images.push_back(finish_image(p, images, i, prepared[size_t(i)].seed));
    }
    return Status::ok();
  });
  if (!times) return times.status();
  result.set_times(*times);
  return result;
}

}  // namespace atelier
