#include "serve/worker.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "backend/ops.h"
#include "pipeline/sd_batch.h"
#include "pipeline/sd_pipeline.h"
#include "serve/job_output.h"

namespace atelier::serve {
namespace {

constexpr double kBusyWindowS = 10.0;  // the busy ratio covers about the last 10 seconds
// Latents decoded by one VAE call when several jobs finish together: the decode's activations grow with the
// batch (a 512x512 image's largest is 128 channels at full resolution, 64 MB in f32), so a bound keeps a
// burst of finishing jobs from needing gigabytes at once while still sharing the call's fixed costs.
constexpr int64_t kMaxDecodeImages = 8;

// Rows of a VAE decode call: the largest power of two <= min(left, kMaxDecodeImages), so that decodes come in
// four shapes (1, 2, 4, 8 images) that the warm-up plans, instead of any count that happens to finish together.
int64_t decode_chunk(int64_t left) {
  int64_t c = 1;
  while (c * 2 <= std::min(left, kMaxDecodeImages)) c *= 2;
  return c;
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

// A job admitted on this worker: its model, plan, and one DenoiseSample per image.
struct Worker::ActiveJob {
  JobPtr job;
  std::shared_ptr<SdModel> model;
  std::shared_ptr<SdPipeline> pipe;
  GenerationPlan plan;
  std::vector<PreparedSample> prepared;  // owns the samplers and generators
  std::vector<DenoiseSample> samples;
  std::string group;                     // model + latent shape + conditioning shape: who may share a call
  int total_calls = 0;                   // per image
  int enqueued_step = 0;  // calls done once the last call enqueued with it finishes
  int previews_sent = 0;

  bool done() const {
    return std::all_of(samples.begin(), samples.end(), [](const DenoiseSample& s) { return s.done(); });
  }
  int calls_done(const DenoiseSample& s) const { return s.sampler->call_index() - s.sampler->begin_index(); }
  int min_calls_done() const {
    int m = total_calls;
    for (const auto& s : samples) m = std::min(m, calls_done(s));
    return m;
  }
  double remaining_work() const {
    double w = 0;
    for (const auto& s : samples) w += double(s.sampler->calls_remaining()) * double(s.x.size(2) * s.x.size(3) * 64);
    return w;
  }
  // Whether the call that brings the job to `step` should produce a preview.
  bool wants_preview(int step) const {
    const ServeRequest& r = job->request();
    if (r.preview) return true;
    if (r.partial_images <= 0 || step >= total_calls || previews_sent >= r.partial_images) return false;
    const int stride = std::max(1, total_calls / (r.partial_images + 1));
    return step % stride == 0;
  }
};

Worker::Worker(int index, WorkerOptions options, const ModelRegistry& registry, MetricsRegistry& metrics,
               ThreadPool& host_pool, WorkerHooks hooks)
    : index_(index),
      options_(std::move(options)),
      registry_(registry),
      metrics_(metrics),
      host_pool_(host_pool),
      hooks_(std::move(hooks)),
      models_(options_.models) {
  busy_marks_.push_back({Clock::now(), 0.0});
}

Worker::~Worker() { stop("the server is shutting down"); }

std::string Worker::label() const { return device().str() + "#" + std::to_string(index_); }

Labels Worker::device_labels() const { return {{"device", device().str()}, {"worker", std::to_string(index_)}}; }

void Worker::start() { thread_ = std::thread([this] { loop(); }); }

void Worker::stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    stop_reason_ = reason;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Worker::assign(JobPtr job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    load_ += job->request().images();
    outstanding_ = outstanding_.load() + job->request().work();
    inbox_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void Worker::inject_failure(int failing_probes, bool at_decode) {
  failing_probes_ = failing_probes;
  (at_decode ? fail_next_decode_ : fail_next_call_) = true;
  cv_.notify_all();
}

void Worker::update_load() {
  int load = 0;
  double work = 0;
  for (const auto& aj : active_) {
    for (const auto& s : aj->samples) load += !s.done();
    work += aj->remaining_work();
  }
  for (const DitJob& d : dit_jobs_) {  // the running one (the first) counts what is left of it
    load += d.job->request().images();
    work += d.job->request().work() * (1.0 - d.job->progress());
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& j : inbox_) {
    load += j->request().images();
    work += j->request().work();
  }
  load_ = load;
  outstanding_ = work;
}

void Worker::add_busy(BusyKind kind, double seconds, int rows) {
  last_busy_end_ = Clock::now();  // worker thread only, as every caller
  const double end = steady_seconds();
  std::lock_guard<std::mutex> lock(busy_mu_);
  timeline_.push_back({end - seconds, end, kind, rows});
  if (timeline_.size() > kTimelineSpans) timeline_.pop_front();
  busy_by_kind_s_[int(kind)] += seconds;
  ++count_by_kind_[int(kind)];
  prompt_hits_ = int64_t(prompts_.hits());  // copied here: the cache itself belongs to the worker thread
  prompt_misses_ = int64_t(prompts_.misses());
}

bool Worker::wait_for_work() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!healthy_) {
    cv_.wait_for(lock, std::chrono::milliseconds(options_.probe_interval_ms), [&] { return stopping_; });
    return !stopping_;
  }
  if (active_.empty() && !in_flight_ && dit_jobs_.empty()) {
    cv_.wait(lock, [&] { return stopping_ || !inbox_.empty(); });
    if (stopping_) return false;
    // Dynamic batching: an idle worker that just got work waits briefly for more to share its first call.
    if (options_.batch_window_ms > 0)
      cv_.wait_for(lock, std::chrono::milliseconds(options_.batch_window_ms),
                   [&] { return stopping_ || load_.load() >= options_.max_batch; });
  }
  return !stopping_;
}

void Worker::loop() {
  // CPU workers share the machine's cores: each computes with its own share (ICVs are per thread), so that
  // several workers do not oversubscribe the cores and stall each other's OpenMP barriers.
  if (device().is_cpu() && options_.cpu_threads > 0) omp_set_num_threads(options_.cpu_threads);
  // A GPU worker's host work is launching and small conversions: an OpenMP team of its own would only spin
  // on the cores that the other workers' threads need to keep their GPUs fed.
  if (!device().is_cpu()) omp_set_num_threads(1);
  backend_for(device()).bind_current_thread();
  call_timer_ = backend_for(device()).make_device_timer();
  std::optional<trace::ThreadAttach> attach;
  if (const char* v = std::getenv("ATELIER_SERVE_PROFILE"); v && std::string(v) == "1") {
    profile_ = std::make_unique<trace::Recorder>(trace::bit(trace::Category::kCall) | trace::bit(trace::Category::kOp));
    attach.emplace(*profile_);
  }
  while (wait_for_work()) {
    if (!healthy_) {
      probe();
      continue;
    }
    std::deque<JobPtr> incoming;
    {
      std::lock_guard<std::mutex> lock(mu_);
      incoming.swap(inbox_);
    }
    // Admission and the model call run under one guard: an exception from the engine is a device failure.
    try {
      prefetch_prompts(incoming);
      while (!incoming.empty()) {
        const JobPtr job = incoming.front();
        admit(job);
        incoming.pop_front();
      }
      drop_cancelled();
      if (!active_.empty() || in_flight_) run_call();
      if (!dit_jobs_.empty()) run_dit_job();
    } catch (const std::bad_alloc&) {  // out of host memory: the jobs at hand fail, the device stays
      const Status oom(ErrorCode::kResourceExhausted, "out of memory");
      for (const JobPtr& j : incoming) j->fail(oom);
      for (const auto& aj : active_) aj->job->fail(oom);
      for (const DitJob& d : dit_jobs_) d.job->fail(oom);
      active_.clear();
      dit_jobs_.clear();
      in_flight_.reset();
      update_load();
    } catch (const std::exception& e) {
      {
        std::lock_guard<std::mutex> lock(mu_);  // jobs not yet admitted go back with the rest, in order
        for (auto it = incoming.rbegin(); it != incoming.rend(); ++it) inbox_.push_front(*it);
      }
      fail_device(internal_error(std::string("device ") + label() + " failed: " + e.what()));
    }
  }
  // Stopping: whatever is still held fails with the reason.
  std::lock_guard<std::mutex> lock(mu_);
  const Status why = internal_error(stop_reason_);
  for (const auto& aj : active_) aj->job->fail(why);
  for (const DitJob& d : dit_jobs_) d.job->fail(why);
  for (const auto& j : inbox_) j->fail(why);
  active_.clear();
  dit_jobs_.clear();
  in_flight_.reset();
  inbox_.clear();
  load_ = 0;
  outstanding_ = 0;
}

void Worker::admit(const JobPtr& job) {
  const auto t_admit = Clock::now();
  if (job->cancel_requested()) {
    job->cancel(job->cancel_reason());
    return;
  }
  if (Clock::now() > job->deadline()) {
    job->fail(Status(ErrorCode::kCancelled, "timed out before it could start"));
    return;
  }
  if (const auto wait = job->mark_running(label())) metrics_.observe(metric::kQueueWait, {}, *wait);
  const ServeRequest& r = job->request();
  auto fail = [&](const Status& st) { job->fail(st); };
  const ModelEntry* entry = registry_.find(r.model);
  if (!entry) return fail(not_found("unknown model '" + r.model + "'; available: " + registry_.names()));
  double load_s = 0;
  auto model = models_.acquire(*entry, &load_s);
  if (!model) return fail(model.status());
  if (load_s > 0) metrics_.observe(metric::kStage, {{"stage", "model_load"}}, load_s);
  if (entry->is_dit()) {  // runs whole, in its turn (run_dit_job)
    dit_jobs_.push_back({job, std::move(*model)});
    ++admissions_;
    add_busy(BusyKind::kAdmit, since(t_admit));
    return;
  }

  auto aj = std::make_unique<ActiveJob>();
  aj->job = job;
  aj->model = model->sd;
  aj->pipe = std::make_shared<SdPipeline>(aj->model);
  auto plan = aj->pipe->plan(r.gen, r.init_image ? &*r.init_image : nullptr, r.mask ? &*r.mask : nullptr);
  if (!plan) return fail(plan.status());
  aj->plan = std::move(*plan);
  const GenerateRequest& g = aj->plan.request;
  auto t0 = Clock::now();
  auto cond = encode_prompt(*aj, g.prompt);
  if (!cond) return fail(cond.status());
  Tensor uncond;
  if (aj->plan.guided()) {
    auto u = encode_prompt(*aj, g.negative_prompt);
    if (!u) return fail(u.status());
    uncond = *u;
  }
  metrics_.observe(metric::kStage, {{"stage", "text_encode"}}, since(t0));
  t0 = Clock::now();
  for (int i = 0; i < aj->plan.image_count(); ++i) {
    auto s = aj->pipe->prepare_sample(aj->plan, i);
    if (!s) return fail(s.status());
    aj->prepared.push_back(std::move(*s));
  }
  if (aj->plan.init_image.defined()) metrics_.observe(metric::kStage, {{"stage", "init_encode"}}, since(t0));
  for (PreparedSample& p : aj->prepared) {
    DenoiseSample d;
    d.sampler = p.sampler.get();
    d.x = p.latents;
    d.cond = *cond;
    d.uncond = uncond;
    d.cfg_scale = g.cfg_scale;
    d.kept = p.kept;
    aj->samples.push_back(std::move(d));
  }
  aj->total_calls = aj->samples.front().sampler->calls_remaining();
  aj->group = entry->name + "|" + shape_str(aj->samples.front().x.shape()) + "|" + shape_str(cond->shape());
  warm_up(*aj);
  ++admissions_;
  add_busy(BusyKind::kAdmit, since(t_admit));
  job->set_progress(0, aj->total_calls);
  active_.push_back(std::move(aj));
}

// Before a burst of admissions: the prompts its jobs will ask for that are not cached yet, encoded in one
// text-encoder call per (model, clip skip, emphasis) into the prompt cache, so that every admission hits it (one
// call's launches instead of one call per prompt: ~3.5 ms each on an H200, most of it launch-bound). Only
// models already resident (loading stays admission's business); a failure leaves each prompt to its own
// admission, which reports it.
void Worker::prefetch_prompts(const std::deque<JobPtr>& jobs) {
  // At most half the cache per burst: entries put in must still be there when their admissions ask.
  const size_t max_prompts = prompts_.capacity() / 2;
  if (jobs.size() < 2) return;
  const auto t0 = Clock::now();
  struct Group {
    std::shared_ptr<SdModel> model;
    int clip_skip = 0;
    bool emphasis = false;
    std::vector<std::string> texts;
  };
  std::vector<Group> groups;
  size_t wanted = 0;
  for (const JobPtr& job : jobs) {
    if (job->cancel_requested()) continue;
    const GenerateRequest& g = job->request().gen;
    const ModelEntry* entry = registry_.find(job->request().model);
    std::shared_ptr<SdModel> model = entry ? models_.resident(entry->name) : nullptr;
    if (!model) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& gr) {
      return gr.model == model && gr.clip_skip == g.clip_skip && gr.emphasis == g.emphasis;
    });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{model, g.clip_skip, g.emphasis, {}});
    for (const std::string* text : {&g.prompt, g.cfg_scale > 1.0f ? &g.negative_prompt : nullptr})
      if (text && wanted < max_prompts && std::find(it->texts.begin(), it->texts.end(), *text) == it->texts.end() &&
          !prompts_.contains(model, *text, g.clip_skip, g.emphasis)) {
        it->texts.push_back(*text);
        ++wanted;
      }
  }
  int64_t prompts = 0, calls = 0;
  for (const Group& gr : groups) {
    if (gr.texts.size() < 2) continue;  // one prompt: its admission encodes it as cheaply
    auto encoded = SdPipeline(gr.model).encode_prompts(gr.texts, gr.clip_skip, gr.emphasis);
    if (!encoded) continue;
    for (size_t i = 0; i < gr.texts.size(); ++i) prompts_.put(gr.model, gr.texts[i], gr.clip_skip, gr.emphasis, (*encoded)[i]);
    prompts += int64_t(gr.texts.size());
    ++calls;
  }
  if (calls == 0) return;
  add_busy(BusyKind::kAdmit, since(t0));
  std::lock_guard<std::mutex> lock(busy_mu_);
  prompts_prefetched_ += prompts;
  prefetch_calls_ += calls;
}

