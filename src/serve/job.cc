#include "serve/job.h"

namespace atelier::serve {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

const char* job_state_name(JobState s) {
  switch (s) {
    case JobState::kQueued: return "queued";
    case JobState::kRunning: return "running";
    case JobState::kDone: return "done";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
  }
  return "?";
}

Job::Job(std::string id, ServeRequest request, double timeout_s, TerminalHook on_terminal)
    : id_(std::move(id)),
      request_(std::move(request)),
      created_(Clock::now()),
      created_wall_(std::chrono::system_clock::now()),
      deadline_(timeout_s > 0 ? created_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))
                              : Clock::time_point::max()),
      on_terminal_(std::move(on_terminal)) {}

void Job::terminal_locked_hook() {
  if (on_terminal_) on_terminal_(state_, error_, images_.size(), seconds_between(created_, Clock::now()));
}

bool Job::terminal_locked() const {
  return state_ == JobState::kDone || state_ == JobState::kFailed || state_ == JobState::kCancelled;
}

void Job::emit_locked(const std::string& type, nlohmann::json data) {
  data["job_id"] = id_;
  events_.push_back({next_seq_++, type, std::move(data)});
  // Trim the oldest step/preview events first so that queued/started stay visible to late readers.
  auto droppable = [](const JobEvent& e) { return e.type == "step" || e.type == "preview"; };
  while (events_.size() > kMaxEvents) {
    auto it = events_.begin();
    while (it != events_.end() && !droppable(*it)) ++it;
    events_.erase(it == events_.end() ? events_.begin() : it);
  }
  if (terminal_locked()) {  // finished jobs are kept for polling: drop the bulky preview images
    for (JobEvent& e : events_)
      if (e.type == "preview") e.data.erase("image");
    preview_b64_.clear();
    preview_b64_.shrink_to_fit();
  }
  cv_.notify_all();
}

void Job::mark_queued() {
  std::lock_guard<std::mutex> lock(mu_);
  emit_locked("queued", {{"state", "queued"}});
}

std::optional<double> Job::mark_running(const std::string& device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (terminal_locked()) return std::nullopt;
  state_ = JobState::kRunning;
  device_ = device;
  ++attempts_;
  std::optional<double> wait;
  if (!started_) {
    started_ = Clock::now();
    wait = seconds_between(created_, *started_);
  }
  emit_locked("started", {{"state", "running"}, {"device", device}, {"attempt", attempts_}});
  return wait;
}

void Job::mark_requeued(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (terminal_locked()) return;
  state_ = JobState::kQueued;
  step_ = 0;
  preview_step_ = 0;  // the next attempt's previews start again
  emit_locked("requeued", {{"state", "queued"}, {"reason", reason}});
}

void Job::set_progress(int step, int total) {
  std::lock_guard<std::mutex> lock(mu_);
  if (terminal_locked()) return;
  step_ = step;
  total_steps_ = total;
  emit_locked("step", {{"step", step}, {"total_steps", total}, {"progress", total ? double(step) / total : 0.0}});
}

void Job::set_preview(int step, std::string jpeg_b64) {
  std::lock_guard<std::mutex> lock(mu_);
  // Previews are encoded on the host pool's threads and may finish out of order: one older than the preview already
  // shown is dropped, so clients see them in step order.
  if (terminal_locked() || step <= preview_step_) return;
  preview_step_ = step;
  preview_b64_ = jpeg_b64;
  emit_locked("preview", {{"step", step}, {"total_steps", total_steps_}, {"image", std::move(jpeg_b64)}, {"format", "jpeg"}});
}

bool Job::finish(std::vector<JobImage> images) {
  std::lock_guard<std::mutex> lock(mu_);
  if (terminal_locked()) return false;
  state_ = JobState::kDone;
  finished_at_ = Clock::now();
  step_ = total_steps_;
  images_ = std::move(images);
  nlohmann::json seeds = nlohmann::json::array();
  for (const auto& i : images_) seeds.push_back(i.seed);
  terminal_locked_hook();
  emit_locked("done", {{"state", "done"}, {"images", images_.size()}, {"seeds", seeds}});
  return true;
}

