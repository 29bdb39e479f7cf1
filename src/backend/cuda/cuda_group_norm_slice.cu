// Channels-last group norm in one kernel where a (sample, group slice) fits in the shared memory of a block or of
// a cluster of blocks (cuda_group_norm_slice.h).
//
// Cluster k of cs blocks (cs = 1 unless the cluster policy below splits the slice) owns channels [k * cb, (k + 1) * cb)
// of sample n's p pixels: gb whole groups, gb the fewest whose channels make whole 16-byte vectors (SD's 32 groups of
// 10-80 channels: 40-120 channels). Block rank r of the cluster holds rows [r * rows_per_block, ...) of the slice: it
// copies them into its shared memory once (cp.async: every row's load in flight together), sums them per channel and
// group, and the cluster adds its blocks' group sums through distributed shared memory (each block reads every rank's
// sums in rank order: bit-identical totals everywhere). Then the squared deviations from the mean, from shared memory,
// totalled the same way (two passes over the staged values: exact where a single pass of sums and squares loses digits
// under a large mean), and act(x * scale + shift) written from shared memory. x is read once and y written once: the
// floor, where the three-kernel path (statistics, merge, apply) reads x twice and pays three launches and their tails
// (23-25 us for SD's 16-row [16, 1280, 8, 8] norms).
//
// Threads: column vector v = tid % vcb of the slice (fixed per thread, so its V channels' sums stay in registers)
// and rows tid / vcb, stepping rows_per_pass (about 256 or 512 / vcb); the block's group sums are warp sums of each
// thread's share (a slice has at most 8 groups), then the warps' added by one thread per group.
#include "backend/cuda/cuda_group_norm_slice.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_norm_act.cuh"
#include "backend/cuda/cuda_norm_common.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace atelier::cuda {
namespace {

// Block size targets (whole rows of column vectors): 256, or 512 for a grid of fewer blocks than SMs (one block
// per slice at batch 2 without clusters: session 26's size there); 512 measured slower on larger grids.
constexpr int kSliceThreads = 256;
constexpr int kSliceThreadsFewBlocks = 512;
// Staged values per block, at most: two blocks per SM. Clusters split a slice further, down to about
// kClusterTargetBytes per block (ATELIER_GN_SLICE_KB), so that a norm of few samples fills the GPU with small
// blocks. They pay where one block per slice would leave SMs idle and the tensor stays in L2 (batch 2 at 512²:
// the three kernels' launches and tails were most of their time), not on larger norms (16 rows, 1024²: 20-130%
// slower than the one-block or three-kernel paths, session 27): so only where the slices are fewer than the SMs
// and the tensor is at most kClusterMaxTensorBytes (ATELIER_GN_CLUSTER_MAX_MB).
constexpr int64_t kSliceMaxBytes = int64_t(96) << 10;
constexpr int64_t kClusterTargetBytes = int64_t(16) << 10;
constexpr int64_t kClusterMaxTensorBytes = int64_t(16) << 20;
constexpr int kMaxSliceGroups = 8;   // a slice's groups: gb = V / gcd(cg, V) <= V <= 8
constexpr int kMaxWarps = kSliceThreadsFewBlocks / 32;
constexpr int kPortableCluster = 8;  // larger clusters need the non-portable opt-in (sm_90: 16)
constexpr int kMaxCluster = 16;

struct SliceArgs {
  ChannelSources src;  // x alone, or x and a second tensor side by side along channels
  const void* offset;  // [N, C] in x's dtype (unit channel stride), or null
  int64_t offset_stride;
  NormAffine aff;
  int64_t p;  // pixels per sample
  int c, groups, gb;
  int rows_per_pass;  // rows a pass of the block covers (threads past vcb * rows_per_pass only join the reductions)
  int cs;             // blocks per cluster (grid x = slices * cs)
  int rows_per_block;  // rows of the slice each block of a cluster holds (the last may hold fewer)
  float eps;
  UnaryOp act;
};

// load(0) + load(1) + ... + load(count - 1), added in that order (count <= N), with every load issued before the
// first add: a loop of dependent loads (shared or distributed shared memory) waits out each one's round trip.
template <int N, class Load>
__device__ __forceinline__ float sum_in_order(int count, const Load& load) {
  float v[N];
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = i < count ? load(i) : 0.0f;
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (i < count) s += v[i];
  return s;
}

// Each thread's per-channel sums acc[V] (channels v * V .. of the slice) -> the block's per-group sums in
// group_out[gb]: per group, the thread's share, a warp sum, then one thread per group adds the warps' (in order).
// Whole block calls; red is [kMaxWarps][kMaxSliceGroups] of scratch.
template <int V>
__device__ __forceinline__ void reduce_groups(const float (&acc)[V], float* red, float* group_out, int v, int cg, int gb) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
#pragma unroll
  for (int g = 0; g < kMaxSliceGroups; ++g) {
    if (g >= gb) break;  // gb is the block's: the whole warp leaves together
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < V; ++e)
      if ((v * V + e) / cg == g) s += acc[e];
    s = warp_sum(s);
    if (lane == 0) red[warp * kMaxSliceGroups + g] = s;
  }
  __syncthreads();
  if (threadIdx.x < unsigned(gb))
    group_out[threadIdx.x] =
        sum_in_order<kMaxWarps>(int(blockDim.x) / 32, [&](int w) { return red[w * kMaxSliceGroups + threadIdx.x]; });
  __syncthreads();
}

