#include "backend/cuda/cuda_timer.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {

namespace {

// Ranges kept resolvable: a 20-step SD generation opens about 25,000 op ranges.
constexpr uint64_t kSlots = uint64_t(1) << 17;

// ATELIER_CUDA_PROFILE_RANGE=NAME[:SKIP]: the profiler API's capture range (cudaProfilerStart/Stop) is the
// (SKIP+1)-th traced range named NAME (a stage or call such as "unet"), so that `ncu --profile-from-start off`
// measures exactly one model call's kernels, not the plan searches and warm-up before it.
struct ProfileRange {
  std::string name;
  int skip = 0;
  static ProfileRange from_env() {
    ProfileRange r;
    const char* v = std::getenv("ATELIER_CUDA_PROFILE_RANGE");
    if (v == nullptr || *v == '\0') return r;
    const std::string s = v;
    const size_t colon = s.find(':');
    r.name = s.substr(0, colon);
    if (colon != std::string::npos) r.skip = std::atoi(s.c_str() + colon + 1);
    return r;
  }
};

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

  uint64_t begin(const char* name, trace::Category category) override {
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
    // Stages and calls also open NVTX ranges (ops open their own in the backend) for external profilers.
    s.nvtx = category == trace::Category::kStage || category == trace::Category::kCall;
    if (s.nvtx) nvtxRangePushA(name);
    s.profiled = !profile_.name.empty() && !profiling_ && profile_.name == name && profile_seen_++ == profile_.skip;
    if (s.profiled) {
      profiling_ = true;
      ATELIER_CUDA_OK(cudaProfilerStart());
    }
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
    if (s.profiled) {
      ATELIER_CUDA_OK(cudaProfilerStop());
      s.profiled = false;
    }
    if (s.nvtx) nvtxRangePop();
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
    bool nvtx = false;      // pushed an NVTX range
    bool profiled = false;  // opened the profiler's capture range
  };
  Slot& slot(uint64_t token) { return slots_[token % kSlots]; }

  CudaBackend& backend_;
  cudaEvent_t origin_ = nullptr;
  int64_t origin_ns_ = 0;
  std::mutex mu_;
  std::vector<Slot> slots_ = std::vector<Slot>(kSlots);
  uint64_t next_ = 0;
  const ProfileRange profile_ = ProfileRange::from_env();
  int profile_seen_ = 0;
  bool profiling_ = false;
};

}  // namespace

std::unique_ptr<trace::DeviceTimer> make_device_timer(int index) {
  if (!backend_available(Device::cuda(index))) return nullptr;
  return std::make_unique<CudaEventTimer>(cuda_backend(index));
}

std::unique_ptr<trace::DeviceTimer> CudaBackend::make_device_timer() { return std::make_unique<CudaEventTimer>(*this); }

}  // namespace atelier::cuda
