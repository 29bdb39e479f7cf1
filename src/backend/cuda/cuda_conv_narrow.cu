// Convolutions with few output or few input channels on mma.sync (m16n8k16, f32 accumulation): see
// cuda_conv_narrow.h. A warp owns 16 consecutive output pixels (the product's 16 rows); each lane computes the input
// pixel of its two rows (g and g + 8) per tap, reading the channels straight from global memory (L1 holds a block's
// taps: neighbouring warps read the same rows), zero outside the image as the padding.
//
// Few outputs (O <= 8: one n8 tile, the products' k running over taps x C): a lane loads 8 channels of each row and of
// its output's weight row as one 16-byte vector per 32 channels and feeds them to two k16 products. The vector's
// channels are not the k positions the fragment layout names (k = 2q, 2q + 1, 2q + 8, 2q + 9 of lane q), but A and B
// use the same assignment, so each product still sums the same channel products: the sum's order is the only change.
// Few inputs (kh * kw * C <= 64: at most four k16 chunks, held in registers for the whole warp): k = tap * C + channel
// as the packed weight [O, kh, kw, C] orders it, each lane's pairs (2q, 2q + 1) one 32-bit load of a pixel's channel
// pair; then every n8 tile of the outputs in turn.
#include "backend/cuda/cuda_conv_narrow.h"

#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_ptx.cuh"