// After a model call (device synchronized): its device time and the UNet's recording statistics, for status().
void Worker::note_call(uint64_t timed, double enqueue_s, const GraphRunner::Stats& g) {
  const auto span = timed ? call_timer_->resolve(timed) : std::nullopt;
  std::lock_guard<std::mutex> lock(busy_mu_);
  model_call_enqueue_s_ += enqueue_s;
  if (span) model_call_device_s_ += span->dur_us * 1e-6;
  graph_stats_ = g;
}

// The first job of a group (a model and its latent and conditioning shapes) on a device that records its
// work: every UNet batch bucket up to the worker's largest call is planned (convolution, attention and GEMM
// plans are timed on first sight of a shape) and recorded, and every decode chunk planned, before the job
// joins a batch. Without it those plans were made inside the batches that first needed them: on a two-GPU
// server, one to two seconds of timing runs per new bucket, in the middle of everyone's requests.
void Worker::warm_up(const ActiveJob& aj) {
  if (!backend_for(device()).can_capture()) return;
  std::erase_if(warmed_, [](const auto& w) { return w.first.expired(); });
  for (const auto& [model, group] : warmed_)
    if (model.lock() == aj.model && group == aj.group) return;
  warmed_.emplace_back(aj.model, aj.group);
  const auto t0 = Clock::now();
  const UNet& unet = *aj.model->unet;
  const DenoiseSample& s = aj.samples.front();
  const int64_t most_rows = int64_t(std::max(1, options_.max_batch)) * (s.guided() ? 2 : 1);
  for (int64_t rows : unet.graphs().options().batch_buckets) {
    if (rows > most_rows) break;
    if (s.guided() && rows % 2 == 1) continue;  // guided samples come with their uncond rows: always even
    Shape xs = s.x.shape(), cs = s.cond.shape();
    xs[0] = cs[0] = rows;
    const Tensor x = Tensor::zeros(xs, s.x.dtype(), device()), ctx = Tensor::zeros(cs, s.cond.dtype(), device());
    const Tensor t = Tensor::full({rows}, 500.0f, device());
    for (int call = 0; call <= unet.graphs().options().warmup; ++call)  // the eager call(s), then the recording
      if (auto out = unet.forward(x, t, ctx); !out) return;  // the real call will report it
  }
  for (int64_t n = 1; n <= kMaxDecodeImages; n *= 2) {
    Shape xs = s.x.shape();
    xs[0] = n;
    aj.pipe->decode(Tensor::zeros(xs, s.x.dtype(), device()));
  }
  backend_for(device()).synchronize();
  metrics_.observe(metric::kStage, {{"stage", "warm_up"}}, since(t0));
}

