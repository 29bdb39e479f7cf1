// Matrix products on the CPU: OpenBLAS sgemm per tile, OpenMP across tiles, bias/residual/activation
// fused into each tile while it is still in cache.
//
// Threading policy. OpenBLAS is only ever asked for single-threaded products; every parallel CPU kernel
// splits its work into tiles across one OpenMP team. Why: Debian's default libopenblas0 is the pthreads
// build, whose worker threads busy-wait after each call and compete with the OpenMP team for the same cores
// (with 2 cores, a pthreads OpenBLAS product followed by an OpenMP loop ran measurably slower than either
// alone), and a threaded sgemm called from inside an OpenMP region would oversubscribe. So:
//  - pthreads build (openblas_get_parallel() == 1): we set OpenBLAS to one thread once, at first use;
//  - OpenMP build (== 2): OpenBLAS already runs single-threaded inside our parallel regions, and we must
//    not call openblas_set_num_threads (it would also change the OpenMP team size).
// Both builds then behave identically and there is one thread pool. Splitting a product across threads
// repacks B (or A) once per thread, which costs O(K*N) against O(M*N*K/threads) of arithmetic. Measured
// (bench/ops_bench.cc, BM_GemmThenNorm_*: a 320x2880 @ 2880x4096 product then GroupNorm+SiLU, pinned to
// 2 cores): OpenMP tiles 37.8 ms, OpenBLAS's own 2 threads 38.5 ms. Equal speed, so the simpler single
// pool wins; it is also the only safe choice when ops run inside an OpenMP region. This is also why
// scripts/setup.sh keeps Debian's default (pthreads) libopenblas: either build works the same here.
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <mutex>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace atelier {
namespace cpu {
namespace {


// OpenBLAS 0.3.21 (Debian 12) does not know CPUs newer than its release (e.g. Emerald Rapids, family 6
// model 0xCF) and falls back to its "Prescott" SSE3 kernels: sgemm then runs about 7x slower than with
// its AVX-512 kernels. Unless the user chose a core with OPENBLAS_CORETYPE, re-run the library's dynamic
// core selection with the best table this CPU supports, through the entry points a DYNAMIC_ARCH build
// exports. Must run before the first BLAS call (work buffers are sized lazily on first use).
void select_blas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  if (std::strcmp(openblas_get_corename(), "Prescott") != 0) return;  // detected properly (or a real old CPU)
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    core = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    core = "Haswell";
  if (core == nullptr) return;
  using Fn = void (*)();
  auto quit = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr) return;  // not a DYNAMIC_ARCH build: nothing to re-select
  setenv("OPENBLAS_CORETYPE", core, 0);
  quit();
  init();
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace

void init_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    select_blas_core();
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
  });
}

int max_threads() { return omp_get_max_threads(); }

void sgemm_serial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  init_blas();
  if (k <= 0) {  // BLAS would scale C by beta; do it here so that an empty K is well defined
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  // Leading dimensions of a single row/column may be anything in a view; BLAS insists on >= the width.
  const int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
  lda = std::max(lda, a_cols);
  ldb = std::max(ldb, b_cols);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

}  // namespace cpu

namespace {

// Smallest row/column block a thread gets when a product is split.
constexpr int64_t kMinSplitBlock = 16;

// One rectangular piece of one batch entry of a gemm call.
struct GemmTile {
  int64_t batch, r0, r1, c0, c1;
};

// Row stride of a [.., rows, cols] operand (a single row may carry any stride in a view).
int64_t leading_dim(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  return rows == 1 ? std::max<int64_t>(cols, 1) : t.strides()[t.dim() - 2];
}

}  // namespace

// out [B, M, N] = alpha * op(a) @ op(b) + beta * out + bias, then the epilogue activation.
// a [Ba, M, K] / [Ba, K, M] (trans_a), b [Bb, K, N] / [Bb, N, K] (trans_b), Ba/Bb equal to B or 1;
// a and b have a unit last stride; out contiguous.
void CpuBackend::gemm(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmParams& p) {
  ATELIER_CHECK(out.is_contiguous() && out.dim() == 3, "gemm: out must be contiguous [B, M, N]");
  ATELIER_CHECK(a.strides()[2] == 1 || a.size(2) == 1, "gemm: a needs a unit last stride");
  ATELIER_CHECK(b.strides()[2] == 1 || b.size(2) == 1, "gemm: b needs a unit last stride");
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2);
  const int64_t k = p.trans_a ? a.size(1) : a.size(2);
  const int64_t lda = leading_dim(a), ldb = leading_dim(b);
  const int64_t sa = a.size(0) == 1 ? 0 : a.strides()[0], sb = b.size(0) == 1 ? 0 : b.strides()[0];
  const float* ap = a.data<float>();
  const float* bp = b.data<float>();
  const float* biasp = bias.defined() ? bias.data<float>() : nullptr;
  float* cp = out.data<float>();
  if (out.numel() == 0) return;
  if (p.addend.defined() && p.addend.raw() != out.raw()) copy(out, p.addend);  // then accumulate onto it (beta)

  // Tiles: each batch entry split into enough row (or column) blocks that the team has work.
  const int threads = cpu::max_threads();
  const double macs = double(m) * n * std::max<int64_t>(k, 1);
  const bool split_m = m >= n;
  const int64_t extent = split_m ? m : n;
  int64_t per_batch = 1;
  if (batch < threads && macs * batch >= cpu::kMinParallelMacs)
    per_batch = std::min<int64_t>((threads + batch - 1) / batch, std::max<int64_t>(1, extent / kMinSplitBlock));
  std::vector<GemmTile> tiles;
  tiles.reserve(size_t(batch * per_batch));
  for (int64_t i = 0; i < batch; ++i)
    for (int64_t t = 0; t < per_batch; ++t) {
      const int64_t e0 = extent * t / per_batch, e1 = extent * (t + 1) / per_batch;
      tiles.push_back(split_m ? GemmTile{i, e0, e1, 0, n} : GemmTile{i, 0, m, e0, e1});
    }
  const bool parallel = tiles.size() > 1 && macs * batch >= cpu::kMinParallelMacs;

#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (size_t ti = 0; ti < tiles.size(); ++ti) {
    const GemmTile& t = tiles[ti];
    const int64_t rows = t.r1 - t.r0, cols = t.c1 - t.c0;
    const float* at = ap + t.batch * sa + (p.trans_a ? t.r0 : t.r0 * lda);
    const float* bt = bp + t.batch * sb + (p.trans_b ? t.c0 * ldb : t.c0);
    float* ct = cp + t.batch * m * n + t.r0 * n + t.c0;
    float beta = p.beta;
    const bool prefill_bias = biasp && beta == 0.0f;
    if (prefill_bias) {  // bias enters as the beta=1 term, saving a pass
      for (int64_t r = 0; r < rows; ++r) std::copy(biasp + t.c0, biasp + t.c1, ct + r * n);
      beta = 1.0f;
    }
    cpu::sgemm_serial(p.trans_a, p.trans_b, rows, cols, k, p.alpha, at, lda, bt, ldb, beta, ct, n);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = ct + r * n;
      if (biasp && !prefill_bias)
        for (int64_t j = 0; j < cols; ++j) row[j] += biasp[t.c0 + j];
      if (p.epilogue != UnaryOp::kIdentity) cpu::unary_span(row, row, cols, p.epilogue);
    }
  }
}

}  // namespace atelier
