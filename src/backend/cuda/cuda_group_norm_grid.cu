// Channels-last group norm of a large tensor in one cooperative kernel (cuda_group_norm_grid.h).
//
// Why: past what the slice kernel stages (a (sample, group slice) in one block's or one cluster's shared memory),
// the three-kernel path (statistics, merge, apply) reads x twice and pays three launches; SD's 16-row
// [16, 320, 64, 64] norms took 80-90 us there against a read-twice-write-once floor of ~36 us (session 26). Here
// x is read from DRAM once where it fits in the SMs' shared memories (132 x 227 KB on an H100/H200: SD 1024²'s
// [2, 320, 128, 128] whole) and otherwise once plus its unstaged part, which the apply re-reads first, while it is
// likely still in L2.
//
// The tensor is [N * P, C] rows of pixels. Block b of one per SM owns rows [b * R, (b + 1) * R) (R <= P, so a block
// spans at most two samples: segments 0 and 1). It copies its first S rows into shared memory (cp.async, all in
// flight), sums the rest from global memory meanwhile, then the staged ones: per thread and channel the sums of
// d = x + o - ref and d^2, ref being the group's first value of the sample (the same in every block: f32 sums keep the
// spread under a large mean, as the three-kernel path's shifted chunk sums do). The block folds them into per-group
// sums (a fixed order) and writes them to `partial`; after the grid barrier every block adds, in double and in one
// fixed order, the sums of the blocks covering its samples (the same bits in every block), and applies
// act((x + o - mean) * rstd * gamma + beta): first its unstaged rows, then the staged ones from shared memory.
//
// Threads: column vector v = tid % vc of the row (its V channels' sums, shifts and affine parameters stay in
// registers; at most two groups, as a group is at least a vector wide) and rows tid / vc, stepping rows_per_pass.
// y may be x: every element is read before the barrier or by the thread that then writes it.
#include "backend/cuda/cuda_group_norm_grid.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_norm_common.cuh"
#include "backend/cuda/cuda_norm_act.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace atelier::cuda {
namespace {

constexpr int kGridThreads = 512;  // block size target (whole rows of column vectors); one block per SM
constexpr int kLoadUnroll = 6;     // unstaged rows a thread has in flight (8 made the bf16 kernel spill)
constexpr int kApplyUnroll = 4;    // the same in the apply (likely L2 hits; 8 made the bf16 kernel spill)
constexpr int kMergeUnroll = 8;    // block sums a lane loads before it adds any (the merge after the barrier)
constexpr int kMinMergeLanes = 8;  // the smallest team merging a group's block sums (64 blocks in one round trip)

struct GridArgs {
  ChannelSources src;  // x alone, or x and a second tensor side by side along channels
  const void* offset;  // [N, C] in x's dtype (unit channel stride), or null
  int64_t offset_stride;
  NormAffine aff;
  int64_t p, rows;  // pixels per sample; N * p
  int c, groups;
  int rows_per_block, staged_rows, rows_per_pass;
  float eps;
  UnaryOp act;
  float2* partial;  // [gridDim.x][2][groups]: each block's per-segment (sum d, sum d^2) per group
};

template <typename T>
__device__ __forceinline__ float offset_at(const GridArgs& a, int64_t n, int ch) {
  return a.offset ? to_f32(static_cast<const T*>(a.offset)[n * a.offset_stride + ch]) : 0.0f;
}

// The value sample n's group g is summed about: its first element (pixel 0, the group's first channel) + offset.
template <typename T>
__device__ __forceinline__ float group_ref(const T* x, const GridArgs& a, int64_t n, int g) {
  const int ch = g * (a.c / a.groups);
  return to_f32(source_at<T>(x, a.src, a.c, n * a.p, ch)) + offset_at<T>(a, n, ch);
}

// A staged vector as one 16-byte shared-memory load: read through a Vec<T> reference, the compiler loaded its
// 16-bit elements one by one (ncu: eight LDS.U16 per vector).
template <typename T>
__device__ __forceinline__ Vec<T> load_staged(const Vec<T>* p) {
  const float4 raw = *reinterpret_cast<const float4*>(p);
  Vec<T> v;
  memcpy(&v, &raw, sizeof(v));
  return v;
}

// fn(r, vector) for this thread's rows r = first, first + step, ... below end of the rows at xs (vc vectors apart),
// U loads issued before any is used (the last batch predicated).
template <int U, typename T, class Fn>
__device__ __forceinline__ void for_rows_loaded(const Vec<T>* xs, int vc, int first, int end, int step, const Fn& fn) {
  for (int r = first; r < end; r += U * step) {
    Vec<T> in[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r + u * step < end) in[u] = xs[int64_t(r + u * step) * vc];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r + u * step < end) fn(r + u * step, in[u]);
  }
}