void Worker::fold_profile() {
  const std::vector<trace::Event> events = profile_->events();
  profile_->clear();
  std::lock_guard<std::mutex> lock(busy_mu_);
  for (const trace::Event& e : events) {
    if (e.depth > 0) continue;  // nested ops are inside their caller's range
    auto& [count, seconds] = profile_totals_[e.name];
    ++count;
    seconds += e.seconds();
  }
}

Expected<Tensor> Worker::encode_prompt(const ActiveJob& aj, const std::string& text) {
  const GenerateRequest& g = aj.plan.request;
  return prompts_.get(aj.model, text, g.clip_skip, g.emphasis,
                      [&] { return aj.pipe->encode_prompt(text, g.clip_skip, g.emphasis); });
}

bool Worker::end_if_cancelled_or_late(Job& j) {
  if (j.cancel_requested()) {
    j.cancel(j.cancel_reason());
  } else if (Clock::now() > j.deadline()) {
    j.fail(Status(ErrorCode::kCancelled, "timed out after " + std::to_string(int(j.age_s())) + " s"));
  } else {
    return false;
  }
  return true;
}

void Worker::drop_cancelled() {
  const size_t before = dit_jobs_.size() + active_.size();
  std::erase_if(dit_jobs_, [](const DitJob& d) { return end_if_cancelled_or_late(*d.job); });  // waiting for their turn
  // Their samples leave the batch at this step boundary.
  std::erase_if(active_, [](const std::unique_ptr<ActiveJob>& aj) { return end_if_cancelled_or_late(*aj->job); });
  const bool freed = dit_jobs_.size() + active_.size() < before;
  if (freed) {
    update_load();
    if (hooks_.capacity_freed) hooks_.capacity_freed();
  }
}

