// cuda_product_probes.h: the Hopper attention kernel's products (cuda_attention_wgmma.cu, head dim 40, 128-key
// tiles) on their own, on zeros or random bf16 operands. Each pattern is a kernel of its own: a wgmma behind a
// branch that ptxas cannot prove uniform across the warpgroup makes it serialise every product of the kernel
// (C7512), which is why these are not roles of the overlap probe in cuda_unit_probes.cu.
#include <cstdint>

#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_wgmma.cuh"
#include "cuda_product_probes.h"
#include "cuda_unit_probes.h"  // device_major

namespace atelier::bench {
namespace {

constexpr int kTiles = 2048;                            // 128-key tiles per working warpgroup and launch
constexpr int kBlockK = 128;                            // keys per tile (the kernel's default)
[[maybe_unused]] constexpr int kKSteps = kBlockK / 16;  // P V's k-steps per tile
constexpr int kWarpgroups = 3;                          // the kernel's consumers at head dim <= 64
constexpr int kBlockQ = 64 * kWarpgroups;
constexpr size_t kSmem = 128 * 1024;  // more than half an SM's shared memory: one block per SM
// Shared-memory carve-up (zeros): Q [kBlockQ][64] (one atom column), K [kBlockK][64], V as two atom columns of
// [kBlockK][64] (N up to 128), P per warpgroup as two atom columns of [64][64] (the shared-memory P V).
constexpr uint32_t kQBytes = kBlockQ * 128, kKBytes = kBlockK * 128, kVBytes = 2 * kBlockK * 128,
                   kPBytes = 2 * 64 * 128;
constexpr uint32_t kUsedBytes = kQBytes + kKBytes + kVBytes + kWarpgroups * kPBytes;
static_assert(kUsedBytes + 1024 <= kSmem);
[[maybe_unused]] constexpr int kFirstTurnBarrier = 1;  // named barriers 1 .. 3 (0 is __syncthreads')

#if defined(ATELIER_WGMMA)
// One tile's products of warpgroup c: S (kS k-steps) and P V (8 k-steps at N = kN; none when kN == 0), each
// committed as a group when kSplit (the consumer's two groups), else both in one. S accumulates over the tiles,
// unlike the kernel's (whose first k-step starts from zero): nothing here reads S between tiles, and a tile's S
// that the next one overwrites is dead code that ptxas removes (session 53's first run: S at 1.6x the tensor
// pipe's peak).
template <int kS, int kN, bool kPSmem, bool kSplit>
__device__ __forceinline__ void issue_tile(float (&s)[64], float (&o)[kN > 0 ? kN / 2 : 1],
                                           const uint32_t (&pa)[kKSteps][4], uint32_t q, uint32_t k, uint32_t v,
                                           uint32_t p) {
  using namespace cuda::wgmma;
  cuda::wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kS; ++kk)
    mma_m64n128k16_ss<0>(s, desc_sw128(q + kk * 32, 0, kAtomGroupBytes), desc_sw128(k + kk * 32, 0, kAtomGroupBytes),
                         true);
  if constexpr (kS > 0 && kSplit) commit();
  if constexpr (kN > 0) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const uint64_t db = desc_sw128(v + kk * 16 * 128, kBlockK * 128, kAtomGroupBytes);
      // V MN-major (atom columns kBlockK * 128 bytes apart), as the kernel's issue_pv
      if constexpr (kPSmem) {
        static_assert(kN == 64, "P from shared memory is probed at N = 64 only");
        const uint64_t da = desc_sw128(p + (kk / 4) * 64 * 128 + (kk % 4) * 32, 0, kAtomGroupBytes);
        mma_ss<kN, 1>(o, da, db, true);
      } else {
        mma_rs<kN, 1>(o, pa[kk], db, true);
      }
    }
  }
  if constexpr (!(kS > 0 && kSplit) || kN > 0) commit();
}

// Two bf16 values in [-1, 1) from a hash of `i`.
__device__ __forceinline__ uint32_t operand_bits(uint32_t i) {
  const uint32_t h = i * 2654435761u ^ (i >> 13) * 40503u;
  const float lo = float(h & 0xFFFF) / 32768.0f - 1.0f, hi = float(h >> 16) / 32768.0f - 1.0f;
  return cuda::pack2<__nv_bfloat16>(lo, hi);
}

#endif

