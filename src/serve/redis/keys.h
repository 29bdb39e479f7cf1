// The Redis keys of the shared queue (all under the `atelier:` prefix) and the job hash's field names.
// docs/serve.md ("Redis mode") describes each and who writes it.
#pragma once
#include <string>

namespace atelier::serve::redis {

inline constexpr const char* kGroup = "workers";                 // the one consumer group of every jobs stream
inline constexpr const char* kWorkersKey = "atelier:workers";    // hash: worker name -> heartbeat JSON
inline constexpr const char* kStatsKey = "atelier:stats";        // hash: reclaimed, dead_letters (counters)
inline constexpr const char* kDeadKey = "atelier:dead";          // stream: malformed messages moved aside
inline constexpr const char* kModelsKey = "atelier:models";      // set: model names that have a jobs stream

// One stream per model, so a worker reads only the models it serves: entries {id: <job id>}.
inline std::string jobs_stream(const std::string& model) { return "atelier:jobs:" + model; }
// The job hash: state, request (JSON), model, entry (stream entry id), epoch, owner, device, step,
// total_steps, attempts, cancel (a reason, set while running), error, result (JSON), created_ms, finished_ms.
inline std::string job_key(const std::string& id) { return "atelier:job:" + id; }
// The job's events: entries {type, data (JSON)}; a gateway replays them from the start after a restart.
inline std::string events_key(const std::string& id) { return "atelier:events:" + id; }
// One image of a result, binary (encoded PNG/JPEG/WebP); `epoch` keeps a stale owner's write apart.
inline std::string result_key(const std::string& id, int64_t epoch, size_t n) {
  return "atelier:result:" + id + ":" + std::to_string(epoch) + ":" + std::to_string(n);
}

}  // namespace atelier::serve::redis
