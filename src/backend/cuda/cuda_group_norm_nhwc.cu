// GroupNorm (+ fused activation) over channels-last activations: x and y are [N, C, H, W] tensors whose buffers
// are [N, P, C] (P = H * W pixels), as the UNet and VAE keep them on the GPU (Backend::prefers_channels_last).
// torch's formulas (biased variance, eps inside the square root), statistics in f32 with the merge in double.
//
// Three kernels. Statistics: block (chunk k, sample n) walks rows of its chunk, thread (r0, v) the V channels of
// column vector v (16-byte loads, kNhwcUnroll rows in flight), summing deviations from a per-(chunk, group) shift
// (the group's first channel in the chunk's first row, so that f32 sums keep the spread under a large mean, as
// the NCHW kernels' two passes do); the block reduces its rows per channel, then its channels per group, and
// writes one GroupChunk per group. Merge: one warp per (sample, group) combines the chunks (in double, about a
// common reference) and writes each channel's (scale, shift) = (rstd * gamma, beta - mean * rstd * gamma).
// Apply: y = act(x * scale + shift), a thread keeping one column's scale/shift in registers and walking rows.
// An optional per-(sample, channel) offset o (a resnet's time embedding: the norm of x + o) costs no work per
// element: the statistics subtract (shift - o) where they subtracted shift, the apply adds o * scale to shift.
// Small group norms may merge inside the apply kernel instead (set_group_norm_apply_merge): each apply block
// merges its sample's (at most kApplyMergeChunks) chunks into shared memory first, the same arithmetic.
//
// Index arithmetic is 32-bit except for buffer offsets: 64-bit divisions (dozens of instructions each) in the
// reduction and in every apply thread's setup cost about as much as the loads themselves.
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_group_norm_grid.h"
#include "backend/cuda/cuda_group_norm_slice.h"
#include "backend/cuda/cuda_norm_common.cuh"
#include "backend/cuda/cuda_nvtx.h"

