// The sm_80 tensor-core building blocks the mma.sync attention kernels share (cuda_attention.cu: the tiled flash
// kernel; cuda_attention_short.cu: attention over short key sequences): the m16n8k16 product with f32 accumulators
// and the ldmatrix loads of its fragments; the cp.async copy of a tile into shared memory.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16/.f16; g = lane / 4, t = lane % 4):
//   A 16x16: a0 = (row g, cols 2t, 2t+1), a1 = (row g+8, same), a2 = (row g, cols 2t+8, 2t+9), a3 = (row g+8, same)
//   B 16x8:  b0 = (rows 2t, 2t+1, col g), b1 = (rows 2t+8, 2t+9, col g)
//   C 16x8:  c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, same)
// ldmatrix (non-transposed) hands thread i the elements (row i/4, cols 2(i%4), 2(i%4)+1) of each 8x8 matrix:
// the A layout for row-major Q, and the B layout for K^T when the matrices' rows are K's rows (keys).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_ptx.cuh"

namespace atelier::cuda {

// Row pitch (elements) of the shared tiles these kernels copy with copy_tile_async and read with ldmatrix: DPAD
// columns plus 4 words of padding, so that the eight rows one ldmatrix reads fall in different banks.
template <int DPAD> constexpr int kPitch = DPAD + 8;

// c += a b for one 16x16 A fragment and one 16x8 B fragment (b0, b1), f32 accumulators.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}

// Starts the copy of ROWS rows x DPAD columns of g (row stride `stride` elements) into a shared tile of row pitch
// PITCH elements, by the threads first, first + step, ...; rows >= rows_valid and columns >= d are zero-filled (the
// padded head dims' columns and ragged tiles' rows contribute zeros to the products).
template <typename T, int DPAD, int PITCH, int ROWS>
__device__ __forceinline__ void copy_tile_async(T* smem, const T* g, int64_t stride, int rows_valid, int d, int first, int step) {
  constexpr int kChunks = DPAD / 8;  // 16-byte chunks per row
  for (int i = first; i < ROWS * kChunks; i += step) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool valid = r < rows_valid && c < d;
    cp_async16(smem + r * PITCH + c, valid ? g + int64_t(r) * stride + c : g, valid);
  }
}

// The A fragment of the 16x16 block at (row, col) of a row-major smem tile, through one ldmatrix.x4:
// lanes 0-15 address rows row..row+15 at col, lanes 16-31 the same rows at col + 8.
template <int PITCH, typename T>
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], const T* tile, int row, int col, int lane) {
  ldmatrix_x4(a, tile + (row + (lane & 15)) * PITCH + col + (lane >> 4) * 8);
}

}  // namespace atelier::cuda
