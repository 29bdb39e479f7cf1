// NVIDIA Management Library readings (the server's per-device metrics, `atelier bench`'s utilization), opened
// at run time with dlopen("libnvidia-ml.so.1") so that everything builds and runs on machines without a GPU
// driver (the readings are then simply absent). Only the few functions used are declared here. Device
// indices are CUDA's, as the server's device pool counts them; CUDA_VISIBLE_DEVICES renumbers them (CUDA's
// device i is the i-th GPU it lists, by NVML index or UUID), which read() follows. (With identical GPUs CUDA's
// default order is NVML's PCI order; CUDA_DEVICE_ORDER=PCI_BUS_ID makes it so for mixed ones.)
#pragma once
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace atelier {

// Which GPU NVML should read for CUDA device `cuda_index` under CUDA_VISIBLE_DEVICES = `visible` (null or
// empty: unset, the same index): an NVML index, or a UUID ("GPU-..."/"MIG-..." entries); nullopt when CUDA
// cannot see that many devices.
struct NvmlSelector {
  unsigned index = 0;
  std::string uuid;  // non-empty: select by UUID
};
std::optional<NvmlSelector> nvml_selector(const char* visible, int cuda_index);

struct GpuReading {
  double utilization = 0;      // 0..1 (GPU busy fraction over NVML's last sample period)
  double memory_used = 0;      // bytes
  double memory_total = 0;     // bytes
  double temperature_c = 0;
  double power_w = 0;
  double sm_clock_hz = 0;
};

class Nvml {
 public:
  // nullptr when the library or the driver is unavailable.
  static std::unique_ptr<Nvml> open();
  ~Nvml();
  // Readings of CUDA device `index`; nullopt when NVML cannot read that device.
  std::optional<GpuReading> read(int index) const;

 private:
  struct Api;
  explicit Nvml(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

// Samples one GPU's utilization on a background thread from construction until stop(): what a user of
// nvidia-smi would see during the measured loop. NVML's counter covers its own last sample period (1/6 s to
// 1 s by GPU), so runs shorter than that read little. Without NVML or for a device it cannot read, stop()
// gives nullopt.
class NvmlUtilizationSampler {
 public:
  static constexpr std::chrono::milliseconds kDefaultPeriod{50};
  NvmlUtilizationSampler(int device_index, std::chrono::milliseconds period = kDefaultPeriod);
  ~NvmlUtilizationSampler();
  NvmlUtilizationSampler(const NvmlUtilizationSampler&) = delete;
  NvmlUtilizationSampler& operator=(const NvmlUtilizationSampler&) = delete;
  // Stops sampling (idempotent): the mean utilization in percent over the samples read, if any.
  std::optional<double> stop();

 private:
  void run(int device_index, std::chrono::milliseconds period);

  std::unique_ptr<Nvml> nvml_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  double sum_ = 0.0;
  int samples_ = 0;
  std::thread thread_;
};

}  // namespace atelier
