#include "backend/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/trace.h"

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
  nvmlReturn_t (*energy)(nvmlDevice_t, unsigned long long*) = nullptr;  // millijoules since load; optional
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
  sym(api->energy, "nvmlDeviceGetTotalEnergyConsumption");
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

NvmlSampler::NvmlSampler(int device_index, std::chrono::milliseconds period) : nvml_(Nvml::open()), device_index_(device_index) {
  if (!nvml_) return;
  {
    // The first reading before the constructor returns: it precedes whatever the caller times next, so the
    // samples cover that span from its start (a first reading taken by the thread came up to milliseconds late).
    std::lock_guard<std::mutex> lock(mu_);
    sample(device_index);
  }
  if (!samples_.empty()) thread_ = std::thread([this, device_index, period] { run(device_index, period); });
}

NvmlSampler::~NvmlSampler() { stop(); }

void NvmlSampler::sample(int device_index) {
  const std::optional<GpuReading> r = nvml_->read(device_index);
  if (!r) return;
  samples_.push_back(NvmlSample{trace::now_ns(), r->utilization, r->sm_clock_hz, r->energy_j});
}

void NvmlSampler::run(int device_index, std::chrono::milliseconds period) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, period, [this] { return stopping_; }))
    sample(device_index);  // under the lock: NVML's calls take microseconds, stop() waits for them
}

std::optional<double> NvmlSampler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  const bool was_running = thread_.joinable();
  if (was_running) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (was_running) sample(device_index_);  // the run's end: a last reading (once: the thread is joined now)
  if (samples_.empty()) return std::nullopt;
  constexpr double kPercent = 100.0;
  double sum = 0.0;
  for (const NvmlSample& x : samples_) sum += x.utilization;
  return kPercent * sum / double(samples_.size());
}

std::optional<double> energy_between(const std::vector<NvmlSample>& samples, int64_t a_ns, int64_t b_ns) {
  // The counter is a staircase (on an H200 it moves every ~100 ms, 13-149 ms apart: session 18), while the
  // samples come every 10 ms: between two samples on one step the energy did not stop. So the cumulative
  // energy is taken as known at the samples where a new value first shows (each step's time, within one
  // sample period), linear between them and extended at either end by the nearest step's slope.
  std::vector<const NvmlSample*> steps;
  const NvmlSample* last = nullptr;
  for (const NvmlSample& x : samples) {
    if (!x.energy_j) continue;
    if (!last || *x.energy_j != *last->energy_j) steps.push_back(&x);
    last = &x;
  }
  constexpr size_t kMinSteps = 3;  // two changes of the counter: one slope at least
  if (steps.size() < kMinSteps || !last || b_ns < a_ns || steps.front()->t_ns > a_ns || last->t_ns < b_ns) return std::nullopt;
  // The first reading's value was reached at an unknown earlier time: it anchors nothing.
  steps.erase(steps.begin());
  const auto at = [&](int64_t t) {
    size_t i = 1;
    while (i + 1 < steps.size() && steps[i]->t_ns < t) ++i;
    const NvmlSample& lo = *steps[i - 1];
    const NvmlSample& hi = *steps[i];
    const double slope = (*hi.energy_j - *lo.energy_j) / double(hi.t_ns - lo.t_ns);
    return *lo.energy_j + slope * double(t - lo.t_ns);
  };
  return at(b_ns) - at(a_ns);
}

std::optional<double> mean_sm_clock_mhz(const std::vector<NvmlSample>& samples, int64_t a_ns, int64_t b_ns) {
  if (samples.empty()) return std::nullopt;
  constexpr double kMhz = 1e6;
  double sum = 0.0;
  int n = 0;
  for (const NvmlSample& x : samples)
    if (x.t_ns >= a_ns && x.t_ns <= b_ns) {
      sum += x.sm_clock_hz;
      ++n;
    }
  if (n > 0) return sum / n / kMhz;
  const int64_t mid = a_ns + (b_ns - a_ns) / 2;
  const auto nearest = std::min_element(samples.begin(), samples.end(), [mid](const NvmlSample& p, const NvmlSample& q) {
    return std::llabs(p.t_ns - mid) < std::llabs(q.t_ns - mid);
  });
  return nearest->sm_clock_hz / kMhz;
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
  constexpr double kJoulesPerMillijoule = 1e-3;
  unsigned long long mj = 0;
  if (api_->energy && api_->energy(dev, &mj) == kNvmlSuccess) r.energy_j = double(mj) * kJoulesPerMillijoule;
  return r;
}

}  // namespace atelier