// A model call enqueued on the device and not yet finished: what finishing it reports, taken when it was enqueued
// (by then the next call may have moved the samples on).
struct Worker::PendingCall {
  struct Entry {
    JobPtr job;      // looked up in active_ when the call finishes: the job may have left since
    int step = 0;    // its calls done once this call finishes
    bool moved = false;  // whether the call moved that count (a job some of whose samples sat out may not move)
    Tensor preview;  // its first sample's x0 estimate, where this call makes a preview
  };
  std::shared_ptr<SdModel> model;  // its UNet's recording statistics, for status()
  std::vector<Entry> jobs;         // the jobs in the call
  int rows = 0;                    // samples in the call
  Clock::time_point enqueued;
  uint64_t timed = 0;              // its device timer range (0: none)
  double enqueue_s = 0;            // host time to enqueue it
  uint64_t mark = 0;               // the device has finished it once its queue passes this mark
  double busy_s = -1;              // its busy span once accounted (account_call), -1 before
};

Worker::ActiveJob* Worker::find_active(const JobPtr& job) {
  for (const auto& aj : active_)
    if (aj->job == job) return aj.get();
  return nullptr;
}

void Worker::run_call() {
  std::unique_ptr<PendingCall> next = enqueue_call();
  if (in_flight_) {
    std::unique_ptr<PendingCall> done = std::move(in_flight_);
    finish_call(*done, next.get());
  }
  in_flight_ = std::move(next);
  if (sync_each_call()) finish_in_flight();
}

