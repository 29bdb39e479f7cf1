#include "core/dtype.h"

#include <cmath>

namespace atelier {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
    case DType::F64: return "f64";
    case DType::BOOL: return "bool";
    case DType::I8: return "i8";
    case DType::I16: return "i16";
    case DType::F8E4M3: return "f8e4m3";
  }
  return "?";
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // Subnormal: normalise the mantissa.
    exp = 1;
    while ((mant & 0x400u) == 0) { mant <<= 1; --exp; }
    mant &= 0x3ffu;
    return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t float_to_f16(float f) {
  const uint32_t b = float_to_bits(f);
  const uint16_t sign = uint16_t((b >> 16) & 0x8000u);
  const uint32_t abs = b & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;           // overflow (>= 65520 rounds to inf)
  if (abs < 0x38800000u) {                                  // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;                     // < 2^-25 rounds to zero
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;                         // 14 + (112 - e) + 1 - 1
    uint32_t half_m = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return sign | uint16_t(half_m);
  }
  uint32_t v = abs - 0x38000000u;                           // rebias exponent 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);                           // round to nearest even
  return sign | uint16_t(v >> 13);
}

float f8e4m3_to_float(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t mant = v & 0x7u;
  if (exp == 0xf && mant == 0x7) return bits_to_float(sign | 0x7fc00000u);
  if (exp == 0) {  // subnormal: mant * 2^-9
    const float mag = float(mant) * (1.0f / 512.0f);
    return sign ? -mag : mag;
  }
  return bits_to_float(sign | ((exp + 120) << 23) | (mant << 20));
}

uint8_t float_to_f8e4m3(float f) {
  constexpr uint8_t kNan = 0x7f, kMaxFinite = 0x7e;  // 0.1111.110 = 1.75 * 2^8 = 448
  constexpr float kMinNormal = 1.0f / 64.0f;          // 2^-6
  const uint32_t b = float_to_bits(f);
  const uint8_t sign = uint8_t((b >> 24) & 0x80u);
  const uint32_t mag_bits = b & 0x7fffffffu;
  if (mag_bits > 0x7f800000u) return sign | kNan;
  const float mag = bits_to_float(mag_bits);
  if (mag >= kF8E4M3Max) return sign | kMaxFinite;
  if (mag < kMinNormal) {
    // Subnormals are multiples of 2^-9: mag * 512 is exact, and rounding it to an integer (nearbyint: ties to
    // even in the default rounding mode) is the e4m3 rounding; 8 becomes 0.0001.000, the smallest normal.
    return sign | uint8_t(std::nearbyint(mag * 512.0f));
  }
  // Normal: keep 3 of the 23 mantissa bits, ties to even; a carry into the exponent is correct rounding (and
  // stays <= 448: nothing below 448 rounds up to the next step, 480).
  uint32_t r = mag_bits + 0x7ffffu + ((mag_bits >> 20) & 1u);
  r &= ~0xfffffu;
  const uint32_t exp = (r >> 23) - 127 + 7, mant = (r >> 20) & 7u;
  return sign | uint8_t((exp << 3) | mant);
}

}  // namespace atelier
