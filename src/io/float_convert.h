// The weight loader's float conversions of whole tensors: a checkpoint's f16 or f32 values into the compute dtype
// (f32 on the CPU, bf16 on CUDA). Each gives the bits of the scalar conversions of core/dtype.h (f16 -> f32 exactly;
// to bf16 rounded to nearest even, NaN kept quiet), on every core (OpenMP) and, where the CPU has AVX2 and F16C, eight
// values an instruction: the generic per-element path (through double, a switch per value) loaded SD 1.5's fp16 UNet
// into bf16 at 0.43 GB/s on the development machine.
//
// `src` may be unaligned (a tensor inside a memory-mapped file); `dst` too.
#pragma once
#include <cstdint>

namespace atelier {

void convert_f16_to_f32(const void* src, float* dst, int64_t n);
void convert_f16_to_bf16(const void* src, uint16_t* dst, int64_t n);
void convert_f32_to_bf16(const void* src, uint16_t* dst, int64_t n);
void convert_bf16_to_f32(const void* src, float* dst, int64_t n);

// Whether the vector forms run on this CPU (AVX2 and F16C); the scalar forms otherwise.
bool float_convert_vectorized();

}  // namespace atelier
