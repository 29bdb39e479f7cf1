// Normalisations on the GPU: GroupNorm (+ fused activation), LayerNorm, RMSNorm. torch's formulas (biased
// variance, eps inside the square root). Statistics in f32, two passes: the mean, then deviations from it.
// The second pass also sums the deviations themselves, which measures the rounding of the first-pass mean
// (its f32 sum loses digits when the mean is large against the spread): the refined mean is mean + sum(d)/n
// and the variance sum(d^2)/n - (sum(d)/n)^2. x - mean is exact for x near the mean (Sterbenz), so
// normalising as ((x - mean) - correction) * rstd keeps f32 results at the CPU backend's accuracy.
//
// GroupNorm spreads each group over several blocks, since SD has only batch * 32 groups: blocks compute
// the moments of a chunk, one small kernel merges the chunks of a group (Chan's formula, in double), and the
// apply kernel normalises. LayerNorm and RMSNorm take one block per row.
#include <algorithm>
#include <cstdint>

#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_norm_common.cuh"
#include "backend/cuda/cuda_nvtx.h"
#include "backend/packed_operands.h"

namespace atelier::cuda {
namespace {

constexpr int64_t kGroupChunk = 4096;     // elements per statistics block, at least
constexpr int64_t kMaxGroupChunks = 256;  // chunks per group, at most (bounds the merge loop)

struct ChunkStats {
  float mean;  // first-pass mean (f32)
  float dev;   // sum of deviations from it
  float sq;    // sum of squared deviations from it
};

struct GroupStats {
  float center;    // the group mean rounded to f32
  float residual;  // mean - center
  float rstd;
};

// Chunk k of group blockIdx.y covers elements [k * chunk, min(count, (k + 1) * chunk)) of that group.
template <typename T>
__global__ void group_chunk_stats_kernel(ChunkStats* stats, const T* x, int64_t count, int64_t chunk) {
  __shared__ float scratch[32];
  const int64_t group = blockIdx.y, k = blockIdx.x;
  const int64_t start = k * chunk, len = min(chunk, count - start);
  const T* xp = x + group * count + start;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) s += to_f32(xp[i]);
  const float mean = block_sum(s, scratch) / float(len);
  float dev = 0.0f, sq = 0.0f;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    const float d = to_f32(xp[i]) - mean;
    dev += d;
    sq += d * d;
  }
  dev = block_sum(dev, scratch);
  sq = block_sum(sq, scratch);
  if (threadIdx.x == 0) stats[group * gridDim.x + k] = {mean, dev, sq};
}

// One thread per group: merges its chunks (Chan et al.'s pairwise update, in double).
__global__ void group_merge_kernel(GroupStats* out, const ChunkStats* stats, int64_t groups, int64_t chunks, int64_t count,
                                   int64_t chunk, float eps) {
  const int64_t g = global_thread();
  if (g >= groups) return;
  double n = 0.0, mean = 0.0, m2 = 0.0;
  for (int64_t k = 0; k < chunks; ++k) {
    const ChunkStats c = stats[g * chunks + k];
    const double nb = double(min(chunk, count - k * chunk));
    const double mb = double(c.mean) + double(c.dev) / nb;                       // refined chunk mean
    const double m2b = fmax(double(c.sq) - double(c.dev) * double(c.dev) / nb, 0.0);  // about the refined mean
    const double delta = mb - mean;
    const double total = n + nb;
    mean += delta * nb / total;
    m2 += m2b + delta * delta * n * nb / total;
    n = total;
  }
  const double var = m2 / double(count);
  const float center = float(mean);
  out[g] = {center, float(mean - double(center)), float(1.0 / sqrt(var + double(eps)))};
}

