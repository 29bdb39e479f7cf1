// Helpers for the GPU tests (cuda_*_test.cc, the atelier_gpu_tests binary, ctest label `gpu`): skipping with
// the reason when no CUDA device is usable, moving tensors, and CPU<->CUDA parity checks.
//
// Parity criteria. f32: rel L2 of the CUDA result against the CPU backend's result within a tolerance
// (1e-5 unless a test says why not). bf16/f16: the CUDA op gets inputs rounded to the 16-bit dtype and
// returns a 16-bit result; its error against the CPU's f32 result on the unrounded inputs (the reference)
// must be at most twice the error of the CPU op fed the same rounded inputs, plus the rounding of the output
// itself (which the CPU's f32 output does not have): err_gpu <= 2 * err_cpu + one output ulp.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/ops.h"
#include "test_util.h"

namespace atelier::test {

inline Device cuda0() { return Device::cuda(0); }

// Why cuda:0 cannot be used ("" when it can).
inline std::string cuda_unavailable_reason() {
  if (backend_available(cuda0())) return "";
  try {
    backend_for(cuda0());
  } catch (const Error& e) {
    return e.what();
  }
  return "unknown";
}

inline cuda::CudaBackend& cuda_be() { return static_cast<cuda::CudaBackend&>(backend_for(cuda0())); }

// cuda:0's FP8 attention switched on (or off) for a scope, then back to its default (CudaBackend::
// set_fp8_attention: off until it has been measured).
struct Fp8AttentionScope {
  explicit Fp8AttentionScope(bool on) { cuda_be().set_fp8_attention(on); }
  ~Fp8AttentionScope() { cuda_be().set_fp8_attention(cuda::CudaBackend::fp8_attention_default()); }
  Fp8AttentionScope(const Fp8AttentionScope&) = delete;
  Fp8AttentionScope& operator=(const Fp8AttentionScope&) = delete;
};

// The own implicit-GEMM kernel's switches (its mode and forced split-K parts) as they were, restored when the scope
// ends: the base of the tests' scopes that turn them.
struct OwnConvScope {
  cuda::OwnConv own_conv = cuda::own_conv_mode();
  int split = cuda::own_conv_split();
  ~OwnConvScope() {
    cuda::set_own_conv(own_conv);
    cuda::set_own_conv_split(split);
  }
};

// Output rounding allowance per dtype: one unit roundoff of the stored result.
inline double output_ulp(DType t) { return t == DType::BF16 ? 1.0 / 256 : t == DType::F16 ? 1.0 / 2048 : 0.0; }

// x (host f32) rounded to dt and back: what a 16-bit input holds.
inline Tensor rounded(const Tensor& x, DType dt) {
  if (!x.defined() || dt == DType::F32 || x.dtype() != DType::F32) return x;
  return ops::cast(ops::cast(x, dt), DType::F32);
}

// The 16-bit dtypes every parity test runs beside f32.
inline constexpr DType kLowp[] = {DType::BF16, DType::F16};

// x [N, C, H, W] as a channels-last tensor of the same values (the layout the GPU keeps SD's activations in).
inline Tensor channels_last(const Tensor& x) { return ops::contiguous(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2}); }

// x (host f32) in dt on cuda:0; other dtypes (ids) move unchanged.
inline Tensor to_gpu(const Tensor& x, DType dt = DType::F32) {
  Tensor y = x.dtype() == DType::F32 && dt != DType::F32 ? ops::cast(x, dt) : x;
  return ops::to_device(y, cuda0());
}

struct ParityResult {
  double gpu_err = 0.0;  // CUDA result vs the CPU f32 reference
  double cpu_err = 0.0;  // CPU on rounded inputs vs the reference (0 for f32)
  double tol = 0.0;
  bool ok = false;
};

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs fn on host f32 inputs (the reference), on inputs rounded to dt (CPU), and on cuda:0 in dt; checks the
// criterion above (f32: gpu_err <= f32_tol) and prints the figures.
inline ParityResult check_parity(const std::string& what, const OpFn& fn, const std::vector<Tensor>& inputs, DType dt,
                                 double f32_tol = 1e-5) {
  ParityResult r;
  const Tensor ref = fn(inputs);
  std::vector<Tensor> rin, gin;
  for (const Tensor& x : inputs) {
    rin.push_back(rounded(x, dt));
    gin.push_back(x.defined() ? to_gpu(x, dt) : x);
  }
  const Tensor g = fn(gin);
  EXPECT_EQ(g.device(), cuda0()) << what;
  EXPECT_EQ(g.shape(), ref.shape()) << what;
  if (g.shape() != ref.shape()) return r;
  const std::vector<float> want = ref.to_vector();
  r.gpu_err = rel_l2(g.to_vector(), want);
  if (dt == DType::F32) {
    r.tol = f32_tol;
  } else {
    r.cpu_err = rel_l2(fn(rin).to_vector(), want);
    r.tol = 2.0 * r.cpu_err + output_ulp(dt);
  }
  r.ok = r.gpu_err <= r.tol;
  std::printf("[ parity   ] %-58s %-4s gpu %.3g  cpu(rounded in) %.3g  tol %.3g%s\n", what.c_str(),
              std::string(dtype_name(dt)).c_str(), r.gpu_err, r.cpu_err, r.tol, r.ok ? "" : "  FAIL");
  return r;
}

#define EXPECT_PARITY(what, fn, inputs, dt, ...)                                                  \
  do {                                                                                            \
    const ::atelier::test::ParityResult _r = ::atelier::test::check_parity(what, fn, inputs, dt, ##__VA_ARGS__); \
    EXPECT_TRUE(_r.ok) << (what) << " [" << ::atelier::dtype_name(dt) << "]: gpu err " << _r.gpu_err        \
                       << " > tol " << _r.tol << " (cpu err on rounded inputs " << _r.cpu_err << ")";  \
  } while (0)

}  // namespace atelier::test

// Skips the test, printing why, when cuda:0 is not usable.
#define ATELIER_REQUIRE_CUDA()                                                  \
  do {                                                                          \
    const std::string _why = ::atelier::test::cuda_unavailable_reason();        \
    if (!_why.empty()) GTEST_SKIP() << "no usable CUDA device: " << _why;       \
  } while (0)

// The same, and when cuda:0 is not a Hopper (sm_90): the wgmma/TMA kernels (attention, own GEMMs) run there only.
#define ATELIER_REQUIRE_HOPPER()                                                                           \
  do {                                                                                                     \
    ATELIER_REQUIRE_CUDA();                                                                                \
    int _major = 0;                                                                                        \
    cudaDeviceGetAttribute(&_major, cudaDevAttrComputeCapabilityMajor, 0);                                 \
    if (_major != 9) GTEST_SKIP() << "the wgmma kernels run on sm_90 only; this device is sm_" << _major << "x"; \
  } while (0)
