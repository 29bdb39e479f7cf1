// Recorded execution on CUDA: Backend::capture records what a function enqueues on the device's stream as a
// CUDA graph, with its intermediates in a private pool of the device allocator (cuda_allocator.h), and
// replays it with one launch. A UNet call of SD 1.5 is about a thousand kernels; replayed as a graph the
// host enqueues it in microseconds and the GPU never waits for the host between kernels.
#include "backend/cuda/cuda_graph.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"

namespace atelier::cuda {

namespace {

std::atomic<int64_t> g_memsets_replaced{0};
bool& memset_kernels_flag() {
  static bool on = !env_is("ATELIER_GRAPH_MEMSET_KERNELS", "0");
  return on;
}

constexpr int kFillThreads = 256;
constexpr int kMaxFillBlocks = 1024;
// Memsets of more bytes stay memset nodes: the node's idle time weighs less against a longer write, and the fill
// kernel stores element by element. (Session 47, H100: with every memset replaced, the 1024² step was 0.4% slower in
// two turns while CFG and 16 rows gained; with the cap it was within the clocks' noise. The CFG and 16-row steps'
// memsets are 4 bytes, and one each of 25,600 and 46,080, all below the cap.)
constexpr size_t kMaxReplacedBytes = size_t(64) << 10;

// A memset node's writes: `height` rows `pitch` bytes apart, each `width` elements of `elem` bytes set to `value`
// (its low `elem` bytes). One grid-stride pass; SD's memsets are a single 4-byte element.
__global__ void fill_kernel(uint8_t* dst, size_t pitch, unsigned value, unsigned elem, size_t width, size_t height) {
  const size_t total = width * height;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    uint8_t* p = dst + (i / width) * pitch + (i % width) * elem;
    if (elem == 4) {
      *reinterpret_cast<uint32_t*>(p) = value;
    } else if (elem == 2) {
      *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(value);
    } else {
      *p = static_cast<uint8_t>(value);
    }
  }
}

// `node`'s incoming (or outgoing) edges: the nodes at their other end and the edges' data.
bool edges_of(cudaGraphNode_t node, bool incoming, std::vector<cudaGraphNode_t>& nodes, std::vector<cudaGraphEdgeData>& data) {
  size_t n = 0;
  const auto query = [&](cudaGraphNode_t* to, cudaGraphEdgeData* d) {
    return incoming ? cudaGraphNodeGetDependencies(node, to, d, &n) : cudaGraphNodeGetDependentNodes(node, to, d, &n);
  };
  if (query(nullptr, nullptr) != cudaSuccess) return false;
  nodes.assign(n, nullptr);
  data.assign(n, cudaGraphEdgeData{});
  return n == 0 || query(nodes.data(), data.data()) == cudaSuccess;
}

enum class Replaced { kYes, kKept, kFailed };

// A kernel node doing memset node `node`'s writes, wired into its place (kYes); kKept for a memset of more than
// kMaxReplacedBytes; kFailed (and the graph as it was) where an edit failed.
Replaced replace_memset(cudaGraph_t graph, cudaGraphNode_t node) {
  cudaMemsetParams m{};
  std::vector<cudaGraphNode_t> in, out;
  std::vector<cudaGraphEdgeData> in_data, out_data;
  if (cudaGraphMemsetNodeGetParams(node, &m) != cudaSuccess || (m.elementSize != 1 && m.elementSize != 2 && m.elementSize != 4))
    return Replaced::kFailed;
  if (m.width * std::max<size_t>(m.height, 1) * m.elementSize > kMaxReplacedBytes) return Replaced::kKept;
  if (!edges_of(node, true, in, in_data) || !edges_of(node, false, out, out_data)) return Replaced::kFailed;
  uint8_t* dst = static_cast<uint8_t*>(m.dst);
  size_t pitch = m.height > 1 ? m.pitch : m.width * m.elementSize, width = m.width, height = std::max<size_t>(m.height, 1);
  unsigned value = m.value, elem = m.elementSize;
  void* args[] = {&dst, &pitch, &value, &elem, &width, &height};
  cudaKernelNodeParams k{};
  k.func = reinterpret_cast<void*>(&fill_kernel);
  k.blockDim = dim3(kFillThreads);
  k.gridDim = dim3(unsigned(std::min<size_t>((width * height + kFillThreads - 1) / kFillThreads, kMaxFillBlocks)));
  k.kernelParams = args;
  cudaGraphNode_t fill = nullptr;
  if (cudaGraphAddKernelNode(&fill, graph, nullptr, 0, &k) != cudaSuccess) return Replaced::kFailed;
  const std::vector<cudaGraphNode_t> to_fill(in.size(), fill), from_fill(out.size(), fill);
  const bool wired = (in.empty() || cudaGraphAddDependencies(graph, in.data(), to_fill.data(), in_data.data(), in.size()) == cudaSuccess) &&
                     (out.empty() || cudaGraphAddDependencies(graph, from_fill.data(), out.data(), out_data.data(), out.size()) == cudaSuccess);
  if (!wired) {
    cudaGraphDestroyNode(fill);  // its edges go with it
    return Replaced::kFailed;
  }
  return cudaGraphDestroyNode(node) == cudaSuccess ? Replaced::kYes : Replaced::kFailed;
}

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

bool graph_memset_kernels() { return memset_kernels_flag(); }
void set_graph_memset_kernels(bool on) { memset_kernels_flag() = on; }
int64_t graph_memsets_replaced() { return g_memsets_replaced.load(); }

bool graph_nodes(cudaGraph_t graph, std::vector<cudaGraphNode_t>* nodes) {
  size_t n = 0;
  if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) return false;
  nodes->assign(n, nullptr);
  return n == 0 || cudaGraphGetNodes(graph, nodes->data(), &n) == cudaSuccess;
}