// y = act(((x - center) - residual) * rstd * gamma[c] + beta[c]); group blockIdx.y, its chunk blockIdx.x;
// `spatial` elements per channel.
template <typename T>
__global__ void group_apply_kernel(T* y, const T* x, const GroupStats* stats, NormAffine aff, int64_t count, int64_t chunk,
                                   int64_t spatial, int64_t channels_per_group, int64_t groups, UnaryOp act) {
  const int64_t group = blockIdx.y, k = blockIdx.x;
  const GroupStats st = stats[group];
  const int64_t start = k * chunk, len = min(chunk, count - start);
  const int64_t c0 = (group % groups) * channels_per_group;
  const int64_t base = group * count + start;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    const uint32_t within = uint32_t(start + i);  // count < 2^31 (checked on the host)
    const int64_t c = c0 + within / uint32_t(spatial);
    const float g = aff.gamma ? load_any(aff.gamma, aff.gamma_dtype, c) : 1.0f;
    const float b = aff.beta ? load_any(aff.beta, aff.beta_dtype, c) : 0.0f;
    const float v = ((to_f32(x[base + i]) - st.center) - st.residual) * st.rstd * g + b;
    y[base + i] = from_f32<T>(apply_unary_for<T>(v, act));
  }
}

// --- GroupNorm, vectorised: 16-byte loads and stores, a thread's chunk elements kept in registers ----------
// Taken when the group size and the spatial size are multiples of the vector width and both buffers are
// 16-byte aligned (every SD shape): the statistics pass reads x once (the scalar kernel reads it twice), the
// apply pass loads gamma/beta once per vector. Same arithmetic as the scalar kernels.

constexpr int kVecsPerThread = 4;

template <typename T>
constexpr int64_t vec_chunk() {
  return int64_t(kNormThreads) * kVecsPerThread * Vec<T>::kWidth;
}

template <typename T>
__global__ void group_chunk_stats_vec_kernel(ChunkStats* stats, const T* x, int64_t count, int64_t chunk) {
  constexpr int V = Vec<T>::kWidth;
  __shared__ float scratch[32];
  const int64_t group = blockIdx.y, k = blockIdx.x;
  const int64_t start = k * chunk, len = min(chunk, count - start), nvec = len / V;
  const auto* xp = reinterpret_cast<const Vec<T>*>(x + group * count + start);
  float vals[kVecsPerThread][V];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) {
    const int64_t vi = int64_t(j) * blockDim.x + threadIdx.x;
    const Vec<T> v = vi < nvec ? xp[vi] : Vec<T>{};
#pragma unroll
    for (int e = 0; e < V; ++e) {
      vals[j][e] = to_f32(v.v[e]);
      s += vals[j][e];  // zero outside the chunk
    }
  }
  const float mean = block_sum(s, scratch) / float(len);
  float dev = 0.0f, sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecsPerThread; ++j) {
    if (int64_t(j) * blockDim.x + threadIdx.x >= nvec) continue;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = vals[j][e] - mean;
      dev += d;
      sq += d * d;
    }
  }
  dev = block_sum(dev, scratch);
  sq = block_sum(sq, scratch);
  if (threadIdx.x == 0) stats[group * gridDim.x + k] = {mean, dev, sq};
}

// The V elements of a vector share a channel (spatial % V == 0).
template <typename T>
__global__ void group_apply_vec_kernel(T* y, const T* x, const GroupStats* stats, NormAffine aff, int64_t count, int64_t chunk,
                                       int64_t spatial, int64_t channels_per_group, int64_t groups, UnaryOp act) {
  constexpr int V = Vec<T>::kWidth;
  const int64_t group = blockIdx.y, k = blockIdx.x;
  const GroupStats st = stats[group];
  const int64_t start = k * chunk, len = min(chunk, count - start), nvec = len / V;
  const int64_t c0 = (group % groups) * channels_per_group;
  const auto* xp = reinterpret_cast<const Vec<T>*>(x + group * count + start);
  auto* yp = reinterpret_cast<Vec<T>*>(y + group * count + start);
  for (int64_t vi = threadIdx.x; vi < nvec; vi += blockDim.x) {
    const int64_t c = c0 + uint32_t(start + vi * V) / uint32_t(spatial);  // count < 2^31 (checked on the host)
    const float g = aff.gamma ? load_any(aff.gamma, aff.gamma_dtype, c) : 1.0f;
    const float b = aff.beta ? load_any(aff.beta, aff.beta_dtype, c) : 0.0f;
    const Vec<T> in = xp[vi];
    Vec<T> out;
#pragma unroll
    for (int e = 0; e < V; ++e)
      out.v[e] = from_f32<T>(apply_unary_for<T>(((to_f32(in.v[e]) - st.center) - st.residual) * st.rstd * g + b, act));
    yp[vi] = out;
  }
}

