// Timing a few enqueued runs with CUDA events, for the per-shape choices made at a shape's first eager call
// (cuDNN graph-API plans, cuDNN SDPA against the flash kernel, cuBLASLt algorithms).
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/choice_store.h"
#include "backend/cuda/cuda_common.h"

namespace atelier::cuda {

// CUDA events for timing, destroyed with the timer.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  bool ok = false;
  EventPair() { ok = cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess; }
  ~EventPair() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

// Timing with a cold L2 (on unless ATELIER_TIMING_COLD=0): each timed call comes after a write of kColdBytes, more
// than the L2 holds (H200: 50 MB), so that the call reads its operands from DRAM as a replayed model step reads its
// weights. Back to back, a candidate's second and third calls found its weights (SD's 8x8 convolutions: 29.5-59 MB)
// in L2, which favoured forms the replay then ran slower (session 37). Measured in session 38 (docs/performance.md),
// in turns on one card each: CFG 5.011 / 5.013 ms against 5.054 / 5.051 back to back, 16 rows 26.27 / 26.45 against
// 26.37 / 26.48.
constexpr size_t kColdBytes = size_t(96) << 20;
inline bool timing_cold() {
  static const bool on = !env_is("ATELIER_TIMING_COLD", "0");
  return on;
}
// The current device's kColdBytes of scratch for timing_cold (allocated at its first use, kept for the process), or
// null where it cannot be allocated (then the calls are timed warm).
inline void* cold_scratch() {
  static std::mutex mu;
  static std::map<int, void*> scratch;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = scratch.try_emplace(device, nullptr);
  if (fresh && cudaMalloc(&it->second, kColdBytes) != cudaSuccess) {
    (void)cudaGetLastError();
    it->second = nullptr;
  }
  return it->second;
}

// Mean device milliseconds of `runs` calls of `enqueue` on `stream`, or -1 when one returns false or an event fails:
// back to back, or (timing_cold) each alone after the L2 is overwritten. Synchronises: never call it while the stream
// is being captured.
inline float time_runs_cold(const EventPair& ev, cudaStream_t stream, int runs, const std::function<bool()>& enqueue,
                            void* scratch) {
  float total = 0.0f;
  for (int i = 0; i < runs; ++i) {
    float ms = 0.0f;
    if (cudaMemsetAsync(scratch, i & 1, kColdBytes, stream) != cudaSuccess ||
        cudaEventRecord(ev.start, stream) != cudaSuccess || !enqueue() || cudaEventRecord(ev.stop, stream) != cudaSuccess ||
        cudaEventSynchronize(ev.stop) != cudaSuccess || cudaEventElapsedTime(&ms, ev.start, ev.stop) != cudaSuccess)
      return -1.0f;
    total += ms;
  }
  return total / float(runs);
}
inline float time_runs(const EventPair& ev, cudaStream_t stream, int runs, const std::function<bool()>& enqueue) {
  if (!ev.ok) return -1.0f;
  if (timing_cold())
    if (void* scratch = cold_scratch()) return time_runs_cold(ev, stream, runs, enqueue, scratch);
  if (cudaEventRecord(ev.start, stream) != cudaSuccess) return -1.0f;
  for (int i = 0; i < runs; ++i)
    if (!enqueue()) return -1.0f;
  float ms = 0.0f;
  if (cudaEventRecord(ev.stop, stream) != cudaSuccess || cudaEventSynchronize(ev.stop) != cudaSuccess ||
      cudaEventElapsedTime(&ms, ev.start, ev.stop) != cudaSuccess)
    return -1.0f;
  return ms / float(runs);
}

// Each candidate's best of `rounds` turns of `runs` back-to-back calls (mean device ms per call), after one
// warm-up call each; -1 for a candidate whose warm-up or a run fails (it takes no further turns). Why turns:
// timed one after the other, the candidates met the GPU at different clocks (a process's first calls plan
// while the clocks still ramp) and cache states, and the choice between plans within a few percent of each
// other changed from one process to the next (cuDNN's SDPA at SD's head dim 40: 140 against 153 us per call).
// Synchronises: never call it while the stream is being captured.
inline std::vector<float> time_in_turns(const EventPair& ev, cudaStream_t stream, int rounds, int runs,
                                        const std::vector<std::function<bool()>>& candidates) {
  std::vector<float> best(candidates.size(), -1.0f);
  std::vector<bool> alive(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) alive[i] = time_runs(ev, stream, 1, candidates[i]) >= 0.0f;
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (!alive[i]) continue;
      const float ms = time_runs(ev, stream, runs, candidates[i]);
      if (ms < 0.0f) {
        alive[i] = false;
        best[i] = -1.0f;
      } else if (best[i] < 0.0f || ms < best[i]) {
        best[i] = ms;
      }
    }
  return best;
}