namespace atelier::cuda {
namespace {

constexpr int kWarps = 8;                  // warps per block: 128 output pixels
constexpr int kNarrowThreads = kWarps * 32;
constexpr int kRows = 16;                  // output pixels per warp (the m16 of the product)
constexpr int kMaxOutputs = 8;             // few outputs: one n8 tile
constexpr int kChunkChannels = 32;         // few outputs: channels per lane vector pair of products
constexpr int kMaxChunks = 4;              // few inputs: k16 chunks held in registers (kh * kw * C <= 64)

std::atomic<int64_t> g_launches{0};

struct Geometry {
  int64_t pixels;  // n * ho * wo
  int h, w, c, o, kh, kw, ho, wo, pad_h, pad_w, ktot;
};

// This lane's two rows (g, g + 8) of the warp's 16 pixels: whether they exist and where they are.
struct LaneRows {
  int64_t pix[2];
  int img[2], oy[2], ox[2];
  bool live[2];
};
__device__ __forceinline__ LaneRows lane_rows(const Geometry& g, int64_t first, int row) {
  LaneRows r;
  for (int i = 0; i < 2; ++i) {
    r.pix[i] = first + row + 8 * i;
    r.live[i] = r.pix[i] < g.pixels;
    const int64_t p = r.live[i] ? r.pix[i] : 0, per_image = int64_t(g.ho) * g.wo;
    r.img[i] = int(p / per_image);
    const int rem = int(p - int64_t(r.img[i]) * per_image);
    r.oy[i] = rem / g.wo, r.ox[i] = rem - r.oy[i] * g.wo;
  }
  return r;
}
// Row i's input pixel for tap (ty, tx), or null outside the image (the zero padding).
template <typename T>
__device__ __forceinline__ const T* tap_pixel(const T* x, const Geometry& g, const LaneRows& r, int i, int ty, int tx) {
  const int iy = r.oy[i] + ty - g.pad_h, ix = r.ox[i] + tx - g.pad_w;
  if (!r.live[i] || iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) return nullptr;
  return x + ((int64_t(r.img[i]) * g.h + iy) * g.w + ix) * g.c;
}
__device__ __forceinline__ uint4 load16(const void* p) { return p ? __ldg(static_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0); }
__device__ __forceinline__ uint32_t load4(const void* p) { return p ? __ldg(static_cast<const unsigned int*>(p)) : 0u; }

// Writes row i's outputs n, n + 1 (acc pair) + bias where they exist.
template <typename T>
__device__ __forceinline__ void store_pair(T* out, const T* bias, const Geometry& g, const LaneRows& r, int i, int n, float v0, float v1) {
  if (!r.live[i]) return;
  T* dst = out + r.pix[i] * g.o + n;
  if (bias) {
    if (n < g.o) v0 += to_f32(bias[n]);
    if (n + 1 < g.o) v1 += to_f32(bias[n + 1]);
  }
  if (n + 1 < g.o && g.o % 2 == 0) {
    *reinterpret_cast<uint32_t*>(dst) = pack2<T>(v0, v1);
  } else {
    if (n < g.o) dst[0] = from_f32<T>(v0);
    if (n + 1 < g.o) dst[1] = from_f32<T>(v1);
  }
}

// x [N, H, W, C] (C a multiple of 32), w [O, kh, kw, C] (O <= 8) -> out [N, Ho, Wo, O] + bias.
template <typename T>
__global__ void __launch_bounds__(kNarrowThreads) conv_few_outputs_kernel(T* out, const T* x, const T* w, const T* bias, Geometry g) {
  const int lane = int(threadIdx.x) % 32, row = lane / 4, q = lane % 4;
  const int64_t first = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * kRows;
  if (first >= g.pixels) return;  // the whole warp
  const LaneRows r = lane_rows(g, first, row);
  const T* wrow = row < g.o ? w + int64_t(row) * g.ktot + q * 8 : nullptr;  // this lane's output's weights (B's column)
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int ty = 0; ty < g.kh; ++ty)
    for (int tx = 0; tx < g.kw; ++tx) {
      const T* a0 = tap_pixel(x, g, r, 0, ty, tx);
      const T* a1 = tap_pixel(x, g, r, 1, ty, tx);
      const T* wt = wrow ? wrow + (ty * g.kw + tx) * g.c : nullptr;
#pragma unroll 2
      for (int c0 = 0; c0 < g.c; c0 += kChunkChannels) {
        const uint4 v0 = load16(a0 ? a0 + c0 + q * 8 : nullptr), v1 = load16(a1 ? a1 + c0 + q * 8 : nullptr);
        const uint4 wv = load16(wt ? wt + c0 : nullptr);
        const uint32_t lo[4] = {v0.x, v1.x, v0.y, v1.y}, hi[4] = {v0.z, v1.z, v0.w, v1.w};
        mma16816<T>(acc, lo, wv.x, wv.y);
        mma16816<T>(acc, hi, wv.z, wv.w);
      }
    }
  // C fragment: acc[0], acc[1] row g outputs 2q, 2q + 1; acc[2], acc[3] row g + 8.
  store_pair(out, bias, g, r, 0, 2 * q, acc[0], acc[1]);
  store_pair(out, bias, g, r, 1, 2 * q, acc[2], acc[3]);
}

// x [N, H, W, C] (C even, kh * kw * C <= 64), w [O, kh, kw, C] (O a multiple of 8) -> out [N, Ho, Wo, O] + bias.
template <typename T>
__global__ void __launch_bounds__(kNarrowThreads) conv_few_inputs_kernel(T* out, const T* x, const T* w, const T* bias, Geometry g) {
  const int lane = int(threadIdx.x) % 32, row = lane / 4, q = lane % 4;
  const int64_t first = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * kRows;
  if (first >= g.pixels) return;
  const LaneRows r = lane_rows(g, first, row);
  const int chunks = (g.ktot + 15) / 16;
  // A for every chunk: a[ch][0] row g k = 16 ch + 2q (and + 1), [1] row g + 8, [2] row g at k + 8, [3] row g + 8.
  uint32_t a[kMaxChunks][4];
#pragma unroll
  for (int ch = 0; ch < kMaxChunks; ++ch)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int k = ch * 16 + 2 * q + 8 * half;
      const bool in_k = ch < chunks && k < g.ktot;
      const int tap = in_k ? k / g.c : 0, channel = k - tap * g.c, ty = tap / g.kw, tx = tap - ty * g.kw;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const T* p = in_k ? tap_pixel(x, g, r, i, ty, tx) : nullptr;
        a[ch][2 * half + i] = load4(p ? p + channel : nullptr);
      }
    }
  for (int n0 = 0; n0 < g.o; n0 += 8) {
    const T* wrow = w + int64_t(n0 + row) * g.ktot + 2 * q;  // B's column: output n0 + g
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ch = 0; ch < kMaxChunks; ++ch) {
      if (ch >= chunks) break;
      const int k = ch * 16 + 2 * q;
      mma16816<T>(acc, a[ch], load4(k < g.ktot ? wrow + ch * 16 : nullptr), load4(k + 8 < g.ktot ? wrow + ch * 16 + 8 : nullptr));
    }
    store_pair(out, bias, g, r, 0, n0 + 2 * q, acc[0], acc[1]);
    store_pair(out, bias, g, r, 1, n0 + 2 * q, acc[2], acc[3]);
  }
}

