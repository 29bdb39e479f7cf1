// The gated linear unit inside its product (ops::linear_glu through cuda_gemm_glu.cu, Hopper only) against the
// CPU backend, and the cases the kernel leaves to the product + glu pass.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gemm_glu.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"

namespace atelier {
namespace {

using test::random_tensor;

// The fused kernel switched on for a test (it is off by default until measured), then back.
struct FusedGluScope {
  bool was = cuda::fused_glu_enabled();
  FusedGluScope() { cuda::set_fused_glu(true); }
  ~FusedGluScope() { cuda::set_fused_glu(was); }
};

bool hopper() {
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major == 9;
}

// SD's GEGLU shapes (a 64x64 latent's tokens, 320 channels, 1280 = 4 x 320 per half), rows that are not whole
// tiles, halves that are not whole 64-column tiles, k that is not whole 64-element steps, no bias, SiLU and the
// tanh GELU; each must have run the fused kernel on an H200.
TEST(CudaOps, LinearGluInOneKernelMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  if (!hopper()) GTEST_SKIP() << "the fused GLU product is a Hopper (sm_90) kernel; this device is not one";
  FusedGluScope fused;
  struct Case { Shape x; int64_t h; bool bias; UnaryOp act; };
  const Case cases[] = {{{2, 4096, 320}, 1280, true, UnaryOp::kGelu},   {{1, 77, 64}, 96, true, UnaryOp::kGelu},
                        {{3, 100, 104}, 130, false, UnaryOp::kGelu},    {{1, 200, 640}, 2560, true, UnaryOp::kSilu},
                        {{1, 129, 1280}, 64, true, UnaryOp::kGeluTanh}, {{5, 8}, 16, true, UnaryOp::kGelu}};
  for (const Case& c : cases) {
    const int64_t k = c.x.back();
    const Tensor x = random_tensor(c.x, 51), w = random_tensor({2 * c.h, k}, 52, 1.0f / std::sqrt(float(k)));
    const Tensor b = c.bias ? random_tensor({2 * c.h}, 53, 0.5f) : Tensor();
    const auto fn = [act = c.act](const std::vector<Tensor>& in) {
      return ops::linear_glu(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), act);
    };
    const std::string what = "linear_glu " + shape_str(c.x) + " x [" + std::to_string(2 * c.h) + ", " + std::to_string(k) +
                             "]" + (c.bias ? " + bias" : "") + " act " + std::to_string(int(c.act));
    const int64_t before = cuda::fused_glu_launches();
    const std::vector<Tensor> inputs = c.bias ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x, w};
    EXPECT_PARITY(what, fn, inputs, DType::BF16);
    EXPECT_EQ(cuda::fused_glu_launches() - before, 1) << what << ": the fused kernel did not run";
  }
}

// What the kernel does not take runs as the product and the glu pass, with the same values: f16 and f32, an
// odd half width, an activation it has no instance of, and every case with the kernel switched off.
TEST(CudaOps, LinearGluOutsideTheKernelMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  const Tensor x = random_tensor({2, 33, 64}, 61), w = random_tensor({2 * 48, 64}, 62, 0.125f), b = random_tensor({96}, 63);
  const Tensor w_odd = random_tensor({2 * 37, 64}, 64, 0.125f), b_odd = random_tensor({74}, 65);
  for (bool on : {true, false}) {
    FusedGluScope scope;
    cuda::set_fused_glu(on);
    const int64_t before = cuda::fused_glu_launches();
    const auto gelu = [](const std::vector<Tensor>& in) { return ops::linear_glu(in[0], in[1], in[2], UnaryOp::kGelu); };
    const auto relu = [](const std::vector<Tensor>& in) { return ops::linear_glu(in[0], in[1], in[2], UnaryOp::kRelu); };
    EXPECT_PARITY("linear_glu f16", gelu, std::vector<Tensor>({x, w, b}), DType::F16);
    EXPECT_PARITY("linear_glu f32", gelu, std::vector<Tensor>({x, w, b}), DType::F32);
    EXPECT_PARITY("linear_glu odd half width", gelu, std::vector<Tensor>({x, w_odd, b_odd}), DType::BF16);
    EXPECT_PARITY("linear_glu relu", relu, std::vector<Tensor>({x, w, b}), DType::BF16);
    EXPECT_EQ(cuda::fused_glu_launches(), before) << "the fused kernel took a case it does not handle (on = " << on << ")";
    if (!on) EXPECT_PARITY("linear_glu bf16, kernel off", gelu, std::vector<Tensor>({x, w, b}), DType::BF16);
  }
}

}  // namespace
}  // namespace atelier
