#include "serve/device_pool.h"

#include <algorithm>
#include <thread>

#include "backend/backend.h"

namespace atelier::serve {
namespace {

constexpr int kMaxCudaDevices = 16;

}  // namespace

Expected<std::vector<Device>> parse_devices(const std::string& spec) {
  std::vector<Device> out;
  if (spec == "all") {
    for (int i = 0; i < kMaxCudaDevices; ++i)
      if (backend_available(Device::cuda(i))) out.push_back(Device::cuda(i));
    if (out.empty()) out.push_back(Device::cpu());
    return out;
  }
  size_t start = 0;
  while (start <= spec.size()) {
    const size_t comma = spec.find(',', start);
    std::string item = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    if (!item.empty() && item.find_first_not_of("0123456789") == std::string::npos) item = "cuda:" + item;
    auto dev = Device::parse(item);
    if (!dev) return invalid_argument("--devices: " + dev.status().message() + " (use all, cpu, or CUDA indices like 0,1)");
    if (!backend_available(*dev))
      return unsupported("--devices: " + dev->str() + " is not available in this build or on this machine");
    out.push_back(*dev);
  }
  if (out.empty()) return invalid_argument("--devices: no device given");
  return out;
}

void DevicePool::add_workers(const std::vector<Device>& devices, const WorkerOptions& base, const ModelRegistry& registry,
                             MetricsRegistry& metrics, ThreadPool& host_pool, const WorkerHooks& hooks) {
  int cpu_workers = 0;
  for (const Device& d : devices) cpu_workers += d.is_cpu();
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  for (size_t i = 0; i < devices.size(); ++i) {
    WorkerOptions wo = base;
    if (wo.cpu_threads <= 0) wo.cpu_threads = std::max(1, cores / std::max(1, cpu_workers));
    wo.models.device = devices[i];
    add(std::make_unique<Worker>(int(workers_.size()), wo, registry, metrics, host_pool, hooks));
  }
}

void DevicePool::start() {
  for (auto& w : workers_) w->start();
}

void DevicePool::stop(const std::string& reason) {
  for (auto& w : workers_) w->stop(reason);
}

Worker* DevicePool::pick() const {
  Worker* best = nullptr;
  for (const auto& w : workers_) {
    if (!w->healthy() || (w->load() > 0 && w->load() >= w->max_batch())) continue;
    if (!best || w->outstanding_work() < best->outstanding_work()) best = w.get();
  }
  return best;
}

Worker* DevicePool::at(int index) const {
  return index >= 0 && size_t(index) < workers_.size() ? workers_[size_t(index)].get() : nullptr;
}

int DevicePool::healthy_count() const {
  int n = 0;
  for (const auto& w : workers_) n += w->healthy();
  return n;
}

}  // namespace atelier::serve
