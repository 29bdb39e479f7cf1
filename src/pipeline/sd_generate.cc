// SdPipeline::generate: a whole request (batch_count batches of batch_size images) through the stages.
#include <chrono>
#include <random>

#include "backend/ops.h"
#include "io/infotext.h"
#include "pipeline/image_resize.h"
#include "pipeline/sd_pipeline.h"
#include "sampling/sampler_names.h"

namespace atelier {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr uint32_t kMaxRandomSeed = 0xffffffffu;  // A1111 draws random seeds below 2^32

std::string trim_float(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

struct Plan {
  GenerateRequest req;             // with width/height and seed resolved
  sampling::SamplerSpec spec;
  std::string sampler_name;        // canonical (ours)
  std::string schedule_name;
  RngKind rng = RngKind::kCuda;
  Tensor init_image;               // [1, 3, H, W] in [0, 1] for img2img
};

Expected<Plan> make_plan(const SdModel& m, const GenerateRequest& r) {
  ATELIER_RETURN_IF_ERROR(r.validate());
  Plan p{r, {}, {}, {}, {}, {}};
  ATELIER_ASSIGN_OR_RETURN(auto spec, sampling::parse_sampler(r.sampler));
  ATELIER_ASSIGN_OR_RETURN(auto sched, sampling::parse_schedule(r.schedule));
  ATELIER_ASSIGN_OR_RETURN(p.spec, sampling::with_schedule(spec, sched));
  p.sampler_name = std::string(sampling::sampler_name(p.spec.kind));
  p.schedule_name = std::string(sampling::schedule_name(p.spec.schedule));
  ATELIER_ASSIGN_OR_RETURN(p.rng, parse_rng_kind(r.rng));
  if (!r.init_image.empty()) {
    ATELIER_ASSIGN_OR_RETURN(Image img, read_image(r.init_image));
    if (p.req.width == 0) p.req.width = img.width / kLatentFactor * kLatentFactor;
    if (p.req.height == 0) p.req.height = img.height / kLatentFactor * kLatentFactor;
    if (p.req.width < kLatentFactor || p.req.height < kLatentFactor)
      return invalid_argument("init image " + r.init_image + " is smaller than 8x8");
    p.init_image = tensor_from_image(resize_image(img, p.req.width, p.req.height));
  }
  if (p.req.width == 0) p.req.width = m.default_size;
  if (p.req.height == 0) p.req.height = m.default_size;
  if (p.req.seed < 0) p.req.seed = int64_t(std::random_device{}() % kMaxRandomSeed);
  if (p.req.clip_skip > m.text_encoder->max_clip_skip())
    return invalid_argument("clip skip " + std::to_string(p.req.clip_skip) + " is not supported by this model (at most " +
                            std::to_string(m.text_encoder->max_clip_skip()) + ")");
  return p;
}

InfotextParams infotext_params(const SdModel& m, const Plan& p, int64_t seed) {
  const GenerateRequest& r = p.req;
  InfotextParams kv = {{"Steps", std::to_string(r.steps)},
                       {"Sampler", a1111_sampler_name(p.sampler_name)},
                       {"Schedule type", a1111_schedule_name(p.schedule_name)},
                       {"CFG scale", trim_float(r.cfg_scale)},
                       {"Seed", std::to_string(seed)},
                       {"Size", std::to_string(r.width) + "x" + std::to_string(r.height)}};
  if (!m.hash.empty()) kv.push_back({"Model hash", m.hash});
  kv.push_back({"Model", m.name});
  if (p.init_image.defined()) kv.push_back({"Denoising strength", trim_float(r.strength)});
  if (r.clip_skip > 1) kv.push_back({"Clip skip", std::to_string(r.clip_skip)});
  if (p.rng == RngKind::kCpu) kv.push_back({"RNG", "CPU"});
  kv.push_back({"Version", std::string("atelier ") + ATELIER_VERSION});
  return kv;
}

}  // namespace

Expected<GenerateResult> SdPipeline::generate(const GenerateRequest& request, const ProgressCallback& progress) const {
  const auto t_start = Clock::now();
  GenerateResult result;
  Status st = catch_status([&]() -> Status {
    const SdModel& m = *model_;
    const Device dev = m.unet->device();
    ATELIER_ASSIGN_OR_RETURN(Plan p, make_plan(m, request));
    const GenerateRequest& r = p.req;
    StageTimes& times = result.times;
    auto t0 = Clock::now();
    ATELIER_ASSIGN_OR_RETURN(Tensor cond1, encode_prompt(r.prompt, r.clip_skip, r.emphasis));
    Tensor uncond1;
    if (r.cfg_scale > 1.0f) {
      ATELIER_ASSIGN_OR_RETURN(uncond1, encode_prompt(r.negative_prompt, r.clip_skip, r.emphasis));
    }
    times.text_encode_s = since(t0);
    const int f = m.vae->config().downscale_factor();
    const Shape latent_shape = {1, m.unet->config().in_channels, r.height / f, r.width / f};
    nlohmann::json overrides = {{"prediction_type", m.prediction == Prediction::kV ? "v_prediction" : "epsilon"}};
    const int bs = r.batch_size;
    const Tensor cond = ops::concat(std::vector<Tensor>(size_t(bs), cond1), 0);
    const Tensor uncond = uncond1.defined() ? ops::concat(std::vector<Tensor>(size_t(bs), uncond1), 0) : Tensor();
    for (int batch = 0; batch < r.batch_count; ++batch) {
      std::vector<std::unique_ptr<sampling::Sampler>> owned;
      std::vector<sampling::Sampler*> samplers;
      std::vector<std::shared_ptr<NoiseGenerator>> gens;
      std::vector<Tensor> rows;
      std::vector<int64_t> seeds;
      t0 = Clock::now();
      for (int i = 0; i < bs; ++i) {
        const int64_t seed = r.seed + int64_t(batch) * bs + i;  // A1111: consecutive seeds per image
        seeds.push_back(seed);
        std::shared_ptr<NoiseGenerator> gen = make_generator(p.rng, uint64_t(seed));
        ATELIER_ASSIGN_OR_RETURN(auto s, sampling::make_sampler(m.scheduler_config, p.spec, r.steps, overrides));
        s->set_noise_source([gen, dev](const Shape& shape) { return randn_tensor(*gen, shape).to(dev); });
        if (p.init_image.defined()) {  // img2img: VAE sample, then the noise, from the same generator
          ATELIER_RETURN_IF_ERROR(s->set_strength(r.strength));
          const Tensor lat = encode_image(p.init_image, *gen);
          const Tensor noise = randn_tensor(*gen, latent_shape).to(dev);
          const sampling::NoiseRule rule = s->noise_rule();
          rows.push_back(ops::lincomb({lat, noise}, {rule.x0, rule.noise}));
        } else {
          rows.push_back(ops::affine(randn_tensor(*gen, latent_shape).to(dev), s->init_noise_sigma()));
        }
        gens.push_back(gen);
        samplers.push_back(s.get());
        owned.push_back(std::move(s));
      }
      if (p.init_image.defined()) times.vae_s += since(t0);
      t0 = Clock::now();
      Tensor x = ops::concat(rows, 0);
      ATELIER_ASSIGN_OR_RETURN(x, denoise(samplers, x, cond, uncond, r.cfg_scale, batch, progress, &times));
      times.denoise_s += since(t0);
      t0 = Clock::now();
      const Tensor images = decode(x);
      backend_for(dev).synchronize();
      times.vae_s += since(t0);
      t0 = Clock::now();
      for (int i = 0; i < bs; ++i) {
        GeneratedImage g;
        g.seed = seeds[size_t(i)];
        g.image = image_from_tensor(images, i);
        g.infotext = build_infotext(r.prompt, r.negative_prompt, infotext_params(m, p, g.seed));
        GenerateRequest per_image = r;
        per_image.seed = g.seed;
        g.info = {{"settings", per_image.to_json()}, {"sampler", p.sampler_name}, {"schedule", p.schedule_name},
                  {"model", {{"name", m.name}, {"hash", m.hash}, {"path", m.path}, {"family", sd_family_name(m.family)},
                             {"prediction", prediction_name(m.prediction)}}},
                  {"device", dev.str()}, {"infotext", g.infotext}};
        result.images.push_back(std::move(g));
      }
      times.image_encode_s += since(t0);
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  result.times.total_s = since(t_start);
  for (auto& g : result.images) g.info["timings"] = result.times.to_json();
  return result;
}

}  // namespace atelier
