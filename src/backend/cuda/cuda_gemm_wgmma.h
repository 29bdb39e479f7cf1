// Matrix products of our own on Hopper's warpgroup MMA and bulk tensor copies, for the epilogues cuBLASLt lacks or
// runs slowly:
//   - a gated linear unit inside its product (GEGLU, SwiGLU; Backend::linear_glu): out = (x W_v^T + b_v) *
//     act(x W_g^T + b_g). Without it the product writes both halves ([M, 2H]) and a second pass reads them back to
//     write [M, H] (SD's GEGLU: 1.55 ms per 16-row UNet call, session 24's trace);
//   - a linear layer with bias and residual (out = x W^T + b + r): session 24 measured SD's residual products on
//     cuBLASLt's heuristics 1.15-1.96x the time of the same products without the residual;
//   - a channels-last convolution (stride 1, no dilation) as an implicit GEMM with bias and residual: the linear
//     layer's kernel with x's boxes read from the input shifted by each tap, the tensor map's zero fill as padding
//     (no im2col matrix). A candidate beside cuDNN and im2col + cuBLASLt, timed per shape (CudaBackend's conv choice);
//     for products of few tiles also split-K forms (each tile's k-steps on several SMs, the f32 parts summed in
//     order by the last one: SD's 8x8 level at 16 rows, 81 -> 53 us; docs/performance.md, session 34).
// The GLU is on by default since session 30 (ping-pong consumers: faster than cuBLASLt's product + the glu pass at
// every SD shape; docs/performance.md, session 30); the linear layer stays off (slower than cuBLASLt everywhere).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace atelier::cuda {

// Row-major bf16 operands of one product: x [m, k] (row stride ldx), w (ldw), bias, out [m, n] (ldo).
//   GLU: w [2n, k], rows [0, n) the value and [n, 2n) the gate (diffusers' GEGLU proj, torch's chunk(2, -1)),
//        optional bias [2n]: out = (x w_v^T + b_v) * act(x w_g^T + b_g);
//   linear: w [n, k], optional bias [n] and residual [m, n] (row stride ldo; may be out itself):
//        out = x w^T + bias + residual.
struct OwnGemmArgs {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  const void* residual = nullptr;  // linear only
  void* out = nullptr;
  int64_t ldx = 0, ldw = 0, ldo = 0;
  int64_t m = 0, k = 0, n = 0;
  UnaryOp act = UnaryOp::kGelu;  // GLU only
  int sm_count = 0;
  size_t max_smem = 0;
};

// One convolution: input [n][h][w][c] (dense channels-last bf16), weight [o][kh][kw][c], optional bias [o] and
// residual [n][ho][wo][o] (may be out), out [n][ho][wo][o]; stride 1, no dilation, ho = h + 2 pad_h - kh + 1 (the
// same for w). out = conv(input, weight) + bias + residual.
struct OwnConvArgs {
  const void* input = nullptr;
  // A second input side by side along channels (a skip concatenation read where it lies): input holds channels
  // [0, c1) in rows of c1, input2 [c1, c) in rows of c - c1; c1 a multiple of 64. Null: input alone (rows of c).
  const void* input2 = nullptr;
  int64_t c1 = 0;
  // A 1x1 shortcut convolution accumulated with this one (a resnet's conv2 and its conv_shortcut, the shortcut's
  // output never written): shortcut [n][ho][wo][sc_c1] and shortcut2 [n][ho][wo][sc_c - sc_c1] side by side (null:
  // shortcut alone, rows of sc_c), sc_c and sc_c1 multiples of 64, ho == h and wo == w. The weight's rows then hold
  // kh * kw * c + sc_c columns, the shortcut's last; bias is the two biases' sum.
  const void* shortcut = nullptr;
  const void* shortcut2 = nullptr;
  int64_t sc_c = 0, sc_c1 = 0;
  // An upsampler's four output phases as one product (cuda_conv_upsample.cu): o = 4 x out's channels, the weight's
  // rows phase q = 2a + b major, kh = kw = 2, pad 1, ho == h and wo == w. Phase (a, b)'s taps start a rows and b
  // columns past the padding's origin, and its pixel (i, j) is out's (2i + a, 2j + b) of [n][2h][2w][o / 4]. No
  // residual, second input or shortcut.
  bool upsample_phases = false;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const void* residual = nullptr;
  void* out = nullptr;
  int64_t n = 0, c = 0, h = 0, w = 0, o = 0, kh = 0, kw = 0, ho = 0, wo = 0;
  int pad_h = 0, pad_w = 0;
  int sm_count = 0;
  size_t max_smem = 0;
  // Split-K: each output tile's k-steps in `split` parts run on different SMs (1: none); the parts' sums meet in
  // split_workspace (conv_split_workspace_bytes, 256-byte aligned, its first conv_split_flag_bytes zero before the
  // first launch: every launch leaves them zero).
  int split = 1;
  void* split_workspace = nullptr;
};

