// A device worker: one thread that owns one device's model replicas and runs the step-level batching loop.
//
// Each iteration of the loop is ONE denoising model call (pipeline/sd_batch.h) over the active samples that
// share a model and a latent size (groups take turns, oldest samples first, at most max_batch per call). The call
// is enqueued before the worker waits for the previous one (one call in flight: the device starts it right after
// the previous call's last kernel, while the host reports that call and prepares the next).
// Between calls, at the step boundary, the worker admits the jobs the scheduler assigned to it (text
// encoding, initial latents), drops cancelled and timed-out jobs, and retires finished ones: their latents
// are decoded on the worker and their images encoded on the host pool, so the next call never waits on
// PNG encoding or on a client. Jobs that finish in the same call are decoded together, and encoded prompts
// are cached (serve/prompt_cache.h): both are device work that everyone else's batch waits for.
//
// FLUX and Z-Image jobs (ModelFamily) are not step-batched: their pipelines run a request whole, so the worker
// queues them apart and runs one whole request per loop iteration (worker_dit.cc), after finishing the SD call in
// flight; SD jobs on the same worker wait for it, and SD calls and admissions go on between DiT requests. FLUX
// requests queued together that can share model calls run as one batch (up to max_batch images): batching at
// request boundaries, not step-level. Each DiT step still reports progress and is a point where cancellation and
// the timeout take effect (a job cancelled inside a batch ends at once; its rows finish with the batch).
//
// A failure of the device (an exception from the engine, e.g. a CUDA error, or the test hook) marks the
// worker unhealthy and hands every job it holds back to the scheduler, which re-queues them at the front;
// the worker then probes its device every probe interval and returns to service when a probe passes.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/graph_runner.h"
#include "core/trace.h"
#include "serve/job.h"
#include "serve/metrics.h"
#include "serve/model_registry.h"
#include "serve/prompt_cache.h"
#include "serve/thread_pool.h"

namespace atelier::serve {

struct WorkerOptions {
  int max_batch = 8;            // samples in one model call
  int batch_window_ms = 0;      // an idle worker waits this long for more work before its first call
  int probe_interval_ms = 1000; // an unhealthy worker probes its device this often
  int cpu_threads = 0;          // CPU workers: OpenMP threads of this worker (0 = the library's default)
  ModelCacheOptions models;     // device, tokenizer, budget
  std::string output_dir;       // save every image (PNG + JSON sidecar) here when set
};

// The per-worker options of a command's options (ServeOptions for `atelier serve`, RedisWorkerOptions for
// `atelier worker`: the same field names), so both commands configure their workers alike.
template <typename CommandOptions>
WorkerOptions worker_options_of(const CommandOptions& o) {
  WorkerOptions wo;
  wo.cpu_threads = o.cpu_threads;
  wo.max_batch = o.max_batch;
  wo.batch_window_ms = o.batch_window_ms;
  wo.probe_interval_ms = o.probe_interval_ms;
  wo.output_dir = o.output_dir;
  wo.models = {Device::cpu(), o.tokenizer_dir, o.model_memory_mb << 20, o.max_models_per_device, o.dtype, o.offload};
  return wo;
}

// How a worker reports to the scheduler. Called from the worker thread, never under the worker's lock.
struct WorkerHooks {
  std::function<void()> capacity_freed;  // samples left the worker: assign more
  // The device failed; `jobs` (admission order) must be re-queued or failed. `why` says what failed.
  std::function<void(int worker, std::vector<JobPtr> jobs, const Status& why)> device_failed;
};

class Worker {
 public:
  Worker(int index, WorkerOptions options, const ModelRegistry& registry, MetricsRegistry& metrics,
         ThreadPool& host_pool, WorkerHooks hooks);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void start();
  // Stops the loop; jobs still held are failed with `reason`.
  void stop(const std::string& reason);

  int index() const { return index_; }
  Device device() const { return options_.models.device; }
  std::string label() const;  // "cpu#0", "cuda:1#2": device and worker index

  // --- the scheduler's view --------------------------------------------------------------------------
  void assign(JobPtr job);
  int load() const { return load_.load(); }                 // images assigned and not yet finished
  double outstanding_work() const { return outstanding_.load(); }
  int max_batch() const { return options_.max_batch; }
  bool healthy() const { return healthy_.load(); }

  // Test hook: the next model call (or, with `at_decode`, the next VAE decode of finished jobs) fails as a device
  // error, then `failing_probes` probes fail too.
  void inject_failure(int failing_probes, bool at_decode = false);

  nlohmann::json status() const;
  void collect(MetricsRegistry& m);