// The cluster's totals of its blocks' group sums part[gb] into total[gb], the same in every block (ranks added in
// order). Whole cluster calls; a block's part must stay unchanged until the cluster's next barrier.
__device__ __forceinline__ void cluster_totals(float* part, float* total, int gb, int cs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cs > 1) {
    __cluster_barrier_arrive();  // release: this block's part is visible to the cluster
    __cluster_barrier_wait();
    // Ranks added in rank order (the same bits in every block); their remote reads all in flight together (one
    // after another they paid a distributed-shared-memory round trip per rank, 16 in a row, twice per norm).
    if (threadIdx.x < unsigned(gb))
      total[threadIdx.x] = sum_in_order<kMaxCluster>(cs, [&](int r) {
        return *static_cast<const float*>(__cluster_map_shared_rank(part + threadIdx.x, unsigned(r)));
      });
    __syncthreads();
    return;
  }
#endif
  if (threadIdx.x < unsigned(gb)) total[threadIdx.x] = part[threadIdx.x];
  __syncthreads();
}

template <typename T, Act kAct>
__device__ __forceinline__ void group_norm_slice_body(T* y, const T* x, const SliceArgs& a) {
  constexpr int V = Vec<T>::kWidth;
  extern __shared__ float4 smem_f4[];
  const int cg = a.c / a.groups, cb = a.gb * cg, vcb = cb / V, vc = a.c / V;
  const int rows_per_pass = a.rows_per_pass, v = int(threadIdx.x) % vcb, r0 = int(threadIdx.x) / vcb;
  const int n = int(blockIdx.y), ch0 = int(blockIdx.x) / a.cs * cb, rank = int(blockIdx.x) % a.cs;
  const int64_t row_begin = int64_t(rank) * a.rows_per_block;
  const int rows = int(min(int64_t(a.rows_per_block), a.p - row_begin));  // > 0: the launcher's split
  Vec<T>* tile = reinterpret_cast<Vec<T>*>(smem_f4);                        // [rows_per_block][vcb]
  float* red = reinterpret_cast<float*>(tile + int64_t(a.rows_per_block) * vcb);  // [kMaxWarps][kMaxSliceGroups]
  float* part_sum = red + kMaxWarps * kMaxSliceGroups;                      // [gb] each: this block's sums,
  float* part_sq = part_sum + kMaxSliceGroups;                              // then the cluster's totals
  float* mean = part_sq + kMaxSliceGroups;
  float* rstd = mean + kMaxSliceGroups;
  const int64_t sample = int64_t(n) * a.p * a.c + row_begin * a.c + ch0;
  int xstride;  // x's rows, in vectors: vc, or the row of the source this thread's vector lies in
  const Vec<T>* xs = source_rows<T>(x, a.src, a.c, int64_t(n) * a.p + row_begin, ch0 + v * V, xstride);
  Vec<T>* ys = reinterpret_cast<Vec<T>*>(y + sample) + v;
  const bool active = r0 < rows_per_pass;  // a last partial row of threads only helps with the reductions
  // Stage this block's rows: every copy in flight at once (a load-then-store loop waits a round trip per row).
  if (active) {
    for (int r = r0; r < rows; r += rows_per_pass) cp_async16(&tile[r * vcb + v], &xs[int64_t(r) * xstride], true);
    cp_async_commit();
  }
  // The offset and the affine parameters of this thread's channels, loaded before the statistics (loaded after
  // them, gamma and beta added a memory round trip to every block's critical path), and while the staging copies
  // are in flight: loaded after their wait, they were a second round trip before the first sum (session 46, H100:
  // the slice norms 12.5 -> 12.3 us a launch on the CFG step, the step 5.226 -> 5.214 ms).
  float o[V], gam[V], bet[V], acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const int ch = ch0 + v * V + e;
    o[e] = a.offset ? to_f32(static_cast<const T*>(a.offset)[n * a.offset_stride + ch]) : 0.0f;
    gam[e] = a.aff.gamma ? load_any(a.aff.gamma, a.aff.gamma_dtype, ch) : 1.0f;
    bet[e] = a.aff.beta ? load_any(a.aff.beta, a.aff.beta_dtype, ch) : 0.0f;
    acc[e] = 0.0f;
  }
  if (active) cp_async_wait_all();  // each thread reads back only what it copied
  // Pass 1: the sum of x + o per channel, then per group, then over the cluster.
  if (active)
    for (int r = r0; r < rows; r += rows_per_pass) {
      const Vec<T> in = tile[r * vcb + v];
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += to_f32(in.v[e]) + o[e];
    }
  const float count = float(a.p) * float(cg);
  reduce_groups<V>(acc, red, part_sum, v, cg, a.gb);
  cluster_totals(part_sum, mean, a.gb, a.cs);
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
    for (int r = r0; r < rows; r += rows_per_pass) {
      const Vec<T> in = tile[r * vcb + v];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = to_f32(in.v[e]) + o[e] - mu[e];
        acc[e] = fmaf(d, d, acc[e]);
      }
    }
  reduce_groups<V>(acc, red, part_sq, v, cg, a.gb);
  cluster_totals(part_sq, rstd, a.gb, a.cs);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The other blocks may still read this block's sums: it leaves only once all have read (the wait below).
  if (a.cs > 1) __cluster_barrier_arrive();
