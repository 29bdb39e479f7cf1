// torch's CUDA generator (at::CUDAGeneratorImpl) and its float32 randn / rand kernels, computed on the CPU.
//
// Launch (distribution_nullary_kernel, calc_execution_policy): blocks of 256 threads,
//   grid   = min(ceil(numel / 256), multiprocessor_count * (max_threads_per_multiprocessor / 256)),
//   stride = 256 * grid, rounds = ceil(numel / (4 * stride)).
// The draw takes Philox offset `offset` from the generator and advances it by 4 * rounds. Thread t does
// curand_init(seed, subsequence = t, offset): its Philox counter starts at (offset / 4, 0, t) (128 bits:
// x,y = the 64-bit position, z,w = the 64-bit subsequence), key = (seed lo, seed hi). In round r it calls
// curand_normal4 (or curand_uniform4) once, on the counter's block r, and element t + stride * (4r + i)
// gets component i (elements past numel are dropped, their numbers wasted).
// curand_normal4: Box-Muller on (x0, x1) -> components 0, 1 and (x2, x3) -> 2, 3, where
//   u = fma(float(a), 2^-32, 2^-33), v = fma(float(b), 2pi 2^-32, pi 2^-32)   (float(a) rounds to nearest),
//   s = sqrtf(-2 logf(u)), component pair = (s * sin v, s * cos v),
// with CUDA's logf (reproduced operation for operation below: exact) and __sincosf, which is the GPU's
// MUFU.SIN / MUFU.COS hardware approximation of sin(2pi * RZ(v * (1/2pi)_f)); see hw_sincos().
// curand_uniform4: fma(float(a), 2^-32, 2^-33) in (0, 1]; torch then maps 1 to 0.
#include <algorithm>
#include <bit>
#include <cmath>

#include "core/rng.h"

