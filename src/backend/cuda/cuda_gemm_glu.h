// A gated linear unit inside its product (GEGLU, SwiGLU): out = (x W_v^T + b_v) * act(x W_g^T + b_g) in one
// Hopper kernel of ours (wgmma, TMA), for Backend::linear_glu. cuBLASLt has no such epilogue: without it the
// product writes both halves ([M, 2H]) and a second pass reads them back to write [M, H] (SD's GEGLU: 1.55 ms
// per 16-row UNet call, session 24's trace).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace atelier::cuda {

// Row-major bf16 operands: x [m, k] (row stride ldx), w [2h, k] (ldw; rows [0, h) the value, [h, 2h) the gate:
// diffusers' GEGLU proj and torch's chunk(2, -1)), optional bias [2h], out [m, h] (ldo).
struct GluGemmArgs {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  int64_t ldx = 0, ldw = 0, ldo = 0;
  int64_t m = 0, k = 0, h = 0;
  UnaryOp act = UnaryOp::kGelu;
  int sm_count = 0;
  size_t max_smem = 0;
};

// Enqueues the kernel; false (nothing launched) where it does not take the case: a device other than sm_90, an
// activation other than GELU (erf or tanh) and SiLU, strides or addresses that break the tensor maps' 16-byte
// rule, an odd h or ldo.
bool launch_gemm_glu(const GluGemmArgs& a, int cc_major, cudaStream_t stream);

// Off unless ATELIER_FUSED_GLU=1 (or the setter: tests, benches) until it is measured against cuBLASLt + the
// GLU pass on the H200 (docs/cuda.md, session 25).
bool fused_glu_enabled();
void set_fused_glu(bool on);
// Kernels launched so far (tests: the case was taken).
int64_t fused_glu_launches();

}  // namespace atelier::cuda
