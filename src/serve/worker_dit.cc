// FLUX and Z-Image jobs on a device worker (worker.h): one whole request per turn through the model's pipeline, with
// the worker's progress reports, cancellation, timeout, metrics and failover around it.
#include <algorithm>

#include "pipeline/flux_pipeline.h"
#include "pipeline/zimage_pipeline.h"
#include "serve/job_output.h"
#include "serve/worker.h"

namespace atelier::serve {
namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Previews of a DiT job cost a VAE decode each (the low-cost latent->RGB map is fitted to SD's 4 channels), so a job
// gets the OpenAI request's partial_images, or kDitPreviews when it asked for per-step previews, evenly spaced.
constexpr int kDitPreviews = 3;

bool wants_dit_preview(const ServeRequest& r, int step, int total, int sent) {
  const int wanted = r.partial_images > 0 ? r.partial_images : r.preview ? kDitPreviews : 0;
  if (sent >= wanted || step >= total) return false;  // the last step's image is the result itself
  return step % std::max(1, total / (wanted + 1)) == 0;
}

// The first image of `latents` (FLUX: packed [B, L, 64]; Z-Image: [1, C, h, w]) decoded to host pixels, as the
// pipelines decode their results (the current latents, not an x0 estimate: flow matching's are part noise until
// the end).
Expected<Image> decode_preview(const LoadedModel& m, const GenerateRequest& g, const Tensor& latents) {
  const Tensor first = latents.narrow(0, 0, 1);
  if (m.flux) {
    const int64_t f = m.flux->vae->config().downscale_factor();
    const int64_t h = (g.height ? g.height : m.flux->default_size) / f, w = (g.width ? g.width : m.flux->default_size) / f;
    return image_from_tensor(FluxPipeline(m.flux).decode(first, h, w).to(Device::cpu()), 0);
  }
  ATELIER_ASSIGN_OR_RETURN(Tensor pixels, ZImagePipeline(m.zimage).decode(first));
  return image_from_tensor(pixels.to(Device::cpu()), 0);
}

// Progress sequences of a request: FLUX denoises each batch of batch_size images together, Z-Image one image at a
// time; each sequence reports `steps` model calls.
int dit_sequences(const LoadedModel& m, const GenerateRequest& g) {
  return m.flux ? g.batch_count : g.batch_size * g.batch_count;
}

}  // namespace

void Worker::run_dit_job() {
  // The SD call in flight finishes first: its jobs' progress and images are not held up behind a whole DiT request.
  finish_in_flight();
  const DitJob& dj = dit_jobs_.front();  // stays queued while it runs: a device failure re-queues it with the rest
  const JobPtr job = dj.job;
  const ServeRequest& r = job->request();
  const int sequences = dit_sequences(dj.model, r.gen);
  const int rows = dj.model.flux ? r.gen.batch_size : 1;  // images in one model call
  job->set_progress(0, r.gen.steps * sequences);

  Clock::time_point mark = Clock::now();
  int previews = 0;
  auto progress = [&](const StepProgress& p) {
    if (fail_next_call_.exchange(false)) throw Error("injected device failure (test hook)");
    const double dt = since(mark);
    mark = Clock::now();
    add_busy(BusyKind::kModelCall, dt, rows);  // the first call's span also holds the text encoding and the noise
    metrics_.observe(metric::kStage, {{"stage", "model_call"}}, dt);
    metrics_.observe(metric::kBatchSize, {}, double(rows));
    metrics_.inc(metric::kSteps, {}, double(rows));
    metrics_.inc(metric::kModelCalls, {{"device", device().str()}});
    const int step = p.batch_index * p.total_calls + p.call, total = sequences * p.total_calls;
    job->set_progress(step, total);
    if (p.latents && wants_dit_preview(r, step, total, previews)) {
      auto image = decode_preview(dj.model, r.gen, *p.latents);
      if (image) {
        ++previews;
        host_pool_.submit([job, image = std::move(*image), step] { publish_preview_image(job, image, step); });
      }
    }
    return !job->cancel_requested() && Clock::now() <= job->deadline();  // false: the pipeline stops at this step
  };
  Expected<GenerateResult> result = [&]() -> Expected<GenerateResult> {
    if (dj.model.flux) {
      FluxOptions fo;
      fo.guidance = r.guidance;
      fo.max_sequence_length = r.max_sequence_length;
      fo.cfg_explicit = true;  // validate_for_model set cfg_scale to 1 (no CFG) unless the client gave it
      return FluxPipeline(dj.model.flux).generate(r.gen, fo, progress);
    }
    return ZImagePipeline(dj.model.zimage).generate(r.gen, progress);
  }();
  // A device error inside the pipeline comes back as an internal Status: a device failure, as an exception from an
  // SD call is (fail_device re-queues this job, still first in dit_jobs_, with the others).
  if (!result && result.status().code() == ErrorCode::kInternal) throw Error(result.status());
  add_busy(BusyKind::kDecode, since(mark));  // the last sequence's VAE decode and image conversion
  dit_jobs_.pop_front();
  if (result) {
    metrics_.observe(metric::kStage, {{"stage", "text_encode"}}, result->times.text_encode_s);
    metrics_.observe(metric::kStage, {{"stage", "vae_decode"}}, result->times.vae_s);
    host_pool_.submit([job, images = std::move(result->images), dir = options_.output_dir, &metrics = metrics_] {
      complete_job(job, images, dir, metrics);
    });
  } else if (!end_if_cancelled_or_late(*job)) {
    job->fail(result.status());
  }
  update_load();
  if (hooks_.capacity_freed) hooks_.capacity_freed();
}

}  // namespace atelier::serve