// One block per row of d elements.
template <typename T>
__global__ void layer_norm_kernel(T* y, const T* x, NormAffine aff, int64_t d, float eps) {
  __shared__ float scratch[32];
  const T* xr = x + int64_t(blockIdx.x) * d;
  T* yr = y + int64_t(blockIdx.x) * d;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += to_f32(xr[j]);
  const float mean = block_sum(s, scratch) / float(d);
  float dev = 0.0f, sq = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = to_f32(xr[j]) - mean;
    dev += v;
    sq += v * v;
  }
  const float corr = block_sum(dev, scratch) / float(d);
  const float var = fmaxf(block_sum(sq, scratch) / float(d) - corr * corr, 0.0f);
  const float rstd = 1.0f / sqrtf(var + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = aff.gamma ? load_any(aff.gamma, aff.gamma_dtype, j) : 1.0f;
    const float b = aff.beta ? load_any(aff.beta, aff.beta_dtype, j) : 0.0f;
    yr[j] = from_f32<T>(((to_f32(xr[j]) - mean) - corr) * rstd * g + b);
  }
}

// Short rows (FLUX's and Z-Image's q/k norms over a head dim of 128): one warp per row, kWarpRowsPerBlock rows
// per block. One block of 64 threads per 128-element row spent most of its time starting blocks and in
// barriers (152 calls, 8.5 ms of a FLUX 1024² step on the H200).
constexpr int kWarpRowsPerBlock = 8;
constexpr int64_t kMaxWarpRow = 1024;

// Rows of up to kWarpLnMaxVecs vectors (SD's 320/640/1280 channels in bf16): one warp per row, the row held in
// registers, so x is read once and there is no block barrier. One block per row spent the SD UNet's layer norms
// in barriers and re-reads of 320-element rows (3.0 ms of a batch-16 step on the H200, ~0.7 TB/s). Same
// statistics and normalisation as layer_norm_kernel. The kernel is compiled per row length in vectors per lane
// (kMaxVecs): sized for the longest row, a 320-channel row kept registers for six vectors where it uses two,
// and the occupancy that cost left too few loads in flight (1.3 TB/s on 65536 x 320).
constexpr int kWarpLnMaxVecs = 6;  // per lane: 6 x 32 lanes x 8 bf16 = 1536 elements (768 in f32)
constexpr int kNarrowRowsPerSm = 96;  // rows per SM from which fewer lanes per row pay (12,672 on the H200's 132)

// Blocks per SM asked of ptxas per row length where gamma and beta come from shared memory (kShared): the row's
// packed vectors stay live across the reductions, and the conversions are cheap enough to redo in each pass rather
// than hold 8 floats per vector. (The other parameter forms' loads need more registers: no bound.)
template <int kMaxVecs, bool kShared>
constexpr int kWarpLnMinBlocks = !kShared ? 1 : kMaxVecs <= 2 ? 6 : kMaxVecs == 3 ? 5 : kMaxVecs <= 5 ? 4 : 3;

