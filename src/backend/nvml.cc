#include "backend/nvml.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace atelier {
namespace {

// The subset of nvml.h used here (ABI-stable since NVML 5; the _v2 entry points since CUDA 5.5).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kNvmlTemperatureGpu = 0;
constexpr int kNvmlClockSm = 1;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

}  // namespace

struct Nvml::Api {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*handle_by_uuid)(const char*, nvmlDevice_t*) = nullptr;  // optional
  nvmlReturn_t (*utilization)(nvmlDevice_t, NvmlUtilization*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, NvmlMemory*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;  // milliwatts
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned int*) = nullptr;  // MHz
};

std::unique_ptr<Nvml> Nvml::open() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return nullptr;
  auto api = std::make_unique<Api>();
  api->lib = lib;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    return fn != nullptr;
  };
  const bool ok = sym(api->init, "nvmlInit_v2") && sym(api->shutdown, "nvmlShutdown") &&
                  sym(api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2") &&
                  sym(api->utilization, "nvmlDeviceGetUtilizationRates") && sym(api->memory, "nvmlDeviceGetMemoryInfo") &&
                  sym(api->temperature, "nvmlDeviceGetTemperature") && sym(api->power, "nvmlDeviceGetPowerUsage") &&
                  sym(api->clock, "nvmlDeviceGetClockInfo");
  sym(api->handle_by_uuid, "nvmlDeviceGetHandleByUUID");
  if (!ok || api->init() != kNvmlSuccess) {
    dlclose(lib);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(api)));
}

Nvml::Nvml(std::unique_ptr<Api> api) : api_(std::move(api)) {}

Nvml::~Nvml() {
  if (api_ && api_->lib) {
    api_->shutdown();
    dlclose(api_->lib);
  }
}

NvmlUtilizationSampler::NvmlUtilizationSampler(int device_index, std::chrono::milliseconds period) : nvml_(Nvml::open()) {
  if (nvml_ && nvml_->read(device_index)) thread_ = std::thread([this, device_index, period] { run(device_index, period); });
}

NvmlUtilizationSampler::~NvmlUtilizationSampler() { stop(); }

void NvmlUtilizationSampler::run(int device_index, std::chrono::milliseconds period) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    const std::optional<GpuReading> r = nvml_->read(device_index);
    lock.lock();
    if (r) {
      sum_ += r->utilization;
      ++samples_;
    }
    wake_.wait_for(lock, period, [this] { return stopping_; });
  }
}

std::optional<double> NvmlUtilizationSampler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (samples_ == 0) return std::nullopt;
  constexpr double kPercent = 100.0;
  return kPercent * sum_ / samples_;
}

std::optional<NvmlSelector> nvml_selector(const char* visible, int cuda_index) {
  if (cuda_index < 0) return std::nullopt;
  if (visible == nullptr || *visible == '\0') return NvmlSelector{unsigned(cuda_index), ""};
  std::vector<std::string> entries;
  std::string cur;
  for (const char* p = visible;; ++p) {
    if (*p == ',' || *p == '\0') {
      entries.push_back(cur);
      cur.clear();
      if (*p == '\0') break;
    } else if (*p != ' ') {
      cur += *p;
    }
  }
  const auto is_uuid = [](const std::string& e) { return e.rfind("GPU-", 0) == 0 || e.rfind("MIG-", 0) == 0; };
  const auto is_index = [](const std::string& e) { return !e.empty() && e.find_first_not_of("0123456789") == std::string::npos; };
  // CUDA stops at the first entry that is neither: the devices after it are invisible.
  for (int i = 0; i <= cuda_index; ++i)
    if (size_t(i) >= entries.size() || !(is_uuid(entries[size_t(i)]) || is_index(entries[size_t(i)]))) return std::nullopt;
  const std::string& e = entries[size_t(cuda_index)];
  if (is_uuid(e)) return NvmlSelector{0, e};
  return NvmlSelector{unsigned(std::stoul(e)), ""};
}

std::optional<GpuReading> Nvml::read(int index) const {
  const std::optional<NvmlSelector> sel = nvml_selector(std::getenv("CUDA_VISIBLE_DEVICES"), index);
  if (!sel) return std::nullopt;
  nvmlDevice_t dev = nullptr;
  const nvmlReturn_t found = sel->uuid.empty() ? api_->handle_by_index(sel->index, &dev)
                             : api_->handle_by_uuid ? api_->handle_by_uuid(sel->uuid.c_str(), &dev)
                                                    : nvmlReturn_t(-1);
  if (found != kNvmlSuccess) return std::nullopt;
  GpuReading r;
  NvmlUtilization u{};
  if (api_->utilization(dev, &u) == kNvmlSuccess) r.utilization = u.gpu / 100.0;
  NvmlMemory m{};
  if (api_->memory(dev, &m) == kNvmlSuccess) {
    r.memory_used = double(m.used);
    r.memory_total = double(m.total);
  }
  unsigned int v = 0;
  if (api_->temperature(dev, kNvmlTemperatureGpu, &v) == kNvmlSuccess) r.temperature_c = v;
  if (api_->power(dev, &v) == kNvmlSuccess) r.power_w = v / 1000.0;
  if (api_->clock(dev, kNvmlClockSm, &v) == kNvmlSuccess) r.sm_clock_hz = v * 1e6;
  return r;
}

}  // namespace atelier
