// NVIDIA Management Library readings (the server's per-device metrics, `atelier bench`'s utilization, energy and
// clock), opened at run time with dlopen("libnvidia-ml.so.1") so that everything builds and runs on machines
// without a GPU driver (the readings are then simply absent). Only the few functions used are declared here. Device
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
#include <vector>

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
  // Energy the GPU has used since the driver loaded (nvmlDeviceGetTotalEnergyConsumption, Volta and newer;
  // absent on older GPUs and drivers without it). Differences between two readings are what a run used.
  std::optional<double> energy_j;
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

// One reading of the sampler below: host steady-clock time (trace::now_ns()) and what NVML said then.
struct NvmlSample {
  int64_t t_ns = 0;
  double utilization = 0;  // 0..1
  double sm_clock_hz = 0;
  std::optional<double> energy_j;  // cumulative (GpuReading::energy_j)
};

// Energy (J) used between host times a_ns <= b_ns from the samples' cumulative counter, taken where it changed
// (NVML refreshes it in steps, ~100 ms apart on an H200) and linear between and beyond those points; nullopt
// when the samples do not cover [a_ns, b_ns] or the counter changed fewer than twice. Over a span of T seconds
// the error is about the power's change within one step over T: benches report it for spans of a second or more.
std::optional<double> energy_between(const std::vector<NvmlSample>& samples, int64_t a_ns, int64_t b_ns);
// Mean SM clock (MHz) of the samples inside [a_ns, b_ns] (the nearest one when none is inside); nullopt without
// samples.
std::optional<double> mean_sm_clock_mhz(const std::vector<NvmlSample>& samples, int64_t a_ns, int64_t b_ns);

// Samples one GPU on a background thread from construction until stop(): its utilization (what a user of
// nvidia-smi would see during the measured loop), SM clock and energy counter, each sample timed on the host's
// steady clock, the first at construction and the last at stop(). NVML's utilization counter covers its own
// last sample period (1/6 s to 1 s by GPU), so runs shorter than that read little. Without NVML or for a device
// it cannot read, stop() gives nullopt and there are no samples.
class NvmlSampler {
 public:
  static constexpr std::chrono::milliseconds kDefaultPeriod{10};
  NvmlSampler(int device_index, std::chrono::milliseconds period = kDefaultPeriod);
  ~NvmlSampler();
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;
  // Stops sampling (idempotent): the mean utilization in percent over the samples read, if any.
  std::optional<double> stop();
  // The samples (after stop()).
  const std::vector<NvmlSample>& samples() const { return samples_; }

 private:
  void run(int device_index, std::chrono::milliseconds period);
  void sample(int device_index);  // appends one reading (mu_ held)

  std::unique_ptr<Nvml> nvml_;
  int device_index_ = 0;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<NvmlSample> samples_;
  std::thread thread_;
};

}  // namespace atelier
