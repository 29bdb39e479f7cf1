// Channels-last group norm (+ activation, + optional per-(sample, channel) offset) in one kernel, for norms whose
// (sample, group slice) fits in a block's shared memory (SD's UNet at 8x8-32x32), or on Hopper in the shared
// memories of a cluster of up to 16 blocks (norms of few samples: SD's batch-2 levels, its VAE's 64x64 level)
// (cuda_group_norm_slice.cu).
// CudaBackend::group_norm_nhwc tries it first and falls back to its three-kernel path where it declines.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "backend/backend.h"

namespace atelier::cuda {

struct GroupNormSliceArgs {
  void* y = nullptr;        // [N, P, C] (channels-last [N, C, H, W]), 16-byte aligned
  const void* x = nullptr;  // same layout and dtype
  // A second source: x holds channels [0, c1) (rows of c1 channels) and x2 channels [c1, c) (rows of c - c1), the
  // two side by side as one [N, C, H, W] input (a UNet's skip concatenation, never copied together). Null: x alone.
  const void* x2 = nullptr;
  int c1 = 0;
  const void* offset = nullptr;  // [N, C] in x's dtype, unit channel stride; null for none
  int64_t offset_stride = 0;
  const void* gamma = nullptr;  // [C] or null (1); beta [C] or null (0); either dtype
  const void* beta = nullptr;
  DType gamma_dtype = DType::F32, beta_dtype = DType::F32;
  DType dtype = DType::BF16;
  int64_t n = 0, p = 0;  // samples, pixels per sample
  int c = 0, groups = 0;
  float eps = 1e-5f;
  UnaryOp act = UnaryOp::kIdentity;
  int cc_major = 0;  // the device's compute capability: clusters need 9 (Hopper)
  int sm_count = 0;  // its SMs: clusters are for norms of fewer (sample, slice)s
};

// Enqueues the kernel and returns true, or returns false (nothing enqueued) where it does not apply: a slice of
// whole 16-byte vectors over 96 KB per block (one block where the cluster policy below does not split it, else up
// to 16), groups not a multiple of the slice's, a cluster the device cannot hold, ATELIER_GN_SLICE=0.
bool launch_group_norm_slice(const GroupNormSliceArgs& args, cudaStream_t stream);
// Whether args' second source, where it has one, suits the kernels (slice and grid): 0 < c1 < c, c1 a multiple of the
// 16-byte vector's vec_width channels, x2 16-byte aligned. True without one.
bool two_sources_fit(const GroupNormSliceArgs& args, int vec_width);
bool group_norm_slice_enabled();
void set_group_norm_slice(bool on);  // for tests and comparisons (default: on, unless ATELIER_GN_SLICE=0)
void set_group_norm_cluster(bool on);  // clusters of blocks allowed (default: on, unless ATELIER_GN_CLUSTER=0)
// Which build of the kernel runs: the uncapped one (80 registers a thread), the one of at most 64 (four 256-thread
// blocks an SM instead of three), or by the launch (kAuto, the default): the capped build where blocks queue for the
// SMs (one block a slice, at least as many slices as SMs), the uncapped elsewhere. ATELIER_GN_SLICE_REGS=80 | 64
// chooses one build everywhere (docs/cuda.md, "Session 45").
enum class SliceRegisterCap { kNever, kAlways, kAuto };
void set_group_norm_slice_register_cap(SliceRegisterCap mode);
// Clusters halved while the device cannot hold all of a norm's clusters at once (each block then holds more rows;
// one wave instead of two). Default: on, unless ATELIER_GN_CLUSTER_WAVE=0.
void set_group_norm_cluster_one_wave(bool on);
// Where clusters are used: on tensors of at most max_tensor bytes (default 16 MB, or ATELIER_GN_CLUSTER_MAX_MB)
// with fewer (sample, slice)s than SMs (any_grid_size: at any count), aiming at block_bytes of a slice per block
// (default 16 KB, or ATELIER_GN_SLICE_KB); sizes <= 0: the default.
void set_group_norm_cluster_policy(int64_t block_bytes, int64_t max_tensor, bool any_grid_size = false);
int64_t group_norm_slice_launches();  // kernels enqueued so far (tests: which path ran)
int64_t group_norm_slice_cluster_launches();  // those of them in clusters of more than one block
int64_t group_norm_slice_two_wave_launches();  // those whose clusters the device could not hold all at once

}  // namespace atelier::cuda
