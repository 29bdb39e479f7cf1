// A job: one accepted request, from the queue to its result. Thread-safe: HTTP threads read it (status,
// events), the scheduler and a device worker move it through its states, the host pool stores its images.
//
//   queued -> running -> done | failed | cancelled        (running -> queued again after a device failure)
//
// Every transition and every denoising step appends an event to a bounded log that the server-sent-events
// endpoints replay from any sequence number; a slow reader misses old step events (the log keeps the last
// kMaxEvents), never blocks the worker, and always gets the terminal event.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/serve_request.h"

namespace atelier::serve {

using Clock = std::chrono::steady_clock;
// Clock's reading in seconds: the time base of the workers' timelines and of /v1/stats' "clock_s".
inline double steady_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

enum class JobState { kQueued, kRunning, kDone, kFailed, kCancelled };
const char* job_state_name(JobState s);

struct JobImage {
  std::string data_b64;   // the encoded image (PNG with infotext, or JPEG/WebP with EXIF UserComment)
  std::string format;     // png | jpeg | webp
  std::string infotext;   // A1111 "parameters"
  int64_t seed = 0;
  int width = 0, height = 0;
  std::string path;       // where it was saved (--output-dir), else empty
};

struct JobEvent {
  uint64_t seq = 0;
  std::string type;       // queued | started | step | requeued | done | failed | cancelled
  nlohmann::json data;
};

// Called once, under the job's lock, when a job reaches a terminal state — before any waiter can see it, so
// that counters are up to date when a client learns the outcome. Must not call back into the job.
// Arguments: the terminal state, the error (failed/cancelled), the images made, seconds since submission.
using TerminalHook = std::function<void(JobState, const Status&, size_t images, double age_s)>;

class Job {
 public:
  static constexpr size_t kMaxEvents = 256;

  Job(std::string id, ServeRequest request, double timeout_s, TerminalHook on_terminal = {});
  const std::string& id() const { return id_; }
  const ServeRequest& request() const { return request_; }
  Clock::time_point created() const { return created_; }
  Clock::time_point deadline() const { return deadline_; }
  std::chrono::system_clock::time_point created_wall() const { return created_wall_; }

  // --- transitions (each emits an event; transitions out of a terminal state are ignored) -------------
  void mark_queued();
  // Returns the queue wait (seconds) the first time the job starts, nullopt on a restart.
  std::optional<double> mark_running(const std::string& device);
  void mark_requeued(const std::string& reason);
  // After a model call: `step` of `total` calls done for the slowest of the job's images.
  void set_progress(int step, int total);
  void set_preview(int step, std::string jpeg_b64);
  bool finish(std::vector<JobImage> images);
  bool fail(const Status& error);
  bool cancel(const std::string& reason);

  // --- cancellation requests (DELETE, interrupt, timeout): honoured at the next step boundary ---------
  void request_cancel(const std::string& reason);
  bool cancel_requested() const { return cancel_requested_.load(); }
  std::string cancel_reason() const;

  // --- reads -----------------------------------------------------------------------------------------
  JobState state() const;
  bool finished() const;
  std::vector<JobImage> images() const;
  Status error() const;
  int attempts() const;  // times the job started on a device
  int step() const;
  int total_steps() const;
  double progress() const;  // 0..1
  std::string preview_b64() const;  // latest preview JPEG, base64 (empty when none)
  double age_s() const;
  std::optional<double> finished_age_s() const;  // seconds since the terminal transition
  size_t result_bytes() const;  // bytes of the encoded images held

  // The GET /v1/jobs/{id} document; images included when `with_images`.
  nlohmann::json to_json(bool with_images, int queue_position) const;
  // Events with seq > after, waiting up to `wait` for the first one. `terminal` is set when the log ends.
  std::vector<JobEvent> events_after(uint64_t after, std::chrono::milliseconds wait, bool* terminal) const;
  // Waits until the job is finished or `wait` passes; returns finished().
  bool wait_finished(std::chrono::milliseconds wait) const;

 private:
  void emit_locked(const std::string& type, nlohmann::json data);
  void terminal_locked_hook();
  bool terminal_locked() const;

  const std::string id_;
  const ServeRequest request_;
  const Clock::time_point created_;
  const std::chrono::system_clock::time_point created_wall_;
  const Clock::time_point deadline_;
  const TerminalHook on_terminal_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  JobState state_ = JobState::kQueued;
  std::string device_;
  int attempts_ = 0;
  int step_ = 0, total_steps_ = 0;
  std::optional<Clock::time_point> started_, finished_at_;
  std::vector<JobImage> images_;
  Status error_;
  std::string preview_b64_;
  int preview_step_ = 0;
  std::deque<JobEvent> events_;
  uint64_t next_seq_ = 1;
  std::atomic<bool> cancel_requested_{false};
  std::string cancel_reason_;
};

using JobPtr = std::shared_ptr<Job>;

}  // namespace atelier::serve