 private:
  struct ActiveJob;
  struct PendingCall;
  // A FLUX or Z-Image job admitted and waiting for its turn (its model loaded and held).
  struct DitJob {
    JobPtr job;
    LoadedModel model;
  };
  void run_dit_job();  // the oldest DiT job, whole, with the FLUX jobs that can share its model calls (worker_dit.cc)
  std::vector<DitJob> next_dit_batch() const;  // that job first, then the queued ones that join it
  void loop();
  bool wait_for_work();
  void admit(const JobPtr& job);
  void prefetch_prompts(const std::deque<JobPtr>& jobs);
  // One step of the loop: enqueues the next model call, then finishes the one in flight (one call ahead of the host,
  // as SdPipeline::denoise runs; ATELIER_SYNC_EACH_CALL=1 finishes each call at once).
  void run_call();
  std::unique_ptr<PendingCall> enqueue_call();  // null: nothing to run, or the batch failed (its jobs failed)
  void finish_call(PendingCall& call, PendingCall* next);  // waits for the device, reports, retires jobs done
  void finish_in_flight();  // finish_call of the call in flight, if any, with none after it
  void account_call(PendingCall& call);  // waits for the device to finish it and adds its busy span (once)
  ActiveJob* find_active(const JobPtr& job);
  // Decodes the finished jobs and hands each to the host pool, leaving null where a job was handed over (on an
  // exception the caller puts the others back in active_, so a device failure re-queues them).
  void retire(std::vector<std::unique_ptr<ActiveJob>>& finished);
  Expected<Tensor> encode_prompt(const ActiveJob& aj, const std::string& text);
  void note_call(uint64_t timed, double enqueue_s, const GraphRunner::Stats& graphs);
  void warm_up(const ActiveJob& aj);
  void drop_cancelled();
  // Cancels `j` (a cancel was asked) or fails it (past its deadline) and says so; false: it goes on.
  static bool end_if_cancelled_or_late(Job& j);
  void fail_device(const Status& why);
  void probe();
  void update_load();
  enum class BusyKind { kAdmit, kModelCall, kDecode };
  // Adds a busy span of `seconds` ending now; `rows`: the samples of a model call (0 for other kinds).
  void add_busy(BusyKind kind, double seconds, int rows = 0);
  Labels device_labels() const;

  const int index_;
  const WorkerOptions options_;
  const ModelRegistry& registry_;
  MetricsRegistry& metrics_;
  ThreadPool& host_pool_;
  const WorkerHooks hooks_;
  ModelCache models_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobPtr> inbox_;
  bool stopping_ = false;
  std::string stop_reason_;
  std::thread thread_;

  std::atomic<bool> healthy_{true};
  std::atomic<int> load_{0};
  std::atomic<double> outstanding_{0};
  std::atomic<bool> fail_next_call_{false}, fail_next_decode_{false};
  std::atomic<int> failing_probes_{0};
  std::atomic<int64_t> failures_{0};

  // Worker-thread state.
  std::list<std::unique_ptr<ActiveJob>> active_;
  std::unique_ptr<PendingCall> in_flight_;  // the model call enqueued and not yet finished
  std::deque<DitJob> dit_jobs_;             // admitted FLUX / Z-Image jobs, oldest first (the first may be running)
  Clock::time_point last_busy_end_{};       // the end of the last busy span of any kind (spans never overlap)
  std::string last_group_;
  PromptCache prompts_;
  // Groups whose device shapes are planned and recorded, with the model they were warmed on: a model evicted
  // and loaded again is a new one (its recordings are gone), even at the same address.
  std::vector<std::pair<std::weak_ptr<SdModel>, std::string>> warmed_;
  std::unique_ptr<trace::DeviceTimer> call_timer_;  // times model calls on the device (null on the CPU)
  // ATELIER_SERVE_PROFILE=1: the worker thread's op and call ranges, summed by name after each model call
  // (host time: what the thread spent enqueueing, or blocked, in each) and shown in status() as "host_profile".
  std::unique_ptr<trace::Recorder> profile_;
  void fold_profile();
  // Jobs admitted: status()'s "admissions". Not the count of admission busy spans, which also holds the
  // batched prompt prefetches (their time is admission time).
  std::atomic<uint64_t> admissions_{0};

  // Busy accounting for the busy ratio (guarded by busy_mu_).
  mutable std::mutex busy_mu_;
  double busy_by_kind_s_[3] = {};     // admission (text encoding), model calls, VAE decodes
  double busy_total_s() const { return busy_by_kind_s_[0] + busy_by_kind_s_[1] + busy_by_kind_s_[2]; }
  int64_t count_by_kind_[3] = {};
  int64_t prompt_hits_ = 0, prompt_misses_ = 0;
  int64_t prompts_prefetched_ = 0, prefetch_calls_ = 0;  // prompts encoded ahead of admission, and their calls
  double model_call_enqueue_s_ = 0;  // host time spent enqueueing model calls (the rest waits for the device)
  double model_call_device_s_ = 0;  // device time of the model calls (CUDA events); 0 where unmeasured
  GraphRunner::Stats graph_stats_;  // the last called UNet's recording statistics
  std::map<std::string, std::pair<int64_t, double>> profile_totals_;  // range name -> (count, host seconds)
  std::deque<std::pair<Clock::time_point, double>> busy_marks_;  // (time, busy_total_s) for the window
  // The last kTimelineSpans busy spans (status()'s "timeline"): when a run's ramp-up, gaps and tail happen.
  struct Span {
    double start_s, end_s;  // steady clock, seconds (the clock /v1/stats reports as "clock_s")
    BusyKind kind;
    int rows;
  };
  static constexpr size_t kTimelineSpans = 1024;
  std::deque<Span> timeline_;
};

}  // namespace atelier::serve