void Worker::finish_in_flight() {
  if (!in_flight_) return;
  std::unique_ptr<PendingCall> done = std::move(in_flight_);
  finish_call(*done, nullptr);
}

std::unique_ptr<Worker::PendingCall> Worker::enqueue_call() {
  // Groups in admission order; the one after the last served takes this call (round robin).
  std::vector<std::string> groups;
  for (const auto& aj : active_)
    if (!aj->done() && std::find(groups.begin(), groups.end(), aj->group) == groups.end()) groups.push_back(aj->group);
  if (groups.empty()) return nullptr;
  const auto last = std::find(groups.begin(), groups.end(), last_group_);
  last_group_ = groups[last == groups.end() ? 0 : size_t(last - groups.begin() + 1) % groups.size()];

  std::vector<DenoiseSample*> batch;
  std::vector<ActiveJob*> in_call;
  bool want_denoised = false;
  const size_t max_batch = size_t(std::max(1, options_.max_batch));
  for (const auto& aj : active_) {
    if (aj->group != last_group_ || batch.size() >= max_batch) continue;
    const size_t before = batch.size();
    for (DenoiseSample& s : aj->samples)
      if (!s.done() && batch.size() < max_batch) batch.push_back(&s);
    if (batch.size() > before) {
      in_call.push_back(aj.get());
      want_denoised |= aj->wants_preview(aj->min_calls_done() + 1);
    }
  }
  if (fail_next_call_.exchange(false)) throw Error("injected device failure (test hook)");

  auto call = std::make_unique<PendingCall>();
  call->enqueued = Clock::now();
  call->timed = call_timer_ ? call_timer_->begin("model_call", trace::Category::kCall) : 0;
  call->model = in_call.front()->model;
  Expected<BatchStepOutput> out = [&] {
    try {
      return denoise_batch_step(*call->model->unet, batch, want_denoised);
    } catch (...) {  // a device failure: the range (and its NVTX range) is closed before the worker fails over
      if (call->timed) call_timer_->end(call->timed);
      throw;
    }
  }();
  if (call->timed) call_timer_->end(call->timed);
  call->enqueue_s = since(call->enqueued);  // host time to enqueue the call; the rest is waiting for the device
  if (!out) {  // not a device problem: the request could not be batched (shape error) — fail those jobs
    for (ActiveJob* aj : in_call) aj->job->fail(out.status());
    active_.remove_if([&](const auto& aj) { return std::find(in_call.begin(), in_call.end(), aj.get()) != in_call.end(); });
    update_load();
    return nullptr;
  }
  call->rows = int(batch.size());
  for (ActiveJob* aj : in_call) {
    PendingCall::Entry& j = call->jobs.emplace_back();
    j.job = aj->job;
    j.step = aj->min_calls_done();
    j.moved = j.step != aj->enqueued_step;
    aj->enqueued_step = j.step;
    const bool preview = j.moved && aj->wants_preview(j.step) && aj->samples.front().denoised.defined();
    if (preview) j.preview = aj->samples.front().denoised;
    aj->previews_sent += preview;  // counted here: the next call's wants_preview must see it
  }
  call->mark = backend_for(device()).mark_queue();
  return call;
}