// The first of this thread's rows (r0, r0 + step, ...) at or past `from`.
__device__ __forceinline__ int first_row_from(int from, int r0, int step) {
  return from <= r0 ? r0 : r0 + (from - r0 + step - 1) / step * step;
}

// A thread's per-channel sums (channels v * V + e of one segment) -> the block's per-group sums out[groups]
// (global memory). Each thread folds its channels into its vector's two groups (`upper`: the second), writes them
// to red [rows_per_pass][vc][2], and a warp per group adds the entries of the (row, vector)s touching it in a fixed
// order. Whole block calls (red is free again when it returns).
template <int V>
__device__ __forceinline__ void block_group_sums(const float (&dev)[V], const float (&sq)[V], const bool (&upper)[V], float2* red,
                                                 float2* out, int vc, int cg, int groups, int rows_per_pass, bool active) {
  const int v = int(threadIdx.x) % vc, r0 = int(threadIdx.x) / vc;
  if (active) {
    float2 lo = make_float2(0.0f, 0.0f), hi = lo;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      hi.x += upper[e] ? dev[e] : 0.0f;
      hi.y += upper[e] ? sq[e] : 0.0f;
      lo.x += upper[e] ? 0.0f : dev[e];
      lo.y += upper[e] ? 0.0f : sq[e];
    }
    red[(r0 * vc + v) * 2] = lo;
    red[(r0 * vc + v) * 2 + 1] = hi;
  }
  __syncthreads();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = int(blockDim.x) / 32;
  for (int g = warp; g < groups; g += warps) {
    const int v_first = g * cg / V, nv = ((g + 1) * cg - 1) / V - v_first + 1;
    float2 s = make_float2(0.0f, 0.0f);
    for (int i = lane; i < rows_per_pass * nv; i += 32) {
      const int vv = v_first + i % nv;
      const float2 t = red[((i / nv) * vc + vv) * 2 + (vv * V / cg == g ? 0 : 1)];
      s.x += t.x;
      s.y += t.y;
    }
    s.x = warp_sum(s.x);
    s.y = warp_sum(s.y);
    if (lane == 0) out[g] = s;
  }
  __syncthreads();
}

// Sample n's (mean, rstd) of group g from the partial sums of blocks [b_first, b_last] (segment 1 of a block that
// starts in the previous sample), by a team of `lanes` lanes of one warp (a power of two up to 32, aligned; `mask`
// names them): lane l of it adds blocks b_first + l, + lanes, ... in double (their loads all in flight: one L2 round
// trip for up to lanes * kMergeUnroll blocks), then the lanes' sums meet in a butterfly of shuffles, which leaves the
// same bits in every lane (each step adds the same two values, in either order) and, `lanes` being the same in every
// block, in every block. Every lane of the team returns the result.
template <typename T>
__device__ __forceinline__ float2 merged_stats(const T* x, const GridArgs& a, int64_t n, int g, int lane, int lanes, unsigned mask) {
  const float ref = group_ref<T>(x, a, n, g);
  const int b_first = int(n * a.p / a.rows_per_block), b_last = int(((n + 1) * a.p - 1) / a.rows_per_block);
  double dev = 0.0, sq = 0.0;
  for (int b = b_first + lane; b <= b_last; b += lanes * kMergeUnroll) {
    float2 t[kMergeUnroll];
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      const int bb = b + lanes * u, seg = int64_t(bb) * a.rows_per_block < n * a.p ? 1 : 0;
      if (bb <= b_last) t[u] = __ldcg(&a.partial[(int64_t(bb) * 2 + seg) * a.groups + g]);  // other blocks' writes: not L1
    }
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u)
      if (b + lanes * u <= b_last) dev += double(t[u].x), sq += double(t[u].y);
  }
  for (int m = lanes / 2; m > 0; m >>= 1) {
    dev += __shfl_xor_sync(mask, dev, m);
    sq += __shfl_xor_sync(mask, sq, m);
  }
  const double count = double(a.p) * double(a.c / a.groups), d_mean = dev / count;
  const double var = fmax(sq / count - d_mean * d_mean, 0.0);
  return make_float2(float(double(ref) + d_mean), float(1.0 / sqrt(var + double(a.eps))));
}