bool few_outputs(const NarrowConvArgs& a) { return a.o >= 1 && a.o <= kMaxOutputs && a.c % kChunkChannels == 0; }
bool few_inputs(const NarrowConvArgs& a) { return a.c % 2 == 0 && a.kh * a.kw * a.c <= 16 * kMaxChunks && a.o % 8 == 0; }

}  // namespace

// Off by default: correct on an H100 (session 59, CudaConvNarrow.*), faster not yet shown (one 16-row turn each way,
// 26.185 with them against 25.867 ms without, at clocks 1.5% apart). ATELIER_NARROW_CONV=1 makes them a timed
// candidate, =force forces them.
NarrowConv narrow_conv_default() {
  if (env_is("ATELIER_NARROW_CONV", "1")) return NarrowConv::kAuto;
  if (env_is("ATELIER_NARROW_CONV", "force")) return NarrowConv::kForce;
  return NarrowConv::kOff;
}
int64_t conv_narrow_launches() { return g_launches.load(); }

bool conv_narrow_takes(const NarrowConvArgs& a) {
  if (a.dtype != DType::BF16 && a.dtype != DType::F16) return false;
  if (a.n < 1 || a.c < 1 || a.o < 1 || a.kh < 1 || a.kw < 1 || a.ho != a.h + 2 * a.pad_h - a.kh + 1 ||
      a.wo != a.w_in + 2 * a.pad_w - a.kw + 1 || a.ho < 1 || a.wo < 1)
    return false;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.out) % 4 != 0)
    return false;
  if (a.h > INT32_MAX || a.w_in > INT32_MAX || a.kh * a.kw * a.c > INT32_MAX) return false;
  return few_outputs(a) || few_inputs(a);
}

bool launch_conv_narrow(const NarrowConvArgs& a, cudaStream_t stream) {
  if (!conv_narrow_takes(a)) return false;
  const Geometry g{a.n * a.ho * a.wo, int(a.h), int(a.w_in), int(a.c), int(a.o), int(a.kh), int(a.kw), int(a.ho), int(a.wo),
                   a.pad_h, a.pad_w, int(a.kh * a.kw * a.c)};
  const int64_t blocks = (g.pixels + kWarps * kRows - 1) / (kWarps * kRows);
  if (blocks > INT32_MAX) return false;
  const auto go = [&](auto* out) {
    using T = std::remove_pointer_t<decltype(out)>;
    const T* x = static_cast<const T*>(a.x);
    const T* w = static_cast<const T*>(a.w);
    const T* bias = static_cast<const T*>(a.bias);
    if (few_outputs(a))
      conv_few_outputs_kernel<T><<<unsigned(blocks), kNarrowThreads, 0, stream>>>(out, x, w, bias, g);
    else
      conv_few_inputs_kernel<T><<<unsigned(blocks), kNarrowThreads, 0, stream>>>(out, x, w, bias, g);
  };
  if (a.dtype == DType::BF16)
    go(static_cast<__nv_bfloat16*>(a.out));
  else
    go(static_cast<__half*>(a.out));
  ATELIER_CUDA_LAUNCHED();
  g_launches.fetch_add(1);
  return true;
}

}  // namespace atelier::cuda