// Each fused step below is an explicit std::fma, as nvcc emits it; nothing else may be contracted.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace atelier {
namespace {

constexpr int64_t kBlockSize = 256;   // torch's block_size_bound
constexpr int64_t kUnroll = 4;        // curand4_engine_calls: values per curand_*4 call
constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
constexpr float float_of(uint32_t b) { return std::bit_cast<float>(b); }

constexpr float kTwoPow32Inv = float_of(0x2F800000u);       // curand's CURAND_2POW32_INV = 2^-32
constexpr float kTwoPow32InvTwoPi = float_of(0x30C90FDBu);  // CURAND_2POW32_INV_2PI, as a float

struct U32x4 { uint32_t v[4]; };

// Philox4x32-10 block for counter (position, subsequence) under key (seed).
U32x4 philox(uint64_t position, uint64_t subsequence, uint64_t seed) {
  uint32_t c0 = uint32_t(position), c1 = uint32_t(position >> 32);
  uint32_t c2 = uint32_t(subsequence), c3 = uint32_t(subsequence >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const uint64_t p0 = uint64_t(kPhiloxM0) * c0;
    const uint64_t p1 = uint64_t(kPhiloxM1) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return {{c0, c1, c2, c3}};
}

// CUDA's logf (libdevice __nv_logf, as nvcc 12/13 compile it without fast-math): exact for every
// positive normal or subnormal float, which is all curand can pass it.
float cuda_logf(float a) {
  const bool subnormal = a < 1.17549435e-38f;
  if (subnormal) a *= 8388608.0f;  // 2^23
  const float exp_bias = subnormal ? -23.0f : 0.0f;
  const uint32_t ia = bits_of(a);
  const uint32_t e = (ia - 0x3f2aaaabu) & 0xff800000u;  // exponent that puts the mantissa in [2/3, 4/3)
  const float m = float_of(ia - e);
  const float i = std::fma(float(int32_t(e)), 1.1920929e-7f, exp_bias);  // e / 2^23
  const float f = m - 1.0f;
  float r = std::fma(float_of(0xBE055027u), f, float_of(0x3E1039F6u));
  constexpr uint32_t kCoeffs[] = {0xBDF8CDCCu, 0x3E0F2955u, 0xBE2AD8B9u, 0x3E4CED0Bu,
                                  0xBE7FFF22u, 0x3EAAAA78u, 0xBF000000u};
  for (uint32_t c : kCoeffs) r = std::fma(r, f, float_of(c));
  r = std::fma(r * f, f, f);
  r = std::fma(i, float_of(0x3F317218u), r);  // + i * log(2)
  if (ia >= 0x7f800000u) r = std::fma(a, INFINITY, INFINITY);
  if (a == 0.0f) r = -INFINITY;
  return r;
}

// --- __sincosf: the GPU's MUFU.SIN / MUFU.COS, reproduced bit for bit -----------------------------------
// nvcc compiles __sincosf(v) to t = RZ(v * (1/2pi)_f); MUFU.SIN t; MUFU.COS t. We measured MUFU on an H200
// (sm_90) for every float v in [0.5, 2pi) and found this datapath, which reproduces all of those
// 2 x 30 million outputs and the fixtures' CUDA noise (made on another GPU) exactly:
//   X = floor(t * 2^25) mod 2^25: the angle in turns, 2 quadrant bits + 23 bits y within the quadrant;
//   odd quadrants mirror y by one's complement (~y), quadrants 2 and 3 negate; cos(t) = sin at X + 2^23;
//   sin(pi/2 * y / 2^23) ~ C0 + C1 * xl + C2 * sq(xl), segment = y >> 17 (64 per quadrant), xl = y & (2^17-1),
//   sq = xl^2 with only the partial products of weight >= 2^19 kept, then divided by 2^19;
//   the sum is fixed point with 37 fractional bits, truncated (toward zero) to float.
// The coefficients are the measured table (any C0 in each segment's feasible range gives the same floats).
struct MufuSegment {
  int64_t c0;
  int32_t c1;
  int32_t c2;
};
constexpr int kMufuTurnBits = 25;     // fixed-point bits of the angle in turns
constexpr int kMufuQuadrantBits = 23;
constexpr int kMufuSegmentBits = 17;  // low bits of y inside a segment
constexpr int kMufuSquareDrop = 19;   // partial products below 2^19 are not computed
constexpr int kMufuFracBits = 37;     // fixed-point result: units of 2^-37
constexpr MufuSegment kMufuSin[64] = {
    {0, 25737, -14}, {3372904448, 25730, -48}, {6743801856, 25706, -76},
    {10110623744, 25668, -110}, {13471358976, 25613, -137}, {16823984128, 25544, -171},
    {20166463488, 25459, -201}, {23496810496, 25358, -229}, {26812993536, 25243, -262},
    {30113038336, 25112, -292}, {33394933760, 24966, -322}, {36656717824, 24805, -352},
    {39896412160, 24629, -381}, {43112091648, 24438, -410}, {46301777920, 24233, -441},
    {49463582720, 24013, -470}, {52595609600, 23778, -497}, {55695945728, 23529, -525},
    {58762719232, 23266, -553}, {61794107392, 22989, -581}, {64788275200, 22698, -608},
    {67743399936, 22394, -637}, {70657728512, 22076, -664}, {73529516032, 21744, -688},
    {76356976640, 21400, -715}, {79138471936, 21042, -738}, {81872281600, 20672, -763},
    {84556783616, 20290, -790}, {87190335488, 19895, -812}, {89771380736, 19489, -839},
    {92298346496, 19070, -859}, {94769717248, 18640, -881}, {97184010240, 18199, -904},
    {99539755008, 17747, -926}, {101835546624, 17284, -946}, {104069984256, 16811, -967},
    {106241736704, 16328, -988}, {108349513728, 15834, -1004}, {110391992320, 15332, -1025},
    {112367996928, 14820, -1043}, {114276302848, 14299, -1059}, {116115795968, 13769, -1074},
    {117885313024, 13232, -1093}, {119583838208, 12686, -1107}, {121210322944, 12133, -1123},
    {122763804672, 11572, -1136}, {124243337216, 11004, -1148}, {125648027648, 10430, -1162},
    {126977036288, 9849, -1172}, {128229548032, 9263, -1185}, {129404821504, 8671, -1196},
    {130502160384, 8073, -1203}, {131520880640, 7471, -1213}, {132460384256, 6864, -1220},
    {133320069120, 6254, -1230}, {134099484672, 5639, -1236}, {134798106624, 5021, -1242},
    {135415529472, 4400, -1247}, {135951388672, 3776, -1250}, {136405348352, 3151, -1258},
    {136777142272, 2523, -1260}, {137066565632, 1893, -1260}, {137273401344, 1263, -1263},
    {137397559296, 632, -1265},};

// xl^2 (xl < 2^17) from the partial products x_i x_j 2^(i+j) of weight >= 2^19 only, divided by 2^19.
int64_t mufu_truncated_square(uint32_t xl) {
  int64_t sum = 0;
  for (int j = 0; j < kMufuSegmentBits; ++j) {
    if (!(xl >> j & 1)) continue;
    if (2 * j >= kMufuSquareDrop) sum += int64_t(1) << (2 * j);  // x_j^2
    // 2 x_i x_j 2^(i+j) for i < j, kept when i + j + 1 >= 19
    const int lowest = std::max(0, kMufuSquareDrop - 1 - j);
    if (lowest < j) {
      const uint32_t below = xl & ((1u << j) - 1) & ~((1u << lowest) - 1);
      sum += int64_t(below) << (j + 1);
    }
  }
  return sum >> kMufuSquareDrop;
}

// Nonnegative fixed-point value (units 2^-37) to float, truncating.
float fixed_to_float_rz(int64_t v) {
  if (v <= 0) return 0.0f;
  const int msb = 63 - std::countl_zero(uint64_t(v));
  const int drop = msb - 23;  // keep 24 significant bits
  if (drop > 0) v = (v >> drop) << drop;
  return float(std::ldexp(double(v), -kMufuFracBits));
}

// MUFU.SIN of the angle X / 2^25 turns.
float mufu_sin_turns(uint32_t x) {
  constexpr uint32_t kQuadrantMask = (1u << kMufuQuadrantBits) - 1;
  const uint32_t quadrant = (x >> kMufuQuadrantBits) & 3;
  uint32_t y = x & kQuadrantMask;
  if (quadrant & 1) y = ~y & kQuadrantMask;
  const MufuSegment& seg = kMufuSin[y >> kMufuSegmentBits];
  const uint32_t xl = y & ((1u << kMufuSegmentBits) - 1);
  const float mag = fixed_to_float_rz(seg.c0 + int64_t(seg.c1) * xl + int64_t(seg.c2) * mufu_truncated_square(xl));
  return (quadrant & 2) ? -mag : mag;
}

// __sincosf(v) for v >= 0 (curand's angles are in (0, 2pi]).
void hw_sincos(float v, float* s, float* c) {
  constexpr float kInvTwoPi = float_of(0x3E22F983u);  // the FMUL.RZ constant nvcc emits
  const double prod = double(v) * double(kInvTwoPi);  // exact: 24 x 24 bits
  float t = float(prod);
  if (double(t) > prod) t = std::nextafter(t, 0.0f);  // round toward zero
  const uint32_t turns = uint32_t(uint64_t(std::ldexp(double(t), kMufuTurnBits)) & ((1u << kMufuTurnBits) - 1));
  *s = mufu_sin_turns(turns);
  *c = mufu_sin_turns((turns + (1u << kMufuQuadrantBits)) & ((1u << kMufuTurnBits) - 1));
}

// curand's _curand_box_muller(x, y) -> (s sin v, s cos v).
void box_muller(uint32_t x, uint32_t y, float* out) {
  const float u = std::fma(float(x), kTwoPow32Inv, kTwoPow32Inv / 2);
  const float v = std::fma(float(y), kTwoPow32InvTwoPi, kTwoPow32InvTwoPi / 2);
  const float s = std::sqrt(-2.0f * cuda_logf(u));
  float sin_v, cos_v;
  hw_sincos(v, &sin_v, &cos_v);
  out[0] = s * sin_v;
  out[1] = s * cos_v;
}

// The grid-stride launch of one draw (see the top of the file).
struct Launch {
  int64_t stride = 0;  // threads in the grid
  int64_t rounds = 0;  // curand_*4 calls per thread
};

Launch launch_for(int64_t n, const CudaDeviceProfile& gpu) {
  const int64_t blocks = std::min((n + kBlockSize - 1) / kBlockSize, gpu.max_resident_blocks());
  Launch l;
  l.stride = blocks * kBlockSize;
  l.rounds = (n - 1) / (l.stride * kUnroll) + 1;
  return l;
}

// Runs the launch on the CPU: `four(block, need, vals)` turns one Philox block into the 4 values of a
// curand_*4 call (need[i] says whether component i lands in the tensor, so unused pairs can be skipped).
template <typename Four>
void grid_stride_fill(float* out, int64_t n, uint64_t seed, uint64_t offset, const Launch& l, Four four) {
  const uint64_t first_block = offset / kUnroll;  // curand skipahead: 4 values per counter step
  for (int64_t t = 0; t < l.stride && t < n; ++t) {
    for (int64_t r = 0; r < l.rounds; ++r) {
      const int64_t base = t + l.stride * kUnroll * r;
      if (base >= n) break;
      bool need[kUnroll];
      for (int i = 0; i < kUnroll; ++i) need[i] = base + l.stride * i < n;
      float vals[kUnroll];
      four(philox(first_block + uint64_t(r), uint64_t(t), seed), need, vals);
      for (int i = 0; i < kUnroll; ++i)
        if (need[i]) out[base + l.stride * i] = vals[i];
    }
  }
}

}  // namespace

int64_t CudaDeviceProfile::max_resident_blocks() const {
  return int64_t(multiprocessor_count) * (max_threads_per_multiprocessor / kBlockSize);
}

TorchCudaGenerator::TorchCudaGenerator(uint64_t seed, CudaDeviceProfile gpu) : seed_(seed), gpu_(gpu) {
  ATELIER_CHECK(gpu_.max_resident_blocks() > 0, "CudaDeviceProfile needs SMs and >= 256 threads per SM");
}

void TorchCudaGenerator::manual_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

std::vector<float> TorchCudaGenerator::randn(int64_t n) {
  ATELIER_CHECK(n >= 0, "randn: negative count");
  std::vector<float> out(static_cast<size_t>(n));
  if (n == 0) return out;  // torch launches nothing and keeps the offset
  const Launch l = launch_for(n, gpu_);
  grid_stride_fill(out.data(), n, seed_, offset_, l, [](const U32x4& b, const bool* need, float* vals) {
    if (need[0] || need[1]) box_muller(b.v[0], b.v[1], vals);
    if (need[2] || need[3]) box_muller(b.v[2], b.v[3], vals + 2);
  });
  offset_ += uint64_t(l.rounds * kUnroll);
  return out;
}

std::vector<float> TorchCudaGenerator::rand(int64_t n) {
  ATELIER_CHECK(n >= 0, "rand: negative count");
  std::vector<float> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const Launch l = launch_for(n, gpu_);
  grid_stride_fill(out.data(), n, seed_, offset_, l, [](const U32x4& b, const bool*, float* vals) {
    for (int i = 0; i < kUnroll; ++i) {
      const float u = std::fma(float(b.v[i]), kTwoPow32Inv, kTwoPow32Inv / 2);  // (0, 1]
      vals[i] = u == 1.0f ? 0.0f : u;  // torch reverses the bound: [0, 1)
    }
  });
  offset_ += uint64_t(l.rounds * kUnroll);
  return out;
}

}  // namespace atelier