void Worker::account_call(PendingCall& call) {
  if (call.busy_s >= 0) return;
  backend_for(device()).wait_for_mark(call.mark);
  // From its enqueueing, or from the end of the worker's previous busy span (a call, an admission, a decode) where
  // it was enqueued before that: spans never overlap, and no time is counted twice.
  call.busy_s = std::chrono::duration<double>(Clock::now() - std::max(call.enqueued, last_busy_end_)).count();
  add_busy(BusyKind::kModelCall, call.busy_s, call.rows);
}

void Worker::finish_call(PendingCall& call, PendingCall* next) {
  account_call(call);
  const double dt = call.busy_s;
  note_call(call.timed, call.enqueue_s, call.model->unet->graphs().stats());
  if (profile_) fold_profile();
  metrics_.observe(metric::kStage, {{"stage", "model_call"}}, dt);
  metrics_.observe(metric::kBatchSize, {}, double(call.rows));
  metrics_.inc(metric::kSteps, {}, double(call.rows));
  metrics_.inc(metric::kModelCalls, {{"device", device().str()}});

  for (const PendingCall::Entry& j : call.jobs) {
    ActiveJob* aj = find_active(j.job);
    if (!aj || !j.moved) continue;  // a job cancelled since, or one whose step did not move
    if (j.preview.defined()) {
      const Tensor lat = j.preview.to(Device::cpu());
      host_pool_.submit([job = j.job, lat, step = j.step] { publish_preview(job, lat, step); });
    }
    aj->job->set_progress(j.step, aj->total_calls);
  }
  // Jobs whose samples are all done and whose last call has finished (a job of the next call, already enqueued,
  // waits for it: its last step is reported before its images).
  const auto in_next = [&](const ActiveJob& aj) {
    return next && std::any_of(next->jobs.begin(), next->jobs.end(), [&](const PendingCall::Entry& j) { return j.job == aj.job; });
  };
  std::vector<std::unique_ptr<ActiveJob>> finished;
  for (auto it = active_.begin(); it != active_.end();) {
    if (!(*it)->done() || in_next(**it)) {
      ++it;
      continue;
    }
    finished.push_back(std::move(*it));
    it = active_.erase(it);
  }
  const bool retired = !finished.empty();
  if (retired) {
    // The decode queues behind the next call on the device: that call is waited for (and its span recorded) first,
    // so the decode's span and the vae_decode stage time the decode alone.
    if (next) account_call(*next);
    try {
      retire(finished);
    } catch (...) {  // a device failure surfacing in the decode: those not handed over go back to be re-queued
      for (auto& aj : finished)
        if (aj) active_.push_back(std::move(aj));
      throw;
    }
  }
  update_load();
  if (retired && hooks_.capacity_freed) hooks_.capacity_freed();
}

