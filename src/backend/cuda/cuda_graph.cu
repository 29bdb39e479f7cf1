// Recorded execution on CUDA: Backend::capture records what a function enqueues on the device's stream as a
// CUDA graph, with its intermediates in a private pool of the device allocator (cuda_allocator.h), and
// replays it with one launch. A UNet call of SD 1.5 is about a thousand kernels; replayed as a graph the
// host enqueues it in microseconds and the GPU never waits for the host between kernels.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"

namespace atelier::cuda {

namespace {

class CudaGraphWork final : public CapturedWork {
 public:
  CudaGraphWork(int device, cudaStream_t stream, cudaGraphExec_t exec, DeviceAllocator& alloc,
                std::shared_ptr<DeviceAllocator::Pool> pool)
      : device_(device), stream_(stream), exec_(exec), alloc_(alloc), pool_(std::move(pool)) {}
  ~CudaGraphWork() override {
    DeviceGuard guard(device_);
    // Replays already enqueued keep running: the graph's resources are released once they finish, and the
    // pool's blocks go back to the cache, where stream order protects them as it does every freed block.
    cudaGraphExecDestroy(exec_);
    alloc_.close_pool(pool_);
  }
  void replay() override {
    DeviceGuard guard(device_);
    ATELIER_CUDA_OK(cudaGraphLaunch(exec_, stream_));
  }
  size_t pool_bytes() const override { return pool_->bytes; }

 private:
  int device_;
  cudaStream_t stream_;
  cudaGraphExec_t exec_;
  DeviceAllocator& alloc_;
  std::shared_ptr<DeviceAllocator::Pool> pool_;
};

}  // namespace

std::unique_ptr<CapturedWork> CudaBackend::capture(const std::function<void()>& fn) {
  DeviceGuard guard(index_);
  std::shared_ptr<DeviceAllocator::Pool> pool = alloc_.open_pool();
  // Relaxed: the allocator may call cudaMalloc while recording (a new block for the pool), which the
  // stricter modes forbid; nothing else runs on this device's stream meanwhile (one worker per device).
  cudaError_t err = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed);
  if (err != cudaSuccess) {
    cudaGetLastError();
    alloc_.close_pool(pool);
    ATELIER_CUDA_OK(err);
  }
  cudaGraph_t graph = nullptr;
  try {
    fn();
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // an op refused inside the capture leaves the error behind
    alloc_.close_pool(pool);
    throw;
  }
  err = cudaStreamEndCapture(stream_, &graph);
  alloc_.stop_routing();
  if (err != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    alloc_.close_pool(pool);
    throw Error(Status(ErrorCode::kInternal, std::string("CUDA graph capture failed: ") + cudaGetErrorString(err)));
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) {
    cudaGetLastError();
    alloc_.close_pool(pool);
    throw Error(Status(ErrorCode::kInternal, std::string("CUDA graph instantiation failed: ") + cudaGetErrorString(err)));
  }
  return std::make_unique<CudaGraphWork>(index_, stream_, exec, alloc_, std::move(pool));
}

}  // namespace atelier::cuda
