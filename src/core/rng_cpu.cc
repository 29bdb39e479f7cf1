// torch's CPU generator (at::CPUGeneratorImpl) and its float32 randn / rand kernels, reproduced exactly.
//
// Stream: one std::mt19937 seeded with seed & 0xffffffff. random() is one output; random64() is two, the
// first in the high half. Uniforms: float = (random() & (2^24-1)) * 2^-24, double = (random64() & (2^53-1)) *
// 2^-53 (at::uniform_real_distribution).
//
// randn, numel >= 16 (normal_fill_AVX2, which torch uses on every x86-64 CPU with AVX2, AVX-512 ones too):
//   1. every element gets a float uniform, in order;
//   2. each full block of 16 becomes 16 normals: with u1 = 1 - data[j], u2 = data[j+8] (j < 8),
//      r = sqrt(-2 log u1), theta = 2pi * u2, data[j] = r cos theta, data[j+8] = r sin theta;
//   3. if numel % 16 != 0, the LAST 16 elements are redrawn from 16 fresh uniforms and transformed again
//      (so the draw consumes numel + 16 outputs and overlaps the previous block).
//   log/sin/cos are Pommier's cephes-based avx_mathfun routines; torch's build lets GCC contract their
//   a*b+c steps into FMAs, and we reproduce that contraction operation for operation (see below).
// randn, numel < 16: at::normal_distribution<double> per element: u1, u2 double uniforms,
//   r = sqrt(-2 log1p(-u2)), theta = 2pi u1, value r cos theta, and r sin theta is cached in the generator
//   and returned by the next scalar-path draw (the vectorised path neither reads nor clears the cache).
// rand: one float uniform per element.
#include <cmath>
#include <cstring>

#include "core/rng.h"

// The emulated kernels must round exactly where torch's do: never let the compiler contract a*b+c on
// its own (it would with -march=native); every fused step below is an explicit std::fma.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace atelier {
namespace {

constexpr int kBlock = 16;            // normal_fill_AVX2 works on blocks of 16 floats
constexpr int kHalfBlock = kBlock / 2;
constexpr int kFloatUniformBits = 24;   // std::numeric_limits<float>::digits
constexpr int kDoubleUniformBits = 53;  // std::numeric_limits<double>::digits
constexpr double kPi = 3.14159265358979323846;

uint32_t bits_of(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }
float float_of(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }

// --- avx_mathfun's log256_ps, one lane, as GCC compiles it for torch (a*b+c contracted) ---------------
// Cephes logf: split x = m * 2^e with m in [sqrt(1/2), sqrt(2)), then log(1+f) by a degree-9 polynomial.
[[gnu::always_inline]] inline float cephes_logf(float x) {
  constexpr float kSqrtHalf = 0.707106781186547524f;
  constexpr float kP[9] = {7.0376836292E-2f,  -1.1514610310E-1f, 1.1676998740E-1f,
                           -1.2420140846E-1f, 1.4249322787E-1f,  -1.6668057665E-1f,
                           2.0000714765E-1f,  -2.4999993993E-1f, 3.3333331174E-1f};
  constexpr float kQ1 = -2.12194440e-4f;
  constexpr float kQ2 = 0.693359375f;
  // Inputs here are 1 - u with u a 24-bit uniform: normal, positive, at most 1.
  const uint32_t b = bits_of(x);
  float e = float(int32_t(b >> 23) - 0x7f) + 1.0f;
  float m = float_of((b & ~0x7f800000u) | bits_of(0.5f));  // mantissa in [0.5, 1)
  const bool small = m < kSqrtHalf;
  const float tmp = small ? m : 0.0f;
  m = m - 1.0f;
  e = e - (small ? 1.0f : 0.0f);
  m = m + tmp;
  const float z = m * m;
  float y = kP[0];
  for (int i = 1; i < 9; ++i) y = std::fma(y, m, kP[i]);
  y = y * m;
  y = std::fma(y, z, e * kQ1);
  y = y - z * 0.5f;  // z * 0.5 is exact: contracted or not, one rounding
  const float sum = m + y;
  return std::fma(e, kQ2, sum);
}

// --- avx_mathfun's sincos256_ps, one lane, as GCC compiles it for torch --------------------------------
// Cephes sinf/cosf: j = nearest even multiple of pi/4, x - j*pi/4 in three parts, then the sin and cos
// polynomials, selected and signed by j's octant.
[[gnu::always_inline]] inline void cephes_sincosf(float x, float* s, float* c) {
  constexpr float kFourOverPi = 1.27323954473516f;
  constexpr float kDP1 = -0.78515625f, kDP2 = -2.4187564849853515625e-4f, kDP3 = -3.77489497744594108e-8f;
  constexpr float kCos0 = 2.443315711809948E-005f, kCos1 = -1.388731625493765E-003f,
                  kCos2 = 4.166664568298827E-002f;
  constexpr float kSin0 = -1.9515295891E-4f, kSin1 = 8.3321608736E-3f, kSin2 = -1.6666654611E-1f;
  uint32_t sign_sin = bits_of(x) & 0x80000000u;
  x = std::fabs(x);
  int32_t j = int32_t(x * kFourOverPi);  // truncation, as cvttps
  j = (j + 1) & ~1;
  const float y = float(j);
  const uint32_t swap_sin = uint32_t(j & 4) << 29;
  const bool use_sin_poly_for_cos = (j & 2) == 0;  // avx_mathfun's poly_mask
  x = std::fma(y, kDP1, x);
  x = std::fma(y, kDP2, x);
  x = std::fma(y, kDP3, x);
  const uint32_t sign_cos = uint32_t(~(j - 2) & 4) << 29;
  sign_sin ^= swap_sin;
  const float z = x * x;
  float yc = std::fma(kCos0, z, kCos1);
  yc = std::fma(yc, z, kCos2);
  yc = yc * z;
  yc = std::fma(yc, z, -(z * 0.5f));
  yc = yc + 1.0f;
  float ys = std::fma(kSin0, z, kSin1);
  ys = std::fma(ys, z, kSin2);
  ys = ys * z;
  ys = std::fma(ys, x, x);
  const float sin_abs = use_sin_poly_for_cos ? ys : yc;
  const float cos_abs = use_sin_poly_for_cos ? yc : ys;
  *s = float_of(bits_of(sin_abs) ^ sign_sin);
  *c = float_of(bits_of(cos_abs) ^ sign_cos);
}

// normal_fill_16_AVX2 on data[0..16): uniforms in, normals out (mean 0, std 1). Compiled twice on x86-64, for
// CPUs with FMA (std::fma becomes one instruction) and without (a call to libm's fmaf per fused step, which took
// ~45 ns per normal: 6 ms for the 134k of an SD 1.5 batch-1 conditioning and latents); the loader picks one.
// Both round exactly as torch's kernel does (an FMA is correctly rounded however it is computed).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATELIER_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define ATELIER_FMA_CLONES
#endif
ATELIER_FMA_CLONES void normal_fill_16(float* data) {
  const float two_pi = float(2.0 * kPi);
  for (int j = 0; j < kHalfBlock; ++j) {
    const float u1 = 1.0f - data[j];  // [0, 1) -> (0, 1] for the log
    const float u2 = data[j + kHalfBlock];
    const float radius = std::sqrt(-2.0f * cephes_logf(u1));
    float s, c;
    cephes_sincosf(two_pi * u2, &s, &c);
    // torch then applies fma(n, std, mean) = fma(n, 1, 0): n itself, except that -0 becomes +0.
    data[j] = radius * c + 0.0f;
    data[j + kHalfBlock] = radius * s + 0.0f;
  }
}

}  // namespace

