// Fused ("flash") attention for AVX-512 CPUs. Per block of 16 query rows (two register-blocked groups of
// 8) the keys are walked in chunks of 256: scores for the chunk come from a register-blocked kernel into
// an L1 buffer, the softmax is updated online (running max and sum per row, earlier output rescaled when
// the max grows), and P @ V accumulates into an L1 output block. Nothing of size Sq x Sk exists, and no
// GEMM call repacks K or V per block: K is packed once per head as 16-key tiles, V is read in place.
// CPUs without AVX-512, and wide heads (see kMaxFusedHeadDim), take the GEMM path in cpu_attention.cc.
// Chunks of 64/128/256 keys with 1, 2 or 4 row groups were measured on SD 1.5's 4096-token
// self-attention; 256 keys x 2 groups was the best or tied.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_vecmath.h"

#define ATELIER_AVX512 __attribute__((target("avx512f")))

namespace atelier::cpu {
namespace {

constexpr int kRows = 8;              // query rows per micro-block (the kernels' register blocking)
constexpr int kLanes = 16;            // floats per AVX-512 register
constexpr int64_t kChunk = 256;       // keys per online-softmax step (a multiple of 2 tiles)
constexpr int kMaxVecs = 3;           // value columns per P @ V pass: 3 registers x 8 rows = 24 accumulators
constexpr int kGroups = 2;            // groups of 8 rows that share each key chunk while it is in L1
constexpr int64_t kTaskRows = 32;     // query rows per scheduled task
// Widest head the fused path takes. Narrow heads leave OpenBLAS's GEMMs short of work per call, wide ones
// suit them: measured (1 core / 2 cores) D=40 over 4096 tokens 314/141 ms fused vs 407/151 GEMM path,
// D=64 over 1024 tokens 26.7/14.5 vs 29.8/14.5, D=128 191/86 vs 170/85, D=512 362/221 vs 298/177.
constexpr int64_t kMaxFusedHeadDim = 96;

std::atomic<bool> g_fused_enabled{true};

// Packs k [Sk, D] (row stride ldk) as tiles of 16 keys, kt[t][d][16], zero past Sk; `tiles` is even.
void pack_key_tiles(float* kt, const float* k, int64_t ldk, int64_t sk, int64_t d, int64_t tiles) {
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t dd = 0; dd < d; ++dd) {
      float* dst = kt + (t * d + dd) * kLanes;
      for (int l = 0; l < kLanes; ++l) {
        const int64_t key = t * kLanes + l;
        dst[l] = key < sk ? k[key * ldk + dd] : 0.0f;
      }
    }
}

// s[r][0..32) = sum_d qt[d][r] * (kt0 | kt1)[d][0..16) for the 8 rows: two key tiles at once, so that each
// step issues 16 FMAs for 2 loads and 8 broadcasts.
ATELIER_AVX512 void score_tiles(const float* qt, int64_t d, const float* kt0, const float* kt1, float* s, int64_t lds) {
  __m512 a0[kRows], a1[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
  for (int64_t dd = 0; dd < d; ++dd) {
    const __m512 k0 = _mm512_loadu_ps(kt0 + dd * kLanes), k1 = _mm512_loadu_ps(kt1 + dd * kLanes);
    const float* qd = qt + dd * kRows;
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 qv = _mm512_set1_ps(qd[r]);
      a0[r] = _mm512_fmadd_ps(qv, k0, a0[r]);
      a1[r] = _mm512_fmadd_ps(qv, k1, a1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    _mm512_storeu_ps(s + r * lds, a0[r]);
    _mm512_storeu_ps(s + r * lds + kLanes, a1[r]);
  }
}

// o[r][c0 .. c0 + 16 NV) += sum_j p[r][j] * v[j][c0 ..] over j < n; the last register is masked by `tail`.
// The accumulators are a flat array in fully unrolled loops so that they stay in registers.
template <int NV>
ATELIER_AVX512 void pv_pass(const float* p, int64_t ldp, int64_t n, const float* v, int64_t ldv, float* o, int64_t ldo,
                            __mmask16 tail) {
  __m512 acc[kRows * NV];
#pragma GCC unroll 32
  for (int i = 0; i < kRows * NV; ++i) {
    const int r = i / NV, c = i % NV;
    acc[i] = _mm512_maskz_loadu_ps(c == NV - 1 ? tail : __mmask16(0xffff), o + r * ldo + c * kLanes);
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 vv[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) vv[c] = _mm512_maskz_loadu_ps(c == NV - 1 ? tail : __mmask16(0xffff), v + j * ldv + c * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * ldp + j]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r * NV + c] = _mm512_fmadd_ps(pr, vv[c], acc[r * NV + c]);
    }
  }
#pragma GCC unroll 32
  for (int i = 0; i < kRows * NV; ++i) {
    const int r = i / NV, c = i % NV;
    _mm512_mask_storeu_ps(o + r * ldo + c * kLanes, c == NV - 1 ? tail : __mmask16(0xffff), acc[i]);
  }
}

// Online-softmax step for one row over n scores: adds the mask, updates the running max m and sum l,
// turns s into exp(s - m) and returns the factor earlier output must be scaled by.
ATELIER_AVX512 float softmax_step(float* s, int64_t n, const float* mask, int64_t mask_stride, float* m, float* l) {
  if (mask != nullptr) {
    if (mask_stride == 0) {
      const float m0 = mask[0];
      for (int64_t j = 0; j < n; ++j) s[j] += m0;
    } else {
      for (int64_t j = 0; j < n; ++j) s[j] += mask[j];
    }
  }
  float cmax = -INFINITY;
#pragma omp simd reduction(max : cmax)
  for (int64_t j = 0; j < n; ++j) cmax = s[j] > cmax ? s[j] : cmax;
  const float m_new = std::max(*m, cmax);
  const float center = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: exps are 0, not NaN
  const float alpha = vm::exp(*m - center);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const float e = vm::exp(s[j] - center);
    s[j] = e;
    sum += e;
  }
  *l = *l * alpha + sum;
  *m = m_new;
  return alpha;
}

