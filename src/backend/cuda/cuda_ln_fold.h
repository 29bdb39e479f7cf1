// A layer norm folded into the gated linear unit after it (cuda_ln_fold.cu: the rows' statistics and the folded
// weights; the product itself is cuda_gemm_wgmma.cu's GLU kernel with OwnGemmArgs::ln_rows set): its switch.
#pragma once
#include <cstdint>

namespace atelier::cuda {

// Off unless ATELIER_LN_FOLD=1 (or the setter: tests, A/B runs): CudaBackend::layer_norm_linear_glu folds the norm.
bool ln_fold_enabled();
void set_ln_fold(bool on);
// Calls that ran folded so far (tests: the case was taken).
int64_t ln_fold_calls();

}  // namespace atelier::cuda