// Lanes per (segment, group) team in the merge: the most (up to a warp) that still give every group a team at once,
// so that a block's merge is one round of latency for its first segment. Depends only on the block size and the
// group count, the same in every block (the merged bits must be). A warp per group left SD's 480-thread blocks (15
// warps, 32 groups) three rounds of L2 round trips and double-precision chains one after another.
__device__ __forceinline__ int merge_team_lanes(int threads, int groups) {
  int lanes = 32;
  while (lanes > kMinMergeLanes && threads / lanes < groups) lanes /= 2;
  return lanes;
}

template <typename T, Act kAct>
__global__ void __launch_bounds__(kGridThreads, 1) group_norm_grid_kernel(T* y, const T* x, GridArgs a) {
  constexpr int V = Vec<T>::kWidth;
  extern __shared__ float4 smem_f4[];
  const int vc = a.c / V, cg = a.c / a.groups, rp = a.rows_per_pass;
  const int v = int(threadIdx.x) % vc, r0 = int(threadIdx.x) / vc;
  const bool active = r0 < rp;  // a last partial row of threads only helps with the reductions
  const int64_t row0 = int64_t(blockIdx.x) * a.rows_per_block, n0 = row0 / a.p;
  const int rows = int(min(int64_t(a.rows_per_block), a.rows - row0));  // > 0: the launcher's grid
  const int staged = min(rows, a.staged_rows);
  const int split = int(min(int64_t(rows), (n0 + 1) * a.p - row0));  // rows [0, split): sample n0; the rest n0 + 1
  Vec<T>* tile = reinterpret_cast<Vec<T>*>(smem_f4);                             // [staged_rows][vc]
  float2* red = reinterpret_cast<float2*>(tile + int64_t(a.staged_rows) * vc);  // [rp][vc][2]
  float2* stats = red + rp * vc * 2;                                           // [2][groups]: (mean, rstd)
  int xstride;  // x's rows, in vectors: vc, or the row of the source this thread's vector lies in
  const Vec<T>* xs = source_rows<T>(x, a.src, a.c, row0, v * V, xstride);
  Vec<T>* ys = reinterpret_cast<Vec<T>*>(y + row0 * a.c) + v;

  // This thread's channels: their group (g0, or g0 + 1 where `upper`), and per segment the value their sums are
  // taken about (the group's reference less the channel's offset: d = (x + o) - ref). Their loads go out before the
  // staging copies: behind them they waited for all of them (ncu: the largest single stall of the statistics).
  const int g0 = v * V / cg;
  bool upper[V];
  float shift0[V], shift1[V];
  const auto shifts = [&](float (&shift)[V], int64_t n) {
    const float ref_lo = group_ref<T>(x, a, n, g0), ref_hi = g0 + 1 < a.groups ? group_ref<T>(x, a, n, g0 + 1) : 0.0f;
#pragma unroll
    for (int e = 0; e < V; ++e) shift[e] = (upper[e] ? ref_hi : ref_lo) - offset_at<T>(a, n, v * V + e);
  };
#pragma unroll
  for (int e = 0; e < V; ++e) upper[e] = (v * V + e) / cg > g0;
  shifts(shift0, n0);
  shifts(shift1, split < rows ? n0 + 1 : n0);

  // Stage the first rows: every copy in flight at once.
  if (active)
    for (int r = r0; r < staged; r += rp) cp_async16(&tile[r * vc + v], &xs[int64_t(r) * xstride], true);
  cp_async_commit();

  // Statistics, a segment (sample) at a time: its unstaged rows from global memory (segment 0's while the copies
  // land), then its staged ones; per channel the sums of d and d^2, then the block's per group.
  // Only a block that straddles two samples (one in ~P / rows_per_block) has a segment 1.
  float2* mine = a.partial + int64_t(blockIdx.x) * 2 * a.groups;
  for (int s = 0; s < 2; ++s) {
    const int lo = s == 0 ? 0 : split, hi = s == 0 ? split : rows;
    if (s == 1 && lo >= hi) break;  // the same for the whole block
    float shift[V], d[V], q[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      shift[e] = s == 0 ? shift0[e] : shift1[e];
      d[e] = q[e] = 0.0f;
    }
    const auto add = [&](const Vec<T>& in) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float t = to_f32(in.v[e]) - shift[e];
        d[e] += t;
        q[e] = fmaf(t, t, q[e]);
      }
    };
    if (active)
      for_rows_loaded<kLoadUnroll>(xs, xstride, first_row_from(max(lo, staged), r0, rp), hi, rp, [&](int, const Vec<T>& in) { add(in); });
    if (s == 0) cp_async_wait_all();  // each thread reads back only what it copied
    if (active) {
      const int staged_hi = min(hi, staged);
#pragma unroll 4
      for (int r = first_row_from(lo, r0, rp); r < staged_hi; r += rp) add(load_staged(&tile[r * vc + v]));
    }
    block_group_sums<V>(d, q, upper, red, mine + s * a.groups, vc, cg, a.groups, rp, active);
  }

  cooperative_groups::this_grid().sync();  // every block's sums written (and visible)

  // The affine parameters, loaded here (in flight with the merge's loads) rather than held through the statistics:
  // there they cost registers the bf16 kernel spilled.
  float gam[V], bet[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    gam[e] = a.aff.gamma ? load_any(a.aff.gamma, a.aff.gamma_dtype, v * V + e) : 1.0f;
    bet[e] = a.aff.beta ? load_any(a.aff.beta, a.aff.beta_dtype, v * V + e) : 0.0f;
  }
  {  // a team of lanes per (segment, group)
    const int lanes = merge_team_lanes(int(blockDim.x), a.groups), teams = int(blockDim.x) / lanes;
    const int team = int(threadIdx.x) / lanes, lane = int(threadIdx.x) % lanes;
    const unsigned mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << (int(threadIdx.x) % 32 - lane);
    const int pairs = (split < rows ? 2 : 1) * a.groups;
    for (int i = team; i < pairs; i += teams) {
      const float2 m = merged_stats<T>(x, a, n0 + i / a.groups, i % a.groups, lane, lanes, mask);
      if (lane == 0) stats[i] = m;
    }
  }
  __syncthreads();
  if (!active) return;
  // Apply, per segment: act(x * sc + sh), sc = rstd * gamma, sh = beta + (o - mean) * sc; the unstaged rows first
  // (read last from DRAM, so the likeliest still in L2), then the staged ones.
  for (int s = 0; s < 2; ++s) {
    const int lo = s == 0 ? 0 : split, hi = s == 0 ? split : rows;
    if (lo >= hi) continue;
    const float2 m_lo = stats[s * a.groups + g0], m_hi = g0 + 1 < a.groups ? stats[s * a.groups + g0 + 1] : m_lo;
    float sc[V], sh[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float2 m = upper[e] ? m_hi : m_lo;
      sc[e] = m.y * gam[e];
      sh[e] = fmaf(offset_at<T>(a, n0 + s, v * V + e) - m.x, sc[e], bet[e]);
    }
    const auto apply = [&](const Vec<T>& in) {
      Vec<T> out;
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = from_f32<T>(activate<T, kAct>(fmaf(to_f32(in.v[e]), sc[e], sh[e]), a.act));
      return out;
    };
    for_rows_loaded<kApplyUnroll>(xs, xstride, first_row_from(max(lo, staged), r0, rp), hi, rp,
                                  [&](int r, const Vec<T>& in) { ys[int64_t(r) * vc] = apply(in); });
    const int staged_hi = min(hi, staged);
#pragma unroll 4
    for (int r = first_row_from(lo, r0, rp); r < staged_hi; r += rp) ys[int64_t(r) * vc] = apply(load_staged(&tile[r * vc + v]));
  }
}