// Enqueue the kernel; false (nothing launched) where it does not take the case: a device other than sm_90, an
// activation other than GELU (erf or tanh) and SiLU, strides or addresses that break the tensor maps' 16-byte
// rule, an odd output width or row stride; the GLU also an output or output row stride that is not 16-byte aligned
// (its tiles leave through a tensor map).
bool launch_gemm_glu(const OwnGemmArgs& a, int cc_major, cudaStream_t stream);
bool launch_gemm_linear(const OwnGemmArgs& a, int cc_major, cudaStream_t stream);
// The convolution also declines channel counts that are not multiples of 64 and output sizes whose 128 consecutive
// pixels are not one box (whole rows of one image, whole images, or a part of a row whose width is a multiple of 128).
bool launch_conv_implicit(const OwnConvArgs& a, int cc_major, cudaStream_t stream);
// Whether launch_conv_implicit takes the case (all but the tensor maps' encoding, which needs the driver).
bool conv_implicit_takes(const OwnConvArgs& a, int cc_major);
// Split-K for convolutions of at most half as many output tiles as SMs (SD's 8x8 level at 16 rows: 64 tiles for 132
// SMs): the part counts worth timing for the case (one unit per SM, two per SM; none for larger products), best guess
// first. A split
// that does not fit (the workspace's slots, 16 parts, 4 k-steps per part) is declined by launch_conv_implicit.
std::vector<int> conv_implicit_splits(const OwnConvArgs& a);
size_t conv_split_workspace_bytes(int sm_count);
size_t conv_split_flag_bytes();
// Split-K's switch (ATELIER_OWN_CONV_SPLIT=N or the setter: tests, A/B runs): 0 (default) times
// conv_implicit_splits' counts beside the other candidates in kAuto; 1 never splits; N >= 2 also makes kForce run N
// parts per tile where they fit (kForce runs no split otherwise).
int own_conv_split();
void set_own_conv_split(int split);

// On unless ATELIER_FUSED_GLU=0: ops::linear_glu runs launch_gemm_glu (or the setter: tests, benches).
bool fused_glu_enabled();
void set_fused_glu(bool on);
// Which bf16 linear products (one batch, weights [n, k], no activation) run launch_gemm_linear instead of cuBLASLt:
// those where it measured faster (default: the kernel is one more candidate when GemmEngine times a product's
// algorithms), none (ATELIER_OWN_LINEAR=0), all (=1), or all those with a residual (=residual); or the setter
// (tests, benches).
enum class OwnLinear { kTimed, kOff, kAll, kResidual };
OwnLinear own_linear_mode();
void set_own_linear(OwnLinear mode);
// Whether the mode sends a product with (residual) or without a residual to the kernel without timing it.
bool own_linear_takes(bool residual);
// Whether channels-last bf16 convolutions that launch_conv_implicit takes are timed against cuDNN and the im2col GEMM
// per shape (kAuto, default), never run it (ATELIER_OWN_CONV=0), or always do (ATELIER_OWN_CONV=force; tests).
enum class OwnConv { kAuto, kOff, kForce };
OwnConv own_conv_mode();
void set_own_conv(OwnConv mode);
// Kernels launched so far (tests: the case was taken).
int64_t fused_glu_launches();
int64_t own_linear_launches();
int64_t own_conv_launches();
int64_t own_conv_split_launches();  // of them split-K

}  // namespace atelier::cuda
