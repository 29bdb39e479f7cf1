// 2-D convolution on the CPU: im2col + sgemm, blocked over output pixels so that the column buffer of
// one block stays small (it is built and consumed by the same thread while still in cache) and memory
// stays bounded for large images. A 1x1 stride-1 unpadded convolution is a plain GEMM on the input.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/packed_operands.h"

namespace atelier {
namespace {

// Target size of one thread's im2col block, in floats (4 MiB). Each GEMM call repacks the weights, so
// wider blocks amortise that, but the block should stay near the core's cache. Measured on SD's 64x64x320
// conv3x3 (Xeon, 2 MiB L2/core; 1 thread / 2 threads): 4 MiB 60/37 ms, 8 MiB 64/41, 16 MiB 68/46,
// whole image 82/43.
constexpr int64_t kColBudgetFloats = int64_t(1) << 20;
// Narrowest block of output pixels worth a GEMM call.
constexpr int64_t kMinBlockPixels = 32;

struct ConvGeometry {
  int64_t n, c, h, w;       // input
  int64_t o, kh, kw;        // weights
  int64_t ho, wo;           // output
  int64_t groups, cg, og;   // per-group channels
  int64_t kc;               // rows of the column matrix: cg * kh * kw
  Conv2dParams p;
};

// Fills col [kc, p1 - p0] with the input patches of output pixels [p0, p1) of one (sample, group);
// x points at that group's first channel [cg, h, w].
void im2col_block(float* col, const float* x, const ConvGeometry& g, int64_t p0, int64_t p1) {
  const int64_t width = p1 - p0;
  const Conv2dParams& p = g.p;
  for (int64_t ci = 0; ci < g.cg; ++ci) {
    const float* xc = x + ci * g.h * g.w;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        float* dst = col + ((ci * g.kh + ki) * g.kw + kj) * width;
        const int64_t dy = ki * p.dilation_h - p.pad_h, dx = kj * p.dilation_w - p.pad_w;
        // Output pixels by output row: a run [ox0, ox1) of one row at a time.
        for (int64_t pix = p0; pix < p1;) {
          const int64_t oy = pix / g.wo, ox0 = pix % g.wo;
          const int64_t ox1 = std::min(g.wo, ox0 + (p1 - pix));
          const int64_t run = ox1 - ox0;
          float* d = dst + (pix - p0);
          const int64_t iy = oy * p.stride_h + dy;
          if (iy < 0 || iy >= g.h) {
            std::fill(d, d + run, 0.0f);
          } else {
            const float* src = xc + iy * g.w;
            if (p.stride_w == 1) {
              // Valid ox: 0 <= ox + dx < w.
              const int64_t lo = std::clamp<int64_t>(-dx, ox0, ox1), hi = std::clamp<int64_t>(g.w - dx, ox0, ox1);
              std::fill(d, d + (lo - ox0), 0.0f);
              if (hi > lo) std::memcpy(d + (lo - ox0), src + lo + dx, size_t(hi - lo) * sizeof(float));
              std::fill(d + std::max(hi, lo) - ox0, d + run, 0.0f);
            } else {
              for (int64_t ox = ox0; ox < ox1; ++ox) {
                const int64_t ix = ox * p.stride_w + dx;
                d[ox - ox0] = ix >= 0 && ix < g.w ? src[ix] : 0.0f;
              }
            }
          }
          pix += run;
        }
      }
    }
  }
}

}  // namespace

// x [N, C, H, W], w [O, C/groups, kh, kw], bias [O] optional, addend optional (a view with out's shape);
// x and out contiguous or channels-last (the arithmetic runs on NCHW copies: the CPU's im2col and Winograd
// paths are NCHW) -> out [N, O, Ho, Wo] = conv + bias + addend, the addend added after the bias as a
// separate add would.
void CpuBackend::conv2d(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                        const Tensor& addend) {
  if (out.numel() == 0) return;
  through_packed(*this, out, x, [&](Tensor& oc, const Tensor& xc) {
    conv2d_nchw(oc, xc, w, bias, p);
    if (addend.defined()) binary(oc, oc, addend, BinaryOp::kAdd);
  });
}

// x [N, C, H, W], w [O, C/groups, kh, kw], bias [O] optional, all contiguous -> out [N, O, Ho, Wo].
void CpuBackend::conv2d_nchw(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  ConvGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), w.size(2), w.size(3),
                 out.size(2), out.size(3), p.groups, x.size(1) / p.groups, w.size(0) / p.groups, 0, p};
  g.kc = g.cg * g.kh * g.kw;
  const int64_t pixels = g.ho * g.wo;
  if (out.numel() == 0) return;
  if (cpu::conv2d_winograd(out, x, w, bias, p)) return;
  const bool pointwise = g.kh == 1 && g.kw == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0;

  // Output-pixel blocks: small enough for the column budget, numerous enough to occupy every thread.
  const int threads = cpu::max_threads();
  int64_t block = pointwise ? pixels : std::max(kMinBlockPixels, kColBudgetFloats / std::max<int64_t>(g.kc, 1));
  const int64_t units = g.n * g.groups;
  if (units < threads) block = std::min(block, std::max(kMinBlockPixels, (pixels * units + threads - 1) / threads));
  block = std::min(block, pixels);
  const int64_t blocks_per_unit = (pixels + block - 1) / block;
  const int64_t tasks = units * blocks_per_unit;
  const double macs = double(out.numel()) * g.kc;

  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* bp = bias.defined() ? bias.data<float>() : nullptr;
  float* op = out.data<float>();
#pragma omp parallel if (tasks > 1 && macs >= cpu::kMinParallelMacs)
  {
    // Per-thread scratch, uninitialised (im2col overwrites every element).
    std::unique_ptr<float[]> col(pointwise ? nullptr : new float[size_t(g.kc * block)]);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t unit = t / blocks_per_unit, nb = t % blocks_per_unit;
      const int64_t ni = unit / g.groups, gi = unit % g.groups;
      const int64_t p0 = nb * block, p1 = std::min(pixels, p0 + block);
      const int64_t width = p1 - p0;
      const float* xg = xp + (ni * g.c + gi * g.cg) * g.h * g.w;
      float* cg = op + (ni * g.o + gi * g.og) * pixels + p0;
      const float* wg = wp + gi * g.og * g.kc;
      float beta = 0.0f;
      if (bp) {  // bias prefilled, accumulated onto by the GEMM
        for (int64_t oc = 0; oc < g.og; ++oc) std::fill(cg + oc * pixels, cg + oc * pixels + width, bp[gi * g.og + oc]);
        beta = 1.0f;
      }
      if (pointwise) {
        cpu::sgemm_serial(false, false, g.og, width, g.kc, 1.0f, wg, g.kc, xg + p0, pixels, beta, cg, pixels);
      } else {
        im2col_block(col.get(), xg, g, p0, p1);
        cpu::sgemm_serial(false, false, g.og, width, g.kc, 1.0f, wg, g.kc, col.get(), width, beta, cg, pixels);
      }
    }
  }
}

}  // namespace atelier