#endif
  if (threadIdx.x < unsigned(a.gb)) rstd[threadIdx.x] = rsqrtf(rstd[threadIdx.x] / count + a.eps);
  __syncthreads();
  if (active) {
    // act((x + o - mean) * rstd * gamma + beta) = act(x * sc + sh), sh = beta + (o - mean) * sc.
    float sc[V], sh[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      sc[e] = rstd[(v * V + e) / cg] * gam[e];
      sh[e] = fmaf(o[e] - mu[e], sc[e], bet[e]);
    }
    for (int r = r0; r < rows; r += rows_per_pass) {
      const Vec<T> in = tile[r * vcb + v];
      Vec<T> out;
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = from_f32<T>(activate<T, kAct>(fmaf(to_f32(in.v[e]), sc[e], sh[e]), a.act));
      ys[int64_t(r) * vc] = out;
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (a.cs > 1) __cluster_barrier_wait();
#endif
}

// At most 64 registers a thread (512-thread blocks two to an SM, 256-thread ones four), so that more clusters are
// resident at once: a batch-2 level-0 norm is 16 clusters of 16 blocks, and an SM that holds two blocks (96
// registers) leaves room for 14 (ncu, session 44). Session 45 (H100): 0.5% faster at 16 rows (blocks queue for the
// SMs), 0.5% slower on the CFG step (clusters, all resident) than the uncapped kernel (80 registers, three blocks an
// SM): SliceRegisterCap decides where it runs.
template <typename T, Act kAct>
__global__ void __launch_bounds__(kSliceThreadsFewBlocks, 2) group_norm_slice_kernel(T* y, const T* x, SliceArgs a) {
  group_norm_slice_body<T, kAct>(y, x, a);
}
template <typename T, Act kAct>
__global__ void group_norm_slice_uncapped_kernel(T* y, const T* x, SliceArgs a) {
  group_norm_slice_body<T, kAct>(y, x, a);
}

std::atomic<int64_t> g_launches{0}, g_cluster_launches{0}, g_two_wave_launches{0};

bool& slice_flag() {
  static bool on = !env_is("ATELIER_GN_SLICE", "0");
  return on;
}
SliceRegisterCap& cap_mode() {
  static SliceRegisterCap mode = env_is("ATELIER_GN_SLICE_REGS", "64")   ? SliceRegisterCap::kAlways
                                 : env_is("ATELIER_GN_SLICE_REGS", "80") ? SliceRegisterCap::kNever
                                                                         : SliceRegisterCap::kAuto;
  return mode;
}
bool log_flag() {
  static const bool on = env_is("ATELIER_GN_LOG", "1");
  return on;
}
bool& one_wave_flag() {
  static bool on = !env_is("ATELIER_GN_CLUSTER_WAVE", "0");
  return on;
}
bool& cluster_flag() {
  static bool on = !env_is("ATELIER_GN_CLUSTER", "0");
  return on;
}
// The cluster policy's two sizes: from the environment (KB / MB), else the defaults; set_group_norm_cluster_policy.
int64_t env_bytes(const char* name, int shift, int64_t fallback) {
  const std::optional<double> v = env_number(name);
  return v && *v >= 1 ? int64_t(*v) << shift : fallback;
}
int64_t& target_bytes() {
  static int64_t bytes = env_bytes("ATELIER_GN_SLICE_KB", 10, kClusterTargetBytes);
  return bytes;
}
int64_t& max_tensor_bytes() {
  static int64_t bytes = env_bytes("ATELIER_GN_CLUSTER_MAX_MB", 20, kClusterMaxTensorBytes);
  return bytes;
}
bool& any_grid() {  // clusters also where one block per slice already fills the SMs (tests)
  static bool any = false;
  return any;
}

// The opt-ins a launch of `kernel` with cfg (or an occupancy query of it) needs on the current device: shared memory
// past 48 KB a block, clusters past 8 blocks.
void allow_launch(const void* kernel, const cudaLaunchConfig_t& cfg) {
  constexpr size_t kDefaultSmem = 48 * 1024;
  if (cfg.dynamicSmemBytes > kDefaultSmem)
    ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(cfg.dynamicSmemBytes)));
  if (cfg.numAttrs > 0 && cfg.attrs[0].val.clusterDim.x > unsigned(kPortableCluster))
    ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