bool Job::fail(const Status& error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (terminal_locked()) return false;
  state_ = JobState::kFailed;
  finished_at_ = Clock::now();
  error_ = error;
  terminal_locked_hook();
  emit_locked("failed", {{"state", "failed"}, {"error", error.message()}});
  return true;
}

bool Job::cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (terminal_locked()) return false;
  state_ = JobState::kCancelled;
  finished_at_ = Clock::now();
  error_ = cancelled(reason);
  terminal_locked_hook();
  emit_locked("cancelled", {{"state", "cancelled"}, {"reason", reason}});
  return true;
}

void Job::request_cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!cancel_requested_.load()) cancel_reason_ = reason;
  cancel_requested_ = true;
}

std::string Job::cancel_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancel_reason_;
}

JobState Job::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

bool Job::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return terminal_locked();
}

std::vector<JobImage> Job::images() const {
  std::lock_guard<std::mutex> lock(mu_);
  return images_;
}

Status Job::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

int Job::attempts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return attempts_;
}

int Job::step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return step_;
}

int Job::total_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_steps_;
}

double Job::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == JobState::kDone) return 1.0;
  return total_steps_ ? double(step_) / total_steps_ : 0.0;
}

std::string Job::preview_b64() const {
  std::lock_guard<std::mutex> lock(mu_);
  return preview_b64_;
}

double Job::age_s() const { return seconds_between(created_, Clock::now()); }

size_t Job::result_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const JobImage& i : images_) n += i.data_b64.size() + i.infotext.size();
  return n;
}

std::optional<double> Job::finished_age_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!finished_at_) return std::nullopt;
  return seconds_between(*finished_at_, Clock::now());
}

nlohmann::json Job::to_json(bool with_images, int queue_position) const {
  std::lock_guard<std::mutex> lock(mu_);
  const ServeRequest& r = request_;
  nlohmann::json j = {{"id", id_},
                      {"state", job_state_name(state_)},
                      {"created", std::chrono::duration<double>(created_wall_.time_since_epoch()).count()},
                      {"model", r.model},
                      {"api", api_family_name(r.api)},
                      {"images_requested", r.images()},
                      {"progress", state_ == JobState::kDone ? 1.0 : total_steps_ ? double(step_) / total_steps_ : 0.0},
                      {"step", step_},
                      {"total_steps", total_steps_},
                      {"attempts", attempts_}};
  if (queue_position >= 0) j["queue_position"] = queue_position;
  if (!device_.empty()) j["device"] = device_;
  if (started_) j["queue_wait_s"] = seconds_between(created_, *started_);
  if (finished_at_) j["elapsed_s"] = seconds_between(created_, *finished_at_);
  if (!error_.is_ok()) j["error"] = error_.message();
  if (state_ == JobState::kDone) {
    nlohmann::json imgs = nlohmann::json::array();
    for (const JobImage& i : images_) {
      nlohmann::json ij = {{"seed", i.seed}, {"width", i.width}, {"height", i.height}, {"format", i.format},
                           {"infotext", i.infotext}};
      if (with_images) ij["data"] = i.data_b64;
      if (!i.path.empty()) ij["path"] = i.path;
      imgs.push_back(ij);
    }
    j["images"] = imgs;
  }
  return j;
}

std::vector<JobEvent> Job::events_after(uint64_t after, std::chrono::milliseconds wait, bool* terminal) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto has_new = [&] { return !events_.empty() && events_.back().seq > after; };
  if (!has_new()) cv_.wait_for(lock, wait, has_new);
  std::vector<JobEvent> out;
  for (const JobEvent& e : events_)
    if (e.seq > after) out.push_back(e);
  if (terminal) *terminal = terminal_locked() && (out.empty() || out.back().seq == events_.back().seq);
  return out;
}

bool Job::wait_finished(std::chrono::milliseconds wait) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, wait, [&] { return terminal_locked(); });
}

}  // namespace atelier::serve