// Whether work enqueued on `stream` now would be recorded into a CUDA graph (then nothing may be timed).
inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

// Per key (a shape), which of a few candidates is fastest: all timed in turns (time_in_turns, each run once before,
// so that planning and tuning are not timed) at the key's first eager call, the answer kept. Under capture an unknown
// key answers 0 (the first) without deciding. `log`, where given, sees every time (-1: failed) and the answer. The
// candidates write the same outputs: whichever ran last left the right result. With a store (keep_in), answers are
// kept for later processes too, and an answer an earlier process kept is taken without timing.
template <typename Key>
class TimedChoice {
 public:
  using Log = std::function<void(const std::vector<float>&, int)>;
  int fastest(const Key& key, cudaStream_t stream, const std::vector<std::function<bool()>>& candidates, const Log& log = {}) {
    ChoiceStore* store = nullptr;
    std::string stored_key;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = answers_.find(key);
      if (it != answers_.end()) return it->second;
      store = store_;
      // The candidate count is part of the key: a stored index always names one of today's candidates.
      if (store) stored_key = choice_key(site_, key, "of", candidates.size());
    }
    // Under capture nothing is decided, stored answers included: the winner's first run may plan (a cuDNN plan,
    // a workspace), which a recording cannot hold.
    if (stream_capturing(stream)) return 0;
    if (store) {
      const std::optional<int64_t> kept = store->get(stored_key);
      if (kept && *kept >= 0 && *kept < int64_t(candidates.size())) {
        std::lock_guard<std::mutex> lock(mu_);
        answers_[key] = int(*kept);
        return int(*kept);
      }
    }
    EventPair events;
    int answer = 0;
    if (events.ok) {
      const std::vector<float> ms = time_in_turns(events, stream, kRounds, kRuns, candidates);
      for (size_t i = 1; i < ms.size(); ++i)  // ties go to the earlier candidate
        if (ms[i] >= 0.0f && (ms[answer] < 0.0f || ms[i] < ms[answer])) answer = int(i);
      if (log) log(ms, answer);
      if (store) store->put(stored_key, answer);
    }
    std::lock_guard<std::mutex> lock(mu_);
    answers_[key] = answer;
    return answer;
  }

  // Whether `second` is faster than `first` (the two-candidate form).
  bool second_is_faster(const Key& key, cudaStream_t stream, const std::function<bool()>& first, const std::function<bool()>& second,
                        const std::function<void(float, float, bool)>& log = {}) {
    Log both;
    if (log) both = [&log](const std::vector<float>& ms, int answer) { log(ms[0], ms[1], answer == 1); };
    return fastest(key, stream, {first, second}, both) == 1;
  }

  // Answers are also kept in `store` (not owned; null: this process only), under `site` (names the choice).
  void keep_in(ChoiceStore* store, std::string site) {
    std::lock_guard<std::mutex> lock(mu_);
    store_ = store;
    site_ = std::move(site);
  }

 private:
  static constexpr int kRounds = 2, kRuns = 3;
  std::mutex mu_;
  std::map<Key, int> answers_;
  ChoiceStore* store_ = nullptr;
  std::string site_;
};

}  // namespace atelier::cuda