// The sum of v over the kLanes lanes of this lane's row (aligned groups of kLanes lanes of the warp).
template <int kLanes>
__device__ __forceinline__ float lanes_sum(float v) {
#pragma unroll
  for (int m = kLanes / 2; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// kShared: gamma and beta both present, in T, 16-byte aligned (layer_norm checks it). kLanes lanes per row, 32 /
// kLanes rows per warp: a 320-channel bf16 row is 40 vectors, 2 per lane of a whole warp with 24 of 64 slots idle, 5
// per lane of 8 lanes with none idle (and each warp has 4 rows in flight).
template <typename T, int kMaxVecs, bool kShared, int kLanes>
__global__ void __launch_bounds__(kWarpRowsPerBlock * 32, (kWarpLnMinBlocks<kMaxVecs, kShared>))
    layer_norm_warp_kernel(T* y, const T* x, NormAffine aff, int64_t rows, int64_t d, float eps) {
  constexpr int V = Vec<T>::kWidth;
  // gamma and beta in x's dtype (SD's): the block's rows share them, so its threads stage them in shared memory once,
  // beside their rows' loads. Held per lane in registers (session 29's early load, which took them off the critical
  // path after the reductions) they made the kernel 71 registers at 320 channels, 3 blocks per SM (37.5% occupancy,
  // too few rows in flight: 1.5-1.8 TB/s, session 33).
  __shared__ Vec<T> sg[kShared ? kMaxVecs * 32 : 1], sb[kShared ? kMaxVecs * 32 : 1];
  const int64_t nvec = d / V;
  constexpr int kRowsPerWarp = 32 / kLanes;
  const int64_t row = (int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32) * kRowsPerWarp + threadIdx.x % 32 / kLanes;
  const int lane = threadIdx.x % kLanes;
  const bool live = row < rows;  // lanes past the last row still take part in their warp's shuffles
  // The row as loaded (packed: 4 registers per vector instead of 8 floats), converted in each pass that reads it.
  Vec<T> xv[kMaxVecs];
  {
    const auto* xp = reinterpret_cast<const Vec<T>*>(x + row * d);
#pragma unroll
    for (int j = 0; j < kMaxVecs; ++j) {
      const int64_t vi = int64_t(j) * kLanes + lane;
      xv[j] = live && vi < nvec ? xp[vi] : Vec<T>{};
    }
  }
  if constexpr (kShared) {
    const auto* gp = static_cast<const Vec<T>*>(aff.gamma);
    const auto* bp = static_cast<const Vec<T>*>(aff.beta);
    for (int64_t vi = threadIdx.x; vi < nvec; vi += blockDim.x) sg[vi] = gp[vi], sb[vi] = bp[vi];
    __syncthreads();
  }
  auto* yp = reinterpret_cast<Vec<T>*>(y + row * d);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j)
#pragma unroll
    for (int e = 0; e < V; ++e) s += to_f32(xv[j].v[e]);  // zeros past the row
  const float mean = lanes_sum<kLanes>(s) / float(d);
  float dev = 0.0f, sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    if (int64_t(j) * kLanes + lane >= nvec) continue;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float v = to_f32(xv[j].v[e]) - mean;
      dev += v;
      sq += v * v;
    }
  }
  const float corr = lanes_sum<kLanes>(dev) / float(d);
  const float var = fmaxf(lanes_sum<kLanes>(sq) / float(d) - corr * corr, 0.0f);
  const float rstd = 1.0f / sqrtf(var + eps);
  if (!live) return;
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int64_t vi = int64_t(j) * kLanes + lane;
    if (vi >= nvec) continue;
    Vec<T> out;
    float g[V], b[V];
    if constexpr (kShared) {
      const Vec<T> gv = sg[vi], bv = sb[vi];
#pragma unroll
      for (int e = 0; e < V; ++e) g[e] = to_f32(gv.v[e]), b[e] = to_f32(bv.v[e]);
    } else {
      load_param_run<T>(g, aff.gamma, aff.gamma_dtype, vi * V, 1.0f);
      load_param_run<T>(b, aff.beta, aff.beta_dtype, vi * V, 0.0f);
    }
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_f32<T>(((to_f32(xv[j].v[e]) - mean) - corr) * rstd * g[e] + b[e]);
    yp[vi] = out;
  }
}

template <typename T>
__global__ void rms_norm_kernel(T* y, const T* x, NormAffine aff, int64_t d, float eps) {
  __shared__ float scratch[32];
  const T* xr = x + int64_t(blockIdx.x) * d;
  T* yr = y + int64_t(blockIdx.x) * d;
  float q = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = to_f32(xr[j]);
    q += v * v;
  }
  const float rstd = 1.0f / sqrtf(block_sum(q, scratch) / float(d) + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = aff.gamma ? load_any(aff.gamma, aff.gamma_dtype, j) : 1.0f;
    yr[j] = from_f32<T>(to_f32(xr[j]) * rstd * g);
  }
}


