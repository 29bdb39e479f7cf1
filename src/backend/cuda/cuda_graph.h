// Edits to a recorded CUDA graph before it is instantiated (cuda_graph.cu; CudaBackend::capture applies them).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace atelier::cuda {

// Whether captured graphs get their memset nodes replaced by kernels (on unless ATELIER_GRAPH_MEMSET_KERNELS=0).
bool graph_memset_kernels();
void set_graph_memset_kernels(bool on);

// Replaces every memset node of `graph` of at most 64 KiB (1-, 2- or 4-byte elements, one or more rows) by a kernel
// node writing the same elements, with the memset's incoming and outgoing edges (their edge data kept). Why:
// cuDNN's SDPA plans and some cuBLASLt algorithms enqueue a 4-byte memset before their kernel; inside a replayed
// graph each such memset node idled the device ~8 us (1.3 us before it, 6.6-8.8 after), where kernel-to-kernel
// edges cost ~0.3 (session 47's traces: 10 memsets in a CFG UNet call, 54 at 16 rows). Returns the nodes replaced,
// or -1 where an edit failed (the graph then still does what it did: a node is only removed once its replacement
// is wired).
int replace_memset_nodes(cudaGraph_t graph);

// Ends `stream`'s capture and returns the graph it recorded; nullptr where the capture failed (an op that cannot
// be recorded, an invalidated capture), with *err saying why, the partial graph destroyed and the error cleared.
// CudaBackend::capture and CudaBackend::launch_batch end their recordings through it.
cudaGraph_t end_capture(cudaStream_t stream, cudaError_t* err) noexcept;

// Ends `stream`'s capture and throws away what it recorded (a recording abandoned by an exception, a batch
// dropped), clearing any error the capture left.
void discard_capture(cudaStream_t stream) noexcept;

// `graph`'s nodes into *nodes (in the order cudaGraphGetNodes gives: a capture's order); false where CUDA refused.
bool graph_nodes(cudaGraph_t graph, std::vector<cudaGraphNode_t>* nodes);

// Memset nodes replaced in this process's graphs so far (tests, logs).
int64_t graph_memsets_replaced();

}  // namespace atelier::cuda
