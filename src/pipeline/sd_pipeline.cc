#include "pipeline/sd_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>

#include "backend/ops.h"
#include "io/infotext.h"
#include "pipeline/init_image.h"
#include "pipeline/sd_batch.h"
#include "sampling/sampler_names.h"
#include "tokenizers/prompt_weights.h"

namespace atelier {
namespace {

using trace::Category;

constexpr uint32_t kRandomSeedRange = 0xffffffffu;  // A1111 draws random seeds below 2^32

}  // namespace

nlohmann::json StageTimes::to_json() const {
  double mean_call = 0;
  for (double c : call_ms) mean_call += c;
  if (!call_ms.empty()) mean_call /= double(call_ms.size());
  return {{"text_encode_s", text_encode_s}, {"denoise_s", denoise_s}, {"vae_s", vae_s},
          {"image_encode_s", image_encode_s}, {"total_s", total_s}, {"model_calls", call_ms.size()},
          {"mean_call_ms", mean_call}};
}

StageTimes StageTimes::from_events(const std::vector<trace::Event>& events) {
  StageTimes t;
  t.text_encode_s = trace::total_seconds(events, stage::kTextEncode);
  t.denoise_s = trace::total_seconds(events, stage::kDenoise);
  t.vae_s = trace::total_seconds(events, stage::kVaeDecode) + trace::total_seconds(events, stage::kVaeEncode);
  t.image_encode_s = trace::total_seconds(events, stage::kImageEncode);
  t.total_s = trace::total_seconds(events, stage::kGenerate);
  for (const trace::Event* e : trace::named(events, stage::kModelCall)) t.call_ms.push_back(e->seconds() * 1e3);
  return t;
}

void GenerateResult::set_times(const StageTimes& t) {
  times = t;
  for (GeneratedImage& g : images) g.info["timings"] = times.to_json();
}

Expected<StageTimes> timed_stages(const std::function<Status()>& body) {
  trace::Recorder stages(trace::kPipelineCategories);
  trace::ThreadAttach attach(stages);
  trace::Scope total(stage::kGenerate, Category::kStage);
  ATELIER_RETURN_IF_ERROR(catch_status(body));
  total.finish();
  return StageTimes::from_events(stages.events());
}

std::string a1111_sampler_name(const std::string& sampler) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"euler", "Euler"}, {"euler_a", "Euler a"}, {"heun", "Heun"}, {"ddim", "DDIM"},
      {"dpmpp_2m", "DPM++ 2M"}, {"dpmpp_2m_sde", "DPM++ 2M SDE"}, {"lcm", "LCM"}};
  for (auto& [ours, theirs] : kNames)
    if (sampler == ours) return theirs;
  return sampler;
}

std::string a1111_schedule_name(const std::string& schedule) {
  if (schedule == "karras") return "Karras";
  if (schedule == "exponential") return "Exponential";
  return "Automatic";
}

Expected<Tensor> SdPipeline::encode_prompt(const std::string& text, int clip_skip, bool emphasis) const {
  ATELIER_ASSIGN_OR_RETURN(std::vector<Tensor> one, encode_prompts({text}, clip_skip, emphasis));
  return one.front();
}

Expected<std::vector<Tensor>> SdPipeline::encode_prompts(const std::vector<std::string>& texts, int clip_skip,
                                                         bool emphasis) const {
  const SdModel& m = *model_;
  const Device dev = m.unet->device();
  trace::Scope range(stage::kTextEncode, Category::kStage);
  if (clip_skip > m.text_encoder->max_clip_skip())
    return invalid_argument("clip skip " + std::to_string(clip_skip) + " is more than this text encoder allows (" +
                            std::to_string(m.text_encoder->max_clip_skip()) + ")");
  std::vector<WeightedTokens> tokens;
  for (const std::string& text : texts) {
    if (!emphasis) {
      tokens.push_back({m.tokenizer->encode(text), {}});
      continue;
    }
    ATELIER_ASSIGN_OR_RETURN(auto chunks, parse_prompt_attention(text));
    tokens.push_back(encode_weighted(*m.tokenizer, chunks));
  }
  std::vector<Tensor> out(texts.size());
  std::vector<bool> done(texts.size(), false);
  for (size_t first = 0; first < texts.size(); ++first) {  // one call per token count, rows in text order
    if (done[first]) continue;
    const size_t len = tokens[first].ids.size();
    std::vector<size_t> rows;
    std::vector<int32_t> ids;
    for (size_t i = first; i < texts.size(); ++i)
      if (!done[i] && tokens[i].ids.size() == len) {
        rows.push_back(i);
        ids.insert(ids.end(), tokens[i].ids.begin(), tokens[i].ids.end());
        done[i] = true;
      }
    Tensor host_ids = Tensor::empty({int64_t(rows.size()), int64_t(len)}, DType::I32);
    std::memcpy(host_ids.raw(), ids.data(), ids.size() * sizeof(int32_t));
    // Host ids: the encoder checks them there and its recorded calls copy them in (no round trip through the device).
    ATELIER_ASSIGN_OR_RETURN(Tensor hidden, m.text_encoder->forward(host_ids, clip_skip));
    for (size_t r = 0; r < rows.size(); ++r) {
      Tensor row = hidden.narrow(0, int64_t(r), 1);
      const std::vector<float>& w = tokens[rows[r]].weights;
      // A prompt without (word:weight) markup has every weight 1, where A1111's rescaling is the identity:
      // skipping it is exact and spares a device-to-host copy of the hidden states.
      if (emphasis && std::any_of(w.begin(), w.end(), [](float v) { return v != 1.0f; })) {
        Tensor weights = Tensor::from_vector(w, {1, int64_t(w.size())}).to(dev);
        ATELIER_ASSIGN_OR_RETURN(row, apply_emphasis(row, weights));
      }
      out[rows[r]] = row;
    }
  }
  return out;
}