namespace atelier::cuda {
namespace {

struct GroupChunk {
  float shift;  // the group's first channel in the chunk's first row
  float dev;    // sum over the chunk's elements of the group of (x - shift)
  float sq;     // sum of (x - shift)^2
};

constexpr int kNhwcStatsThreads = 256;    // block size target of the statistics kernel (columns x rows per pass)
constexpr int kNhwcUnroll = 8;            // rows a thread loads before it accumulates (memory parallelism)
constexpr int kNhwcMaxRowsPerThread = 256;  // statistics: rows per thread, at most (bounds a block's time)
constexpr int kApplyUnroll = 4;           // apply: rows a thread loads before it stores
constexpr int kMergeThreads = 128;
constexpr int64_t kMaxGridY = 65535;

// The optional [N, C] offset added to x before the norm: sample n's channels at p + n * sample_stride (unit
// channel stride, x's dtype); p null when there is none.
template <typename T>
struct ChannelOffset {
  const T* p = nullptr;
  int64_t sample_stride = 0;
  __device__ __forceinline__ float at(int n, int ch) const { return p ? to_f32(p[n * sample_stride + ch]) : 0.0f; }
};

template <typename T>
__global__ void group_stats_nhwc_kernel(GroupChunk* out, const T* x, ChannelOffset<T> off, int64_t p_count, int c, int groups,
                                        int rows_per_chunk, int rows_per_pass) {
  constexpr int V = Vec<T>::kWidth;
  extern __shared__ float2 partial[];  // [rows_per_pass][c]: each thread's (sum d, sum d^2) per channel
  const int vc = c / V, cg = c / groups, n = int(blockIdx.y), k = int(blockIdx.x);
  const int64_t r_begin = int64_t(k) * rows_per_chunk, r_end = min(p_count, r_begin + rows_per_chunk);
  const int v = int(threadIdx.x) % vc, r0 = int(threadIdx.x) / vc;
  const T* sample = x + int64_t(n) * p_count * c;
  const T* col = sample + v * V;
  // shift: the group's first value of (x + o); the loop subtracts shift - o from x, which is (x + o) - shift.
  float shift[V], dev[V], sq[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const int first = (v * V + e) / cg * cg;
    shift[e] = to_f32(sample[r_begin * c + first]) + off.at(n, first) - off.at(n, v * V + e);
    dev[e] = sq[e] = 0.0f;
  }
  const auto add = [&](const Vec<T>& xv) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = to_f32(xv.v[e]) - shift[e];
      dev[e] += d;
      sq[e] += d * d;
    }
  };
  // kNhwcUnroll loads issued before any is used, the last batch's predicated (a chunk's rows per thread need
  // not be a multiple of it: a serial tail of loads cost a memory round trip each).
  for (int64_t r = r_begin + r0; r < r_end; r += kNhwcUnroll * rows_per_pass) {
    Vec<T> xv[kNhwcUnroll];
#pragma unroll
    for (int u = 0; u < kNhwcUnroll; ++u)
      if (r + u * rows_per_pass < r_end) xv[u] = *reinterpret_cast<const Vec<T>*>(col + (r + u * rows_per_pass) * c);
#pragma unroll
    for (int u = 0; u < kNhwcUnroll; ++u)
      if (r + u * rows_per_pass < r_end) add(xv[u]);
  }
#pragma unroll
  for (int e = 0; e < V; ++e) partial[r0 * c + v * V + e] = make_float2(dev[e], sq[e]);
  __syncthreads();
  // Each channel over the block's rows (a thread per channel: consecutive threads, consecutive entries)...
  for (int ch = int(threadIdx.x); ch < c; ch += int(blockDim.x)) {
    float2 s = partial[ch];
    for (int rr = 1; rr < rows_per_pass; ++rr) {
      const float2 t = partial[rr * c + ch];
      s.x += t.x;
      s.y += t.y;
    }
    partial[ch] = s;
  }
  __syncthreads();
  // ... then each group over its channels, a warp per group (the block's full warps; blockDim >= 128).
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = int(blockDim.x) / 32;
  if (warp >= warps) return;
  for (int g = warp; g < groups; g += warps) {
    float d = 0.0f, q = 0.0f;
    for (int j = lane; j < cg; j += 32) {
      const float2 s = partial[g * cg + j];
      d += s.x;
      q += s.y;
    }
    d = warp_sum(d);
    q = warp_sum(q);
    if (lane == 0) out[(int64_t(n) * gridDim.x + k) * groups + g] = {to_f32(sample[r_begin * c + g * cg]) + off.at(n, g * cg), d, q};
  }
}

// One warp per (sample, group). Every chunk's sums are moved to one reference, the shift of the group's first
// chunk (an element of the group, so within a few standard deviations of its mean): with a = shift_k - ref,
// sum(x - ref) = dev_k + n_k a and sum((x - ref)^2) = sq_k + 2 a dev_k + n_k a^2, exact in double. The lanes sum
// strided chunks (kMergeUnroll loads in flight) and the warp sums the lanes: no division in the loop. (Chan's
// pairwise update, with two double divisions per chunk in a dependent chain, took 22 us for the VAE's 1024
// chunks per group.) Then the lanes write the group's channels' (scale, shift).
constexpr int kMergeUnroll = 8;

// Group g of sample n's chunks (chunk k at mine[k * groups]) merged by one warp, as described above; every lane
// returns the group's mean and rstd. The whole warp must call it.
__device__ __forceinline__ void merge_group_stats(const GroupChunk* mine, int groups, int chunk_count, int rows_per_chunk, int64_t p_count,
                                  int cg, float eps, int lane, double& mean, double& rstd) {
  const double ref = double(mine[0].shift);
  double sum = 0.0, sum_sq = 0.0;
  const auto add = [&](const GroupChunk& s, int k) {
    const double nk = double(min(int64_t(rows_per_chunk), p_count - int64_t(k) * rows_per_chunk) * cg);
    const double a = double(s.shift) - ref, dev = double(s.dev);
    sum += dev + nk * a;
    sum_sq += double(s.sq) + a * (2.0 * dev + nk * a);
  };
  int k = lane;
  for (; k + (kMergeUnroll - 1) * 32 < chunk_count; k += kMergeUnroll * 32) {
    GroupChunk s[kMergeUnroll];
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) s[u] = mine[int64_t(k + u * 32) * groups];
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) add(s[u], k + u * 32);
  }
  for (; k < chunk_count; k += 32) add(mine[int64_t(k) * groups], k);
  for (int off = 16; off > 0; off /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, off);
    sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, off);
  }
  const double count = double(p_count) * cg, d_mean = sum / count;
  mean = ref + d_mean;
  rstd = 1.0 / sqrt(fmax(sum_sq / count - d_mean * d_mean, 0.0) + double(eps));
}

