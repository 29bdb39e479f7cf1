// Channels-last group norm in one kernel where a (sample, group slice) fits in shared memory (cuda_group_norm_slice.h).
//
// Block (slice s, sample n) owns channels [s * cb, (s + 1) * cb) of sample n's p pixels: gb whole groups, gb the
// fewest whose channels make whole 16-byte vectors (SD's 32 groups of 10-80 channels: 40-120 channels). It
// copies them from global memory into shared memory once (summing x + o per channel as it goes), takes the mean,
// then the squared deviations from the mean from shared memory (two passes over the staged values: exact where a
// single pass of sums and squares loses digits under a large mean), and writes act(x * scale + shift) from shared
// memory. x is read once and y written once: the floor, where the three-kernel path (statistics, merge, apply)
// reads x twice and pays three launches and their tails (23-25 us for SD's 16-row [16, 1280, 8, 8] norms).
//
// Threads: column vector v = tid % vcb of the slice (fixed per thread, so its V channels' sums stay in registers)
// and rows tid / vcb, stepping rows_per_pass (about 512 / vcb). Partial sums go through a [rows_per_pass][cb] table.
#include "backend/cuda/cuda_group_norm_slice.h"

#include <algorithm>
#include <atomic>
#include <numeric>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_norm_common.cuh"

namespace atelier::cuda {
namespace {

constexpr int kSliceThreads = 512;                  // block size target (whole rows of column vectors)
constexpr int64_t kSliceMaxBytes = int64_t(80) << 10;  // staged values per block: two blocks per SM with their tables
constexpr int kMaxSliceGroups = 32;                 // mean / rstd slots in shared memory

struct SliceArgs {
  const void* offset;  // [N, C] in x's dtype (unit channel stride), or null
  int64_t offset_stride;
  NormAffine aff;
  int64_t p;  // pixels per sample
  int c, groups, gb;
  int rows_per_pass;  // rows a pass of the block covers (threads past vcb * rows_per_pass only join the reductions)
  float eps;
  UnaryOp act;
};

// table [rows_per_pass][cb] of per-thread sums -> per-group totals in group_out[gb] (whole block calls).
__device__ __forceinline__ void reduce_groups(float* table, float* group_out, int rows_per_pass, int cb, int cg, int gb) {
  __syncthreads();
  for (int ch = int(threadIdx.x); ch < cb; ch += int(blockDim.x)) {
    float s = 0.0f;
    for (int r = 0; r < rows_per_pass; ++r) s += table[r * cb + ch];
    table[ch] = s;
  }
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int g = warp; g < gb; g += int(blockDim.x) / 32) {
    float s = 0.0f;
    for (int j = lane; j < cg; j += 32) s += table[g * cg + j];
    s = warp_sum(s);
    if (lane == 0) group_out[g] = s;
  }
  __syncthreads();
}

template <typename T>
__global__ void group_norm_slice_kernel(T* y, const T* x, SliceArgs a) {
  constexpr int V = Vec<T>::kWidth;
  extern __shared__ float4 smem_f4[];
  const int cg = a.c / a.groups, cb = a.gb * cg, vcb = cb / V, vc = a.c / V;
  const int rows_per_pass = a.rows_per_pass, v = int(threadIdx.x) % vcb, r0 = int(threadIdx.x) / vcb;
  const int n = int(blockIdx.y), ch0 = int(blockIdx.x) * cb;
  Vec<T>* tile = reinterpret_cast<Vec<T>*>(smem_f4);                        // [p][vcb]
  float* table = reinterpret_cast<float*>(tile + a.p * vcb);                 // [rows_per_pass][cb]
  float* mean = table + rows_per_pass * cb;                                  // [gb]
  float* rstd = mean + kMaxSliceGroups;                                      // [gb]
  const Vec<T>* xs = reinterpret_cast<const Vec<T>*>(x + int64_t(n) * a.p * a.c + ch0) + v;
  Vec<T>* ys = reinterpret_cast<Vec<T>*>(y + int64_t(n) * a.p * a.c + ch0) + v;
  const bool active = r0 < rows_per_pass;  // a last partial row of threads only helps with the reductions
  float o[V], acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const int ch = ch0 + v * V + e;
    o[e] = a.offset ? to_f32(static_cast<const T*>(a.offset)[n * a.offset_stride + ch]) : 0.0f;
    acc[e] = 0.0f;
  }
  // Pass 1: stage the slice, sum x + o per channel.
  if (active)
    for (int64_t r = r0; r < a.p; r += rows_per_pass) {
      const Vec<T> in = xs[r * vc];
      tile[r * vcb + v] = in;
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += to_f32(in.v[e]) + o[e];
    }
  if (active)
#pragma unroll
    for (int e = 0; e < V; ++e) table[r0 * cb + v * V + e] = acc[e];
  const float count = float(a.p) * float(cg);
  reduce_groups(table, mean, rows_per_pass, cb, cg, a.gb);
  if (threadIdx.x < unsigned(a.gb)) mean[threadIdx.x] /= count;
  __syncthreads();
  // Pass 2: squared deviations from the group's mean, from shared memory.
  float mu[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    mu[e] = mean[(v * V + e) / cg];
    acc[e] = 0.0f;
  }
  if (active)
    for (int64_t r = r0; r < a.p; r += rows_per_pass) {
      const Vec<T> in = tile[r * vcb + v];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = to_f32(in.v[e]) + o[e] - mu[e];
        acc[e] = fmaf(d, d, acc[e]);
      }
    }
  if (active)
