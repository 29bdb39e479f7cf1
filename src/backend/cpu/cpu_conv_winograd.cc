// 3x3 stride-1 convolution by Winograd's F(2x2, 3x3): each 2x2 output tile comes from a 4x4 input tile
// with 16 products per (input, output) channel pair instead of 36, so the GEMM work drops 2.25x (SD's
// 64x64x320 conv3x3: 35 ms against 60 ms through im2col on one core). The transforms only add, subtract
// and halve: measured against a double reference, rel L2 5.5e-7 against 3.7e-7 for im2col at 320-640
// channels (tests/ops_linalg_test.cc checks both paths at 1e-5).
//
// Work is split into tasks of whole tile rows of one image. Per task: the input strip is copied with its
// zero padding, transformed into V[16][C][tiles], multiplied by the transformed weights U[16][O][C]
// (16 GEMMs), and the products M[16][O][tiles] are transformed back into the output with the bias.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace atelier::cpu {
namespace {

constexpr int kTile = 16;                        // transform points per tile (4x4)
// Fewer output tiles per image than this and the 16 GEMMs get too narrow: measured (1 core / 2 cores,
// batch 2) Winograd vs im2col at 8x8x1280 80.6/47.5 vs 40.2/20.4 ms, 12x12x640 28.8/14.7 vs 22.3/14.0,
// 16x16x1280 130/61 vs 206/82, 32x32x640 65.8/37.7 vs 129/69.4, 64x64x320 61.5/40.4 vs 116/60.8.
constexpr int64_t kMinTiles = 64;
constexpr int64_t kMinChannels = 8;              // thinner layers: the transforms would dominate
constexpr int64_t kBufferFloats = int64_t(1) << 22;  // V + M per thread (16 MiB)

std::atomic<bool> g_winograd_enabled{true};

struct Geometry {
  int64_t n, c, h, w, o, ho, wo, pad_h, pad_w;
  int64_t th, tw;  // tile rows / columns (2x2 outputs each)
  int64_t wp;      // padded strip width: 2 * tw + 2
};

// U[xi][o][c] = (G g G^T)[xi] for every 3x3 kernel g = w[o][c], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1].
// Each U entry is a fixed combination of the 9 taps, (G (x) G)[xi][k], so the whole transform is one
// [16, 9] @ [9, O*C] product: columns [oc0, oc1) of it here (plain loops over kernels did not vectorise).
void transform_weights(float* u, const float* w, int64_t plane, int64_t oc0, int64_t oc1) {
  static const auto kCoeff = [] {
    constexpr float kG[4][3] = {{1.0f, 0.0f, 0.0f}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0.0f, 0.0f, 1.0f}};
    std::array<float, kTile * 9> c{};
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        for (int a = 0; a < 3; ++a)
          for (int b = 0; b < 3; ++b) c[(i * 4 + j) * 9 + a * 3 + b] = kG[i][a] * kG[j][b];
    return c;
  }();
  if (oc1 > oc0) sgemm_serial(false, true, kTile, oc1 - oc0, 9, 1.0f, kCoeff.data(), 9, w + oc0 * 9, 9, 0.0f, u + oc0, plane);
}

// strip[c][r][s] = x[c][2 ty0 - pad_h + r][s - pad_w] (zero outside) for r < 2 rows + 2, s < wp.
void pad_strip(float* strip, const float* x, const Geometry& g, int64_t ty0, int64_t rows) {
  const int64_t sh = 2 * rows + 2;
  for (int64_t ci = 0; ci < g.c; ++ci)
    for (int64_t r = 0; r < sh; ++r) {
      float* dst = strip + (ci * sh + r) * g.wp;
      const int64_t iy = 2 * ty0 - g.pad_h + r;
      std::fill(dst, dst + g.wp, 0.0f);
      if (iy < 0 || iy >= g.h) continue;
      const int64_t x0 = std::max<int64_t>(0, g.pad_w), x1 = std::min<int64_t>(g.wp, g.w + g.pad_w);
      if (x1 > x0) std::memcpy(dst + x0, x + (ci * g.h + iy) * g.w + (x0 - g.pad_w), size_t(x1 - x0) * sizeof(float));
    }
}

// V[xi][c][t] = (B^T d B)[xi] for the 4x4 tile d at (2 ty, 2 tx) of the strip; t = ty * tw + tx.
// B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
ATELIER_SIMD_CLONES
void transform_input(float* v, const float* strip, const Geometry& g, int64_t rows, int64_t ntiles) {
  const int64_t sh = 2 * rows + 2;
  for (int64_t ci = 0; ci < g.c; ++ci)
    for (int64_t ty = 0; ty < rows; ++ty) {
      const float* base = strip + (ci * sh + 2 * ty) * g.wp;
      float* vt = v + ci * ntiles + ty * g.tw;
#pragma omp simd
      for (int64_t tx = 0; tx < g.tw; ++tx) {
        const float* d = base + 2 * tx;
        float t[4][4];  // B^T d
        for (int j = 0; j < 4; ++j) {
          const float d0 = d[j], d1 = d[g.wp + j], d2 = d[2 * g.wp + j], d3 = d[3 * g.wp + j];
          t[0][j] = d0 - d2;
          t[1][j] = d1 + d2;
          t[2][j] = d2 - d1;
          t[3][j] = d1 - d3;
        }
        const int64_t plane = g.c * ntiles;
        for (int i = 0; i < 4; ++i) {
          vt[(i * 4 + 0) * plane + tx] = t[i][0] - t[i][2];
          vt[(i * 4 + 1) * plane + tx] = t[i][1] + t[i][2];
          vt[(i * 4 + 2) * plane + tx] = t[i][2] - t[i][1];
          vt[(i * 4 + 3) * plane + tx] = t[i][1] - t[i][3];
        }
      }
    }
}