std::atomic<int64_t> g_launches{0};

bool& grid_flag() {
  static bool on = !env_is("ATELIER_GN_GRID", "0");
  return on;
}

// The current device's opt-in shared memory per block (0 where it has no cooperative launches), asked once.
size_t device_smem_optin() {
  static std::mutex mu;
  static std::map<int, size_t> cache;
  int device = 0;
  ATELIER_CUDA_OK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace(device, 0);
  if (fresh) {
    int coop = 0, optin = 0;
    ATELIER_CUDA_OK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
    ATELIER_CUDA_OK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    it->second = coop ? size_t(optin) : 0;
  }
  return it->second;
}

// The kernel for an element type and activation: fn(kernel) for the instantiation, with T's null pointer as a tag.
template <typename T, class Fn>
auto with_typed_kernel(UnaryOp op, const Fn& fn) {
  return with_act(op, [&](auto act) { return fn(group_norm_grid_kernel<T, decltype(act)::value>, static_cast<T*>(nullptr)); });
}
template <class Fn>
auto with_kernel(DType dtype, UnaryOp op, const Fn& fn) -> decltype(with_typed_kernel<float>(op, fn)) {
  switch (dtype) {
    case DType::BF16: return with_typed_kernel<__nv_bfloat16>(op, fn);
    case DType::F16: return with_typed_kernel<__half>(op, fn);
    case DType::F32: return with_typed_kernel<float>(op, fn);
    default: return {};
  }
}
const void* kernel_for(DType dtype, UnaryOp op) {
  return with_kernel(dtype, op, [](auto kernel, auto*) { return reinterpret_cast<const void*>(kernel); });
}

}  // namespace