// kPerTile: the consumer's schedule (S and P V as two groups, wait for S, then for P V, before the next tile);
// else streamed (one group per tile, one kept in flight). kTurns: the ring of turns around each tile's issue.
template <int kS, int kN, bool kPSmem, bool kPerTile, bool kTurns>
__global__ void __launch_bounds__(128 * kWarpgroups, 1)
    product_probe_kernel(int warpgroups, bool random_operands, uint32_t* sink) {
#if defined(ATELIER_WGMMA)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  // Zeros, or bf16 values in [-1, 1) (the tensor cores' power, not their rate, depends on the data).
  for (uint32_t i = threadIdx.x * 4; i < kUsedBytes; i += blockDim.x * 4)
    *reinterpret_cast<uint32_t*>(base + i) = random_operands ? operand_bits(i) : 0u;
  cuda::wgmma::fence_async_smem();
  __syncthreads();
  const int c = int(threadIdx.x) / 128;
  if (c >= warpgroups) return;
  const uint32_t q = cuda::smem_u32(base) + c * 64 * 128, k = cuda::smem_u32(base) + kQBytes, v = k + kKBytes,
                 p = v + kVBytes + c * kPBytes;
  const cuda::tma::TurnRing turn(kFirstTurnBarrier, c, warpgroups);
  float s[64], o[kN > 0 ? kN / 2 : 1];
#pragma unroll
  for (int i = 0; i < 64; ++i) s[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < (kN > 0 ? kN / 2 : 1); ++i) o[i] = 0.0f;
  // Two sets of P fragments, alternate tiles': streamed, a tile's products read one while the previous tile's may
  // still read the other (with one set ptxas serialises the products for want of registers, C7512).
  uint32_t pa[kKSteps][4], pb[kKSteps][4];
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      pa[kk][i] = pb[kk][i] = random_operands ? operand_bits(threadIdx.x * 32 + kk * 4 + i) : 0u;
  if (kTurns) turn.start();

#pragma unroll 2
  for (int t = 0; t < kTiles; ++t) {
    if constexpr (kTurns) turn.begin();
    issue_tile<kS, kN, kPSmem, kPerTile>(s, o, (t & 1) ? pb : pa, q, k, v, p);
    if constexpr (kTurns) {
      if (t + 1 < kTiles || !turn.last) turn.end();
    }
    if constexpr (kPerTile) {
      if constexpr (kS > 0 && kN > 0) cuda::wgmma::wait<1>();  // S done, P V may still run (then the softmax)
      cuda::wgmma::fence_operands(s);
      cuda::wgmma::wait<0>();
      if constexpr (kN > 0) cuda::wgmma::fence_operands(o);
    } else {
      cuda::wgmma::wait<1>();
    }
  }
  cuda::wgmma::wait<0>();
  cuda::wgmma::fence_operands(s);
  uint32_t out = 0;
#pragma unroll
  for (int i = 0; i < 64; ++i) out ^= __float_as_uint(s[i]);
  if constexpr (kN > 0) {
    cuda::wgmma::fence_operands(o);
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) out ^= __float_as_uint(o[i]);
  }
  if (out == 0x9E3779B9u) *sink = out;  // keeps the work alive; practically never taken
#else
  (void)warpgroups;
  (void)random_operands;
  (void)sink;
  __trap();
#endif
}

// A row of the table: the probe's fields from its kernel's template arguments.
template <int kS, int kN, bool kPSmem, bool kPerTile, bool kTurns>
ProductProbe probe(const char* name, int warpgroups, bool random_operands = false) {
  return {name, kS, kN, kPSmem, kPerTile, kTurns, warpgroups, random_operands,
          product_probe_kernel<kS, kN, kPSmem, kPerTile, kTurns>};
}

}  // namespace

const std::vector<ProductProbe>& product_probes() {
  static const std::vector<ProductProbe> list = [] {
    std::vector<ProductProbe> l = {
        probe<3, 0, false, false, false>("products S (3 k-steps) streamed, 1 warpgroup", 1),
        probe<3, 0, false, false, false>("products S (3 k-steps) streamed, 3 warpgroups", 3),
        probe<0, 40, false, false, false>("products PV n40 RS streamed, 1 warpgroup", 1),
        probe<0, 40, false, false, false>("products PV n40 RS streamed, 3 warpgroups", 3),
        probe<0, 64, false, false, false>("products PV n64 RS streamed, 3 warpgroups", 3),
        probe<0, 64, true, false, false>("products PV n64 SS streamed, 3 warpgroups", 3),
        probe<0, 80, false, false, false>("products PV n80 RS streamed, 3 warpgroups", 3),
        probe<0, 128, false, false, false>("products PV n128 RS streamed, 3 warpgroups", 3),
        probe<3, 40, false, true, false>("products tile S+PV n40, 1 warpgroup", 1),
        probe<3, 40, false, true, false>("products tile S+PV n40, 2 warpgroups", 2),
        probe<3, 40, false, true, false>("products tile S+PV n40, 3 warpgroups", 3),
        probe<3, 40, false, true, true>("products tile S+PV n40, 3 warpgroups, turns", 3),
        probe<3, 0, false, true, true>("products tile S only, 3 warpgroups, turns", 3),
        probe<0, 40, false, true, true>("products tile PV n40 only, 3 warpgroups, turns", 3),
        probe<3, 64, false, true, true>("products tile S+PV n64, 3 warpgroups, turns", 3),
        probe<3, 64, true, true, true>("products tile S+PV n64 SS, 3 warpgroups, turns", 3),
        probe<3, 0, false, false, false>("products S streamed, 3 warpgroups, random", 3, true),
        probe<0, 40, false, false, false>("products PV n40 RS streamed, 3 warpgroups, random", 3, true),
        probe<3, 40, false, true, true>("products tile S+PV n40, 3 warpgroups, turns, random", 3, true),
    };
    for (const ProductProbe& p : l)  // once per kernel, not per timed launch
      cudaFuncSetAttribute(reinterpret_cast<const void*>(p.kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kSmem));
    return l;
  }();
  return list;
}

bool product_probe_runs() { return device_major() == 9; }

void launch_product_probe(const ProductProbe& probe, int sms, uint32_t* sink, cudaStream_t stream) {
  probe.kernel<<<unsigned(sms), 128 * kWarpgroups, kSmem, stream>>>(probe.warpgroups, probe.random_operands, sink);
}

double product_probe_flops(const ProductProbe& probe, int sms) {
  const double per_tile = 2.0 * 64 * 128 * 16 * probe.s_steps + 2.0 * 64 * probe.pv_n * kBlockK;
  return per_tile * kTiles * probe.warpgroups * sms;
}

int product_probe_tiles() { return kTiles; }

}  // namespace atelier::bench
