// Channels-last group norm (+ activation, + optional per-(sample, channel) offset) of a tensor too large for the
// one-kernel slice path (SD's 16-row and 1024² 64x64/128x128 levels, the VAE's large norms), in one cooperative
// kernel: one block per SM owns a contiguous run of pixel rows, keeps as many as fit in its shared memory, and the
// blocks exchange group sums through a grid barrier (cuda_group_norm_grid.cu).
// CudaBackend::group_norm_nhwc tries it after the slice kernel, before its three-kernel path.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "backend/cuda/cuda_group_norm_slice.h"

namespace atelier::cuda {

// The launch's shape for args: block size, rows per block and how many of them are staged, shared memory, and the
// device memory it needs (its blocks' partial group sums).
struct GroupNormGridPlan {
  int threads = 0, rows_per_pass = 0, rows_per_block = 0, staged_rows = 0, blocks = 0;
  size_t smem = 0, scratch_bytes = 0;
};

// The plan, or nothing where the kernel does not apply: before compute capability 8 or without cooperative
// launches, a group narrower than a 16-byte vector (the vector of channels a thread owns must span at most two
// groups), a row wider than 512 vectors, a block's run of rows longer than a sample (a block must span at most two
// samples: norms of many small samples take the slice kernel), ATELIER_GN_GRID=0. Raises the kernel's shared-memory
// limit on the current device for the launch.
std::optional<GroupNormGridPlan> plan_group_norm_grid(const GroupNormSliceArgs& args);
// Enqueues the kernel planned for args (on the device current when it was planned): scratch holds at least
// plan.scratch_bytes bytes (any contents).
void launch_group_norm_grid(const GroupNormSliceArgs& args, const GroupNormGridPlan& plan, void* scratch, cudaStream_t stream);
bool group_norm_grid_enabled();
void set_group_norm_grid(bool on);  // for tests and comparisons (default: on, unless ATELIER_GN_GRID=0)
int64_t group_norm_grid_launches();  // kernels enqueued so far (tests: which path ran)

}  // namespace atelier::cuda