bool group_norm_grid_enabled() { return grid_flag(); }
void set_group_norm_grid(bool on) { grid_flag() = on; }
int64_t group_norm_grid_launches() { return g_launches.load(); }

std::optional<GroupNormGridPlan> plan_group_norm_grid(const GroupNormSliceArgs& g) {
  const void* kernel = kernel_for(g.dtype, g.act);
  if (!grid_flag() || kernel == nullptr || g.cc_major < 8 || g.sm_count <= 0 || g.groups <= 0 || g.c % g.groups != 0 ||
      g.n <= 0 || g.p <= 0)
    return std::nullopt;
  const int esize = int(dtype_size(g.dtype)), V = kVecBytes / esize, cg = g.c / g.groups;
  if (g.c % V != 0 || cg < V || g.c / V > kGridThreads || !two_sources_fit(g, V)) return std::nullopt;
  const size_t optin = device_smem_optin();
  if (optin == 0) return std::nullopt;
  GroupNormGridPlan pl{};
  const int vc = g.c / V;
  pl.rows_per_pass = kGridThreads / vc;
  pl.threads = (vc * pl.rows_per_pass + 31) / 32 * 32;
  const int64_t rows = g.n * g.p, per_block = (rows + g.sm_count - 1) / g.sm_count;
  if (per_block > g.p || per_block > (int64_t(1) << 30)) return std::nullopt;
  pl.rows_per_block = int(per_block);
  pl.blocks = int((rows + per_block - 1) / per_block);
  const size_t red = size_t(pl.rows_per_pass) * vc * 2 * sizeof(float2) + size_t(2) * g.groups * sizeof(float2);
  const size_t row_bytes = size_t(g.c) * esize;
  if (red > optin) return std::nullopt;
  pl.staged_rows = int(std::min<int64_t>(per_block, int64_t((optin - red) / row_bytes)));
  pl.smem = size_t(pl.staged_rows) * row_bytes + red;
  // The opt-in (which the occupancy calculator and the launch both need) belongs to the current device: raised here,
  // for each norm, as the slice kernel does per launch.
  ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(pl.smem)));
  if (blocks_per_sm(kernel, pl.threads, pl.smem) < 1) return std::nullopt;  // every block must be resident
  pl.scratch_bytes = size_t(pl.blocks) * 2 * g.groups * sizeof(float2);
  return pl;
}

void launch_group_norm_grid(const GroupNormSliceArgs& g, const GroupNormGridPlan& plan, void* scratch, cudaStream_t stream) {
  NormAffine aff;
  aff.gamma = g.gamma, aff.beta = g.beta, aff.gamma_dtype = g.gamma_dtype, aff.beta_dtype = g.beta_dtype;
  GridArgs a{ChannelSources{g.x2, g.c1}, g.offset, g.offset_stride, aff, g.p, g.n * g.p, g.c, g.groups, plan.rows_per_block, plan.staged_rows,
             plan.rows_per_pass, g.eps, g.act, static_cast<float2*>(scratch)};
  with_kernel(g.dtype, g.act, [&](auto kernel, auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ATELIER_CUDA_OK(launch_cooperative(kernel, unsigned(plan.blocks), unsigned(plan.threads), plan.smem, stream, static_cast<T*>(g.y),
                                       static_cast<const T*>(g.x), a));
    ATELIER_CUDA_LAUNCHED();
    g_launches.fetch_add(1);
    return true;
  });
}

}  // namespace atelier::cuda