// Group g's channels' (scale, shift) from its mean and rstd into table[ch] (lanes stride the channels).
__device__ __forceinline__ void write_group_scale_shift(float2* table, NormAffine aff, int g, int cg, int lane, double mean, double rstd) {
  for (int ch = g * cg + lane; ch < (g + 1) * cg; ch += 32) {
    const double gam = aff.gamma ? load_any(aff.gamma, aff.gamma_dtype, ch) : 1.0f;
    const double bet = aff.beta ? load_any(aff.beta, aff.beta_dtype, ch) : 0.0f;
    const double sc = rstd * gam;
    table[ch] = make_float2(float(sc), float(bet - mean * sc));
  }
}

__global__ void group_merge_nhwc_kernel(float2* scale_shift, const GroupChunk* chunks, NormAffine aff, int samples, int groups, int c,
                                        int chunk_count, int rows_per_chunk, int64_t p_count, float eps) {
  const int item = int((int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32);
  const int lane = int(threadIdx.x) % 32;
  if (item >= samples * groups) return;  // whole warps leave together
  const int n = item / groups, g = item % groups, cg = c / groups;
  double mean, rstd;
  merge_group_stats(chunks + int64_t(n) * chunk_count * groups + g, groups, chunk_count, rows_per_chunk, p_count, cg, eps, lane,
                    mean, rstd);
  write_group_scale_shift(scale_shift + int64_t(n) * c, aff, g, cg, lane, mean, rstd);
}

// A thread's V channels' (scale, shift) from a [c] table of float2 (global or shared memory).
template <int V>
__device__ __forceinline__ void load_scale_shift(float (&sc)[V], float (&sh)[V], const float2* table, int v) {
  const float4* ss = reinterpret_cast<const float4*>(table + v * V);
#pragma unroll
  for (int e = 0; e < V; e += 2) {
    const float4 p = ss[e / 2];
    sc[e] = p.x;
    sh[e] = p.y;
    sc[e + 1] = p.z;
    sh[e + 1] = p.w;
  }
}

// A thread's V channels' shift with the offset folded in: act((x + o) * sc + sh) = act(x * sc + (sh + o * sc)).
template <typename T, int V>
__device__ __forceinline__ void fold_offset(float (&sh)[V], const float (&sc)[V], ChannelOffset<T> off, int n, int v) {
  if (!off.p) return;
#pragma unroll
  for (int e = 0; e < V; ++e) sh[e] = fmaf(off.at(n, v * V + e), sc[e], sh[e]);
}

// The apply loop of one thread: column v of sample n, rows r0, r0 + step, ... (kApplyUnroll loads in flight).
template <typename T>
__device__ __forceinline__ void apply_column(T* y, const T* x, const float (&sc)[Vec<T>::kWidth], const float (&sh)[Vec<T>::kWidth],
                                             int64_t p_count, int vc, int v, int64_t r0, int64_t step, UnaryOp act) {
  constexpr int V = Vec<T>::kWidth;
  const Vec<T>* xs = reinterpret_cast<const Vec<T>*>(x) + v;
  Vec<T>* ys = reinterpret_cast<Vec<T>*>(y) + v;
  const auto apply = [&](const Vec<T>& in) {
    Vec<T> o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = from_f32<T>(apply_unary_for<T>(fmaf(to_f32(in.v[e]), sc[e], sh[e]), act));
    return o;
  };
  for (int64_t r = r0; r < p_count; r += kApplyUnroll * step) {  // loads issued together, the last batch predicated
    Vec<T> in[kApplyUnroll];
#pragma unroll
    for (int u = 0; u < kApplyUnroll; ++u)
      if (r + u * step < p_count) in[u] = xs[(r + u * step) * vc];
#pragma unroll
    for (int u = 0; u < kApplyUnroll; ++u)
      if (r + u * step < p_count) ys[(r + u * step) * vc] = apply(in[u]);
  }
}

// y = act(x * scale[n, c] + shift[n, c]) over sample blockIdx.y. A block is rows_per_pass whole rows of vc
// column vectors, so a thread keeps one column (its V channels' scale and shift loaded once) and walks rows
// r0 + k * gridDim.x * rows_per_pass, kApplyUnroll loads in flight.
template <typename T>
__global__ void group_apply_nhwc_kernel(T* y, const T* x, ChannelOffset<T> off, const float2* scale_shift, int64_t p_count, int c,
                                        int rows_per_pass, UnaryOp act) {
  constexpr int V = Vec<T>::kWidth;
  const int vc = c / V, n = int(blockIdx.y), v = int(threadIdx.x) % vc;
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_pass + int(threadIdx.x) / vc, step = int64_t(gridDim.x) * rows_per_pass;
  float sc[V], sh[V];
  load_scale_shift<V>(sc, sh, scale_shift + int64_t(n) * c, v);
  fold_offset<T, V>(sh, sc, off, n, v);
  apply_column<T>(y + int64_t(n) * p_count * c, x + int64_t(n) * p_count * c, sc, sh, p_count, vc, v, r0, step, act);
}

// group_apply_nhwc_kernel with the merge first: the block's full warps merge sample blockIdx.y's groups (their
// chunk_count <= kApplyMergeChunks chunks each) into a shared [c] (scale, shift) table, then every thread
// applies as above. Every block repeats the merge: 16 chunks of 32 groups are ~6 KB of L2-resident reads.
constexpr int kApplyMergeChunks = 16;
constexpr int64_t kApplyMergeMaxBytes = int64_t(8) << 20;  // "small": SD's group norms up to 64x64x320 at batch 2 (5 MB)
constexpr size_t kApplyMergeMaxSmem = 32 * 1024;           // the [c] table: up to 4096 channels

template <typename T>
__global__ void group_apply_merge_nhwc_kernel(T* y, const T* x, ChannelOffset<T> off, const GroupChunk* chunks, NormAffine aff, int groups,
                                              int chunk_count, int rows_per_chunk, int64_t p_count, int c, int rows_per_pass,
                                              float eps, UnaryOp act) {
  constexpr int V = Vec<T>::kWidth;
  extern __shared__ float4 table_mem[];  // float4: the 16-byte alignment of load_scale_shift's reads
  float2* table = reinterpret_cast<float2*>(table_mem);  // [c]
  const int vc = c / V, n = int(blockIdx.y), v = int(threadIdx.x) % vc, cg = c / groups;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = int(blockDim.x) / 32;
  if (warp < warps) {  // a last partial warp only waits (the merge's shuffles need whole warps)
    for (int g = warp; g < groups; g += warps) {
      double mean, rstd;
      merge_group_stats(chunks + int64_t(n) * chunk_count * groups + g, groups, chunk_count, rows_per_chunk, p_count, cg, eps,
                        lane, mean, rstd);
      write_group_scale_shift(table, aff, g, cg, lane, mean, rstd);
    }
  }
  __syncthreads();
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_pass + int(threadIdx.x) / vc, step = int64_t(gridDim.x) * rows_per_pass;
  float sc[V], sh[V];
  load_scale_shift<V>(sc, sh, table, v);
  fold_offset<T, V>(sh, sc, off, n, v);
  apply_column<T>(y + int64_t(n) * p_count * c, x + int64_t(n) * p_count * c, sc, sh, p_count, vc, v, r0, step, act);
}

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of `kernel` (with `threads` threads and `smem` dynamic shared bytes) resident on the whole device at
// once (at least one per SM).
int64_t resident_blocks(const void* kernel, int threads, size_t smem, int sms) {
  return int64_t(std::max(blocks_per_sm(kernel, threads, smem), 1)) * std::max(sms, 1);
}

}  // namespace