TorchCpuGenerator::TorchCpuGenerator(uint64_t seed) { manual_seed(seed); }

void TorchCpuGenerator::manual_seed(uint64_t seed) {
  seed_ = seed;
  engine_.seed(uint32_t(seed & 0xffffffffu));  // at::mt19937 keeps the low 32 bits
  next_double_normal_.reset();
}

uint64_t TorchCpuGenerator::next_u64() {
  const uint64_t hi = next_u32();
  const uint64_t lo = next_u32();
  return (hi << 32) | lo;
}

float TorchCpuGenerator::next_float_uniform() {
  constexpr uint32_t kMask = (1u << kFloatUniformBits) - 1;
  return float(next_u32() & kMask) * std::ldexp(1.0f, -kFloatUniformBits);
}

double TorchCpuGenerator::next_double_uniform() {
  constexpr uint64_t kMask = (uint64_t(1) << kDoubleUniformBits) - 1;
  return double(next_u64() & kMask) * std::ldexp(1.0, -kDoubleUniformBits);
}

double TorchCpuGenerator::next_double_normal() {
  if (next_double_normal_) {
    const double v = *next_double_normal_;
    next_double_normal_.reset();
    return v;
  }
  const double u1 = next_double_uniform();
  const double u2 = next_double_uniform();
  const double r = std::sqrt(-2.0 * std::log1p(-u2));
  const double theta = 2.0 * kPi * u1;
  next_double_normal_ = r * std::sin(theta);
  return r * std::cos(theta);
}

void TorchCpuGenerator::fill_normal_vectorised(float* data, int64_t n) {
  for (int64_t i = 0; i < n; ++i) data[i] = next_float_uniform();
  for (int64_t i = 0; i + kBlock <= n; i += kBlock) normal_fill_16(data + i);
  if (n % kBlock != 0) {
    float* tail = data + n - kBlock;
    for (int i = 0; i < kBlock; ++i) tail[i] = next_float_uniform();
    normal_fill_16(tail);
  }
}

std::vector<float> TorchCpuGenerator::randn(int64_t n) {
  ATELIER_CHECK(n >= 0, "randn: negative count");
  std::vector<float> out(static_cast<size_t>(n));
  if (n >= kBlock) {
    fill_normal_vectorised(out.data(), n);
  } else {
    for (auto& v : out) v = float(next_double_normal());
  }
  return out;
}

std::vector<float> TorchCpuGenerator::rand(int64_t n) {
  ATELIER_CHECK(n >= 0, "rand: negative count");
  std::vector<float> out(static_cast<size_t>(n));
  for (auto& v : out) v = next_float_uniform();
  return out;
}

}  // namespace atelier
