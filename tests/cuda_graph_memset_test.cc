// Memset nodes of recorded graphs replaced by kernels (backend/cuda/cuda_graph.h): the same bytes written, in the
// same place of the graph's order, both in a graph built by hand (1-, 2- and 4-byte elements, rows with a pitch,
// a copy that must see the memsets before it) and in the backend's own recordings. Skips with the reason without
// a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_graph.h"
#include "cuda_test_util.h"

namespace atelier {
namespace {

constexpr size_t kBytes = 4096;
constexpr size_t kCopyAt = 3072;  // where the copy node puts the first 16 bytes

struct DeviceBytes {
  uint8_t* p = nullptr;
  explicit DeviceBytes(size_t n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, n), cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(p); }
};

std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t g) {
  std::vector<cudaGraphNode_t> nodes;
  EXPECT_TRUE(cuda::graph_nodes(g, &nodes));
  return nodes;
}
cudaGraphNodeType type_of(cudaGraphNode_t node) {
  cudaGraphNodeType t{};
  EXPECT_EQ(cudaGraphNodeGetType(node, &t), cudaSuccess);
  return t;
}
std::vector<cudaGraphNode_t> dependencies_of(cudaGraphNode_t node) {
  size_t n = 0;
  EXPECT_EQ(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> deps(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n > 0) EXPECT_EQ(cudaGraphNodeGetDependencies(node, deps.data(), data.data(), &n), cudaSuccess);
  return deps;
}

cudaMemsetParams memset_params(void* dst, unsigned elem, unsigned value, size_t width, size_t height = 1, size_t pitch = 0) {
  cudaMemsetParams m{};
  m.dst = dst, m.elementSize = elem, m.value = value, m.width = width, m.height = height, m.pitch = pitch;
  return m;
}

// A: bytes [0, 1000) = 0x11; B after A: 300 4-byte elements from 0 = 0x12345678 (over A's first 1200 bytes);
// C (no edges): 5 rows of 10 2-byte elements 0xBEEF, 64 bytes apart, from 2048; D after B: a copy of bytes [0, 16)
// to kCopyAt, which must see B's bytes; E (no edges): 128 KiB of another buffer, above the cap: stays a memset.
// Replaced: one memset node left (E), D's one dependency a kernel whose one dependency is a kernel (A's), and the
// bytes as the memsets would have left them.
TEST(CudaGraph, MemsetNodesBecomeKernelsWritingTheSameBytes) {
  ATELIER_REQUIRE_CUDA();
  constexpr size_t kLarge = size_t(128) << 10;
  DeviceBytes buf(kBytes), large(kLarge);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaGraphCreate(&g, 0), cudaSuccess);
  cudaGraphNode_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  const cudaMemsetParams pa = memset_params(buf.p, 1, 0x11, 1000), pb = memset_params(buf.p, 4, 0x12345678u, 300);
  const cudaMemsetParams pc = memset_params(buf.p + 2048, 2, 0xBEEF, 10, 5, 64);
  ASSERT_EQ(cudaGraphAddMemsetNode(&a, g, nullptr, 0, &pa), cudaSuccess);
  ASSERT_EQ(cudaGraphAddMemsetNode(&b, g, &a, 1, &pb), cudaSuccess);
  ASSERT_EQ(cudaGraphAddMemsetNode(&c, g, nullptr, 0, &pc), cudaSuccess);
  ASSERT_EQ(cudaGraphAddMemcpyNode1D(&d, g, &b, 1, buf.p + kCopyAt, buf.p, 16, cudaMemcpyDeviceToDevice), cudaSuccess);
  cudaGraphNode_t e = nullptr;
  const cudaMemsetParams pe = memset_params(large.p, 1, 0x5A, kLarge);
  ASSERT_EQ(cudaGraphAddMemsetNode(&e, g, nullptr, 0, &pe), cudaSuccess);

  const int64_t before = cuda::graph_memsets_replaced();
  EXPECT_EQ(cuda::replace_memset_nodes(g), 3);
  EXPECT_EQ(cuda::graph_memsets_replaced() - before, 3);
  int kernels = 0, memsets = 0;
  for (cudaGraphNode_t node : nodes_of(g)) {
    memsets += type_of(node) == cudaGraphNodeTypeMemset;
    kernels += type_of(node) == cudaGraphNodeTypeKernel;
  }
  EXPECT_EQ(kernels, 3);
  EXPECT_EQ(memsets, 1) << "the 128 KiB memset (above the cap) should stay, the small ones go";
  EXPECT_EQ(type_of(e), cudaGraphNodeTypeMemset);
  const std::vector<cudaGraphNode_t> d_deps = dependencies_of(d);
  ASSERT_EQ(d_deps.size(), 1u) << "the copy lost its edge from B";
  EXPECT_EQ(type_of(d_deps[0]), cudaGraphNodeTypeKernel);
  const std::vector<cudaGraphNode_t> b_deps = dependencies_of(d_deps[0]);
  ASSERT_EQ(b_deps.size(), 1u) << "B's kernel lost its edge from A";
  EXPECT_EQ(type_of(b_deps[0]), cudaGraphNodeTypeKernel);

  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got(kBytes);
  ASSERT_EQ(cudaMemcpy(got.data(), buf.p, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<uint8_t> got_large(kLarge);
  ASSERT_EQ(cudaMemcpy(got_large.data(), large.p, kLarge, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < kLarge; ++i) ASSERT_EQ(got_large[i], 0x5A) << "large byte " << i;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);

  std::vector<uint8_t> want(kBytes, 0);
  std::memset(want.data(), 0x11, 1000);
  for (size_t i = 0; i < 300; ++i) {
    const uint32_t v = 0x12345678u;
    std::memcpy(&want[4 * i], &v, 4);
  }
  for (size_t r = 0; r < 5; ++r)
    for (size_t e = 0; e < 10; ++e) {
      const uint16_t v = 0xBEEF;
      std::memcpy(&want[2048 + 64 * r + 2 * e], &v, 2);
    }
  std::memcpy(&want[kCopyAt], &want[0], 16);
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(got[i], want[i]) << "byte " << i;
}

// The backend's recordings: a memset enqueued inside CudaBackend::capture runs as a kernel, on every replay.
TEST(CudaGraph, RecordedMemsetsReplayAsKernels) {
  ATELIER_REQUIRE_CUDA();
  if (!cuda::graph_memset_kernels()) GTEST_SKIP() << "ATELIER_GRAPH_MEMSET_KERNELS=0 keeps memset nodes";
  cuda::CudaBackend& be = test::cuda_be();
  DeviceBytes buf(kBytes);
  uint8_t value = 0x21;
  const int64_t before = cuda::graph_memsets_replaced();
  const auto work = be.capture([&] { ASSERT_EQ(cudaMemsetAsync(buf.p, value, kBytes, be.stream()), cudaSuccess); });
  EXPECT_EQ(cuda::graph_memsets_replaced() - before, 1);
  for (int replay = 0; replay < 3; ++replay) {
    ASSERT_EQ(cudaMemsetAsync(buf.p, 0, kBytes, be.stream()), cudaSuccess);
    work->replay();
    std::vector<uint8_t> got(kBytes);
    ASSERT_EQ(cudaMemcpyAsync(got.data(), buf.p, kBytes, cudaMemcpyDeviceToHost, be.stream()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(be.stream()), cudaSuccess);
    for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(got[i], value) << "replay " << replay << ", byte " << i;
  }
}

}  // namespace
}  // namespace atelier