#pragma unroll
    for (int e = 0; e < V; ++e) table[r0 * cb + v * V + e] = acc[e];
  reduce_groups(table, rstd, rows_per_pass, cb, cg, a.gb);
  if (threadIdx.x < unsigned(a.gb)) rstd[threadIdx.x] = rsqrtf(rstd[threadIdx.x] / count + a.eps);
  __syncthreads();
  if (!active) return;
  // act((x + o - mean) * rstd * gamma + beta) = act(x * sc + sh), sh = beta + (o - mean) * sc.
  float sc[V], sh[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const int ch = ch0 + v * V + e;
    const float gam = a.aff.gamma ? load_any(a.aff.gamma, a.aff.gamma_dtype, ch) : 1.0f;
    const float bet = a.aff.beta ? load_any(a.aff.beta, a.aff.beta_dtype, ch) : 0.0f;
    sc[e] = rstd[(v * V + e) / cg] * gam;
    sh[e] = fmaf(o[e] - mu[e], sc[e], bet);
  }
  for (int64_t r = r0; r < a.p; r += rows_per_pass) {
    const Vec<T> in = tile[r * vcb + v];
    Vec<T> out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_f32<T>(apply_unary_for<T>(fmaf(to_f32(in.v[e]), sc[e], sh[e]), a.act));
    ys[r * vc] = out;
  }
}

std::atomic<int64_t> g_launches{0};

bool& slice_flag() {
  static bool on = !env_is("ATELIER_GN_SLICE", "0");
  return on;
}

}  // namespace

bool group_norm_slice_enabled() { return slice_flag(); }
int64_t group_norm_slice_launches() { return g_launches.load(); }
void set_group_norm_slice(bool on) { slice_flag() = on; }

bool launch_group_norm_slice(const GroupNormSliceArgs& g, cudaStream_t stream) {
  if (!slice_flag() || g.groups <= 0 || g.c % g.groups != 0 || g.n <= 0 || g.p <= 0 || g.n > 65535) return false;
  const int esize = int(dtype_size(g.dtype));
  const int V = kVecBytes / esize;
  const int cg = g.c / g.groups;
  const int gb = V / std::gcd(cg, V);  // fewest groups whose channels are whole vectors
  if (g.groups % gb != 0 || gb > kMaxSliceGroups) return false;
  const int cb = gb * cg, vcb = cb / V;
  const int64_t tile_bytes = g.p * cb * esize;
  if (tile_bytes > kSliceMaxBytes || vcb > kSliceThreads) return false;
  // Rows per pass: as many as kSliceThreads allow, at most the sample's (8x8 images have 64: no idle threads, and the
  // per-channel reduction walks no more partial rows than there are).
  const int rows_per_pass = int(std::clamp<int64_t>(kSliceThreads / vcb, 1, g.p));
  const int threads = std::max(32, (vcb * rows_per_pass + 31) / 32 * 32);  // whole warps for the reductions
  const size_t smem = size_t(tile_bytes) + size_t(rows_per_pass) * cb * sizeof(float) + 2 * kMaxSliceGroups * sizeof(float);
  NormAffine aff;
  aff.gamma = g.gamma, aff.beta = g.beta, aff.gamma_dtype = g.gamma_dtype, aff.beta_dtype = g.beta_dtype;
  SliceArgs a{g.offset, g.offset_stride, aff, g.p, g.c, g.groups, gb, rows_per_pass, g.eps, g.act};
  const dim3 grid(unsigned(g.groups / gb), unsigned(g.n));
  const auto go = [&](auto* y, const auto* x) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(x)>>;
    const auto kernel = group_norm_slice_kernel<T>;
    constexpr size_t kDefaultSmem = 48 * 1024;  // more needs the opt-in (per launch: it belongs to the current device)
    if (smem > kDefaultSmem) ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<grid, unsigned(threads), smem, stream>>>(y, x, a);
    ATELIER_CUDA_LAUNCHED();
    g_launches.fetch_add(1);
    return true;
  };
  switch (g.dtype) {
    case DType::BF16: return go(static_cast<__nv_bfloat16*>(g.y), static_cast<const __nv_bfloat16*>(g.x));
    case DType::F16: return go(static_cast<__half*>(g.y), static_cast<const __half*>(g.x));
    case DType::F32: return go(static_cast<float*>(g.y), static_cast<const float*>(g.x));
    default: return false;
  }
}

}  // namespace atelier::cuda