Expected<Tensor> SdPipeline::denoise(const std::vector<sampling::Sampler*>& samplers, Tensor x, const Tensor& cond,
                                     const Tensor& uncond, float cfg_scale, int batch_index,
                                     const ProgressCallback& progress, StageTimes* times,
                                     const std::vector<KeptRegion>& kept) const {
  const UNet& unet = *model_->unet;
  const int64_t batch = x.size(0);
  ATELIER_CHECK(int64_t(samplers.size()) == batch, "denoise: one sampler per latent row");
  ATELIER_CHECK(cond.size(0) == batch && (cfg_scale <= 1.0f || uncond.size(0) == batch),
                "denoise: one conditioning row per latent row");
  ATELIER_CHECK(kept.empty() || int64_t(kept.size()) == batch, "denoise: no kept region, or one per latent row");
  // The request's samples as one batch of the step-level batcher (pipeline/sd_batch.h).
  std::vector<DenoiseSample> samples(static_cast<size_t>(batch));
  std::vector<DenoiseSample*> ptrs;
  // With CFG, the cond rows and then the uncond rows of one buffer, made once: the batch step stacks a call's
  // context from consecutive rows without a copy, where separate buffers cost a concatenation every step.
  const bool guided = cfg_scale > 1.0f;
  const bool one_buffer = guided && cond.shape() == uncond.shape() && cond.dtype() == uncond.dtype();
  const Tensor contexts = one_buffer ? ops::concat({cond, uncond}, 0) : cond;
  for (int64_t b = 0; b < batch; ++b) {
    DenoiseSample& d = samples[size_t(b)];
    d.sampler = samplers[size_t(b)];
    d.x = x.narrow(0, b, 1);
    d.cond = contexts.narrow(0, b, 1);
    if (guided) d.uncond = one_buffer ? contexts.narrow(0, batch + b, 1) : uncond.narrow(0, b, 1);
    d.cfg_scale = cfg_scale;
    if (!kept.empty()) d.kept = kept[size_t(b)];
    ptrs.push_back(&d);
  }
  const int total = samplers.front()->calls_remaining();
  // One call in flight ahead of the host: call n + 1 is enqueued before the host waits for call n, so the device
  // runs n + 1's first kernels right after n's last. Waiting after each call left the device idle ~0.2 ms per
  // step while the host prepared the next one (docs/performance.md, session 39). Progress is reported per
  // finished call, in order; a cancel takes effect one call later. ATELIER_SYNC_EACH_CALL=1: wait after each.
  Backend& backend = backend_for(x.device());
  const bool run_ahead = !sync_each_call();
  struct Finished {
    int call;
    Tensor x, denoised;
    uint64_t mark;  // the device has finished the call once it passes this
  };
  std::optional<Finished> in_flight;
  int64_t last_done_ns = trace::now_ns();
  const auto finish = [&](Finished& f) -> Status {
    backend.wait_for_mark(f.mark);
    const int64_t now = trace::now_ns();
    if (times) times->call_ms.push_back(double(now - last_done_ns) * 1e-6);  // from the previous call's end
    last_done_ns = now;
    if (progress && !progress({batch_index, f.call + 1, total, &f.x, f.denoised.defined() ? &f.denoised : nullptr}))
      return cancelled("generation cancelled");
    return Status::ok();
  };
  for (int call = 0; !samplers.front()->done(); ++call) {
    // One model call: the UNet (its own stage::kUnet range) and the sampler update (stage::kSamplerStep), both
    // opened inside denoise_batch_step; the range holds the enqueueing (its device span, where a device timer
    // runs, the call's device work).
    Finished f;
    {
      trace::Scope call_range(stage::kModelCall, Category::kCall, call);
      ATELIER_ASSIGN_OR_RETURN(BatchStepOutput step, denoise_batch_step(unet, ptrs, bool(progress)));
      f = {call, step.x, step.denoised, 0};
    }
    f.mark = backend.mark_queue();
    x = f.x;
    if (in_flight) ATELIER_RETURN_IF_ERROR(finish(*in_flight));
    in_flight = std::move(f);
    if (!run_ahead) {
      ATELIER_RETURN_IF_ERROR(finish(*in_flight));
      in_flight.reset();
    }
  }
  if (in_flight) ATELIER_RETURN_IF_ERROR(finish(*in_flight));
  if (kept.empty()) return x;
  std::vector<Tensor> rows;
  for (DenoiseSample& d : samples) {
    d.x = x.narrow(0, int64_t(rows.size()), 1);
    rows.push_back(final_latents(d));
  }
  return ops::concat(rows, 0);
}

Tensor SdPipeline::decode(const Tensor& latents) const {
  trace::Scope range(stage::kVaeDecode, Category::kStage);
  Tensor img = model_->vae->latents_to_image(latents);
  img = ops::affine(img, 0.5f, 0.5f);  // (image / 2 + 0.5).clamp(0, 1)
  img = ops::binary(img, Tensor::full({1}, 0.0f, img.device()), BinaryOp::kMax);
  img = ops::binary(img, Tensor::full({1}, 1.0f, img.device()), BinaryOp::kMin);
  backend_for(img.device()).synchronize();  // the range measures the work, not its launch
  return img;
}

Tensor SdPipeline::encode_image(const Tensor& image01, NoiseGenerator& gen) const {
  return vae_encode_sample(*model_->vae, image01, gen, model_->unet->device());
}

}  // namespace atelier