// How many clusters of this kernel's shape the current device holds at once (the occupancy calculator, asked once per
// kernel, shape and device); 0: none (a cluster wider than what a GPC holds never starts).
int max_active_clusters(const void* kernel, const cudaLaunchConfig_t& cfg) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, unsigned, unsigned, unsigned, size_t>, int> cache;
  int device = 0;
  ATELIER_CUDA_OK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  const unsigned cs = cfg.numAttrs > 0 ? cfg.attrs[0].val.clusterDim.x : 1;
  auto [it, fresh] = cache.try_emplace({device, kernel, cfg.gridDim.x, cfg.blockDim.x, cs, cfg.dynamicSmemBytes}, 0);
  if (fresh) {
    allow_launch(kernel, cfg);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
      cudaGetLastError();
      clusters = 0;
    }
    it->second = clusters;
  }
  return it->second;
}

// ATELIER_GN_LOG=1: one stderr line per launch shape (which cluster size and kernel the policies chose, and how many
// of its clusters the device holds at once against the slices it needs).
void log_launch(const GroupNormSliceArgs& g, int cs, int64_t slices, int resident, bool capped) {
  static std::mutex mu;
  static std::set<std::tuple<int64_t, int64_t, int, int, int, bool>> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert({g.n, g.p, g.c, g.groups, cs, capped}).second) return;
  std::fprintf(stderr, "[gn-slice] n %lld p %lld c %d groups %d: %lld slices, cluster %d, %s kernel, %d clusters resident%s\n",
               static_cast<long long>(g.n), static_cast<long long>(g.p), g.c, g.groups, static_cast<long long>(slices), cs,
               capped ? "64-register" : "uncapped", resident, cs > 1 && resident < slices ? " (two waves)" : "");
}

}  // namespace