template <typename T>
__global__ void rms_norm_warp_kernel(T* y, const T* x, NormAffine aff, int64_t rows, int64_t d, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together: the shuffles below see full warps
  const int lane = threadIdx.x % 32;
  const T* xr = x + row * d;
  T* yr = y + row * d;
  float q = 0.0f;
  for (int64_t j = lane; j < d; j += 32) {
    const float v = to_f32(xr[j]);
    q += v * v;
  }
  const float rstd = 1.0f / sqrtf(warp_sum(q) / float(d) + eps);
  for (int64_t j = lane; j < d; j += 32) {
    const float g = aff.gamma ? load_any(aff.gamma, aff.gamma_dtype, j) : 1.0f;
    yr[j] = from_f32<T>(to_f32(xr[j]) * rstd * g);
  }
}

// Rows of exactly LANES 16-byte vectors (FLUX's and Z-Image's q/k norms: 128 bf16 = 16 vectors): LANES lanes
// per row, one load and one store each, 32 / LANES rows per warp. The warp-per-row kernel above moves 2-byte
// elements four per lane and loaded gamma element by element (1.5 TB/s; 4.4 ms of a FLUX step).
constexpr int kRmsVecThreads = 256;

template <typename T, int LANES>
__global__ void rms_norm_vec_kernel(T* y, const T* x, NormAffine aff, int64_t rows, float eps) {
  constexpr int V = Vec<T>::kWidth;
  const int64_t row = int64_t(blockIdx.x) * (kRmsVecThreads / LANES) + threadIdx.x / LANES;
  const int lane = int(threadIdx.x) % LANES;
  const bool live = row < rows;  // every lane takes part in the shuffles of lanes_row_rstd
  const Vec<T> v[1] = {live ? reinterpret_cast<const Vec<T>*>(x + row * LANES * V)[lane] : Vec<T>{}};
  float f[1][V];
  const float rstd = lanes_row_rstd<T, LANES, 1>(v, f, eps);
  if (!live) return;
  float g[V];
  load_param_run<T>(g, aff.gamma, aff.gamma_dtype, int64_t(lane) * V, 1.0f);
  Vec<T> o;
#pragma unroll
  for (int e = 0; e < V; ++e) o.v[e] = from_f32<T>(f[0][e] * rstd * g[e]);
  reinterpret_cast<Vec<T>*>(y + row * LANES * V)[lane] = o;
}

}  // namespace

// The channels-last kernels add the offset inside both passes; elsewhere (NCHW tensors, the kernels' unsupported
// cases) it is added in a pass of its own first (Backend's default).
void CudaBackend::group_norm_offset(Tensor& out, const Tensor& x, const Tensor& offset, const Tensor& gamma, const Tensor& beta,
                                    int groups, float eps, UnaryOp act) {
  if (x.numel() == 0) return;
  if (gn_offset_in_kernels_ && group_norm_nhwc(out, x, offset, gamma, beta, groups, eps, act)) return;
  Backend::group_norm_offset(out, x, offset, gamma, beta, groups, eps, act);
}

// a [N, C1, H, W] and b [N, C2, H, W] side by side -> out [N, C1 + C2, H, W], all channels-last: the slice or grid
// kernel reading each 16-byte vector from the part it lies in (the same sums in the same order as over their
// concatenation: the same bits).
bool CudaBackend::group_norm_concat(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& gamma, const Tensor& beta,
                                    int groups, float eps, UnaryOp act) {
  if (!concat_in_place_ || out.numel() == 0) return false;
  return group_norm_nhwc(out, a, Tensor(), gamma, beta, groups, eps, act, b);
}

