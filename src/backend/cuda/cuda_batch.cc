// Batched launches on CUDA (Backend::run_batched). Between two replayed recordings a host loop enqueues a few small
// kernels: at an SD step boundary the CFG combine, the sampler's update, the next call's scaled and doubled
// latents and its timesteps, a few hundred KB in all. Launched one by one, each waits out its own launch on the
// device: session 47's trace showed them 4-10 us apart with the kernel tracer on, although the host had enqueued
// them ~5 ms ahead. Recorded into a graph and launched as one, they follow each other as a recording's kernels do.
// The host pays for the capture, an in-place update of the executable graph of an earlier batch with the same
// kernels (cudaGraphExecUpdate: no instantiation per step) and the launch, while the device is still busy with the
// call before.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_graph.h"
#include "core/status.h"

namespace atelier::cuda {

namespace {

std::atomic<int64_t> g_launched{0}, g_instantiated{0}, g_updated{0}, g_paused{0};

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{!env_is("ATELIER_LAUNCH_BATCHES", "0")};
  return on;
}

thread_local cudaStream_t t_batch_stream = nullptr;  // the stream the calling thread gathers a batch on, if any

// What an executable graph made for one batch needs of another to take its parameters in place: nodes of the same
// kinds, kernel nodes of the same functions, in the same order (a capture from one stream is a chain, so the order
// fixes the edges). Copies and memsets differ only in their parameters, which an update carries.
std::string topology_key(const std::vector<cudaGraphNode_t>& nodes) {
  std::string key;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    ATELIER_CUDA_OK(cudaGraphNodeGetType(node, &type));
    key += std::to_string(int(type));
    cudaKernelNodeParams p{};
    if (type == cudaGraphNodeTypeKernel) {
      if (cudaGraphKernelNodeGetParams(node, &p) == cudaSuccess) {
        key += ':' + std::to_string(reinterpret_cast<uintptr_t>(p.func));
      } else {
        cudaGetLastError();  // a driver-API kernel: the update checks its function itself
      }
    }
    key += ';';
  }
  return key;
}

}  // namespace

LaunchBatchStats launch_batch_stats() {
  return {g_launched.load(), g_instantiated.load(), g_updated.load(), g_paused.load()};
}
void set_launch_batches(bool on) { enabled_flag() = on; }
bool launch_batches() { return enabled_flag().load(); }
bool batching_on(cudaStream_t stream) { return t_batch_stream != nullptr && t_batch_stream == stream; }

// The executable graphs of earlier batches, by topology_key, most recently used first: a denoise loop alternates
// between a few shapes of batch (after the call, before the next), each updated in place at every step.
struct CudaBackend::BatchGraphs {
  static constexpr size_t kMaxExecs = 8;
  struct Exec {
    std::string key;
    cudaGraphExec_t exec = nullptr;
  };
  std::list<Exec> execs;

  ~BatchGraphs() {
    for (Exec& e : execs) cudaGraphExecDestroy(e.exec);  // launches in flight complete first
  }

  // An executable graph that runs `graph`'s work (`nodes`: its nodes): an earlier batch's updated in place where
  // the topology matches and the update succeeds, else a new one.
  cudaGraphExec_t exec_for(cudaGraph_t graph, const std::vector<cudaGraphNode_t>& nodes) {
    const std::string key = topology_key(nodes);
    for (auto it = execs.begin(); it != execs.end(); ++it) {
      if (it->key != key) continue;
      cudaGraphExecUpdateResultInfo info{};
      // Launches of it already enqueued keep the parameters they were launched with.
      if (cudaGraphExecUpdate(it->exec, graph, &info) == cudaSuccess) {
        execs.splice(execs.begin(), execs, it);
        g_updated.fetch_add(1);
        return execs.front().exec;
      }
      cudaGetLastError();
      cudaGraphExecDestroy(it->exec);
      execs.erase(it);
      break;
    }
    cudaGraphExec_t exec = nullptr;
    ATELIER_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    g_instantiated.fetch_add(1);
    execs.push_front({key, exec});
    while (execs.size() > kMaxExecs) {
      cudaGraphExecDestroy(execs.back().exec);
      execs.pop_back();
    }
    return exec;
  }
};

bool CudaBackend::batch_open_here() const { return batch_thread_ == std::this_thread::get_id(); }

bool CudaBackend::open_batch() {
  DeviceGuard guard(index_);
  // Relaxed: the allocator may call cudaMalloc for a tensor made inside the batch.
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  batch_thread_ = std::this_thread::get_id();
  t_batch_stream = stream_;
  return true;
}

void CudaBackend::drop_batch() noexcept {
  DeviceGuard guard(index_);
  discard_capture(stream_);
  batch_thread_ = std::thread::id{};
  t_batch_stream = nullptr;
}

void CudaBackend::launch_batch() {
  DeviceGuard guard(index_);
  cudaError_t err = cudaSuccess;
  cudaGraph_t graph = end_capture(stream_, &err);
  batch_thread_ = std::thread::id{};
  t_batch_stream = nullptr;
  if (graph == nullptr) {
    // Something inside the batch was not recordable: its work is lost, so this call fails; later batches run
    // eagerly rather than fail the same way.
    set_launch_batches(false);
    throw Error(Status(ErrorCode::kInternal, std::string("a batched launch could not be recorded (") + cudaGetErrorString(err) +
                                                 "); batched launches are off from now on (as with ATELIER_LAUNCH_BATCHES=0)"));
  }
  struct OwnGraph {
    cudaGraph_t g;
    ~OwnGraph() { cudaGraphDestroy(g); }
  } own{graph};
  std::vector<cudaGraphNode_t> nodes;
  if (!graph_nodes(graph, &nodes)) {
    const cudaError_t why = cudaGetLastError();
    throw Error(Status(ErrorCode::kInternal, std::string("a batched launch's graph could not be read: ") + cudaGetErrorString(why)));
  }
  if (nodes.empty()) return;
  if (!batch_graphs_) batch_graphs_ = std::make_shared<BatchGraphs>();
  ATELIER_CUDA_OK(cudaGraphLaunch(batch_graphs_->exec_for(graph, nodes), stream_));
  g_launched.fetch_add(1);
}

void CudaBackend::run_batched(const std::function<void()>& fn) {
  // Nested in another batch, inside a recording (its own capture gathers the work already) or switched off: eager.
  if (!launch_batches() || batch_thread_ != std::thread::id{} || stream_capturing(stream_) || !open_batch()) {
    fn();
    return;
  }
  try {
    fn();
  } catch (...) {
    if (batch_open_here()) drop_batch();
    throw;
  }
  if (batch_open_here()) launch_batch();  // a pause that could not open the batch again leaves none open
}

CudaBackend::BatchPause::BatchPause(CudaBackend& b) : b_(b) {
  if (!b_.batch_open_here()) return;
  b_.launch_batch();
  paused_ = true;
  g_paused.fetch_add(1);
}

CudaBackend::BatchPause::~BatchPause() {
  if (paused_) b_.open_batch();  // where it cannot, the rest of the batch's work runs eagerly
}

}  // namespace atelier::cuda
