#include "backend/cuda/cuda_timer.h"

#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"

namespace atelier::cuda {

namespace {

// Ranges kept resolvable: a 20-step SD generation opens about 25,000 op ranges.
constexpr uint64_t kSlots = uint64_t(1) << 17;

class CudaEventTimer final : public trace::DeviceTimer {
 public:
  explicit CudaEventTimer(CudaBackend& backend) : backend_(backend) {
    DeviceGuard guard(backend_.index());
    ATELIER_CUDA_OK(cudaEventCreate(&origin_));
    backend_.synchronize();
    ATELIER_CUDA_OK(cudaEventRecord(origin_, backend_.stream()));
    ATELIER_CUDA_OK(cudaEventSynchronize(origin_));
    origin_ns_ = trace::now_ns();
  }
  ~CudaEventTimer() override {
    DeviceGuard guard(backend_.index());
    for (auto& s : slots_) {
      if (s.start) cudaEventDestroy(s.start);
      if (s.end) cudaEventDestroy(s.end);
    }
    cudaEventDestroy(origin_);
  }

  std::string device_name() const override { return "cuda:" + std::to_string(backend_.index()); }
  int64_t origin_host_ns() const override { return origin_ns_; }

  uint64_t begin(const char*, trace::Category) override {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(backend_.stream(), &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone)
      return 0;
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t token = ++next_;  // tokens 1, 2, ...; slot = token % kSlots
    Slot& s = slot(token);
    DeviceGuard guard(backend_.index());
    if (!s.start) {
      ATELIER_CUDA_OK(cudaEventCreate(&s.start));
      ATELIER_CUDA_OK(cudaEventCreate(&s.end));
    }
    s.token = token;
    s.ended = false;
    ATELIER_CUDA_OK(cudaEventRecord(s.start, backend_.stream()));
    return token;
  }

  void end(uint64_t token) override {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slot(token);
    if (s.token != token) return;  // recycled meanwhile
    DeviceGuard guard(backend_.index());
    ATELIER_CUDA_OK(cudaEventRecord(s.end, backend_.stream()));
    s.ended = true;
  }

  std::optional<trace::DeviceSpan> resolve(uint64_t token) override {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slot(token);
    if (s.token != token || !s.ended) return std::nullopt;
    DeviceGuard guard(backend_.index());
    float start_ms = 0, dur_ms = 0;
    if (cudaEventElapsedTime(&start_ms, origin_, s.start) != cudaSuccess ||
        cudaEventElapsedTime(&dur_ms, s.start, s.end) != cudaSuccess) {
      cudaGetLastError();  // not yet complete: the caller did not synchronize
      return std::nullopt;
    }
    return trace::DeviceSpan{double(start_ms) * 1e3, double(dur_ms) * 1e3};
  }

 private:
  struct Slot {
    cudaEvent_t start = nullptr, end = nullptr;
    uint64_t token = 0;
    bool ended = false;
  };
  Slot& slot(uint64_t token) { return slots_[token % kSlots]; }

  CudaBackend& backend_;
  cudaEvent_t origin_ = nullptr;
  int64_t origin_ns_ = 0;
  std::mutex mu_;
  std::vector<Slot> slots_ = std::vector<Slot>(kSlots);
  uint64_t next_ = 0;
};

}  // namespace

std::unique_ptr<trace::DeviceTimer> make_device_timer(int index) {
  if (!backend_available(Device::cuda(index))) return nullptr;
  return std::make_unique<CudaEventTimer>(cuda_backend(index));
}

std::unique_ptr<trace::DeviceTimer> CudaBackend::make_device_timer() { return std::make_unique<CudaEventTimer>(*this); }

}  // namespace atelier::cuda