bool group_norm_slice_enabled() { return slice_flag(); }
int64_t group_norm_slice_launches() { return g_launches.load(); }
int64_t group_norm_slice_cluster_launches() { return g_cluster_launches.load(); }
int64_t group_norm_slice_two_wave_launches() { return g_two_wave_launches.load(); }
void set_group_norm_slice(bool on) { slice_flag() = on; }
void set_group_norm_cluster(bool on) { cluster_flag() = on; }
void set_group_norm_slice_register_cap(SliceRegisterCap mode) { cap_mode() = mode; }
void set_group_norm_cluster_one_wave(bool on) { one_wave_flag() = on; }
void set_group_norm_cluster_policy(int64_t block_bytes, int64_t max_tensor, bool any_grid_size) {
  target_bytes() = block_bytes > 0 ? block_bytes : kClusterTargetBytes;
  max_tensor_bytes() = max_tensor > 0 ? max_tensor : kClusterMaxTensorBytes;
  any_grid() = any_grid_size;
}

bool two_sources_fit(const GroupNormSliceArgs& g, int vec_width) {
  if (g.x2 == nullptr) return true;
  return g.c1 > 0 && g.c1 < g.c && g.c1 % vec_width == 0 && reinterpret_cast<uintptr_t>(g.x2) % kVecBytes == 0;
}

