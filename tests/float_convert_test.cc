// The loader's whole-tensor float conversions (io/float_convert.h) against core/dtype.h's scalar conversions: every
// f16 value, f32 values of every exponent with rounding ties and NaNs, at unaligned addresses and lengths that leave
// tails after the vector lanes and cross the OpenMP blocks.
#include "io/float_convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace atelier {
namespace {

// Bytes of `values` at an odd offset inside a buffer (a tensor inside a mapped file need not be aligned).
template <typename T>
std::vector<uint8_t> unaligned(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T) + 1);
  std::memcpy(bytes.data() + 1, values.data(), values.size() * sizeof(T));
  return bytes;
}

std::vector<uint16_t> every_f16() {
  std::vector<uint16_t> v(1 << 16);
  for (size_t i = 0; i < v.size(); ++i) v[i] = uint16_t(i);
  return v;
}

// F16C makes a signalling f16 NaN quiet where the scalar conversion keeps its payload as it is: both NaNs of the sign.
bool same_f32(float got, float want) {
  if (std::isnan(want)) return std::isnan(got) && std::signbit(got) == std::signbit(want);
  return float_to_bits(got) == float_to_bits(want);
}

TEST(FloatConvert, EveryF16ValueToF32AndBf16) {
  std::printf("[ convert ] vector forms %s on this CPU\n", float_convert_vectorized() ? "used" : "not available");
  const std::vector<uint16_t> h = every_f16();
  const std::vector<uint8_t> src = unaligned(h);
  std::vector<float> f(h.size());
  std::vector<uint16_t> b(h.size());
  convert_f16_to_f32(src.data() + 1, f.data(), int64_t(h.size()));
  convert_f16_to_bf16(src.data() + 1, b.data(), int64_t(h.size()));
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_TRUE(same_f32(f[i], f16_to_float(h[i]))) << "f16 0x" << std::hex << h[i];
    ASSERT_EQ(b[i], float_to_bf16(f16_to_float(h[i]))) << "f16 0x" << std::hex << h[i];
  }
}

TEST(FloatConvert, F32ToBf16RoundsAsTheScalarFormAndBf16ToF32IsExact) {
  std::vector<uint32_t> bits;
  for (uint32_t exp = 0; exp < 256; ++exp)  // every exponent, with mantissas at and around the rounding ties
    for (uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0x18000u, 0xffffu, 0x7fffffu, 0x400000u, 0x1u})
      for (uint32_t sign : {0u, 0x80000000u}) bits.push_back(sign | (exp << 23) | (low & 0x7fffffu));
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) bits.push_back(rng());  // and the rest at random, past several blocks
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * 4);
  for (int64_t n : {int64_t(values.size()), int64_t(7), int64_t(8), int64_t(9), int64_t(65537)}) {
    const std::vector<float> part(values.begin(), values.begin() + n);
    const std::vector<uint8_t> src = unaligned(part);
    std::vector<uint16_t> b(size_t(n) + 1, 0xdead);
    convert_f32_to_bf16(src.data() + 1, b.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b[size_t(i)], float_to_bf16(part[size_t(i)])) << "f32 0x" << std::hex << bits[size_t(i)];
    EXPECT_EQ(b[size_t(n)], 0xdead) << "written past the end";
    const std::vector<uint8_t> bsrc = unaligned(std::vector<uint16_t>(b.begin(), b.begin() + n));
    std::vector<float> back(static_cast<size_t>(n));
    convert_bf16_to_f32(bsrc.data() + 1, back.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(float_to_bits(back[size_t(i)]), uint32_t(b[size_t(i)]) << 16);
  }
}

}  // namespace
}  // namespace atelier
