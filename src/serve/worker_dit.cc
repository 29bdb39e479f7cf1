// FLUX and Z-Image jobs on a device worker (worker.h): one whole request per turn through the model's pipeline, with
// the worker's progress reports, cancellation, timeout, metrics and failover around it. FLUX requests queued
// together that can share model calls (FluxPipeline::batch_compatible: same size, steps, T5 length and CFG; one
// batch each) run as one batch of up to max_batch images, each with its own prompt, seed and guidance.
#include <algorithm>

#include "pipeline/flux_pipeline.h"
#include "pipeline/zimage_pipeline.h"
#include "sampling/sampler.h"
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

// Image `row` of `latents` (FLUX: packed [B, L, 64]; Z-Image: [1, C, h, w]) decoded to host pixels, as the
// pipelines decode their results (the current latents, not an x0 estimate: flow matching's are part noise until
// the end).
Expected<Image> decode_preview(const LoadedModel& m, const GenerateRequest& g, const Tensor& latents, int64_t row) {
  const Tensor first = latents.narrow(0, row, 1);
  if (m.flux) {
    const int64_t f = m.flux->vae->config().downscale_factor();
    const int64_t h = (g.height ? g.height : m.flux->default_size) / f, w = (g.width ? g.width : m.flux->default_size) / f;
    return image_from_tensor(FluxPipeline(m.flux).decode(first, h, w).to(Device::cpu()), 0);
  }
  ATELIER_ASSIGN_OR_RETURN(Tensor pixels, ZImagePipeline(m.zimage).decode(first));
  return image_from_tensor(pixels.to(Device::cpu()), 0);
}

FluxBatchItem flux_item(const ServeRequest& r) {
  FluxBatchItem item;
  item.request = r.gen;
  item.options.guidance = r.guidance;
  item.options.max_sequence_length = r.max_sequence_length;
  item.options.cfg_explicit = true;  // validate_for_model set cfg_scale to 1 (no CFG) unless the client gave it
  item.init_image = r.init_image ? &*r.init_image : nullptr;  // the job keeps its request while the batch runs
  item.mask = r.mask ? &*r.mask : nullptr;
  return item;
}

// Model calls of one progress sequence: the steps img2img leaves (the last int(steps x strength)), or all of them.
int dit_calls(const ServeRequest& r) {
  return r.init_image ? sampling::img2img_steps(r.gen.steps, r.gen.strength) : r.gen.steps;
}

// Progress sequences of a request: FLUX denoises each batch of batch_size images together, Z-Image one image at a
// time; each sequence reports dit_calls model calls.
int dit_sequences(const LoadedModel& m, const GenerateRequest& g) {
  return m.flux ? g.batch_count : g.batch_size * g.batch_count;
}

}  // namespace

std::vector<Worker::DitJob> Worker::next_dit_batch() const {
  std::vector<DitJob> batch{dit_jobs_.front()};
  const std::shared_ptr<FluxModel> flux = batch.front().model.flux;  // a copy: batch grows below
  if (!flux) return batch;
  const FluxPipeline pipe(flux);
  const FluxBatchItem lead = flux_item(batch.front().job->request());
  int rows = lead.request.batch_size;
  for (size_t i = 1; i < dit_jobs_.size(); ++i) {
    const DitJob& d = dit_jobs_[i];
    const FluxBatchItem item = flux_item(d.job->request());
    if (d.model.flux != flux || !pipe.batch_compatible(lead, item)) continue;
    if (rows + item.request.batch_size > options_.max_batch) break;
    rows += item.request.batch_size;
    batch.push_back(d);
  }
  return batch;
}

void Worker::run_dit_job() {
  // The SD call in flight finishes first: its jobs' progress and images are not held up behind a whole DiT request.
  finish_in_flight();
  // The batch's jobs stay queued while they run: a device failure re-queues them with the rest.
  const std::vector<DitJob> batch = next_dit_batch();
  const LoadedModel& model = batch.front().model;
  const GenerateRequest& lead = batch.front().job->request().gen;
  const int sequences = dit_sequences(model, lead);  // a batch of several has one (batch_count 1 each)
  int rows = 0;  // images in one model call
  std::vector<int64_t> first_row;  // each job's first row in the batch's latents
  for (const DitJob& d : batch) {
    first_row.push_back(rows);
    rows += model.flux ? d.job->request().gen.batch_size : 1;
    d.job->set_progress(0, dit_calls(d.job->request()) * sequences);
  }
  std::vector<bool> ended(batch.size(), false);  // cancelled or timed out during the batch (its rows run on)
  std::vector<int> previews(batch.size(), 0);

  Clock::time_point mark = Clock::now();
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
    bool any_left = false;
    for (size_t k = 0; k < batch.size(); ++k) {
      if (ended[k]) continue;
      const JobPtr& job = batch[k].job;
      job->set_progress(step, total);
      if (p.latents && wants_dit_preview(job->request(), step, total, previews[k])) {
        auto image = decode_preview(model, job->request().gen, *p.latents, first_row[k]);
        if (image) {
          ++previews[k];
          host_pool_.submit([job, image = std::move(*image), step] { publish_preview_image(job, image, step); });
        }
      }
      ended[k] = end_if_cancelled_or_late(*job);  // its client hears at once; its rows finish with the batch
      any_left = any_left || !ended[k];
    }
    return any_left;  // false: the pipeline stops at this step
  };
  Expected<std::vector<GenerateResult>> results = [&]() -> Expected<std::vector<GenerateResult>> {
    if (batch.size() > 1) {
      std::vector<FluxBatchItem> items;
      for (const DitJob& d : batch) items.push_back(flux_item(d.job->request()));
      return FluxPipeline(model.flux).generate_batch(items, progress);
    }
    const ServeRequest& r = batch.front().job->request();
    const Image* init = r.init_image ? &*r.init_image : nullptr;
    const Image* mask = r.mask ? &*r.mask : nullptr;
    Expected<GenerateResult> one = model.flux ? FluxPipeline(model.flux).generate(r.gen, flux_item(r).options, progress, init, mask)
                                              : ZImagePipeline(model.zimage).generate(r.gen, progress, init, mask);
    if (!one) return one.status();
    return std::vector<GenerateResult>{std::move(*one)};
  }();
  // A device error inside the pipeline comes back as an internal Status: a device failure, as an exception from an
  // SD call is (fail_device re-queues the batch's jobs, still in dit_jobs_, with the others).
  if (!results && results.status().code() == ErrorCode::kInternal) throw Error(results.status());
  add_busy(BusyKind::kDecode, since(mark));  // the last sequence's VAE decode and image conversion
  std::erase_if(dit_jobs_, [&](const DitJob& d) {
    return std::any_of(batch.begin(), batch.end(), [&](const DitJob& b) { return b.job == d.job; });
  });
  if (results) {
    metrics_.observe(metric::kStage, {{"stage", "text_encode"}}, results->front().times.text_encode_s);
    metrics_.observe(metric::kStage, {{"stage", "vae_decode"}}, results->front().times.vae_s);
  }
  for (size_t k = 0; k < batch.size(); ++k) {
    const JobPtr& job = batch[k].job;
    if (ended[k] || end_if_cancelled_or_late(*job)) continue;
    if (!results) {
      job->fail(results.status());
      continue;
    }
    host_pool_.submit([job, images = std::move((*results)[k].images), dir = options_.output_dir, &metrics = metrics_] {
      complete_job(job, images, dir, metrics);
    });
  }
  update_load();
  if (hooks_.capacity_freed) hooks_.capacity_freed();
}

}  // namespace atelier::serve
