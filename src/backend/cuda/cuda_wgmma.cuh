// Hopper warpgroup MMA (wgmma) building blocks, for a flash-attention kernel of our own (issue 3's Hopper path).
// Verified by CudaWgmma.* on the H200 against a double-precision product; used by cuda_attention_wgmma.cu.
//
// Shared-memory operand tiles are bf16 rows of 64 elements (128 bytes) in the 128-byte swizzle: the 16-byte
// chunk j of row r is stored at chunk j ^ (r % 8) of that row, and a tile (an "atom column") is rows x 128 B,
// 1024-byte aligned. Wider operands are atom columns one after another.
//   K-major operand (A [M][K], or B as [N][K]: Q and K in S = Q K^T): atom column kb holds elements
//     kb*64 .. kb*64+63 of each row; k-step ks (16 elements) starts at column ks/4, byte (ks % 4) * 32 of the
//     row; SBO (between 8-row groups) = 1024 B, LBO unused.
//   MN-major B (B as [K][N] with N contiguous: V in O = P V): K rows of 64 N-elements (128 B); k-step ks starts
//     at row 16 * ks (2048 B further); SBO = 1024 B (between 8-row groups along K), LBO = the byte stride
//     between atom columns along N; wgmma's imm-trans-b = 1.
// Accumulators (m64nN, f32): warp w of the warpgroup holds rows 16w .. 16w+15; d[4j + e] is row
// 16w + lane/4 + 8 * (e / 2), column 8j + 2 * (lane % 4) + (e % 2) (mma.sync's C layout, repeated along N).
// A from registers (the P V product): per warp and k-step, mma.sync's m16k16 A fragment of rows 16w...
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_ptx.cuh"

namespace atelier::cuda::wgmma {

constexpr uint32_t kSwizzleBytes = 128;  // one row of an atom: 64 bf16
constexpr uint32_t kAtomGroupBytes = 1024;  // 8 rows: the swizzle's period

// Byte offset of element (r, c) (c < 64) of an atom column of 16-bit elements.
__host__ __device__ __forceinline__ uint32_t sw128_offset(uint32_t r, uint32_t c) {
  return r * kSwizzleBytes + ((((c * 2) >> 4) ^ (r & 7)) << 4) + ((c * 2) & 15);
}

// The matrix descriptor of a 128-byte-swizzled operand starting at shared address `addr`.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr >> 4) & 0x3FFF) | uint64_t((lbo >> 4) & 0x3FFF) << 16 | uint64_t((sbo >> 4) & 0x3FFF) << 32 |
         uint64_t(1) << 62;  // layout type 1: 128-byte swizzle
}


#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATELIER_WGMMA 1
#endif

// Shared-memory writes of the generic proxy made visible to wgmma's async proxy (then a barrier).
__device__ __forceinline__ void fence_async_smem() {
#ifdef ATELIER_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fence() {
#ifdef ATELIER_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#ifdef ATELIER_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait() {
#ifdef ATELIER_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving reads or writes of accumulator registers across a wait.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

#define ATELIER_WGMMA_D32                                                                                            \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),       \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),        \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),       \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define ATELIER_WGMMA_REGS32                                                                                         \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29," \
  "%30,%31}"
// The same for m64n128 (d[64]).
#define ATELIER_WGMMA_D64 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define ATELIER_WGMMA_REGS64 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"  \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"  \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"  \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

// The same for m64n160 (d[80]).
#define ATELIER_WGMMA_D80 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
#define ATELIER_WGMMA_REGS80 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"  \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"  \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"  \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"  \
  "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79}"

// d[64 x 64] (+)= A x B, bf16 operands from shared memory (descriptors), f32 accumulators; accumulate: d +=.
template <int TRANS_B>
__device__ __forceinline__ void mma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef ATELIER_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " ATELIER_WGMMA_REGS32 ", %32, %33, p, 1, 1, 0, %35;\n}\n"
      : ATELIER_WGMMA_D32
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(TRANS_B));
#else
  __trap();
#endif
}

