// Small host-to-device copies as a kernel whose parameters carry the bytes (cuda_copy.cu). A denoise step uploads
// a few host values (the model's timesteps, the CFG scales); through the pinned staging buffers each is a
// cudaMemcpyAsync on a copy engine, device time at the step's boundary that the kernel tracer does not see.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace atelier::cuda {

inline constexpr size_t kInlineUploadBytes = 1024;  // larger copies go through the pinned staging buffers

// Enqueues dst[0, bytes) = src[0, bytes) (host memory, read before this returns) on `stream` and returns true; false
// (nothing enqueued) for copies over kInlineUploadBytes, while the stream is recording a graph (the values would be
// frozen into it: the staging path refuses, so the graph runner runs that work eagerly), or where
// ATELIER_DRIVER_COPIES=1 asks for the driver's copies.
bool upload_inline(void* dst, const void* src, size_t bytes, cudaStream_t stream);
int64_t inline_uploads();  // kernels enqueued so far (tests: which path ran)

}  // namespace atelier::cuda
