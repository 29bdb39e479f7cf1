// Split-K's sum of a tile's parts in the own GEMM kernel (cuda_gemm_wgmma.cu): the tile's last part (the owner) adds
// the others' slots. Not a standalone header: included by cuda_gemm_wgmma.cu inside its namespace, after Params, Unit
// and the split-K constants; kept apart so that the kernel file stays readable. Measured and removed (session 38):
// a spread sum where every part adds a 1/split slice of all parts' slots (commit b06fb48): faster kernels alone, the
// replayed SD steps slower in 6 of 7 comparisons, with the choices timed warm or cold (docs/performance.md).
#pragma once

// Split-K's slot of unit (part, tile): a consumer's 2 x BN / 2 accumulators as BN / 4 float4 per thread, float4 q
// of thread t at q * 128 + t (each store and load instruction of a warp covers 512 consecutive bytes).
template <int BN>
__device__ __forceinline__ float4* split_slot(const Params& p, int part, int tile) {
  return reinterpret_cast<float4*>(p.partial) + (int64_t(part) * p.tiles + tile) * (kBM * BN / 4);
}
// One thread: waits until the count at `flag` reaches `target`; its acquire makes the counted parts' slots visible.
__device__ __forceinline__ void wait_count(const int* flag, int target) {
  int done = 0;
  do asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(done) : "l"(flag) : "memory");
  while (done < target);
}
// A contributing part: its sums to its slot (past L1: another SM reads them), then one count on the tile's flag once
// all 128 threads' stores are ordered before it (the barrier, then a device-scope fence).
template <int BN>
__device__ __forceinline__ void split_contribute(const float (&acc)[2][BN / 2], const Params& p, const Unit& u, int consumer,
                                                 int t) {
  float4* slot = split_slot<BN>(p, u.part, u.tile);
#pragma unroll
  for (int q = 0; q < BN / 4; ++q) {
    const float* a = &acc[4 * q / (BN / 2)][4 * q % (BN / 2)];
    __stcg(slot + q * 128 + t, make_float4(a[0], a[1], a[2], a[3]));
  }
  tma::bar_sync(kConsumerBarrier + consumer, 128);
  if (t == 0) {
    __threadfence();
    atomicAdd(p.flags + u.tile, 1);
  }
}
// The owner (last part): waits until the other split - 1 parts have counted, resets the flag for the next launch,
// and adds their slots to acc in part order.
template <int BN>
__device__ __forceinline__ void split_gather(float (&acc)[2][BN / 2], const Params& p, const Unit& u, int consumer, int t) {
  if (t == 0) {
    wait_count(p.flags + u.tile, p.split - 1);
    atomicExch(p.flags + u.tile, 0);
  }
  tma::bar_sync(kConsumerBarrier + consumer, 128);
  for (int part = 0; part < p.split - 1; ++part) {
    const float4* slot = split_slot<BN>(p, part, u.tile);
#pragma unroll
    for (int q = 0; q < BN / 4; ++q) {
      const float4 v = __ldcg(slot + q * 128 + t);
      float* a = &acc[4 * q / (BN / 2)][4 * q % (BN / 2)];
      a[0] += v.x, a[1] += v.y, a[2] += v.z, a[3] += v.w;
    }
  }
}
