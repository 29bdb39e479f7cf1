#include "core/dtype.h"

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

}  // namespace atelier