// x [N, C, S] contiguous (S = product of the trailing dims), or x and out channels-last [N, C, H, W];
// statistics per (n, group of C/groups channels).
void CudaBackend::group_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps, UnaryOp act) {
  const int64_t n = x.size(0), c = x.size(1);
  if (x.numel() == 0) return;
  if (x.is_channels_last() || out.is_channels_last()) {
    if (group_norm_nhwc(out, x, Tensor(), gamma, beta, groups, eps, act)) return;
    // Outside the channels-last kernels' cases (odd channel counts, f32 rows too wide): through NCHW copies.
    return through_packed(*this, out, x, [&](Tensor& oc, const Tensor& xc) { group_norm(oc, xc, gamma, beta, groups, eps, act); });
  }
  ATELIER_CHECK(x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype(), "group_norm: contiguous tensors of one dtype expected");
  NvtxRange range("group_norm");
  DeviceGuard guard(index_);
  const int64_t spatial = x.numel() / (n * c);
  const int64_t cg = c / groups;
  const int64_t count = cg * spatial;  // elements per group
  const int64_t total_groups = n * groups;
  ATELIER_CHECK(count < (int64_t(1) << 31), "group_norm: groups of 2^31 elements or more are not supported");
  ATELIER_CHECK(total_groups <= 65535, "group_norm: at most 65535 (sample, group) pairs per call");
  const NormAffine aff = affine_of(gamma, beta);
  dispatch_float(x.dtype(), "group_norm", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = Vec<T>::kWidth;
    const bool vec = count % V == 0 && spatial % V == 0 && reinterpret_cast<uintptr_t>(x.raw()) % kVecBytes == 0 &&
                     reinterpret_cast<uintptr_t>(out.raw()) % kVecBytes == 0;
    const int64_t chunk = vec ? vec_chunk<T>() : std::max(kGroupChunk, (count + kMaxGroupChunks - 1) / kMaxGroupChunks);
    const int64_t chunks = (count + chunk - 1) / chunk;
    std::shared_ptr<Buffer> partial = alloc_.allocate(size_t(total_groups * chunks) * sizeof(ChunkStats));
    std::shared_ptr<Buffer> final_stats = alloc_.allocate(size_t(total_groups) * sizeof(GroupStats));
    auto* ps = static_cast<ChunkStats*>(partial->data());
    auto* fs = static_cast<GroupStats*>(final_stats->data());
    const dim3 grid{unsigned(chunks), unsigned(total_groups)};
    if (vec)
      group_chunk_stats_vec_kernel<T><<<grid, kNormThreads, 0, stream_>>>(ps, x.data<T>(), count, chunk);
    else
      group_chunk_stats_kernel<T><<<grid, kNormThreads, 0, stream_>>>(ps, x.data<T>(), count, chunk);
    group_merge_kernel<<<unsigned((total_groups + 127) / 128), 128, 0, stream_>>>(fs, ps, total_groups, chunks, count, chunk, eps);
    if (vec)
      group_apply_vec_kernel<T><<<grid, kNormThreads, 0, stream_>>>(out.data<T>(), x.data<T>(), fs, aff, count, chunk, spatial, cg,
                                                                    groups, act);
    else
      group_apply_kernel<T><<<grid, kNormThreads, 0, stream_>>>(out.data<T>(), x.data<T>(), fs, aff, count, chunk, spatial, cg,
                                                                groups, act);
  });
  ATELIER_CUDA_LAUNCHED();
}

