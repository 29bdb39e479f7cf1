// A layer norm folded into the gated linear unit after it (cuda_ln_fold.cu): the rows' statistics and the folded
// weights; the product itself is cuda_gemm_wgmma.cu's GLU kernel with OwnGemmArgs::ln_rows set.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace atelier::cuda {

// Off unless ATELIER_LN_FOLD=1 (or the setter: tests, A/B runs): CudaBackend::layer_norm_linear_glu folds the norm.
bool ln_fold_enabled();
void set_ln_fold(bool on);
// Calls that ran folded so far (tests: the case was taken).
int64_t ln_fold_calls();

// stats [rows][2] f32 = (rstd, -mean rstd) of each row of x [rows, d] (bf16, d a multiple of 8, 16-byte aligned).
void launch_ln_row_stats(float* stats, const void* x, int64_t rows, int64_t d, float eps, cudaStream_t stream);
// w [rows, k], gamma and beta [k], bias [rows] (bf16; beta and bias may be null) -> wf [rows, k] bf16 = w gamma,
// g [rows] f32 = wf's row sums as rounded, b [rows] f32 = w beta + bias.
void launch_ln_fold_weights(void* wf, float* g, float* b, const void* w, const void* gamma, const void* beta, const void* bias,
                            int64_t rows, int64_t k, cudaStream_t stream);

}  // namespace atelier::cuda