void Worker::retire(std::vector<std::unique_ptr<ActiveJob>>& finished) {
  if (fail_next_decode_.exchange(false)) throw Error("injected device failure at a decode (test hook)");
  // Every image row of the finished jobs, decoded in chunks of rows of one group (model and latent shape).
  struct Row {
    size_t job;  // index into finished
    size_t sample;
  };
  std::vector<Row> rows;
  for (size_t j = 0; j < finished.size(); ++j)
    for (size_t i = 0; i < finished[j]->samples.size(); ++i) rows.push_back({j, i});
  auto group_of = [&](const Row& r) -> const std::string& { return finished[r.job]->group; };
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) { return group_of(a) < group_of(b); });
  std::vector<std::vector<Tensor>> pixels(finished.size());  // per job: its [1, 3, H, W] rows on the host
  for (size_t begin = 0; begin < rows.size();) {
    size_t same = begin + 1;
    while (same < rows.size() && group_of(rows[same]) == group_of(rows[begin])) ++same;
    const size_t end = begin + size_t(decode_chunk(int64_t(same - begin)));
    const auto t0 = Clock::now();
    std::vector<Tensor> latents;
    for (size_t r = begin; r < end; ++r) latents.push_back(final_latents(finished[rows[r].job]->samples[rows[r].sample]));
    const Tensor batch = latents.size() == 1 ? latents.front() : ops::concat(latents, 0);
    const Tensor images01 = finished[rows[begin].job]->pipe->decode(batch).to(Device::cpu());
    const double dt = since(t0);
    add_busy(BusyKind::kDecode, dt);
    metrics_.observe(metric::kStage, {{"stage", "vae_decode"}}, dt);
    for (size_t r = begin; r < end; ++r) pixels[rows[r].job].push_back(images01.narrow(0, int64_t(r - begin), 1));
    begin = end;
  }
  // Pixels, infotext, encoding, base64 and saving happen on the host pool: the next model call does not wait.
  for (size_t j = 0; j < finished.size(); ++j) {
    ActiveJob& aj = *finished[j];
    std::vector<int64_t> seeds;
    for (const PreparedSample& p : aj.prepared) seeds.push_back(p.seed);
    host_pool_.submit([job = aj.job, pipe = aj.pipe, plan = aj.plan, seeds = std::move(seeds), rows = std::move(pixels[j]),
                       dir = options_.output_dir, &metrics = metrics_] {
      std::vector<GeneratedImage> images;
      const Status st = catch_status([&]() -> Status {
        for (size_t i = 0; i < rows.size(); ++i) images.push_back(pipe->finish_image(plan, rows[i], 0, seeds[i]));
        return Status::ok();
      });
      if (st.is_ok()) complete_job(job, images, dir, metrics);
      else job->fail(st);
    });
    finished[j].reset();  // handed over
  }
}

void Worker::fail_device(const Status& why) {
  healthy_ = false;
  ++failures_;
  metrics_.inc(metric::kDeviceFailures, device_labels());
  std::vector<JobPtr> jobs;
  for (const auto& aj : active_) jobs.push_back(aj->job);
  for (const DitJob& d : dit_jobs_) jobs.push_back(d.job);  // the one running is redone from its start
  active_.clear();
  dit_jobs_.clear();
  // What the failed device was computing is redone elsewhere. Dropping the call without waiting for the device is
  // safe while everything it uses is stream-ordered on one stream (the allocator reuses a block only after the
  // stream passes its free; pinned staging is event-guarded; a graph exec destroyed mid-launch is freed after it).
  in_flight_.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& j : inbox_) jobs.push_back(j);
    inbox_.clear();
  }
  models_.clear();  // replicas on a failed device are not trusted; they reload after recovery
  update_load();
  if (hooks_.device_failed) hooks_.device_failed(index_, std::move(jobs), why);
}