// x [R, D] contiguous, normalised per row.
void CudaBackend::layer_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  const int64_t d = x.size(-1);
  const int64_t rows = d ? x.numel() / d : 0;
  if (rows == 0) return;
  ATELIER_CHECK(x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype(), "layer_norm: contiguous tensors of one dtype expected");
  ATELIER_CHECK(rows < (int64_t(1) << 31), "layer_norm: too many rows");
  NvtxRange range("layer_norm");
  DeviceGuard guard(index_);
  dispatch_float(x.dtype(), "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = Vec<T>::kWidth;
    const bool aligned = reinterpret_cast<uintptr_t>(x.data<T>()) % sizeof(Vec<T>) == 0 &&
                         reinterpret_cast<uintptr_t>(out.data<T>()) % sizeof(Vec<T>) == 0;
    if (aligned && d % V == 0 && d <= int64_t(kWarpLnMaxVecs) * 32 * V) {
      const auto in_t = [&](const Tensor& p) {
        return p.defined() && p.dtype() == x.dtype() && p.is_contiguous() && aligned_to(p.raw(), kVecBytes);
      };
      const bool shared = in_t(gamma) && in_t(beta);
      const auto launch = [&](auto vecs, auto lanes) {
        constexpr int kVecs = decltype(vecs)::value, kLanes = decltype(lanes)::value;
        const int64_t rows_per_block = int64_t(kWarpRowsPerBlock) * (32 / kLanes);
        const unsigned blocks = unsigned((rows + rows_per_block - 1) / rows_per_block);
        const auto kernel = shared ? layer_norm_warp_kernel<T, kVecs, true, kLanes> : layer_norm_warp_kernel<T, kVecs, false, kLanes>;
        kernel<<<blocks, kWarpRowsPerBlock * 32, 0, stream_>>>(out.data<T>(), x.data<T>(), affine_of(gamma, beta), rows, d, eps);
      };
      using L32 = std::integral_constant<int, 32>;
      // Rows of exactly 5 vectors per lane at 8 or 16 lanes (SD's 320 and 640 channels in bf16): no idle slots, 4 or 2
      // rows in flight per warp. Only for many rows: with fewer, a whole warp per row finishes sooner (latency, not
      // bandwidth: [8192, 320] 8 us against 9, [2048, 640] 5 against 7; [65536, 320] 38 against 30, session 34).
      const bool many_rows = rows >= int64_t(kNarrowRowsPerSm) * sm_count_;
      if (shared && many_rows && d / V == 5 * 8) return launch(std::integral_constant<int, 5>{}, std::integral_constant<int, 8>{});
      if (shared && many_rows && d / V == 5 * 16) return launch(std::integral_constant<int, 5>{}, std::integral_constant<int, 16>{});
      switch ((d / V + 31) / 32) {  // vectors per lane
        case 1: launch(std::integral_constant<int, 1>{}, L32{}); break;
        case 2: launch(std::integral_constant<int, 2>{}, L32{}); break;
        case 3: launch(std::integral_constant<int, 3>{}, L32{}); break;
        case 4: launch(std::integral_constant<int, 4>{}, L32{}); break;
        case 5: launch(std::integral_constant<int, 5>{}, L32{}); break;  // SD's 1280 channels
        default: launch(std::integral_constant<int, kWarpLnMaxVecs>{}, L32{}); break;
      }
    } else {
      layer_norm_kernel<T><<<unsigned(rows), row_threads(d), 0, stream_>>>(out.data<T>(), x.data<T>(), affine_of(gamma, beta), d, eps);
    }
  });
  ATELIER_CUDA_LAUNCHED();
}

// x [R, D] contiguous: y = x / sqrt(mean(x^2) + eps) * gamma.
void CudaBackend::rms_norm(Tensor& out, const Tensor& x, const Tensor& gamma, float eps) {
  const int64_t d = x.size(-1);
  const int64_t rows = d ? x.numel() / d : 0;
  if (rows == 0) return;
  ATELIER_CHECK(x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype(), "rms_norm: contiguous tensors of one dtype expected");
  ATELIER_CHECK(rows < (int64_t(1) << 31), "rms_norm: too many rows");
  NvtxRange range("rms_norm");
  DeviceGuard guard(index_);
  dispatch_float(x.dtype(), "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = Vec<T>::kWidth;
    const bool aligned = reinterpret_cast<uintptr_t>(x.data<T>()) % kVecBytes == 0 &&
                         reinterpret_cast<uintptr_t>(out.data<T>()) % kVecBytes == 0;
    const int64_t lanes = d / V;
    if (aligned && d % V == 0 && (lanes == 8 || lanes == 16 || lanes == 32)) {
      const unsigned blocks = unsigned((rows * lanes + kRmsVecThreads - 1) / kRmsVecThreads);
      const auto launch = [&](auto l) {
        rms_norm_vec_kernel<T, decltype(l)::value><<<blocks, kRmsVecThreads, 0, stream_>>>(out.data<T>(), x.data<T>(),
                                                                                        affine_of(gamma, Tensor()), rows, eps);
      };
      if (lanes == 8) launch(std::integral_constant<int, 8>{});
      else if (lanes == 16) launch(std::integral_constant<int, 16>{});
      else launch(std::integral_constant<int, 32>{});
    } else if (d <= kMaxWarpRow) {
      const unsigned blocks = unsigned((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock);
      rms_norm_warp_kernel<T><<<blocks, 32 * kWarpRowsPerBlock, 0, stream_>>>(out.data<T>(), x.data<T>(), affine_of(gamma, Tensor()),
                                                                               rows, d, eps);
    } else {
      rms_norm_kernel<T><<<unsigned(rows), row_threads(d), 0, stream_>>>(out.data<T>(), x.data<T>(), affine_of(gamma, Tensor()), d, eps);
    }
  });
  ATELIER_CUDA_LAUNCHED();
}

}  // namespace atelier::cuda
