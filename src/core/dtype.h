// Element types and the exact float16/bfloat16 <-> float32 conversions (round to nearest even), as torch does.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace atelier {

enum class DType : uint8_t { F32, F16, BF16, I32, I64, U8, F64, BOOL, I8, I16, F8E4M3 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::I64: case DType::F64: return 8;
    case DType::U8: case DType::BOOL: case DType::I8: case DType::F8E4M3: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t);  // "f32", "f16", ...

inline float bits_to_float(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }
inline uint16_t float_to_bf16(float f) {
  uint32_t b = float_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x40);  // quiet NaN
  b += 0x7fffu + ((b >> 16) & 1u);                                         // round to nearest even
  return uint16_t(b >> 16);
}

float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

// float8 e4m3fn (the "FN" variant torch, safetensors and CUDA's __nv_fp8_e4m3 use): bias 7, no infinities,
// NaN = S.1111.111, largest finite 448, subnormals of 2^-9.
constexpr float kF8E4M3Max = 448.0f;
float f8e4m3_to_float(uint8_t v);
// Round to nearest even, saturating finite values to +-448 (CUDA's __NV_SATFINITE); NaN stays NaN.
uint8_t float_to_f8e4m3(float f);

#if defined(__CUDACC__)
#define ATELIER_HOST_DEVICE __host__ __device__
#else
#define ATELIER_HOST_DEVICE
#endif

// The scale s of an FP8 (e4m3) row or tensor whose largest magnitude is amax, stored as e4m3(x / s): the smallest
// power of two with amax / s <= 448 (e4m3's largest finite value), at least 2^-126; 1 for a zero or non-finite
// amax. A power of two, as MXFP8's block scales are: x / s is then exact (x times 2^-e), so a kernel quantizes
// with one product per value instead of a division, and every backend makes the same bytes. (Until session 17
// s was amax / 448 itself, whose IEEE quotients cost the quantizing kernels a product and two corrections per
// value; e4m3's relative precision is the same either way, the largest value landing in [224, 448].)
ATELIER_HOST_DEVICE inline float f8e4m3_scale(float amax) {
  constexpr uint32_t kMantissa = 0x7fffffu, k448Mantissa = 0x600000u;  // 448 = 1.75 * 2^8
  constexpr int kBias = 127, k448Exp = 8, kMinExp = -126;
  if (!(amax > 0.0f && amax <= 3.40282347e38f)) return 1.0f;
  uint32_t b;
  memcpy(&b, &amax, 4);
  // amax = m 2^k with m in [1, 2): 448 * 2^e >= amax for e = k - 8 where m <= 1.75, else k - 7. (A subnormal
  // amax is below 448 * 2^-126: the clamp.)
  const int biased = int(b >> 23);
  int e = biased == 0 ? kMinExp : biased - kBias - k448Exp + ((b & kMantissa) > k448Mantissa ? 1 : 0);
  if (e < kMinExp) e = kMinExp;
  const uint32_t sb = uint32_t(e + kBias) << 23;
  float out;
  memcpy(&out, &sb, 4);
  return out;
}

}  // namespace atelier