void Worker::probe() {
  if (failing_probes_.load() > 0) {
    --failing_probes_;
    return;
  }
  bool ok = false;
  try {
    const Tensor a = Tensor::full({16}, 1.0f, device());
    const Tensor b = ops::add(a, a);
    backend_for(device()).synchronize();
    ok = b.to_vector().at(0) == 2.0f;
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok) return;
  healthy_ = true;
  if (hooks_.capacity_freed) hooks_.capacity_freed();
}

nlohmann::json Worker::status() const {
  std::lock_guard<std::mutex> lock(busy_mu_);
  // Where the worker's busy time went: what a slow device's figures are read against.
  const nlohmann::json breakdown = {
      {"admit_seconds", busy_by_kind_s_[int(BusyKind::kAdmit)]},   {"admissions", admissions_.load()},
      {"model_call_seconds", busy_by_kind_s_[int(BusyKind::kModelCall)]},
      {"model_calls", count_by_kind_[int(BusyKind::kModelCall)]},
      {"decode_seconds", busy_by_kind_s_[int(BusyKind::kDecode)]}, {"decode_calls", count_by_kind_[int(BusyKind::kDecode)]},
      {"prompt_cache_hits", prompt_hits_},                          {"prompt_cache_misses", prompt_misses_},
      {"prompts_prefetched", prompts_prefetched_},                  {"prefetch_calls", prefetch_calls_},
      {"model_call_device_seconds", model_call_device_s_}, {"model_call_enqueue_seconds", model_call_enqueue_s_}};
  const GraphRunner::Stats& g = graph_stats_;
  const nlohmann::json graphs = {{"eager_calls", g.eager_calls},   {"captures", g.captures},
                                 {"replays", g.replays},           {"capture_failures", g.capture_failures},
                                 {"pool_bytes", g.pool_bytes},     {"last_failure", g.last_failure}};
  nlohmann::json host_profile = nlohmann::json::object();
  for (const auto& [name, cs] : profile_totals_) host_profile[name] = {{"count", cs.first}, {"seconds", cs.second}};
  nlohmann::json device_counters = nlohmann::json::object();
  for (const auto& [name, value] : backend_for(device()).counters()) device_counters[name] = value;
  // [start, end, kind, rows] per span, oldest first; kinds as in "busy": admit, model_call, decode.
  static const char* kKindNames[] = {"admit", "model_call", "decode"};
  nlohmann::json timeline = nlohmann::json::array();
  for (const Span& s : timeline_) timeline.push_back({s.start_s, s.end_s, kKindNames[int(s.kind)], s.rows});
  return {{"index", index_},      {"device", device().str()}, {"healthy", healthy()},
          {"load", load()},       {"max_batch", options_.max_batch}, {"outstanding_work", outstanding_work()},
          {"models_loaded", models_.loaded()}, {"failures", failures_.load()}, {"busy_seconds", busy_total_s()},
          {"busy", breakdown}, {"graphs", graphs}, {"device_counters", device_counters}, {"host_profile", host_profile},
          {"timeline", timeline}};
}

void Worker::collect(MetricsRegistry& m) {
  const Labels l = device_labels();
  m.set(metric::kDeviceHealthy, l, healthy() ? 1 : 0);
  m.set(metric::kDeviceActive, l, load());
  m.set(metric::kDeviceOutstanding, l, outstanding_work());
  m.set(metric::kModelsLoaded, l, double(models_.loaded()));
  std::lock_guard<std::mutex> lock(busy_mu_);
  const auto now = Clock::now();
  const double busy_total = busy_total_s();
  m.set(metric::kDeviceBusySeconds, l, busy_total);
  // Ratio over the window: keep marks of the last kBusyWindowS seconds (at least one older mark).
  busy_marks_.push_back({now, busy_total});
  while (busy_marks_.size() > 2 && std::chrono::duration<double>(now - busy_marks_[1].first).count() > kBusyWindowS)
    busy_marks_.pop_front();
  const auto& [t_old, b_old] = busy_marks_.front();
  const double span = std::chrono::duration<double>(now - t_old).count();
  m.set(metric::kDeviceBusy, l, span > 0 ? std::min(1.0, (busy_total - b_old) / span) : 0.0);
}

}  // namespace atelier::serve