// The same with A from registers (a: this warp's m16k16 fragment, mma.sync's layout).
template <int TRANS_B>
__device__ __forceinline__ void mma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
#ifdef ATELIER_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " ATELIER_WGMMA_REGS32 ", {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
      : ATELIER_WGMMA_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)), "n"(TRANS_B));
#else
  __trap();
#endif
}

// m64n128k16: d[64] per thread (accumulator layout as above, j = 0 .. 15).
template <int TRANS_B>
__device__ __forceinline__ void mma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef ATELIER_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ATELIER_WGMMA_REGS64 ", %64, %65, p, 1, 1, 0, %67;\n}\n"
      : ATELIER_WGMMA_D64
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(TRANS_B));
#else
  __trap();
#endif
}

// m64n160k16: d[80] per thread (accumulator layout as above, j = 0 .. 19): a 128 x 160 tile in two m64 halves covers
// SD's 320-, 640- and 1280-wide outputs in whole tiles (128-wide tiles leave half of the third 320 tile idle).
template <int TRANS_B>
__device__ __forceinline__ void mma_m64n160k16_ss(float (&d)[80], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
#ifdef ATELIER_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %82, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16 " ATELIER_WGMMA_REGS80 ", %80, %81, p, 1, 1, 0, %83;\n}\n"
      : ATELIER_WGMMA_D80
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(TRANS_B));
#else
  __trap();
#endif
}

template <int TRANS_B>
__device__ __forceinline__ void mma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
#ifdef ATELIER_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " ATELIER_WGMMA_REGS64 ", {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
      : ATELIER_WGMMA_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)), "n"(TRANS_B));
#else
  __trap();
#endif
}

// Narrower products for head dims that are not a multiple of 64 (SD's 40 and 80): P V with N = the head dim.

// m64n40k16 with A from registers: d[20] per thread (accumulator layout as above, j = 0 .. 4).
template <int TRANS_B>
__device__ __forceinline__ void mma_m64n40k16_rs(float (&d)[20], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
#ifdef ATELIER_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %25, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19}, {%20,%21,%22,%23}, %24, p, 1, 1, %26;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)), "n"(TRANS_B));
#else
  __trap();
#endif
}

// m64n80k16 with A from registers: d[40] per thread (accumulator layout as above, j = 0 .. 9).
template <int TRANS_B>
__device__ __forceinline__ void mma_m64n80k16_rs(float (&d)[40], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
#ifdef ATELIER_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}, {%40,%41,%42,%43}, %44, p, 1, 1, %46;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)), "n"(TRANS_B));
#else
  __trap();
#endif
}

// The products above by their N, for kernels templated on it: m64nNk16 from shared memory (N = 64, 128) and with A
// from registers (N = 40, 64, 80, 128); d: N / 2 accumulators per thread.
template <int N, int TRANS_B>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 64 || N == 128);
  if constexpr (N == 64) mma_m64n64k16_ss<TRANS_B>(d, desc_a, desc_b, accumulate);
  else mma_m64n128k16_ss<TRANS_B>(d, desc_a, desc_b, accumulate);
}
template <int N, int TRANS_B>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  static_assert(N == 40 || N == 64 || N == 80 || N == 128);
  if constexpr (N == 40) mma_m64n40k16_rs<TRANS_B>(d, a, desc_b, accumulate);
  else if constexpr (N == 64) mma_m64n64k16_rs<TRANS_B>(d, a, desc_b, accumulate);
  else if constexpr (N == 80) mma_m64n80k16_rs<TRANS_B>(d, a, desc_b, accumulate);
  else mma_m64n128k16_rs<TRANS_B>(d, a, desc_b, accumulate);
}

// fence_operand over a whole accumulator array (after a wait, before its registers are read or written).
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_operand(r[i]);
}

#undef ATELIER_WGMMA_D32
#undef ATELIER_WGMMA_REGS32
#undef ATELIER_WGMMA_D64
#undef ATELIER_WGMMA_REGS64

}  // namespace atelier::cuda::wgmma