// out[o][2 ty + i][2 tx + j] = (A^T m A)[i][j] + bias[o] with A^T = [1 1 1 0; 0 1 -1 -1], cropped to Ho x Wo.
ATELIER_SIMD_CLONES
void transform_output(float* out, const float* m, const float* bias, const Geometry& g, int64_t ty0, int64_t rows, int64_t ntiles) {
  const int64_t plane = g.o * ntiles;
  for (int64_t oc = 0; oc < g.o; ++oc) {
    const float b = bias ? bias[oc] : 0.0f;
    float* oimg = out + oc * g.ho * g.wo;
    for (int64_t ty = 0; ty < rows; ++ty) {
      const float* mt = m + oc * ntiles + ty * g.tw;
      const int64_t oy = 2 * (ty0 + ty);
      const bool two_rows = oy + 1 < g.ho;
      for (int64_t tx = 0; tx < g.tw; ++tx) {
        float s[4][2];  // A^T m, per column pair
        float mm[4][4];
        for (int xi = 0; xi < kTile; ++xi) mm[xi / 4][xi % 4] = mt[xi * plane + tx];
        for (int j = 0; j < 4; ++j) {
          s[j][0] = mm[0][j] + mm[1][j] + mm[2][j];
          s[j][1] = mm[1][j] - mm[2][j] - mm[3][j];
        }
        const int64_t ox = 2 * tx;
        for (int i = 0; i < 2; ++i) {
          if (i == 1 && !two_rows) break;
          float* row = oimg + (oy + i) * g.wo;
          row[ox] = s[0][i] + s[1][i] + s[2][i] + b;
          if (ox + 1 < g.wo) row[ox + 1] = s[1][i] - s[2][i] - s[3][i] + b;
        }
      }
    }
  }
}

}  // namespace

void set_winograd_conv(bool enabled) { g_winograd_enabled = enabled; }

bool conv2d_winograd(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  if (!g_winograd_enabled || w.size(2) != 3 || w.size(3) != 3 || p.stride_h != 1 || p.stride_w != 1 || p.dilation_h != 1 || p.dilation_w != 1 ||
      p.groups != 1)
    return false;
  Geometry g{x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), out.size(2), out.size(3), p.pad_h, p.pad_w, 0, 0, 0};
  g.th = (g.ho + 1) / 2;
  g.tw = (g.wo + 1) / 2;
  g.wp = 2 * g.tw + 2;
  if (g.th * g.tw < kMinTiles || g.c < kMinChannels || g.o < kMinChannels) return false;

  // Tasks: runs of tile rows small enough for the buffers, numerous enough for the team.
  const int threads = max_threads();
  const int64_t rows_fit = std::max<int64_t>(1, kBufferFloats / (kTile * (g.c + g.o) * g.tw));
  const int64_t min_tasks = 2 * int64_t(threads);
  const int64_t rows_balanced = std::max<int64_t>(1, (g.n * g.th + min_tasks - 1) / min_tasks);
  const int64_t rows_per_task = std::min({rows_fit, rows_balanced, g.th});
  const int64_t tasks_per_image = (g.th + rows_per_task - 1) / rows_per_task;

  Tensor u = Tensor::empty({kTile, g.o, g.c});
  const float* up = u.data<float>();
  const int64_t plane = g.o * g.c;
  constexpr int64_t kWeightBlock = 4096;  // kernels per weight-transform work item
  const int64_t weight_blocks = (plane + kWeightBlock - 1) / kWeightBlock;
  const float* xp = x.data<float>();
  const float* bp = bias.defined() ? bias.data<float>() : nullptr;
  float* op = out.data<float>();
  const int64_t max_tiles = rows_per_task * g.tw;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < weight_blocks; ++blk)
      transform_weights(u.data<float>(), w.data<float>(), plane, blk * kWeightBlock, std::min(plane, (blk + 1) * kWeightBlock));
    // Scratch from the pooled allocator: the same sizes come back every denoising step.
    Tensor strip_t = Tensor::empty({g.c * (2 * rows_per_task + 2) * g.wp});
    Tensor v_t = Tensor::empty({kTile * g.c * max_tiles}), m_t = Tensor::empty({kTile * g.o * max_tiles});
    float* strip = strip_t.data<float>();
    float* v = v_t.data<float>();
    float* m = m_t.data<float>();
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < g.n * tasks_per_image; ++t) {
      const int64_t ni = t / tasks_per_image, ty0 = (t % tasks_per_image) * rows_per_task;
      const int64_t rows = std::min(rows_per_task, g.th - ty0), ntiles = rows * g.tw;
      pad_strip(strip, xp + ni * g.c * g.h * g.w, g, ty0, rows);
      transform_input(v, strip, g, rows, ntiles);
      for (int xi = 0; xi < kTile; ++xi)
        sgemm_serial(false, false, g.o, ntiles, g.c, 1.0f, up + xi * plane, g.c, v + xi * g.c * ntiles, ntiles, 0.0f,
                     m + xi * g.o * ntiles, ntiles);
      transform_output(op + ni * g.o * g.ho * g.wo, m, bp, g, ty0, rows, ntiles);
    }
  }
  return true;
}

}  // namespace atelier::cpu
