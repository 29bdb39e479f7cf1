#include "io/float_convert.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/dtype.h"

namespace atelier {
namespace {

constexpr int64_t kBlock = int64_t(1) << 16;               // values per OpenMP task
constexpr int64_t kParallelMinElements = int64_t(1) << 16;  // below this, threads cost more than they save
constexpr int64_t kCopyBlockBytes = int64_t(256) << 10;     // bytes per OpenMP task of copy_bytes
constexpr int64_t kParallelMinCopyBytes = int64_t(1) << 20; // below this one thread copies
constexpr int64_t kLanes = 8;                               // f32 values in an AVX2 register

#define ATELIER_F16C __attribute__((target("avx2,f16c")))

bool vector_forms() {
  static const bool on = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return on;
}

// fn(begin, end) over [0, n) in blocks of `block`, on every core from `parallel_min` on (the conversions: values;
// copy_bytes: bytes).
template <typename Fn>
void in_blocks(int64_t n, const Fn& fn, int64_t block = kBlock, int64_t parallel_min = kParallelMinElements) {
  const int64_t blocks = (n + block - 1) / block;
#pragma omp parallel for if (n >= parallel_min) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) fn(b * block, std::min(n, (b + 1) * block));
}

uint16_t load_u16(const uint8_t* p, int64_t i) {
  uint16_t v;
  std::memcpy(&v, p + i * 2, 2);
  return v;
}
float load_f32(const uint8_t* p, int64_t i) {
  float v;
  std::memcpy(&v, p + i * 4, 4);
  return v;
}

// Eight f32 values rounded to bf16 (float_to_bf16's rule: nearest even, a NaN made quiet), packed into 128 bits.
ATELIER_F16C __m128i bf16_of(__m256 f) {
  const __m256i b = _mm256_castps_si256(f);
  const __m256i abs = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i high = _mm256_srli_epi32(b, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // packus works per 128-bit lane: [r0..r3 r0..r3 | r4..r7 r4..r7]; lanes 0 and 2 of 64 bits hold r0..r7.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

// The vector kernels: [begin, end) in groups of kLanes (end - begin a multiple of it).
ATELIER_F16C void f16_to_f32_vec(const uint8_t* s, float* d, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += kLanes)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * 2))));
}

ATELIER_F16C void f16_to_bf16_vec(const uint8_t* s, uint16_t* d, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += kLanes)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     bf16_of(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * 2)))));
}

ATELIER_F16C void f32_to_bf16_vec(const uint8_t* s, uint16_t* d, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += kLanes)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), bf16_of(_mm256_loadu_ps(reinterpret_cast<const float*>(s + i * 4))));
}

ATELIER_F16C void bf16_to_f32_vec(const uint8_t* s, float* d, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += kLanes) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * 2)));
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
}

// dst[i] = scalar(src, i) over [0, n), through `vec` (the same values, eight at a time) where the CPU has it; the
// values past a block's last whole group of eight by the scalar form.
template <typename Dst, typename Scalar>
void convert(const void* src, Dst* dst, int64_t n, void (*vec)(const uint8_t*, Dst*, int64_t, int64_t), const Scalar& scalar) {
  const auto* s = static_cast<const uint8_t*>(src);
  in_blocks(n, [&](int64_t b, int64_t e) {
    const int64_t vec_end = vector_forms() ? b + (e - b) / kLanes * kLanes : b;
    if (vec_end > b) vec(s, dst, b, vec_end);
    for (int64_t i = vec_end; i < e; ++i) dst[i] = scalar(s, i);
  });
}

}  // namespace

bool float_convert_vectorized() { return vector_forms(); }

void convert_f16_to_f32(const void* src, float* dst, int64_t n) {
  convert(src, dst, n, f16_to_f32_vec, [](const uint8_t* s, int64_t i) { return f16_to_float(load_u16(s, i)); });
}

void convert_f16_to_bf16(const void* src, uint16_t* dst, int64_t n) {
  convert(src, dst, n, f16_to_bf16_vec, [](const uint8_t* s, int64_t i) { return float_to_bf16(f16_to_float(load_u16(s, i))); });
}

void convert_f32_to_bf16(const void* src, uint16_t* dst, int64_t n) {
  convert(src, dst, n, f32_to_bf16_vec, [](const uint8_t* s, int64_t i) { return float_to_bf16(load_f32(s, i)); });
}

void convert_bf16_to_f32(const void* src, float* dst, int64_t n) {
  convert(src, dst, n, bf16_to_f32_vec, [](const uint8_t* s, int64_t i) { return bf16_to_float(load_u16(s, i)); });
}

void copy_bytes(const void* src, void* dst, size_t bytes) {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  in_blocks(int64_t(bytes), [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, size_t(e - b)); }, kCopyBlockBytes,
            kParallelMinCopyBytes);
}

}  // namespace atelier