// Problem description shared by the workers.
struct Problem {
  int64_t b, h, sq, d, hk, sk, dv, group, tiles;
  const float *q, *v, *mask, *kt;
  Shape qs, vs, ms;
  int64_t ldq, ldv;
  float scale;
  float* out;
};

// Per-thread working set: kGroups groups of 8 query rows share each key chunk while it is in L1.
struct Scratch {
  explicit Scratch(const Problem& p)
      : qt(new float[size_t(kGroups * p.d * kRows)]),
        s(new float[size_t(kGroups * kRows * kChunk)]),
        o(new float[size_t(kGroups * kRows * p.dv)]) {}
  std::unique_ptr<float[]> qt, s, o;  // per group: qt [d][8], s [8][kChunk], o [8][dv]
  float m[kGroups * kRows], l[kGroups * kRows];
};

// P @ V for one group of 8 rows over n keys of one chunk, in passes of up to 48 value columns.
ATELIER_AVX512 void pv_chunk(const float* s, int64_t n, const float* vj, int64_t ldv, float* o, int64_t dv) {
  for (int64_t c0 = 0; c0 < dv; c0 += kMaxVecs * kLanes) {
    const int64_t cols = std::min<int64_t>(kMaxVecs * kLanes, dv - c0);
    const int nv = int((cols + kLanes - 1) / kLanes);
    const int last = int(cols - (nv - 1) * kLanes);
    const __mmask16 tail = __mmask16((1u << last) - 1u);
    if (nv == 3) pv_pass<3>(s, kChunk, n, vj + c0, ldv, o + c0, dv, tail);
    else if (nv == 2) pv_pass<2>(s, kChunk, n, vj + c0, ldv, o + c0, dv, tail);
    else pv_pass<1>(s, kChunk, n, vj + c0, ldv, o + c0, dv, tail);
  }
}

