// The weight loader's float conversions of tensors or pieces of them (a GPU load converts a staging slot at a
// time): a checkpoint's f16 or f32 values into the compute dtype (f32 on the CPU, bf16 on CUDA). Each gives the bits
// of the scalar conversions of core/dtype.h (f16 -> f32 exactly; to bf16 rounded to nearest even, NaN kept quiet),
// on every core (OpenMP) and, where the CPU has AVX2 and F16C, eight values an instruction: the generic per-element
// path (through double, a switch per value) loaded SD 1.5's fp16 UNet into bf16 at 0.43 GB/s on the development
// machine.
//
// `src` may be unaligned (a tensor inside a memory-mapped file); `dst` too.
#pragma once
#include <cstddef>
#include <cstdint>

namespace atelier {

void convert_f16_to_f32(const void* src, float* dst, int64_t n);
void convert_f16_to_bf16(const void* src, uint16_t* dst, int64_t n);
void convert_f32_to_bf16(const void* src, uint16_t* dst, int64_t n);
void convert_bf16_to_f32(const void* src, float* dst, int64_t n);

// dst[0, bytes) = src[0, bytes), on every core for large copies: a tensor in the dtype it is stored in, from the file's
// mapping into a device's staging buffer (SD 1.5's 1.7 GB bf16 UNet from the page cache into a reused 8 MB slot:
// 0.14-0.18 s on one core of the development machine, 0.09-0.11 s on its two; `load_bench --host-side`).
void copy_bytes(const void* src, void* dst, size_t bytes);

// Whether the vector forms run on this CPU (AVX2 and F16C); the scalar forms otherwise.
bool float_convert_vectorized();

}  // namespace atelier
