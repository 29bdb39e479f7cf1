#include "pipeline/flux_pipeline.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "backend/ops.h"
#include "io/infotext.h"
#include "pipeline/init_image.h"
#include "sampling/sampler.h"

namespace atelier {

namespace {

using trace::Category;

constexpr uint32_t kMaxRandomSeed = 0xffffffffu;  // as the SD pipeline: random seeds below 2^32
constexpr int kPatch = 2;                         // 2x2 latent packing
constexpr float kTimestepDivisor = 1000.0f;       // the pipeline passes t / 1000
constexpr int kMaxSequenceLength = 4096;
constexpr float kMaxGuidance = 100.0f;

std::string trim_float(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// Whether a request runs classifier-free guidance: only at a cfg_scale the caller gave (FluxOptions::cfg_explicit;
// FLUX.1-dev's own guidance is the embedded `guidance`) and above 1.
bool runs_cfg(const GenerateRequest& r, const FluxOptions& o) { return o.cfg_explicit && r.cfg_scale > 1.0f; }

// ids -> host i32 [1, n]
Tensor ids_tensor(const std::vector<int32_t>& ids) {
  Tensor t = Tensor::empty({1, int64_t(ids.size())}, DType::I32);
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  return t;
}

// Repeats a [1, ...] tensor b times along dim 0.
Tensor repeat_rows(const Tensor& t, int b) { return b == 1 ? t : ops::concat(std::vector<Tensor>(size_t(b), t), 0); }

InfotextParams infotext_params(const FluxModel& m, const GenerateRequest& r, const FluxOptions& o, int64_t seed, bool cfg,
                               bool img2img) {
  InfotextParams kv = {{"Steps", std::to_string(r.steps)},
                       {"Sampler", "Euler"},
                       {"Schedule type", "Simple"},
                       {"CFG scale", cfg ? trim_float(r.cfg_scale) : "1"},
                       {"Distilled CFG Scale", trim_float(o.guidance)},
                       {"Seed", std::to_string(seed)},
                       {"Size", std::to_string(r.width) + "x" + std::to_string(r.height)}};
  if (!m.hash.empty()) kv.push_back({"Model hash", m.hash});
  kv.push_back({"Model", m.name});
  if (img2img) kv.push_back({"Denoising strength", trim_float(r.strength)});
  if (r.rng == "cpu") kv.push_back({"RNG", "CPU"});
  kv.push_back({"Version", std::string("atelier ") + ATELIER_VERSION});
  return kv;
}

}  // namespace

Status FluxOptions::validate() const {
  if (!std::isfinite(guidance) || guidance < 0 || guidance > kMaxGuidance) {
    return invalid_argument("guidance must be a number from 0 to 100");
  }
  if (max_sequence_length < 1 || max_sequence_length > kMaxSequenceLength) {
    return invalid_argument("max sequence length must be from 1 to " + std::to_string(kMaxSequenceLength));
  }
  return Status::ok();
}

nlohmann::json FluxOptions::to_json() const {
  return {{"guidance", guidance}, {"max_sequence_length", max_sequence_length}, {"cfg_explicit", cfg_explicit}};
}

Tensor flux_pack_latents(const Tensor& x) {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const Tensor v = ops::contiguous(x).reshape({b, c, h / kPatch, kPatch, w / kPatch, kPatch});
  return ops::contiguous(v.permute({0, 2, 4, 1, 3, 5})).reshape({b, (h / kPatch) * (w / kPatch), c * kPatch * kPatch});
}

Tensor flux_unpack_latents(const Tensor& p, int64_t h, int64_t w) {
  const int64_t b = p.size(0), c = p.size(2) / (kPatch * kPatch);
  const Tensor v = ops::contiguous(p).reshape({b, h / kPatch, w / kPatch, c, kPatch, kPatch});
  return ops::contiguous(v.permute({0, 3, 1, 4, 2, 5})).reshape({b, c, h, w});
}

Tensor flux_image_ids(int64_t h, int64_t w) {
  const int64_t rows = h / kPatch, cols = w / kPatch;
  std::vector<float> ids(size_t(rows * cols * 3), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ids[size_t((r * cols + c) * 3 + 1)] = float(r);
      ids[size_t((r * cols + c) * 3 + 2)] = float(c);
    }
  }
  return Tensor::from_vector(ids, {rows * cols, 3});
}

Expected<FluxPrompt> FluxPipeline::encode_prompt(const std::string& text, int max_sequence_length) const {
  trace::Scope range(stage::kTextEncode, Category::kStage);
  const FluxModel& m = *model_;
  FluxPrompt p;
  const Tensor cid = ids_tensor(m.clip_tokenizer->encode(text));
  ClipPooledOptions po;
  po.project = false;  // CLIPTextModel's pooler_output: no projection
  ATELIER_ASSIGN_OR_RETURN(auto clip_out, m.clip->forward_with_pooled(cid, po));
  p.pooled = clip_out.pooled;
  const Tensor tid = ids_tensor(m.t5_tokenizer->encode(text, max_sequence_length));
  ATELIER_ASSIGN_OR_RETURN(p.t5, m.t5->forward(tid));
  return p;
}

struct FluxPipeline::EncodedItem {
  GenerateRequest r;  // resolved
  FluxOptions o;
  bool cfg = false;
  FluxPrompt cond, uncond;
  Tensor init;  // img2img: the init image [1, 3, H, W] in [0, 1] at the request's size (host); undefined for txt2img
  Tensor mask;  // inpainting: binarized_latent_mask [1, C, h, w] (host); undefined otherwise
};

Status FluxPipeline::encode_items(std::vector<EncodedItem>& items) const {
  FluxModel& m = *model_;
  std::lock_guard<std::mutex> lock(*m.text_mu);
  if ((!m.clip || !m.t5) && m.load_text_encoders) {
    trace::Scope range("load_text_encoders", Category::kStage);
    ATELIER_RETURN_IF_ERROR(m.load_text_encoders(m));
  }
  if (!m.clip || !m.t5) return internal_error("FLUX: the text encoders are not loaded");
  std::map<std::pair<std::string, int>, FluxPrompt> seen;  // (text, T5 length) -> its encoding
  auto encode = [&](const std::string& text, int length) -> Expected<FluxPrompt> {
    auto it = seen.find({text, length});
    if (it != seen.end()) return it->second;
    ATELIER_ASSIGN_OR_RETURN(FluxPrompt p, encode_prompt(text, length));
    return seen.emplace(std::pair{text, length}, p).first->second;
  };
  for (EncodedItem& item : items) {
    ATELIER_ASSIGN_OR_RETURN(item.cond, encode(item.r.prompt, item.o.max_sequence_length));
    if (item.cfg) {
      ATELIER_ASSIGN_OR_RETURN(item.uncond, encode(item.r.negative_prompt, item.o.max_sequence_length));
    }
  }
  if (m.offload_text_encoders) {  // the prompts' states stay on the device; the encoders' weights go
    const Device dev = m.t5->device();
    m.clip.reset();
    m.t5.reset();
    backend_for(dev).release_cached();
  }
  return Status::ok();
}

Expected<sampling::FlowMatchEuler> FluxPipeline::make_scheduler(int steps, int64_t h, int64_t w) const {
  sampling::FlowMatchPlanOptions o;
  o.sigmas = sampling::flux_sigmas(steps);
  o.mu = sampling::flow_match_mu(model_->scheduler, (h / kPatch) * (w / kPatch));
  return sampling::FlowMatchEuler::create(model_->scheduler, steps, o);
}

Expected<Tensor> FluxPipeline::denoise(sampling::FlowMatchEuler& s, Tensor x, const FluxPrompt& cond,
                                       const FluxPrompt* uncond, const std::vector<float>& guidance, float cfg_scale,
                                       int64_t h, int64_t w, int batch_index, const ProgressCallback& progress,
                                       const std::vector<FluxInpaintRow>& inpaint) const {
  const FluxTransformer& tr = *model_->transformer;
  const Device dev = tr.device();
  const int b = int(x.size(0));
  const auto rows_ok = [b](int64_t n) { return n == 1 || n == b; };
  if (!rows_ok(int64_t(guidance.size())) || !rows_ok(cond.t5.size(0)) || !rows_ok(cond.pooled.size(0)) ||
      (uncond && (!rows_ok(uncond->t5.size(0)) || !rows_ok(uncond->pooled.size(0))))) {
    return invalid_argument("FLUX denoise: guidance and prompts need one row or one per sample (" + std::to_string(b) + ")");
  }
  if (!inpaint.empty() && int64_t(inpaint.size()) != b) return invalid_argument("FLUX denoise: inpainting rows for every row");
  FluxInputs in;
  in.img_ids = flux_image_ids(h, w).to(dev);
  in.txt_ids = Tensor::zeros({cond.t5.size(1), 3}, DType::F32, dev);
  in.guidance = guidance.size() == 1 ? std::vector<float>(size_t(b), guidance[0]) : guidance;
  auto with_prompt = [&](FluxInputs i, const FluxPrompt& p) {
    i.encoder_hidden_states = p.t5.size(0) == b ? p.t5 : repeat_rows(p.t5, b);
    i.pooled = p.pooled.size(0) == b ? p.pooled : repeat_rows(p.pooled, b);
    return i;
  };
  const FluxInputs pos = with_prompt(in, cond);
  const FluxInputs neg = uncond ? with_prompt(in, *uncond) : FluxInputs{};
  const int total = s.num_inference_steps() - s.step_index();
  for (int call = 1; !s.done(); ++call) {
    trace::Scope call_range(stage::kModelCall, Category::kCall, call - 1);
    FluxInputs step = pos;
    step.hidden_states = x;
    step.timestep.assign(size_t(b), s.timestep() / kTimestepDivisor);
    ATELIER_ASSIGN_OR_RETURN(Tensor v, tr.forward(step));
    if (uncond) {
      FluxInputs nstep = neg;
      nstep.hidden_states = x;
      nstep.timestep = step.timestep;
      ATELIER_ASSIGN_OR_RETURN(Tensor vn, tr.forward(nstep));
      v = ops::add(vn, ops::affine(ops::sub(v, vn), cfg_scale));  // neg + cfg * (pos - neg)
    }
    x = s.step(x, v);
    x = blend_flow_inpaint(x, inpaint, s);
    if (progress) {
      StepProgress sp;
      sp.batch_index = batch_index;
      sp.call = call;
      sp.total_calls = total;
      sp.latents = &x;
      if (!progress(sp)) return cancelled("generation cancelled");
    }
  }
  // The denoise stage ends when its device work does: a replayed step returns before the GPU finishes it, and
  // the stage timings (trace, bench) would otherwise hand the last steps to the VAE decode.
  backend_for(x.device()).synchronize();
  return x;
}

Tensor FluxPipeline::decode(const Tensor& packed, int64_t h, int64_t w) const {
  trace::Scope range(stage::kVaeDecode, Category::kStage);
  Tensor img = model_->vae->latents_to_image(flux_unpack_latents(packed, h, w));
  img = ops::affine(img, 0.5f, 0.5f);  // (image / 2 + 0.5).clamp(0, 1)
  img = ops::binary(img, Tensor::full({1}, 0.0f, img.device()), BinaryOp::kMax);
  img = ops::binary(img, Tensor::full({1}, 1.0f, img.device()), BinaryOp::kMin);
  backend_for(img.device()).synchronize();
  return img;
}

Expected<FluxPipeline::EncodedItem> FluxPipeline::prepare(const GenerateRequest& request, const FluxOptions& options,
                                                          const Image* init_image, const Image* mask) const {
  const FluxModel& m = *model_;
  ATELIER_RETURN_IF_ERROR(request.validate());
  ATELIER_RETURN_IF_ERROR(options.validate());
  GenerateRequest r = request;
  EncodedItem item;
  if (r.width == 0) r.width = m.default_size;
  if (r.height == 0) r.height = m.default_size;
  if (r.width % kFluxSizeMultiple != 0 || r.height % kFluxSizeMultiple != 0) {
    return invalid_argument("FLUX image sides must be multiples of 16, got " + std::to_string(r.width) + "x" + std::to_string(r.height));
  }
  // The request's size (the model's by default, as FluxImg2ImgPipeline's 1024), not the image's: it is resized.
  ATELIER_ASSIGN_OR_RETURN(item.init, request_init_image(r, init_image, kFluxSizeMultiple));
  Image loaded_mask;
  ATELIER_ASSIGN_OR_RETURN(mask, request_mask(r, mask, item.init.defined(), loaded_mask));
  if (mask) {
    const int f = m.vae->config().downscale_factor();
    item.mask = binarized_latent_mask(*mask, r.width, r.height, r.height / f, r.width / f, m.vae->config().latent_channels);
  }
  if (r.seed < 0) r.seed = int64_t(std::random_device{}() % kMaxRandomSeed);
  ATELIER_RETURN_IF_ERROR(parse_rng_kind(r.rng).status());
  item.r = r, item.o = options, item.cfg = runs_cfg(r, options);
  return item;
}

bool FluxPipeline::batch_compatible(const FluxBatchItem& a, const FluxBatchItem& b) const {
  const int side = model_->default_size;
  const auto size = [side](int v) { return v == 0 ? side : v; };
  const auto cfg = [](const FluxBatchItem& i) { return runs_cfg(i.request, i.options); };
  // img2img rows share the scheduler's first step: one strength (the steps it leaves) for all or txt2img for all.
  const auto img2img = [](const FluxBatchItem& i) { return i.init_image != nullptr || !i.request.init_image.empty(); };
  return a.request.batch_count == 1 && b.request.batch_count == 1 && size(a.request.width) == size(b.request.width) &&
         size(a.request.height) == size(b.request.height) && a.request.steps == b.request.steps &&
         a.options.max_sequence_length == b.options.max_sequence_length && cfg(a) == cfg(b) &&
         (!cfg(a) || a.request.cfg_scale == b.request.cfg_scale) && img2img(a) == img2img(b) &&
         (!img2img(a) || a.request.strength == b.request.strength);
}

Status FluxPipeline::run_rows(const std::vector<EncodedItem>& items, int batch_index, const ProgressCallback& progress,
                              std::vector<std::vector<GeneratedImage>>& images) const {
  const FluxModel& m = *model_;
  const GenerateRequest& first = items.front().r;
  const bool cfg = items.front().cfg;
  const int f = m.vae->config().downscale_factor();
  const int64_t h = first.height / f, w = first.width / f;
  const int64_t channels = m.vae->config().latent_channels;
  const Device dev = m.transformer->device();
  // Rows in the items' order: noise from each image's seed, and its item's prompts and guidance.
  std::vector<Tensor> rows, t5, pooled, neg_t5, neg_pooled;
  std::vector<float> guidance;
  ATELIER_ASSIGN_OR_RETURN(auto sched, make_scheduler(first.steps, h, w));
  if (items.front().init.defined()) {  // batch_compatible: every item img2img at one strength
    ATELIER_RETURN_IF_ERROR(sched.set_begin_index(first.steps - sampling::img2img_steps(first.steps, first.strength)));
  }
  std::vector<FluxInpaintRow> inpaint;  // one per row when any item inpaints
  const bool inpainting = std::any_of(items.begin(), items.end(), [](const EncodedItem& i) { return i.mask.defined(); });
  for (const EncodedItem& item : items) {
    const int64_t seed0 = item.r.seed + int64_t(batch_index) * item.r.batch_size;
    ATELIER_ASSIGN_OR_RETURN(RngKind rng, parse_rng_kind(item.r.rng));
    for (int i = 0; i < item.r.batch_size; ++i) {
      auto gen = make_generator(rng, uint64_t(seed0 + i));
      Tensor latents;
      FluxInpaintRow row;
      if (item.init.defined()) {  // the VAE's sample, then the noise, from the image's generator
        const Tensor x0 = vae_encode_sample(*m.vae, item.init, *gen, dev);
        const Tensor noise = randn_tensor(*gen, {1, channels, h, w}).to(dev);
        latents = sched.scale_noise(x0, noise);
        if (item.mask.defined()) row = {flux_pack_latents(item.mask.to(dev)), flux_pack_latents(x0), flux_pack_latents(noise)};
      } else {
        latents = randn_tensor(*gen, {1, channels, h, w}).to(dev);
      }
      rows.push_back(flux_pack_latents(latents));
      if (inpainting) inpaint.push_back(row);
      t5.push_back(item.cond.t5), pooled.push_back(item.cond.pooled), guidance.push_back(item.o.guidance);
      if (cfg) neg_t5.push_back(item.uncond.t5), neg_pooled.push_back(item.uncond.pooled);
    }
  }
  // Every row's prompts stacked (a request's rows repeat its own), as denoise would repeat a one-row prompt.
  const FluxPrompt cond{ops::concat(t5, 0), ops::concat(pooled, 0)};
  const FluxPrompt uncond = cfg ? FluxPrompt{ops::concat(neg_t5, 0), ops::concat(neg_pooled, 0)} : FluxPrompt{};
  Tensor x;
  {
    trace::Scope denoise_range(stage::kDenoise, Category::kStage, batch_index);
    ATELIER_ASSIGN_OR_RETURN(x, denoise(sched, ops::concat(rows, 0), cond, cfg ? &uncond : nullptr, guidance,
                                        first.cfg_scale, h, w, batch_index, progress, inpaint));
  }
  const Tensor pixels = decode(x, h, w);
  trace::Scope encode_range(stage::kImageEncode, Category::kStage, batch_index);
  int row = 0;
  images.resize(items.size());
  for (size_t k = 0; k < items.size(); ++k) {
    const EncodedItem& item = items[k];
    for (int i = 0; i < item.r.batch_size; ++i, ++row) {
      const int64_t seed = item.r.seed + int64_t(batch_index) * item.r.batch_size + i;
      GeneratedImage g;
      g.seed = seed;
      g.image = image_from_tensor(pixels, row);
      g.infotext = build_infotext(item.r.prompt, item.r.negative_prompt, infotext_params(m, item.r, item.o, seed, cfg,
                                                                                             item.init.defined()));
      GenerateRequest per_image = item.r;
      per_image.seed = seed;
      g.info = {{"settings", per_image.to_json()}, {"flux", item.o.to_json()}, {"sampler", "flow_match_euler"},
                {"model", {{"name", m.name}, {"hash", m.hash}, {"path", m.path}, {"family", "flux"}, {"layout", m.layout}}},
                {"device", dev.str()}, {"infotext", g.infotext}};
      if (item.mask.defined()) g.info["inpainting"] = "FluxInpaintPipeline";
      images[k].push_back(std::move(g));
    }
  }
  return Status::ok();
}

Expected<GenerateResult> FluxPipeline::generate(const GenerateRequest& request, const FluxOptions& options,
                                                const ProgressCallback& progress, const Image* init_image,
                                                const Image* mask) const {
  std::vector<EncodedItem> items(1);
  ATELIER_ASSIGN_OR_RETURN(items[0], prepare(request, options, init_image, mask));
  const GenerateRequest& r = items[0].r;
  GenerateResult result;
  const Expected<StageTimes> times = timed_stages([&]() -> Status {
    ATELIER_RETURN_IF_ERROR(encode_items(items));
    for (int batch = 0; batch < r.batch_count; ++batch) {
      std::vector<std::vector<GeneratedImage>> images;
      ATELIER_RETURN_IF_ERROR(run_rows(items, batch, progress, images));
      for (auto& g : images[0]) result.images.push_back(std::move(g));
    }
    return Status::ok();
  });
  if (!times) return times.status();
  result.set_times(*times);
  return result;
}

Expected<std::vector<GenerateResult>> FluxPipeline::generate_batch(const std::vector<FluxBatchItem>& batch,
                                                                   const ProgressCallback& progress) const {
  if (batch.empty()) return invalid_argument("FLUX batch: no requests");
  std::vector<EncodedItem> items(batch.size());
  for (size_t k = 0; k < batch.size(); ++k) {
    if (!batch_compatible(batch[0], batch[k])) {
      return invalid_argument("FLUX batch: request " + std::to_string(k) +
                              " differs from the first in size, steps, T5 length, CFG, img2img strength or batch count");
    }
    ATELIER_ASSIGN_OR_RETURN(items[k], prepare(batch[k].request, batch[k].options, batch[k].init_image, batch[k].mask));
  }
  std::vector<std::vector<GeneratedImage>> images;
  const Expected<StageTimes> times = timed_stages([&]() -> Status {
    ATELIER_RETURN_IF_ERROR(encode_items(items));
    return run_rows(items, 0, progress, images);
  });
  if (!times) return times.status();
  std::vector<GenerateResult> results(items.size());
  for (size_t k = 0; k < items.size(); ++k) {
    results[k].images = std::move(images[k]);
    results[k].set_times(*times);
  }
  return results;
}

}  // namespace atelier
