// run_sd_bench: load (or build) the model, warm up, then one traced generation whose ranges give the figures.
#include "pipeline/sd_bench.h"

#include <algorithm>
#include <memory>

#include <omp.h>

#include "backend/nvml.h"
#include "backend/ops.h"
#include "core/rng.h"
#include "core/trace.h"
#include "pipeline/bench_sampler.h"
#include "pipeline/builtin_models.h"
#include "pipeline/request.h"
#include "pipeline/sd_pipeline.h"
#include "sampling/sampler.h"

namespace atelier {
namespace {

using trace::Category;

constexpr const char* kLoadRange = kBenchLoadRange;
constexpr const char* kWarmupRange = kBenchWarmupRange;
constexpr const char* kRunRange = kBenchRunRange;
constexpr double kPercent = 100.0;

struct Loaded {
  std::shared_ptr<SdModel> model;
  std::string label, kind;
  int64_t context_tokens = 77;
};

Expected<Loaded> load_model(const BenchOptions& o, Device dev) {
  trace::Scope range(kLoadRange, Category::kStage);
  Loaded l;
  if (!o.config.empty()) {
    ATELIER_ASSIGN_OR_RETURN(BuiltinSdConfig c, builtin_sd_config(o.config));
    ATELIER_ASSIGN_OR_RETURN(l.model, make_random_sd_model(c, dev, o.seed));
    l.label = "builtin:" + c.name;
    l.kind = "random weights";
    l.context_tokens = c.context_tokens;
    return l;
  }
  SdLoadOptions lo;
  lo.tokenizer_dir = o.tokenizer;
  lo.device = dev;
  lo.compute_hash = false;      // hashing a 2-4 GB file is not what a benchmark measures
  lo.require_tokenizer = false;  // a single file without one is benchmarked on random conditioning
  ATELIER_ASSIGN_OR_RETURN(l.model, load_sd_model(o.model, lo));
  l.label = o.model;
  l.kind = "checkpoint";
  return l;
}

// The conditioning rows: through the text encoder when the model has one, else seeded noise of CLIP's shape.
// -> {cond [B, S, D], uncond [B, S, D] or undefined without CFG}
Expected<std::pair<Tensor, Tensor>> conditioning(const SdPipeline& pipe, const Loaded& l, const BenchOptions& o,
                                                 Device dev) {
  const SdModel& m = *l.model;
  Tensor cond1, uncond1;
  const bool cfg = o.cfg_scale > 1.0f;
  if (m.text_encoder && m.tokenizer) {
    ATELIER_ASSIGN_OR_RETURN(cond1, pipe.encode_prompt(o.prompt, 1, false));
    if (cfg) {
      ATELIER_ASSIGN_OR_RETURN(uncond1, pipe.encode_prompt("", 1, false));
    }
  } else {
    auto gen = make_generator(RngKind::kCpu, o.seed);
    const Shape shape = {1, l.context_tokens, m.unet->config().cross_attention_dim[0]};
    cond1 = randn_tensor(*gen, shape).to(dev);
    if (cfg) uncond1 = randn_tensor(*gen, shape).to(dev);
  }
  auto rows = [&](const Tensor& t) { return t.defined() ? ops::concat(std::vector<Tensor>(size_t(o.batch), t), 0) : t; };
  return std::make_pair(rows(cond1), rows(uncond1));
}

struct Samplers {
  std::vector<std::unique_ptr<sampling::Sampler>> owned;
  std::vector<sampling::Sampler*> ptrs;
  std::vector<std::shared_ptr<NoiseGenerator>> gens;
};

// One sampler per image, as generate() makes them; initial latents [B, C, h, w] into *x.
Expected<Samplers> make_samplers(const SdModel& m, const BenchOptions& o, const Shape& latent1, Device dev, Tensor* x) {
  Samplers s;
  const nlohmann::json overrides = {{"prediction_type", m.prediction == Prediction::kV ? "v_prediction" : "epsilon"}};
  std::vector<Tensor> rows;
  for (int i = 0; i < o.batch; ++i) {
    auto gen = std::shared_ptr<NoiseGenerator>(make_generator(RngKind::kCpu, o.seed + uint64_t(i)));
    ATELIER_ASSIGN_OR_RETURN(auto smp, sampling::make_sampler(m.scheduler_config, o.sampler, o.steps, overrides));
    smp->set_noise_source([gen, dev](const Shape& shape) { return randn_tensor(*gen, shape).to(dev); });
    rows.push_back(ops::affine(randn_tensor(*gen, latent1).to(dev), smp->init_noise_sigma()));
    s.ptrs.push_back(smp.get());
    s.owned.push_back(std::move(smp));
    s.gens.push_back(gen);
  }
  *x = ops::concat(rows, 0);
  return s;
}

// Untimed UNet calls on the CFG batch's shapes (and one VAE decode), so the timed run finds the allocator's
// caches and lazily built state ready.
Status warm_up(const SdPipeline& pipe, const BenchOptions& o, const Tensor& x, const Tensor& context) {
  if (o.warmup <= 0) return Status::ok();
  trace::Scope range(kWarmupRange, Category::kStage);
  const UNet& unet = *pipe.model().unet;
  const Tensor x_in = context.size(0) == x.size(0) ? x : ops::concat({x, x}, 0);
  const Tensor t = Tensor::full({x_in.size(0)}, 500.0f).to(x.device());
  for (int i = 0; i < o.warmup; ++i) {
    ATELIER_ASSIGN_OR_RETURN(Tensor out, unet.forward(x_in, t, context));
    backend_for(x.device()).synchronize();
  }
  return warm_up_decodes(x.device(), [&] {
    (void)pipe.decode(x);
    return Status::ok();
  });
}

// The backend's cudaMalloc count, or -1 where it keeps none.
double malloc_count(Backend& backend) {
  for (const auto& [name, value] : backend.counters())
    if (name == "cuda_mallocs") return value;
  return -1.0;
}

// Shortest span given an energy figure: NVML's counter moves in steps ~100 ms apart (H200), so a span's two
// ends are each uncertain by part of a step; over 1 s that stays within a few percent (FLUX's 2 s loops read
// 50.8-53.1 J per step over five runs in session 18), over SD's 0.13 s loops it did not (2.1 to 4.7 J).
constexpr double kMinEnergySeconds = 1.0;

// The energy figures of `r` from its NVML samples: the denoise loop's device span [from_ns, to_ns] (host steady
// clock) and the timed run's range, each when it lasted kMinEnergySeconds or more.
void summarize_energy(const std::vector<trace::Event>& ev, int64_t from_ns, int64_t to_ns, BenchReport& r) {
  if (r.nvml_samples.empty()) return;
  r.mean_sm_clock_mhz = mean_sm_clock_mhz(r.nvml_samples, from_ns, to_ns);
  const auto energy = [&](int64_t a, int64_t b) {  // none for a span shorter than kMinEnergySeconds
    return double(b - a) * 1e-9 >= kMinEnergySeconds ? energy_between(r.nvml_samples, a, b) : std::nullopt;
  };
  const std::optional<double> loop_j = energy(from_ns, to_ns);
  if (loop_j && r.model_calls > 0) r.energy_per_call_j = *loop_j / r.model_calls;
  if (loop_j) r.mean_power_w = *loop_j / (double(to_ns - from_ns) * 1e-9);
  for (const trace::Event* e : trace::named(ev, kRunRange)) {
    const std::optional<double> run_j = energy(e->start_ns, e->start_ns + e->dur_ns);
    if (run_j && r.batch > 0) r.energy_per_image_j = *run_j / r.batch;
  }
}

}  // namespace

void summarize_bench(const std::vector<trace::Event>& ev, int64_t origin_ns, const char* call_range, bool has_text_encoder,
                     BenchReport& r) {
  for (const trace::Event* e : trace::named(ev, call_range)) {
    r.unet_ms.push_back(e->busy_seconds() * 1e3);  // device time where resolved: host time measures launches there
    r.unet_flops = std::max(r.unet_flops, e->flops);  // the same every call; max guards a partial range
    r.call_flops.push_back(e->flops);
  }
  r.model_calls = int(trace::named(ev, stage::kModelCall).size());
  r.unet_ms_min = r.unet_ms.empty() ? 0 : *std::min_element(r.unet_ms.begin(), r.unet_ms.end());
  for (double v : r.unet_ms) r.unet_ms_mean += v / double(r.unet_ms.size());
  r.unet_ms_median = bench_median(r.unet_ms);
  if (has_text_encoder) r.text_encode_s = trace::total_seconds(ev, stage::kTextEncode);
  r.denoise_s = trace::total_seconds(ev, stage::kDenoise);
  r.vae_decode_s = trace::total_seconds(ev, stage::kVaeDecode);
  for (const trace::Event* e : trace::named(ev, stage::kVaeDecode)) r.vae_decode_flops += e->flops;
  r.total_s = trace::total_seconds(ev, kRunRange);
  r.it_per_s = r.denoise_s > 0 ? r.model_calls / r.denoise_s : 0;
  r.s_per_image = r.total_s / r.batch;
  r.images_per_min = r.s_per_image > 0 ? 60.0 / r.s_per_image : 0;
  r.unet_tflops = r.unet_ms_mean > 0 ? double(r.unet_flops) / (r.unet_ms_mean * 1e-3) / 1e12 : 0;
  r.vae_decode_tflops = r.vae_decode_s > 0 ? double(r.vae_decode_flops) / r.vae_decode_s / 1e12 : 0;
  if (r.ceiling && r.ceiling->tflops > 0) r.pct_of_ceiling = kPercent * r.unet_tflops / r.ceiling->tflops;
  for (const trace::Event* e : trace::named(ev, stage::kDenoise)) {
    const int64_t from = e->start_ns, to = e->start_ns + e->dur_ns;
    const double wall = e->seconds();
    if (wall <= 0) continue;
    r.op_time_pct = kPercent * trace::op_busy_seconds(ev, from, to) / wall;
    if (r.device != "cpu") {
      // Kernel time over the span from the loop's start to the end of its device work.
      // (The loop need not synchronize at its end: the Z-Image benchmark reported 103% against the host's span.)
      const double busy = trace::device_busy_seconds(ev, from, to);
      const double device_end_ns = double(origin_ns) + trace::device_end_us(ev, from, to) * 1e3;
      const double end_ns = std::max(double(to), device_end_ns);
      if (busy > 0) r.gpu_busy_pct = kPercent * busy / ((end_ns - double(from)) * 1e-9);
      summarize_energy(ev, from, int64_t(end_ns), r);
      r.kernels = summarize_kernels(ev, origin_ns, call_range, from, int64_t(end_ns));
    }
  }
}

namespace {

// The timed generation: conditioning, initial latents, denoise loop, VAE decode; events into `rec`, memory and
// counters into `mem`.
Status timed_run(const SdPipeline& pipe, const Loaded& l, const BenchOptions& o, Device dev, const Shape& latent1,
                 TimedRunSampler& mem) {
  trace::Scope run(kRunRange, Category::kStage);
  ATELIER_ASSIGN_OR_RETURN(auto ctx, conditioning(pipe, l, o, dev));
  mem.sample();
  Tensor x;
  ATELIER_ASSIGN_OR_RETURN(Samplers s, make_samplers(*l.model, o, latent1, dev, &x));
  {
    trace::Scope denoise(stage::kDenoise, Category::kStage);
    ATELIER_ASSIGN_OR_RETURN(x, pipe.denoise(s.ptrs, x, ctx.first, ctx.second, o.cfg_scale, 0, mem.progress(), nullptr));
  }
  const Tensor images = pipe.decode(x);
  mem.sample();
  return Status::ok();
}

}  // namespace

double bench_median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Expected<std::unique_ptr<KernelTracer>> open_bench_tracer(const BenchOptions& o) {
  if (!o.kernels) return std::unique_ptr<KernelTracer>();
  return open_kernel_tracer();
}

Status add_traced_kernels(KernelTracer* tracer, trace::Recorder& rec) {
  if (!tracer) return Status::ok();
  int64_t from_ns = 0;
  const std::vector<trace::Event> events = rec.events();
  for (const trace::Event* e : trace::named(events, kRunRange)) from_ns = e->start_ns;
  ATELIER_ASSIGN_OR_RETURN(std::vector<trace::Event> kernels, tracer->collect());
  for (trace::Event& k : kernels)
    if (k.start_ns >= from_ns) rec.add(std::move(k));
  return Status::ok();
}

Status BenchOptions::validate() const {
  if (!model.empty() && !config.empty()) return invalid_argument("give either --model or --config, not both");
  if (model.empty() && config.empty() && !ceiling)
    return invalid_argument("give a model (--model PATH), a built-in configuration (--config sd15|sd21|flux|zimage) or --ceiling");
  if (width < 0 || height < 0 || width % kLatentFactor || height % kLatentFactor || width > kMaxGenerateSide || height > kMaxGenerateSide)
    return invalid_argument("width and height must be multiples of 8 up to " + std::to_string(kMaxGenerateSide) + " (0 = the model's size)");
  if (batch < 1 || batch > kMaxBatch) return invalid_argument("batch must be 1.." + std::to_string(kMaxBatch));
  if (steps < 1 || steps > kMaxSteps) return invalid_argument("steps must be 1.." + std::to_string(kMaxSteps));
  if (warmup < 0) return invalid_argument("warmup must be >= 0");
  if (fp8 && config != "flux" && config != "zimage")
    return invalid_argument("--fp8 is supported for the flux and zimage configurations");
  if (text_encoder && config != "zimage") return invalid_argument("--text-encoder is supported for the zimage configuration");
  if (kernels && device.rfind("cuda", 0) != 0)
    return invalid_argument("--kernels needs a CUDA device (--device cuda[:N]): the kernels' activity comes from CUPTI");
  return Status::ok();
}

Status warm_up_decodes(Device dev, const std::function<Status()>& decode) {
  Backend& backend = backend_for(dev);
  for (int i = 0; i < kMaxWarmupDecodes; ++i) {
    const double before = malloc_count(backend);
    ATELIER_RETURN_IF_ERROR(decode());
    backend.synchronize();
    if (before < 0 || malloc_count(backend) == before) break;
  }
  return Status::ok();
}

Expected<BenchReport> start_bench_report(const BenchOptions& o, Device* device) {
  ATELIER_RETURN_IF_ERROR(o.validate());
  ATELIER_ASSIGN_OR_RETURN(Device dev, Device::parse(o.device));
  if (!backend_available(dev)) return unsupported("device " + dev.str() + " is not available in this build or on this machine");
  BenchReport r;
  r.device = dev.str();
  r.backend = backend_for(dev).name();
  r.host_threads = omp_get_max_threads();
  if (o.ceiling) {
    ATELIER_ASSIGN_OR_RETURN(r.ceiling, measure_gemm_ceiling(dev, default_compute_dtype(dev)));
  }
  *device = dev;
  return r;
}

std::vector<std::pair<std::string, double>> counter_changes(const std::vector<std::pair<std::string, double>>& before,
                                                            const std::vector<std::pair<std::string, double>>& after) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, value] : after) {
    double was = 0.0;
    for (const auto& [n, v] : before)
      if (n == name) was = v;
    out.emplace_back(name, value - was);
  }
  return out;
}

