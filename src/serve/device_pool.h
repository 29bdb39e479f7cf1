// The device workers of one server and the routing rule: a job goes to the healthy worker with the least
// estimated outstanding work (model calls x pixels still to compute), among those with room (fewer than
// max_batch images assigned); an idle worker always has room. Reading utilisation would lag; the estimate
// is exact at the moment of the decision.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "serve/worker.h"

namespace atelier::serve {

// "cpu" -> one CPU worker; "cpu,cpu" -> two; "0,1" or "cuda:0,cuda:1" -> CUDA devices; "all" -> every CUDA
// device the backend offers (the CPU when there is none). Errors name the device that is not available.
Expected<std::vector<Device>> parse_devices(const std::string& spec);

class DevicePool {
 public:
  void add(std::unique_ptr<Worker> w) { workers_.push_back(std::move(w)); }
  // One worker per device with `base`'s options (its `models.device` set per device). CPU workers split the
  // machine's cores between them unless base.cpu_threads is set. Used by `atelier serve` and `atelier worker`.
  void add_workers(const std::vector<Device>& devices, const WorkerOptions& base, const ModelRegistry& registry,
                   MetricsRegistry& metrics, ThreadPool& host_pool, const WorkerHooks& hooks);
  void start();
  void stop(const std::string& reason);

  // The worker that should take a job of `images` images, or nullptr when none has room.
  Worker* pick() const;
  Worker* at(int index) const;
  size_t size() const { return workers_.size(); }
  int healthy_count() const;
  const std::vector<std::unique_ptr<Worker>>& workers() const { return workers_; }

 private:
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace atelier::serve