bool launch_group_norm_slice(const GroupNormSliceArgs& g, cudaStream_t stream) {
  if (!slice_flag() || g.groups <= 0 || g.c % g.groups != 0 || g.n <= 0 || g.p <= 0 || g.n > 65535) return false;
  const int esize = int(dtype_size(g.dtype));
  const int V = kVecBytes / esize;
  if (!two_sources_fit(g, V)) return false;
  const int cg = g.c / g.groups;
  const int gb = V / std::gcd(cg, V);  // fewest groups whose channels are whole vectors
  if (g.groups % gb != 0 || gb > kMaxSliceGroups) return false;
  const int cb = gb * cg, vcb = cb / V;
  if (vcb > kSliceThreads) return false;
  // Blocks per slice: one where it fits and clusters are not allowed (before Hopper, ATELIER_GN_CLUSTER=0, tensors
  // past the policy's size, at least as many slices as SMs); else the fewest (a power of two, at most 16) whose
  // shares are at most the target, or failing that kSliceMaxBytes.
  const bool few_slices = g.n * (g.groups / gb) < g.sm_count;  // one block per slice leaves SMs idle
  const bool clusters = cluster_flag() && g.cc_major >= 9 && g.n * g.p * g.c * esize <= max_tensor_bytes() &&
                        (any_grid() || few_slices);
  const int max_cluster = clusters ? kMaxCluster : 1;
  const int64_t target = clusters ? target_bytes() : kSliceMaxBytes;
  const auto share = [&](int blocks) { return (g.p + blocks - 1) / blocks * cb * esize; };
  int cs = 1;
  while (cs < max_cluster && share(cs) > target) cs *= 2;
  if (share(cs) > kSliceMaxBytes) return false;
  while (cs > 1 && (cs - 1) * ((g.p + cs - 1) / cs) >= g.p) cs /= 2;  // no block without rows
  if (g.groups / gb * int64_t(cs) > int64_t(1) << 31) return false;
  const int64_t slices = g.n * (g.groups / gb);
  NormAffine aff;
  aff.gamma = g.gamma, aff.beta = g.beta, aff.gamma_dtype = g.gamma_dtype, aff.beta_dtype = g.beta_dtype;
  // act: the activation as a type (std::integral_constant<Act, ...>): the kernel instantiated for it.
  const auto go = [&](auto* y, const auto* x, auto act) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(x)>>;
    constexpr Act kAct = decltype(act)::value;
    auto kernel = cap_mode() == SliceRegisterCap::kAlways ? group_norm_slice_kernel<T, kAct> : group_norm_slice_uncapped_kernel<T, kAct>;
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    SliceArgs a{};
    // The launch of `blocks` blocks a slice: rows per block and pass, threads, shared memory.
    const auto configure = [&](int blocks) {
      const int64_t rows_per_block = (g.p + blocks - 1) / blocks;
      // Rows per pass: as many as the block size allows, at most the block's (8x8 images have 64: no idle threads).
      const int block_target = blocks == 1 && few_slices ? kSliceThreadsFewBlocks : kSliceThreads;
      const int rows_per_pass = int(std::clamp<int64_t>(block_target / vcb, 1, rows_per_block));
      const int threads = std::max(32, (vcb * rows_per_pass + 31) / 32 * 32);  // whole warps for the reductions
      const size_t smem = size_t(rows_per_block) * cb * esize + (kMaxWarps + 4) * kMaxSliceGroups * sizeof(float);
      a = SliceArgs{ChannelSources{g.x2, g.c1}, g.offset, g.offset_stride, aff, g.p, g.c, g.groups, gb, rows_per_pass, blocks, int(rows_per_block), g.eps, g.act};
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(unsigned(g.groups / gb * blocks), unsigned(g.n));
      cfg.blockDim = dim3(unsigned(threads));
      cfg.dynamicSmemBytes = smem;
      cfg.stream = stream;
      cluster.val.clusterDim.x = unsigned(blocks), cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
      if (blocks > 1) {
        cfg.attrs = &cluster;
        cfg.numAttrs = 1;
      }
      return cfg;
    };
    const auto resident = [&](auto* k, const cudaLaunchConfig_t& c) { return max_active_clusters(reinterpret_cast<const void*>(k), c); };
    cudaLaunchConfig_t cfg = configure(cs);
    // Clusters the device cannot hold all at once wait for a second wave that pays the whole latency chain again
    // (session 44's ncu: 16 clusters against 14 resident), so the cluster is halved (each block holding twice the
    // rows) while the slices outnumber the resident clusters and the rows still fit (ATELIER_GN_CLUSTER_WAVE=0: not).
    // Session 45 (H100): CFG step -0.6%, 1024² -1.5%, its slice norms 0.97 -> 0.79 ms a call.
    while (one_wave_flag() && cs > 1 && resident(kernel, cfg) < slices && share(cs / 2) <= kSliceMaxBytes) {
      cs /= 2;
      cfg = configure(cs);
    }
    // SliceRegisterCap::kAuto: the 64-register build where blocks queue for the SMs (one block a slice, at least as
    // many slices as SMs: 16 rows' norms, 0.5% off that step), the uncapped one where every block is resident
    // anyway (clusters after the halving, few slices: 0.5% faster on the CFG step there).
    if (cap_mode() == SliceRegisterCap::kAuto && cs == 1 && !few_slices) kernel = group_norm_slice_kernel<T, kAct>;
    const int held = cs > 1 ? resident(kernel, cfg) : 0;
    if (cs > 1 && held == 0) return false;
    if (cs > 1 && held < slices) g_two_wave_launches.fetch_add(1);
    if (log_flag()) log_launch(g, cs, slices, held, kernel == group_norm_slice_kernel<T, kAct>);
    allow_launch(reinterpret_cast<const void*>(kernel), cfg);
    ATELIER_CUDA_OK(cudaLaunchKernelEx(&cfg, kernel, static_cast<T*>(y), x, a));
    ATELIER_CUDA_LAUNCHED();
    g_launches.fetch_add(1);
    if (cs > 1) g_cluster_launches.fetch_add(1);
    return true;
  };
  const auto typed = [&](auto* y, const auto* x) { return with_act(g.act, [&](auto act) { return go(y, x, act); }); };
  switch (g.dtype) {
    case DType::BF16: return typed(static_cast<__nv_bfloat16*>(g.y), static_cast<const __nv_bfloat16*>(g.x));
    case DType::F16: return typed(static_cast<__half*>(g.y), static_cast<const __half*>(g.x));
    case DType::F32: return typed(static_cast<float*>(g.y), static_cast<const float*>(g.x));
    default: return false;
  }
}

}  // namespace atelier::cuda
