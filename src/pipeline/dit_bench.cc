// run_dit_bench: build the random model, warm up through the pipeline's own loop, then one traced generation.
#include "pipeline/dit_bench.h"

#include <algorithm>
#include <cstdio>

#include "backend/nvml.h"
#include "backend/ops.h"
#include "pipeline/bench_sampler.h"
#include "core/rng.h"
#include "pipeline/flux_pipeline.h"
#include "pipeline/stage_names.h"
#include "pipeline/zimage_pipeline.h"

namespace atelier {
namespace {

using trace::Category;

constexpr int kDitSizeMultiple = 16;           // VAE factor 8 x patch 2 (both models)
constexpr uint64_t kConditioningSeed = 0xc0de;  // the conditioning's stream is not the noise's
constexpr const char* kSampler = "flow-match Euler";

// "11.90 B" for the full-size models, the exact count for reduced ones.
std::string param_count(int64_t n) {
  constexpr double kBillion = 1e9;
  if (n < int64_t(kBillion / 10)) return std::to_string(n);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f B", double(n) / kBillion);
  return buf;
}

// Seeded N(0, 1) conditioning of `shape` on `dev`, f32 (the transformers cast inputs to their dtype).
Tensor seeded(uint64_t seed, const Shape& shape, Device dev) {
  auto gen = make_generator(RngKind::kCpu, seed);
  return randn_tensor(*gen, shape).to(dev);
}

struct DitRun {
  BenchReport& report;
  const BenchOptions& o;
  const BuiltinDitConfig& config;
  Device dev;
  int64_t h = 0, w = 0;  // latent rows and columns
  bool cfg = false;
};

// Builds a random model through make(&params) inside the bench's load range, and puts the load time and the
// model's size and dtype in the report.
template <typename MakeModel>
auto load_random_model(DitRun& run, trace::Recorder& rec, const MakeModel& make) {
  int64_t params = 0;
  trace::Scope load_range(kBenchLoadRange, Category::kStage);
  auto model = make(&params);
  if (!model) return model;
  backend_for(run.dev).synchronize();
  load_range.finish();
  run.report.load_s = trace::total_seconds(rec.events(), kBenchLoadRange);
  run.report.model_kind = "random weights, transformer " + param_count(params) + " parameters in " +
                          std::string(dtype_name(default_model_dtype(run.dev))) +
                          (run.o.fp8 ? " (block projections in fp8 e4m3, per-row scales)" : "");
  return model;
}

// FLUX: warm-up calls and decode, then the timed generation through FluxPipeline's stages.
Status run_flux(DitRun& run, trace::Recorder& rec) {
  const BuiltinDitConfig& c = run.config;
  const BenchOptions& o = run.o;
  ATELIER_ASSIGN_OR_RETURN(auto model, load_random_model(run, rec, [&](int64_t* params) {
                             return make_random_flux_model(c, run.dev, o.seed, params, o.fp8);
                           }));
  const FluxPipeline pipe(model);
  const int64_t tokens = o.text_tokens > 0 ? o.text_tokens : c.text_tokens;
  const FluxPrompt cond{seeded(kConditioningSeed, {1, tokens, c.text_width}, run.dev),
                        seeded(kConditioningSeed + 1, {1, c.pooled_width}, run.dev)};
  const FluxPrompt uncond{seeded(kConditioningSeed + 2, {1, tokens, c.text_width}, run.dev),
                          seeded(kConditioningSeed + 3, {1, c.pooled_width}, run.dev)};
  run.report.conditioning = "seeded random T5 states " + shape_str(cond.t5.shape()) + " + CLIP pooled " +
                            shape_str(cond.pooled.shape()) + (run.cfg ? " (and a negative pair)" : "") +
                            "; the text encoders are not built";
  const int64_t channels = c.vae.latent_channels;
  auto noise = [&] {
    std::vector<Tensor> rows;
    for (int i = 0; i < o.batch; ++i)
      rows.push_back(flux_pack_latents(seeded(o.seed + uint64_t(i), {1, channels, run.h, run.w}, run.dev)));
    return ops::concat(rows, 0);
  };
  const FluxPrompt* neg = run.cfg ? &uncond : nullptr;
  if (o.warmup > 0) {
    trace::Scope range(kBenchWarmupRange, Category::kStage);
    ATELIER_ASSIGN_OR_RETURN(auto sched, pipe.make_scheduler(o.warmup, run.h, run.w));
    ATELIER_ASSIGN_OR_RETURN(Tensor x, pipe.denoise(sched, noise(), cond, neg, {o.guidance}, o.cfg_scale, run.h, run.w, 0, {}));
    ATELIER_RETURN_IF_ERROR(warm_up_decodes(run.dev, [&] {
      (void)pipe.decode(x, run.h, run.w);
      return Status::ok();
    }));
  }
  run.report.warmup_s = trace::total_seconds(rec.events(), kBenchWarmupRange);
  rec.clear();  // the figures are the timed run's alone
  TimedRunSampler mem{backend_for(run.dev)};
  const auto nvml = start_nvml_sampler(run.dev);
  trace::Scope range(kBenchRunRange, Category::kStage);
  ATELIER_ASSIGN_OR_RETURN(auto sched, pipe.make_scheduler(o.steps, run.h, run.w));
  Tensor x = noise();
  mem.sample();
  {
    trace::Scope denoise(stage::kDenoise, Category::kStage);
    ATELIER_ASSIGN_OR_RETURN(x, pipe.denoise(sched, x, cond, neg, {o.guidance}, o.cfg_scale, run.h, run.w, 0, mem.progress()));
  }
  (void)pipe.decode(x, run.h, run.w);  // synchronizes
  mem.sample();
  range.finish();
  mem.finish(run.report);
  finish_nvml_sampler(nvml.get(), run.report);
  return Status::ok();
}

// Z-Image: the same through ZImagePipeline's stages (one image per denoise call).
Status run_zimage(DitRun& run, trace::Recorder& rec) {
  const BuiltinDitConfig& c = run.config;
  const BenchOptions& o = run.o;
  ATELIER_ASSIGN_OR_RETURN(auto model, load_random_model(run, rec, [&](int64_t* params) {
                             return make_random_zimage_model(c, run.dev, o.seed, params, o.fp8);
                           }));
  const ZImagePipeline pipe(model);
  const int64_t tokens = o.text_tokens > 0 ? o.text_tokens : c.text_tokens;
  Tensor cond = seeded(kConditioningSeed, {tokens, c.text_width}, run.dev);
  const Tensor uncond = run.cfg ? seeded(kConditioningSeed + 2, {tokens, c.text_width}, run.dev) : Tensor();
  run.report.conditioning = "seeded random Qwen3 features " + shape_str(cond.shape()) +
                            (run.cfg ? " (and a negative set)" : "") + "; the text encoder is not built";
  // --text-encoder: Qwen3-4B with random weights in f32 (what ZImageLoadOptions gives it), encoding a prompt of
  // `tokens` ids (unpadded: what a real prompt of that length costs) whose features condition the transformer.
  std::optional<Qwen3Encoder> encoder;
  std::vector<int32_t> ids;
  const std::vector<int32_t> mask(static_cast<size_t>(tokens), 1);
  if (o.text_encoder && c.qwen3) {
    for (int64_t i = 0; i < tokens; ++i) ids.push_back(int32_t((i * 7919 + 13) % c.qwen3->vocab_size));
    trace::Scope load_range(kBenchLoadRange, Category::kStage);
    int64_t params = 0;
    ATELIER_ASSIGN_OR_RETURN(auto enc, make_random_qwen3_encoder(*c.qwen3, run.dev, DType::F32, o.seed + 1, &params));
    encoder.emplace(std::move(enc));
    backend_for(run.dev).synchronize();
    load_range.finish();
    run.report.load_s = trace::total_seconds(rec.events(), kBenchLoadRange);  // the transformer's and this
    run.report.conditioning = "Qwen3 text encoder (random weights, " + param_count(params) + " parameters in f32) on " +
                              std::to_string(tokens) + " prompt tokens, inside the timed run";
    run.report.model_kind += "; text encoder built";
  }
  const auto encode = [&]() -> Status {
    if (!encoder) return Status::ok();
    trace::Scope text(stage::kTextEncode, Category::kStage);
    ATELIER_ASSIGN_OR_RETURN(cond, encoder->encode_features(ids, mask));
    return Status::ok();
  };
  const Shape latent = {1, c.vae.latent_channels, run.h, run.w};
  const float guidance = run.cfg ? o.cfg_scale : 0.0f;
  if (o.warmup > 0) {
    trace::Scope range(kBenchWarmupRange, Category::kStage);
    ATELIER_RETURN_IF_ERROR(encode());
    ATELIER_ASSIGN_OR_RETURN(Tensor x, pipe.denoise(seeded(o.seed, latent, Device::cpu()), cond, uncond, guidance, o.warmup));
    ATELIER_RETURN_IF_ERROR(warm_up_decodes(run.dev, [&] { return pipe.decode(x).status(); }));
  }
  run.report.warmup_s = trace::total_seconds(rec.events(), kBenchWarmupRange);
  rec.clear();
  TimedRunSampler mem{backend_for(run.dev)};
  const auto nvml = start_nvml_sampler(run.dev);
  trace::Scope range(kBenchRunRange, Category::kStage);
  const Tensor noise = seeded(o.seed, latent, Device::cpu());
  mem.sample();
  ATELIER_RETURN_IF_ERROR(encode());
  ATELIER_ASSIGN_OR_RETURN(Tensor x, pipe.denoise(noise, cond, uncond, guidance, o.steps, nullptr, mem.progress()));
  ATELIER_ASSIGN_OR_RETURN(Tensor image, pipe.decode(x));
  backend_for(run.dev).synchronize();
  mem.sample();
  range.finish();
  mem.finish(run.report);
  finish_nvml_sampler(nvml.get(), run.report);
  return Status::ok();
}

}  // namespace

bool is_dit_bench(const BenchOptions& o) { return is_builtin_dit_config(o.config); }

BenchOptions with_dit_defaults(BenchOptions o, bool steps_given, bool cfg_given) {
  auto c = builtin_dit_config(o.config);
  if (!c) return o;
  if (!steps_given) o.steps = c->default_steps;
  if (!cfg_given) o.cfg_scale = 1.0f;  // FLUX.1-dev: distilled guidance only; Z-Image-Turbo: turbo, no CFG
  return o;
}

Expected<BenchReport> run_dit_bench(const BenchOptions& o) {
  ATELIER_ASSIGN_OR_RETURN(BuiltinDitConfig c, builtin_dit_config(o.config));
  return run_dit_bench(o, c);
}

Expected<BenchReport> run_dit_bench(const BenchOptions& o, const BuiltinDitConfig& c) {
  if (!o.model.empty()) return invalid_argument("the transformer bench runs built-in configurations only (--config flux|zimage)");
  Device dev;
  ATELIER_ASSIGN_OR_RETURN(BenchReport r, start_bench_report(o, &dev));
  r.width = o.width ? o.width : c.default_size;
  r.height = o.height ? o.height : c.default_size;
  if (r.width % kDitSizeMultiple || r.height % kDitSizeMultiple)
    return invalid_argument(c.name + ": width and height must be multiples of 16, got " + std::to_string(r.width) + "x" +
                            std::to_string(r.height));
  if (c.zimage && o.batch != 1) return invalid_argument("zimage: the bench runs one image per batch (--batch 1)");
  DitRun run{r, o, c, dev};
  run.cfg = o.cfg_scale > 1.0f;
  const int f = c.vae.downscale_factor();
  run.h = r.height / f;
  run.w = r.width / f;
  r.model = "builtin:" + c.name;
  r.model_call = "transformer";
  r.batch = o.batch;
  r.unet_batch = run.cfg ? 2 * o.batch : o.batch;
  r.steps = o.steps;
  r.warmup = o.warmup;
  r.cfg_scale = run.cfg ? o.cfg_scale : 0.0f;
  char guidance[32];
  std::snprintf(guidance, sizeof(guidance), ", guidance %g", o.guidance);
  r.sampler = c.flux ? std::string(kSampler) + guidance : std::string(kSampler);
  Status st = run_traced(dev, [&](trace::Recorder& rec) -> Status {
    ATELIER_ASSIGN_OR_RETURN(std::unique_ptr<KernelTracer> tracer, open_bench_tracer(o));
    ATELIER_RETURN_IF_ERROR(c.flux ? run_flux(run, rec) : run_zimage(run, rec));
    backend_for(dev).synchronize();
    ATELIER_RETURN_IF_ERROR(add_traced_kernels(tracer.get(), rec));
    rec.resolve_device_times();
    summarize_bench(rec.events(), rec.origin_ns(), stage::kModelCall, o.text_encoder, r);
    r.ran = true;
    return Status::ok();
  });
  if (!st.is_ok())
    return Status(st.code(), "bench " + c.name + " on " + dev.str() + " at " + std::to_string(r.width) + "x" +
                                 std::to_string(r.height) + ": " + st.message());
  return r;
}

Expected<BenchReport> run_bench(const BenchOptions& o) { return is_dit_bench(o) ? run_dit_bench(o) : run_sd_bench(o); }

}  // namespace atelier