int blocks_per_sm(const void* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, size_t>, int> cache;
  int device = 0;
  ATELIER_CUDA_OK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace({device, kernel, threads, smem}, 0);
  if (fresh && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, threads, smem) != cudaSuccess) {
    cudaGetLastError();
    it->second = 0;
  }
  return it->second;
}

// x, out channels-last [N, C, H, W] (buffers [N, P, C]), offset [N, C] optional (Backend::group_norm_offset);
// false (nothing enqueued) where the kernels do not apply: x or out not channels-last or of different dtypes, C not
// a multiple of the vector width, a row too wide for one block, unaligned buffers.
bool CudaBackend::group_norm_nhwc(Tensor& out, const Tensor& x, const Tensor& offset, const Tensor& gamma, const Tensor& beta,
                                  int groups, float eps, UnaryOp act, const Tensor& x2) {
  if (!x.is_channels_last() || !out.is_channels_last() || x.dtype() != out.dtype()) return false;
  if (x2.defined() && (!x2.is_channels_last() || x2.dtype() != x.dtype() || x2.size(0) != x.size(0) || x2.size(2) != x.size(2) ||
                       x2.size(3) != x.size(3)))
    return false;
  const int64_t n = x.size(0), c = out.size(1), p = x.size(2) * x.size(3);
  bool done = false;
  dispatch_float(x.dtype(), "group_norm", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = Vec<T>::kWidth;
    const int64_t vc = c / V;
    if (c % V != 0 || vc > 1024 || reinterpret_cast<uintptr_t>(x.raw()) % kVecBytes != 0 ||
        reinterpret_cast<uintptr_t>(out.raw()) % kVecBytes != 0)
      return;
    DeviceGuard guard(index_);
    {  // one kernel where a (sample, group slice) fits in shared memory (cuda_group_norm_slice.cu)
      GroupNormSliceArgs sa;
      sa.y = out.raw();
      sa.x = x.raw();
      if (x2.defined()) sa.x2 = x2.raw(), sa.c1 = int(x.size(1));
      if (offset.defined()) sa.offset = offset.raw(), sa.offset_stride = offset.strides()[0];
      const NormAffine aff = affine_of(gamma, beta);
      sa.gamma = aff.gamma, sa.beta = aff.beta, sa.gamma_dtype = aff.gamma_dtype, sa.beta_dtype = aff.beta_dtype;
      sa.dtype = x.dtype();
      sa.n = n, sa.p = p, sa.c = int(c), sa.groups = groups, sa.eps = eps, sa.act = act;
      sa.cc_major = cc_major_, sa.sm_count = sm_count_;
      NvtxRange range("group_norm");
      if (launch_group_norm_slice(sa, stream_)) {
        done = true;
        return;
      }
      // Past the slice kernel's sizes: one cooperative kernel, x staged in the SMs' shared memories
      // (cuda_group_norm_grid.cu); the three kernels below where it declines too.
      if (const std::optional<GroupNormGridPlan> plan = plan_group_norm_grid(sa)) {
        std::shared_ptr<Buffer> scratch = alloc_.allocate(plan->scratch_bytes);
        launch_group_norm_grid(sa, *plan, scratch->data(), stream_);
        done = true;
        return;
      }
    }
    if (x2.defined()) return;  // the three kernels below read one source only
    const int rows_per_pass = int(std::max<int64_t>(1, kNhwcStatsThreads / vc));
    const size_t smem = size_t(rows_per_pass) * size_t(c) * sizeof(float2);
    if (smem > 48 * 1024 || n > kMaxGridY) return;
    const int threads = int(vc) * rows_per_pass;
    // Both passes run as one wave of resident blocks, each thread walking as many rows as that takes: a grid of
    // a row or two per thread ran 1-3 waves of blocks that each paid their start-up (shift loads, barriers, the
    // block reduction) for a few loads; at batch 2 that made a 5 MB group norm take 33 us of kernels (ncu,
    // H200). Capping the apply pass at 4 rows per thread (more waves for large tensors, which ncu timed 15%
    // faster in isolation) measured slower in the models (UNet step 6.67 -> 6.73 ms, VAE decode 7.58 -> 7.84).
    const int64_t stats_wave = resident_blocks(reinterpret_cast<const void*>(&group_stats_nhwc_kernel<T>), threads, smem, sm_count_);
    // Rows per chunk for `wanted` chunks per sample (a thread walks at most kNhwcMaxRowsPerThread rows).
    const auto rows_per_chunk_for = [&](int64_t wanted) {
      return rows_per_pass * std::clamp<int64_t>(ceil_div(ceil_div(p, wanted), rows_per_pass), 1, kNhwcMaxRowsPerThread);
    };
    int64_t rows_per_chunk = rows_per_chunk_for(std::max<int64_t>(1, stats_wave / n));
    // Merged inside the apply kernel: small tensors (whose statistics pass is short with few chunks) or enough
    // samples to fill the device with kApplyMergeChunks chunks each; the [c] table must fit in shared memory.
    const size_t table_smem = size_t(c) * sizeof(float2);
    bool merge_in_apply = gn_apply_merge_ && table_smem <= kApplyMergeMaxSmem &&
                          (n * p * c * int64_t(sizeof(T)) <= kApplyMergeMaxBytes || 2 * n * kApplyMergeChunks >= sm_count_);
    if (merge_in_apply) {
      const int64_t few = rows_per_chunk_for(std::min<int64_t>(kApplyMergeChunks, std::max<int64_t>(1, stats_wave / n)));
      merge_in_apply = ceil_div(p, few) <= kApplyMergeChunks;
      if (merge_in_apply) rows_per_chunk = few;
    }
    const int64_t chunks = ceil_div(p, rows_per_chunk);
    if (chunks > kMaxGridY || n * chunks * groups > (int64_t(1) << 31)) return;
    NvtxRange range("group_norm");
    ChannelOffset<T> off;
    if (offset.defined()) off = {offset.data<T>(), offset.strides()[0]};
    std::shared_ptr<Buffer> partial = alloc_.allocate(size_t(n * chunks * groups) * sizeof(GroupChunk));
    auto* ps = static_cast<GroupChunk*>(partial->data());
    group_stats_nhwc_kernel<T><<<dim3(unsigned(chunks), unsigned(n)), unsigned(threads), smem, stream_>>>(
        ps, x.data<T>(), off, p, int(c), groups, int(rows_per_chunk), rows_per_pass);
    const auto apply_blocks = [&](const void* kernel, size_t apply_smem) {
      const int64_t wave = resident_blocks(kernel, threads, apply_smem, sm_count_);
      return unsigned(std::clamp<int64_t>(std::min(std::max<int64_t>(1, wave / n), ceil_div(p, rows_per_pass)), 1, kMaxGridY));
    };
    if (merge_in_apply) {
      const unsigned blocks = apply_blocks(reinterpret_cast<const void*>(&group_apply_merge_nhwc_kernel<T>), table_smem);
      group_apply_merge_nhwc_kernel<T><<<dim3(blocks, unsigned(n)), unsigned(threads), table_smem, stream_>>>(
          out.data<T>(), x.data<T>(), off, ps, affine_of(gamma, beta), groups, int(chunks), int(rows_per_chunk), p, int(c),
          rows_per_pass, eps, act);
    } else {
      std::shared_ptr<Buffer> table = alloc_.allocate(size_t(n * c) * sizeof(float2));
      auto* ss = static_cast<float2*>(table->data());
      const int64_t warps = n * groups;
      group_merge_nhwc_kernel<<<unsigned((warps * 32 + kMergeThreads - 1) / kMergeThreads), kMergeThreads, 0, stream_>>>(
          ss, ps, affine_of(gamma, beta), int(n), groups, int(c), int(chunks), int(rows_per_chunk), p, eps);
      const unsigned blocks = apply_blocks(reinterpret_cast<const void*>(&group_apply_nhwc_kernel<T>), 0);
      group_apply_nhwc_kernel<T><<<dim3(blocks, unsigned(n)), unsigned(threads), 0, stream_>>>(out.data<T>(), x.data<T>(), off, ss,
                                                                                              p, int(c), rows_per_pass, act);
    }
    ATELIER_CUDA_LAUNCHED();
    done = true;
  });
  return done;
}

}  // namespace atelier::cuda
