// ZImagePipeline: text encoding, the flow-matching loop, VAE decode and whole requests (loading:
// zimage_model.cc).
#include "pipeline/zimage_pipeline.h"

#include <random>

#include "backend/ops.h"
#include "io/infotext.h"
#include "pipeline/init_image.h"
#include "sampling/sampler.h"
#include "tokenizers/chat_template.h"

namespace atelier {
namespace {

using trace::Category;

constexpr int kDefaultSize = 1024;            // ZImagePipeline's default height and width
constexpr int kSizeMultiple = 16;             // vae_scale_factor * 2: latents must split into 2x2 patches
constexpr uint32_t kMaxRandomSeed = 0xffffffffu;
constexpr float kTimestepScale = 1000.0f;     // t = (1000 - timestep) / 1000


std::string trim_float(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

Expected<QwenEncoding> ZImagePipeline::tokenize(const std::string& prompt) const {
  const ZImageModel& m = *model_;
  const std::string& tmpl = m.tokenizer.chat_template();
  auto rendered = apply_chat_template(tmpl, prompt, m.enable_thinking);
  if (!rendered && !(rendered.status().code() == ErrorCode::kUnsupported && is_chatml_template(tmpl))) return rendered.status();
  // Qwen3's full template needs more Jinja than the subset; for one user message it renders plain ChatML.
  const std::string text = rendered ? *rendered : chatml_user_prompt(prompt, m.enable_thinking);
  return m.tokenizer.encode(text, m.max_sequence_length);
}

Expected<std::vector<Tensor>> ZImagePipeline::encode_prompts(const std::vector<std::string>& prompts) const {
  trace::Scope range(stage::kTextEncode, Category::kStage);
  std::vector<QwenEncoding> encodings;
  for (const std::string& p : prompts) {
    ATELIER_ASSIGN_OR_RETURN(auto e, tokenize(p));
    encodings.push_back(std::move(e));
  }
  std::vector<Tensor> features;
  // One use of the encoder for all of them: with offload it is loaded (and dropped) once per request.
  ATELIER_RETURN_IF_ERROR(model_->text_encoder->with_encoder([&](const Qwen3Encoder& enc) -> Status {
    for (const QwenEncoding& e : encodings) {
      ATELIER_ASSIGN_OR_RETURN(auto f, enc.encode_features(e.ids, e.mask));
      features.push_back(std::move(f));
    }
    return Status::ok();
  }));
  return features;
}

Expected<Tensor> ZImagePipeline::encode_prompt(const std::string& prompt) const {
  ATELIER_ASSIGN_OR_RETURN(auto features, encode_prompts({prompt}));
  return features[0];
}

Expected<sampling::FlowMatchEuler> ZImagePipeline::make_scheduler(int steps, int64_t h, int64_t w) const {
  const ZImageModel& m = *model_;
  // The sigmas ZImagePipeline hands the scheduler: linspace(1, 1/steps, steps), as FLUX's.
  sampling::FlowMatchPlanOptions po;
  po.sigmas = sampling::flux_sigmas(steps);
  if (m.scheduler.use_dynamic_shifting) po.mu = sampling::flow_match_mu(m.scheduler, (h / 2) * (w / 2));
  return sampling::FlowMatchEuler::create(m.scheduler, steps, po);
}

Expected<Tensor> ZImagePipeline::denoise(const Tensor& start, const Tensor& cond, const Tensor& uncond, float guidance,
                                         int steps, ZImageRunTrace* trace, const ProgressCallback& progress,
                                         int begin_index, const FlowInpaintRow& inpaint) const {
  const ZImageModel& m = *model_;
  const bool cfg = guidance > 1.0f;  // diffusers: do_classifier_free_guidance = guidance_scale > 1
  if (start.dim() != 4 || start.size(0) != 1)
    return invalid_argument("Z-Image: the start latents must be [1, C, h, w], got " + shape_str(start.shape()));
  if (cfg && !uncond.defined()) return invalid_argument("Z-Image: guidance > 1 needs the negative prompt's features");
  ATELIER_ASSIGN_OR_RETURN(auto sched, make_scheduler(steps, start.size(2), start.size(3)));
  if (begin_index != 0) ATELIER_RETURN_IF_ERROR(sched.set_begin_index(begin_index));
  if (trace) {
    trace->sigmas = sched.sigmas();
    trace->timesteps = sched.timesteps();
  }
  trace::Scope range(stage::kDenoise, Category::kStage);
  return catch_expected<Tensor>([&]() -> Expected<Tensor> {
    Tensor x = ops::contiguous(start.to(m.transformer->device()));
    std::vector<FlowInpaintRow> blend;  // beside x (the VAE may live on another device)
    if (inpaint.defined()) {
      blend.push_back(inpaint);
      for (Tensor* t : {&blend[0].mask, &blend[0].image_latents, &blend[0].noise}) *t = t->to(m.transformer->device());
    }
    const int total = sched.num_inference_steps() - sched.step_index();
    for (int i = 0; !sched.done(); ++i) {
      trace::Scope call(stage::kModelCall, Category::kCall, i);
      const float t = (kTimestepScale - sched.timestep()) / kTimestepScale;
      const Tensor frames = x.select(0, 0).unsqueeze(1);  // [C, 1, h, w]: one frame
      ATELIER_ASSIGN_OR_RETURN(Tensor pred, m.transformer->forward(frames, t, cond));
      if (cfg) {
        ATELIER_ASSIGN_OR_RETURN(Tensor neg, m.transformer->forward(frames, t, uncond));
        pred = ops::add(pred, ops::affine(ops::sub(pred, neg), guidance));  // pos + g * (pos - neg)
      }
      const Tensor velocity = ops::affine(pred.squeeze(1).unsqueeze(0), -1.0f);  // the scheduler wants -output
      x = blend_flow_inpaint(sched.step(x, velocity), blend, sched);
      if (trace) trace->latents_per_step.push_back(x);
      if (progress) {
        StepProgress p;
        p.call = i + 1;
        p.total_calls = total;
        p.latents = &x;
        if (!progress(p)) return cancelled("Z-Image: cancelled at step " + std::to_string(i + 1));
      }
    }
    backend_for(x.device()).synchronize();  // the stage ends with its device work (as FluxPipeline::denoise)
    return x;
  });
}

Expected<Tensor> ZImagePipeline::decode(const Tensor& latents) const {
  trace::Scope range(stage::kVaeDecode, Category::kStage);
  return catch_expected<Tensor>([&]() -> Expected<Tensor> {
    Tensor img = model_->vae->latents_to_image(latents.to(model_->vae->device()));
    img = ops::affine(img, 0.5f, 0.5f);  // (image / 2 + 0.5).clamp(0, 1)
    img = ops::binary(img, Tensor::full({1}, 0.0f, img.device()), BinaryOp::kMax);
    return ops::binary(img, Tensor::full({1}, 1.0f, img.device()), BinaryOp::kMin);
  });
}

Expected<Tensor> ZImagePipeline::start_latents(const Tensor& init, NoiseGenerator& gen, const Shape& shape, int steps,
                                               int begin, FlowInpaintRow* inpaint) const {
  if (!init.defined()) return randn_tensor(gen, shape);
  return catch_expected<Tensor>([&]() -> Expected<Tensor> {
    const Vae& vae = *model_->vae;
    const Tensor x0 = ops::cast(vae_encode_sample(vae, init, gen, vae.device()), DType::F32);  // the sample, then the noise
    const Tensor noise = randn_tensor(gen, shape).to(vae.device());
    ATELIER_ASSIGN_OR_RETURN(auto sched, make_scheduler(steps, shape[2], shape[3]));
    ATELIER_RETURN_IF_ERROR(sched.set_begin_index(begin));
    if (inpaint) inpaint->image_latents = x0, inpaint->noise = noise;
    return sched.scale_noise(x0, noise);
  });
}

Expected<GenerateResult> ZImagePipeline::generate(const GenerateRequest& request, const ProgressCallback& progress,
                                                  const Image* init_image, const Image* mask) const {
  const ZImageModel& m = *model_;
  GenerateRequest r = request;
  ATELIER_RETURN_IF_ERROR(r.validate());
  // img2img: [1, 3, H, W] in [0, 1] at the request's size, which is the image's unless given.
  ATELIER_ASSIGN_OR_RETURN(const Tensor init, request_init_image(r, init_image, kSizeMultiple));
  Image loaded_mask;
  ATELIER_ASSIGN_OR_RETURN(mask, request_mask(r, mask, init.defined(), loaded_mask));
  if (r.width == 0) r.width = kDefaultSize;
  if (r.height == 0) r.height = kDefaultSize;
  if (r.width % kSizeMultiple || r.height % kSizeMultiple)
    return invalid_argument("Z-Image: width and height must be multiples of 16, got " + std::to_string(r.width) + "x" +
                            std::to_string(r.height));
  const int begin = init.defined() ? r.steps - sampling::img2img_steps(r.steps, r.strength) : 0;
  ATELIER_ASSIGN_OR_RETURN(RngKind rng, parse_rng_kind(r.rng));
  if (r.seed < 0) r.seed = int64_t(std::random_device{}() % kMaxRandomSeed);
  const bool cfg = r.cfg_scale > 1.0f;
  GenerateResult result;
  // Ops throw atelier::Error on bad input; the request gets it back as a Status.
  const Expected<StageTimes> times = timed_stages([&]() -> Status {
    std::vector<std::string> prompts{r.prompt};
    if (cfg) prompts.push_back(r.negative_prompt);
    ATELIER_ASSIGN_OR_RETURN(auto features, encode_prompts(prompts));
    const Tensor cond = features[0];
    const Tensor uncond = cfg ? features[1] : Tensor();
    const Shape latent_shape = {1, m.transformer->config().in_channels, r.height / kLatentFactor, r.width / kLatentFactor};
    const Tensor latent_mask =  // inpainting: one mask for every image
        mask ? binarized_latent_mask(*mask, r.width, r.height, latent_shape[2], latent_shape[3], latent_shape[1]) : Tensor();
    const int count = r.batch_size * r.batch_count;
    for (int i = 0; i < count; ++i) {
      const int64_t seed = r.seed + i;  // A1111: consecutive seeds
      auto gen = make_generator(rng, uint64_t(seed));
      FlowInpaintRow inpaint;
      ATELIER_ASSIGN_OR_RETURN(const Tensor start,
                               start_latents(init, *gen, latent_shape, r.steps, begin, mask ? &inpaint : nullptr));
      if (mask) inpaint.mask = latent_mask;
      auto per_step = [&](const StepProgress& p) {
        if (!progress) return true;
        StepProgress q = p;
        q.batch_index = i;
        return progress(q);
      };
      ATELIER_ASSIGN_OR_RETURN(Tensor latents,
                               denoise(start, cond, uncond, r.cfg_scale, r.steps, nullptr, per_step, begin, inpaint));
      ATELIER_ASSIGN_OR_RETURN(Tensor image, decode(latents));
      trace::Scope encode_range(stage::kImageEncode, Category::kStage, i);
      GeneratedImage g;
      g.seed = seed;
      g.image = image_from_tensor(image, 0);
      InfotextParams kv = {{"Steps", std::to_string(r.steps)}, {"Sampler", "Euler"}, {"Schedule type", "Simple"},
                           {"CFG scale", trim_float(r.cfg_scale)}, {"Shift", trim_float(m.scheduler.shift)},
                           {"Seed", std::to_string(seed)}, {"Size", std::to_string(r.width) + "x" + std::to_string(r.height)},
                           {"Model", m.name}};
      if (init.defined()) kv.push_back({"Denoising strength", trim_float(r.strength)});
      if (rng == RngKind::kCpu) kv.push_back({"RNG", "CPU"});
      kv.push_back({"Version", std::string("atelier ") + ATELIER_VERSION});
      g.infotext = build_infotext(r.prompt, cfg ? r.negative_prompt : "", kv);
      GenerateRequest per_image = r;
      per_image.seed = seed;
      g.info = {{"settings", per_image.to_json()}, {"sampler", "flow_match_euler"}, {"schedule", "simple"},
                {"model", {{"name", m.name}, {"path", m.path}, {"family", "zimage"}, {"layout", m.layout}}},
                {"device", m.transformer->device().str()}, {"infotext", g.infotext}};
      if (mask) g.info["inpainting"] = "FluxInpaintPipeline's semantics";
      result.images.push_back(std::move(g));
    }
    return Status::ok();
  });
  if (!times) return times.status();
  result.set_times(*times);
  return result;
}

}  // namespace atelier
