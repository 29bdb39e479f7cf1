// Split-K's two ways to sum a tile's parts in the own GEMM kernel (cuda_gemm_wgmma.cu): the owner's (the tile's last
// part adds the others' slots) and the spread sum (every part adds a slice). Not a standalone header: included by
// cuda_gemm_wgmma.cu inside its namespace, after Params, Unit, the split-K constants and the epilogue helpers
// (load_pair, staged_pair) it uses; kept apart so that the kernel file stays readable.
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

// Spread split-K (the SP instances, ATELIER_SPLIT_SPREAD=1: one unit per block, so every part of a tile runs at
// once): every part writes its slot, waits until all the tile's parts have, then sums slice `part` of the tile's
// slots (float4 f of the slot layout for f in [part F / split, (part + 1) F / split), F = kBM BN / 4) in part order
// and stores it with bias and residual. The owner's form reads all split - 1 slots on one SM (16 parts of SD's 8x8
// level at CFG: 1.2 MB through one SM); spread, each part reads 1 / split of them: those convolutions took 19-20 us
// against 34-44 (ncu, eager), yet the replayed SD steps were 0.02-0.08 ms slower with it (docs/cuda.md, session 37),
// so it is off by default. The slices come into the ring's shared memory (free once the unit's products are done:
// 80 KB at most against the ring's 144 KB) as one bulk copy per part: loaded by the threads, 4 in flight each, the
// 40 float4 a thread sums took 10 round trips (split 4 of SD's 16x16 level: 5 us slower than the owner's form). The staged forms' residual tile is in `staged` (every part
// loads it by TMA before its mainloop, completing phase 0 of `bar`; the copies complete phase 1); kConvDirect's is
// read from global memory. The last part to leave zeroes both counters for the next launch (every part has passed
// the wait on the first by then).
constexpr int kSpreadBatch = 4;  // float4 sums per thread whose loads are issued together
// The output row and column of float4 f of a tile's slot: thread tt's accumulators 4q.. of half h (rows r and r + 8 of
// the half, columns c and c + 1 of the tile: wgmma's layout), as {h, j, r, tt % 4}.
template <int BN>
__device__ __forceinline__ int4 spread_coords(int f) {
  const int q = f / 128, tt = f % 128;
  return make_int4(4 * q / (BN / 2), 4 * q % (BN / 2) / 4, tt / 32 * 16 + tt % 32 / 4, tt % 4);
}
template <Epi E, int BN, bool R>
__device__ __forceinline__ void split_spread(const float (&acc)[2][BN / 2], const Params& p, const Unit& u, uint8_t* ring,
                                             const uint8_t* staged, uint64_t* bar, int consumer, int t) {
  constexpr bool kStagedResidual = R && staged_linear(E);
  if constexpr (kStagedResidual) tma::wait(bar, 0);  // before the copies' phase can complete
  split_contribute<BN>(acc, p, u, consumer, t);  // its slot, then a count on the tile's `arrived` (flags[tile])
  constexpr int kF = kBM * BN / 4;
  const int f0 = u.part * kF / p.split, len = (u.part + 1) * kF / p.split - f0;
  const float4* parts = reinterpret_cast<const float4*>(ring);  // [split][len]
  int* arrived = p.flags + u.tile;
  int* left = p.flags + kSpreadLeft + u.tile;
  if (t == 0) {
    wait_count(arrived, p.split);
    tma::fence_proxy_async_global();  // the other parts' slots, acquired above, before the copies read them
    tma::arrive_expect_tx(bar, uint32_t(p.split * len) * sizeof(float4));
    for (int i = 0; i < p.split; ++i)
      tma::load_bulk(ring + i * len * sizeof(float4), split_slot<BN>(p, i, u.tile) + f0, uint32_t(len) * sizeof(float4), bar);
  }
  tma::wait(bar, kStagedResidual ? 1 : 0);
  // kSpreadBatch float4 at a time, every load of the batch (parts, bias, residual) before its first store: one at a
  // time, each float4's chain of loads and stores waited out its latencies in turn (20 per thread at split 2: the
  // spread form was 5 us slower than the owner's there).
  for (int fb = t; fb < len; fb += 128 * kSpreadBatch) {
    float y[kSpreadBatch][2][2];
    int4 c[kSpreadBatch];
#pragma unroll
    for (int g = 0; g < kSpreadBatch; ++g) {
      const int f = min(fb + 128 * g, len - 1);  // past len: a copy of the last, not stored
      c[g] = spread_coords<BN>(f0 + f);
      float4 s = parts[f];
      for (int i = 1; i < p.split; ++i) {
        const float4 v = parts[i * len + f];
        s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
      }
      const int col = min(u.c0 + 8 * c[g].y + 2 * c[g].w, p.n - 2);  // past n: not stored
      const float2 b = p.bias ? load_pair(p.bias + col) : make_float2(0.0f, 0.0f);
      y[g][0][0] = s.x + b.x, y[g][0][1] = s.y + b.y, y[g][1][0] = s.z + b.x, y[g][1][1] = s.w + b.y;
      if constexpr (kStagedResidual) {
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
          uint32_t v;
          const uint32_t at = staged_pair<BN>(smem_u32(staged), c[g].x, c[g].y, c[g].z + 8 * ri, c[g].w);
          asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(at) : "memory");
          const float2 rv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
          y[g][ri][0] += rv.x, y[g][ri][1] += rv.y;
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kSpreadBatch; ++g) {
      const int row = u.m0 + 64 * c[g].x + c[g].z, col = u.c0 + 8 * c[g].y + 2 * c[g].w;
      if (fb + 128 * g >= len || col >= p.n) continue;  // n is even: col + 1 < n too
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        if (row + 8 * ri >= p.m) continue;
        __nv_bfloat16* out = p.out + int64_t(row + 8 * ri) * p.ldo + col;
        if constexpr (R && !kStagedResidual) {  // kConvDirect: from global memory, just before its store
          const float2 rv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p.residual + (out - p.out)));
          y[g][ri][0] += rv.x, y[g][ri][1] += rv.y;
        }
        *reinterpret_cast<uint32_t*>(out) = pack2<__nv_bfloat16>(y[g][ri][0], y[g][ri][1]);
      }
    }
  }
  tma::bar_sync(kConsumerBarrier + consumer, 128);
  if (t == 0 && atomicAdd(left, 1) == p.split - 1) {
    atomicExch(arrived, 0);
    atomicExch(left, 0);
  }
}