std::unique_ptr<NvmlSampler> start_nvml_sampler(Device dev) {
  if (dev.is_cpu()) return nullptr;
  return std::make_unique<NvmlSampler>(dev.index);
}

void finish_nvml_sampler(NvmlSampler* sampler, BenchReport& r) {
  if (!sampler) return;
  r.nvml_util_pct = sampler->stop();
  r.nvml_samples = sampler->samples();
}

Status run_traced(Device dev, const std::function<Status(trace::Recorder&)>& body) {
  return catch_status([&]() -> Status {
    trace::Recorder rec(trace::kAllCategories);
    trace::ThreadAttach attach(rec);
    // Device times for every range (CUDA events); removed before the timer dies, after the last resolve.
    std::unique_ptr<trace::DeviceTimer> timer = trace::device_timer() ? nullptr : backend_for(dev).make_device_timer();
    if (timer) trace::set_device_timer(timer.get());
    struct Uninstall {
      trace::DeviceTimer* t;
      ~Uninstall() {
        if (t) trace::set_device_timer(nullptr);
      }
    } uninstall{timer.get()};
    return body(rec);
  });
}

Expected<BenchReport> run_sd_bench(const BenchOptions& o) {
  Device dev;
  ATELIER_ASSIGN_OR_RETURN(BenchReport r, start_bench_report(o, &dev));
  if (o.model.empty() && o.config.empty()) return r;
  Status st = run_traced(dev, [&](trace::Recorder& rec) -> Status {
    ATELIER_ASSIGN_OR_RETURN(Loaded l, load_model(o, dev));
    const SdModel& m = *l.model;
    SdPipeline pipe(l.model);
    r.model = l.label;
    r.model_kind = l.kind;
    r.width = o.width ? o.width : m.default_size;
    r.height = o.height ? o.height : m.default_size;
    r.batch = o.batch;
    r.unet_batch = o.cfg_scale > 1.0f ? 2 * o.batch : o.batch;
    r.steps = o.steps;
    r.warmup = o.warmup;
    r.cfg_scale = o.cfg_scale;
    r.sampler = o.sampler;
    r.load_s = trace::total_seconds(rec.events(), kLoadRange);
    const int f = m.vae->config().downscale_factor();
    const Shape latent1 = {1, m.unet->config().in_channels, r.height / f, r.width / f};
    ATELIER_ASSIGN_OR_RETURN(std::unique_ptr<KernelTracer> tracer, open_bench_tracer(o));
    {
      ATELIER_ASSIGN_OR_RETURN(auto ctx, conditioning(pipe, l, o, dev));
      const Tensor context = ctx.second.defined() ? ops::concat({ctx.second, ctx.first}, 0) : ctx.first;
      Tensor x;
      ATELIER_ASSIGN_OR_RETURN(Samplers s, make_samplers(m, o, latent1, dev, &x));
      ATELIER_RETURN_IF_ERROR(warm_up(pipe, o, x, context));
    }
    r.warmup_s = trace::total_seconds(rec.events(), kWarmupRange);
    rec.clear();  // the figures are the timed run's alone
    const auto nvml = start_nvml_sampler(dev);
    TimedRunSampler mem{backend_for(dev)};
    ATELIER_RETURN_IF_ERROR(timed_run(pipe, l, o, dev, latent1, mem));
    backend_for(dev).synchronize();
    ATELIER_RETURN_IF_ERROR(add_traced_kernels(tracer.get(), rec));
    mem.finish(r);
    finish_nvml_sampler(nvml.get(), r);
    rec.resolve_device_times();
    summarize_bench(rec.events(), rec.origin_ns(), stage::kUnet, m.text_encoder.has_value(), r);
    if (!m.text_encoder) r.conditioning = "seeded random context " + shape_str({r.unet_batch, l.context_tokens, m.unet->config().cross_attention_dim[0]}) + " (no text encoder)";
    r.ran = true;
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return r;
}

}  // namespace atelier
