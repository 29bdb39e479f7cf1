// Branch-free f32 approximations of exp, erf and tanh that the compiler vectorises inside loops (libm's
// scalar expf/erff/tanhf calls would not vectorise). Accuracy: exp within ~2 ulp (results under ~1e-38
// flush to 0), erf within 2e-7
// absolute, tanh within ~2e-7 relative + 1e-7 absolute; torch's own vectorised CPU kernels use
// approximations of the same quality, so results stay within f32 rounding of torch's.
// Meant to be inlined into the ISA-specific clones of the span loops (see cpu_elementwise.cc).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace atelier::cpu::vm {

// e^x. Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r, then 2^n
// through the exponent bits. Arguments are clamped to [-88, 88.376]: at -88, n = -127 gives a zero exponent
// field, so results below ~1e-38 (and exp(-inf)) come out as exactly 0 with no select; the top stays finite.
inline float exp(float x) {
  constexpr float kMaxArg = 88.3762626647949f;   // e^kMaxArg is just below FLT_MAX (n = 127)
  constexpr float kMinArg = -88.0f;              // n = -127: 2^n encodes as 0.0f
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;          // ln 2 split so that n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;    // 1.5 * 2^23: adding it rounds to an integer (ties to even)
  float xc = x < kMinArg ? kMinArg : x;          // plain min/max vectorise (fmin/fmax often do not)
  xc = xc > kMaxArg ? kMaxArg : xc;
  const float n = (xc * kLog2e + kRoundMagic) - kRoundMagic;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// erf(x): Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7 (the form torch's vectorised erf uses).
inline float erf(float x) {
  constexpr float kP = 0.3275911f;
  constexpr float kA1 = 0.254829592f, kA2 = -0.284496736f, kA3 = 1.421413741f, kA4 = -1.453152027f, kA5 = 1.061405429f;
  const float ax = std::fabs(x);
  const float t = 1.0f / (1.0f + kP * ax);
  const float poly = ((((kA5 * t + kA4) * t + kA3) * t + kA2) * t + kA1) * t;
  const float y = 1.0f - poly * vm::exp(-ax * ax);
  return std::copysign(y, x);
}

// tanh(x): odd polynomial for |x| < 0.625 (no cancellation near 0), 1 - 2 / (e^(2|x|) + 1) above.
inline float tanh(float x) {
  const float ax = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float big = std::copysign(1.0f - 2.0f / (vm::exp(2.0f * ax) + 1.0f), x);
  return ax < 0.625f ? small : big;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + vm::exp(-x)); }

}  // namespace atelier::cpu::vm