int replace_memset_nodes(cudaGraph_t graph) {
  std::vector<cudaGraphNode_t> nodes;
  if (!graph_nodes(graph, &nodes)) return -1;
  int replaced = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess) return -1;
    if (type != cudaGraphNodeTypeMemset) continue;
    const Replaced r = replace_memset(graph, node);
    if (r == Replaced::kFailed) {
      g_memsets_replaced.fetch_add(replaced);
      return -1;
    }
    replaced += r == Replaced::kYes;
  }
  g_memsets_replaced.fetch_add(replaced);
  return replaced;
}

cudaGraph_t end_capture(cudaStream_t stream, cudaError_t* err) noexcept {
  cudaGraph_t graph = nullptr;
  *err = cudaStreamEndCapture(stream, &graph);
  if (*err == cudaSuccess && graph != nullptr) return graph;
  if (*err == cudaSuccess) *err = cudaErrorStreamCaptureInvalidated;  // no graph: nothing usable was recorded
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  return nullptr;
}

void discard_capture(cudaStream_t stream) noexcept {
  cudaError_t err = cudaSuccess;
  if (cudaGraph_t graph = end_capture(stream, &err)) cudaGraphDestroy(graph);
  cudaGetLastError();  // an op refused inside the capture leaves its error behind
}

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
  try {
    fn();
  } catch (...) {
    discard_capture(stream_);
    alloc_.close_pool(pool);
    throw;
  }
  cudaGraph_t graph = end_capture(stream_, &err);
  alloc_.stop_routing();
  if (graph == nullptr) {
    alloc_.close_pool(pool);
    throw Error(Status(ErrorCode::kInternal, std::string("CUDA graph capture failed: ") + cudaGetErrorString(err)));
  }
  // A failed edit leaves the memset where it was (replace_memset_nodes): the graph stays correct either way.
  if (graph_memset_kernels() && replace_memset_nodes(graph) < 0) cudaGetLastError();
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
