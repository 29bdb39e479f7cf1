// NVIDIA Management Library readings for the per-device metrics, opened at run time with
// dlopen("libnvidia-ml.so.1") so the server builds and runs on machines without a GPU driver (the readings
// are then simply absent). Only the few functions used are declared here.
#pragma once
#include <memory>
#include <optional>

namespace atelier::serve {

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

}  // namespace atelier::serve