// Runs query rows [q0, q0 + rows) (rows <= kGroups * 8) of head (bi, hi).
ATELIER_AVX512 void micro_block(const Problem& p, Scratch& w, int64_t bi, int64_t hi, int64_t q0, int64_t rows) {
  const int groups = int((rows + kRows - 1) / kRows);
  const float* qb = p.q + bi * p.qs[0] + hi * p.qs[1] + q0 * p.ldq;
  for (int g = 0; g < groups; ++g)  // transposed and pre-scaled; missing rows are zero
    for (int64_t dd = 0; dd < p.d; ++dd)
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = g * kRows + r;
        w.qt[(g * p.d + dd) * kRows + r] = row < rows ? qb[row * p.ldq + dd] * p.scale : 0.0f;
      }
  std::fill(w.o.get(), w.o.get() + groups * kRows * p.dv, 0.0f);
  for (int r = 0; r < groups * kRows; ++r) {
    w.m[r] = -INFINITY;
    w.l[r] = 0.0f;
  }
  const int64_t kh = hi / p.group;
  const float* kt = p.kt + (bi * p.hk + kh) * p.tiles * p.d * kLanes;
  const float* vb = p.v + bi * p.vs[0] + kh * p.vs[1];
  for (int64_t j0 = 0; j0 < p.sk; j0 += kChunk) {
    const int64_t n = std::min(kChunk, p.sk - j0);
    for (int g = 0; g < groups; ++g) {
      float* sg = w.s.get() + g * kRows * kChunk;
      float* og = w.o.get() + g * kRows * p.dv;
      for (int64_t t = 0; t * kLanes < n; t += 2) {
        const float* t0 = kt + (j0 / kLanes + t) * p.d * kLanes;
        score_tiles(w.qt.get() + g * p.d * kRows, p.d, t0, t0 + p.d * kLanes, sg + t * kLanes, kChunk);
      }
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = g * kRows + r;
        const float* mrow = nullptr;
        if (p.mask != nullptr && row < rows) mrow = p.mask + bi * p.ms[0] + hi * p.ms[1] + (q0 + row) * p.ms[2] + j0 * p.ms[3];
        const float alpha = softmax_step(sg + r * kChunk, n, mrow, p.ms[3], &w.m[row], &w.l[row]);
        if (alpha != 1.0f)
          for (int64_t c = 0; c < p.dv; ++c) og[r * p.dv + c] *= alpha;
      }
      pv_chunk(sg, n, vb + j0 * p.ldv, p.ldv, og, p.dv);
    }
  }
  float* ob = p.out + ((bi * p.h + hi) * p.sq + q0) * p.dv;
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / w.l[r];  // 0 for a fully masked row: NaN output, as torch gives
    for (int64_t c = 0; c < p.dv; ++c) ob[r * p.dv + c] = w.o[r * p.dv + c] * inv;
  }
}

}  // namespace

void set_fused_attention(bool enabled) { g_fused_enabled = enabled; }

bool attention_fused(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) {
  if (!g_fused_enabled || !__builtin_cpu_supports("avx512f")) return false;
  if (q.size(3) > kMaxFusedHeadDim || v.size(3) > kMaxFusedHeadDim) return false;
  Problem p;
  p.b = q.size(0), p.h = q.size(1), p.sq = q.size(2), p.d = q.size(3);
  p.hk = k.size(1), p.sk = k.size(2), p.dv = v.size(3), p.group = p.h / p.hk;
  p.tiles = (p.sk + 2 * kLanes - 1) / (2 * kLanes) * 2;
  p.q = q.data<float>(), p.v = v.data<float>(), p.mask = mask.defined() ? mask.data<float>() : nullptr;
  p.qs = q.strides(), p.vs = v.strides(), p.ms = mask.defined() ? mask.strides() : Shape{0, 0, 0, 0};
  p.ldq = q.size(2) == 1 ? p.d : q.strides()[2];
  p.ldv = v.size(2) == 1 ? p.dv : v.strides()[2];
  p.scale = scale;
  p.out = out.data<float>();
  // Packed key tiles for every (batch, kv head), from the pooled allocator.
  const int64_t per_head = p.tiles * p.d * kLanes;
  Tensor packed = Tensor::empty({p.b * p.hk, per_head});
  p.kt = packed.data<float>();
  const float* kp = k.data<float>();
  const int64_t ldk = k.size(2) == 1 ? p.d : k.strides()[2];
  const int64_t qgroups = (p.sq + kTaskRows - 1) / kTaskRows;
  const int64_t tasks = p.b * p.h * qgroups;
  const double macs = double(p.b) * p.h * p.sq * p.sk * (p.d + p.dv);
#pragma omp parallel if (macs >= kMinParallelMacs)
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < p.b * p.hk; ++i)
      pack_key_tiles(packed.data<float>() + i * per_head, kp + (i / p.hk) * k.strides()[0] + (i % p.hk) * k.strides()[1], ldk, p.sk,
                     p.d, p.tiles);
    Scratch w(p);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t bh = t / qgroups, g = t % qgroups;
      const int64_t r1 = std::min(p.sq, (g + 1) * kTaskRows);
      for (int64_t r0 = g * kTaskRows; r0 < r1; r0 += kGroups * kRows)
        micro_block(p, w, bh / p.h, bh % p.h, r0, std::min<int64_t>(kGroups * kRows, r1 - r0));
    }
  }
  return true;
}

}  // namespace atelier::cpu
