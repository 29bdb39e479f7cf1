// The gated linear unit inside its product (ops::linear_glu through cuda_gemm_wgmma.cu, Hopper only) against the
// CPU backend, and the cases the kernel leaves to the product + glu pass.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
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

// SD's GEGLU shapes (a 64x64 latent's tokens, 320 channels, 1280 = 4 x 320 per half), rows that are not whole
// tiles, halves that are not whole 64-column tiles (the bulk store of the last tile clipped), k that is not whole
// 64-element steps, no bias, SiLU and the tanh GELU (also at half widths of 80, 240 and 400: 1.25, 3.75 and 6.25 tiles);
// each must have run the fused kernel on an H200.
TEST(CudaOps, LinearGluInOneKernelMatchesCpu) {
  ATELIER_REQUIRE_HOPPER();
  FusedGluScope fused;
  struct Case { Shape x; int64_t h; bool bias; UnaryOp act; };
  const Case cases[] = {{{2, 4096, 320}, 1280, true, UnaryOp::kGelu},   {{1, 77, 64}, 96, true, UnaryOp::kGelu},
                        {{3, 100, 104}, 136, false, UnaryOp::kGelu},    {{1, 200, 640}, 2560, true, UnaryOp::kSilu},
                        {{1, 129, 1280}, 64, true, UnaryOp::kGeluTanh}, {{5, 8}, 16, true, UnaryOp::kGelu},
                        {{3, 100, 104}, 240, false, UnaryOp::kGelu},    {{1, 129, 1280}, 80, true, UnaryOp::kGeluTanh},
                        {{2, 77, 328}, 400, true, UnaryOp::kSilu}};
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
// odd half width, an even one whose rows are not 16-byte multiples (the output's tensor map needs them), an
// activation it has no instance of, and every case with the kernel switched off.
TEST(CudaOps, LinearGluOutsideTheKernelMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  const Tensor x = random_tensor({2, 33, 64}, 61), w = random_tensor({2 * 48, 64}, 62, 0.125f), b = random_tensor({96}, 63);
  const Tensor w_odd = random_tensor({2 * 37, 64}, 64, 0.125f), b_odd = random_tensor({74}, 65);
  const Tensor w_even = random_tensor({2 * 130, 64}, 66, 0.125f), b_even = random_tensor({260}, 67);
  for (bool on : {true, false}) {
    FusedGluScope scope;
    cuda::set_fused_glu(on);
    const int64_t before = cuda::fused_glu_launches();
    const auto gelu = [](const std::vector<Tensor>& in) { return ops::linear_glu(in[0], in[1], in[2], UnaryOp::kGelu); };
    const auto relu = [](const std::vector<Tensor>& in) { return ops::linear_glu(in[0], in[1], in[2], UnaryOp::kRelu); };
    EXPECT_PARITY("linear_glu f16", gelu, std::vector<Tensor>({x, w, b}), DType::F16);
    EXPECT_PARITY("linear_glu f32", gelu, std::vector<Tensor>({x, w, b}), DType::F32);
    EXPECT_PARITY("linear_glu odd half width", gelu, std::vector<Tensor>({x, w_odd, b_odd}), DType::BF16);
    EXPECT_PARITY("linear_glu half width 130", gelu, std::vector<Tensor>({x, w_even, b_even}), DType::BF16);
    EXPECT_PARITY("linear_glu relu", relu, std::vector<Tensor>({x, w, b}), DType::BF16);
    EXPECT_EQ(cuda::fused_glu_launches(), before) << "the fused kernel took a case it does not handle (on = " << on << ")";
    if (!on) EXPECT_PARITY("linear_glu bf16, kernel off", gelu, std::vector<Tensor>({x, w, b}), DType::BF16);
  }
}

// The own linear kernel switched on for a test, then back.
struct OwnLinearScope {
  cuda::OwnLinear was = cuda::own_linear_mode();
  explicit OwnLinearScope(cuda::OwnLinear mode) { cuda::set_own_linear(mode); }
  ~OwnLinearScope() { cuda::set_own_linear(was); }
};

// Linear layers at SD's shapes with bias, with a residual (read from a separate tensor, as ops::linear_residual
// passes it, and accumulated in place: beta = 1 onto the output), odd rows, widths that are not whole 128-column
// tiles (nor whole 32-column boxes of the staged output), k that is not whole 64-element steps, no bias; each must
// have run the kernel. An odd width, a width whose rows are not 16-byte multiples (the output's tensor map needs
// them) and f16 are left to cuBLASLt.
TEST(CudaOps, OwnLinearKernelMatchesCpu) {
  ATELIER_REQUIRE_HOPPER();
  OwnLinearScope own(cuda::OwnLinear::kAll);
  struct Case { Shape x; int64_t n; bool bias; };
  const Case cases[] = {{{2, 4096, 320}, 1280, true}, {{1, 16384, 640}, 640, true}, {{1, 77, 104}, 96, true},
                        {{3, 50, 1280}, 328, false}, {{1, 5, 8}, 8, true}};
  for (const Case& c : cases) {
    const int64_t k = c.x.back();
    Shape out_shape = c.x;
    out_shape.back() = c.n;
    const Tensor x = random_tensor(c.x, 71), w = random_tensor({c.n, k}, 72, 1.0f / std::sqrt(float(k)));
    const Tensor b = c.bias ? random_tensor({c.n}, 73, 0.5f) : Tensor(), r = random_tensor(out_shape, 74);
    const std::string what = "own linear " + shape_str(c.x) + " -> " + std::to_string(c.n) + (c.bias ? " + bias" : "");
    const auto plain = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); };
    const auto resid = [](const std::vector<Tensor>& in) { return ops::linear_residual(in[0], in[1], in[2], in[3]); };
    // beta = 1 onto the output itself: the residual copied into the output first, as an FP8-free accumulate does.
    const auto in_place = [](const std::vector<Tensor>& in) {
      Tensor acc = ops::clone(in[3]);
      Tensor acc3 = acc.reshape({1, acc.numel() / acc.size(-1), acc.size(-1)});
      GemmParams gp;
      gp.trans_b = true;
      gp.beta = 1.0f;
      const Tensor x3 = in[0].reshape({1, acc3.size(1), in[0].size(-1)});
      backend_for(in[0].device()).gemm(acc3, x3, in[1].unsqueeze(0), in[2], gp);
      return acc;
    };
    const int64_t before = cuda::own_linear_launches();
    EXPECT_PARITY(what, plain, std::vector<Tensor>({x, w, b}), DType::BF16);
    EXPECT_PARITY(what + " + residual", resid, std::vector<Tensor>({x, w, b, r}), DType::BF16);
    EXPECT_PARITY(what + " + residual in place", in_place, std::vector<Tensor>({x, w, b, r}), DType::BF16);
    EXPECT_EQ(cuda::own_linear_launches() - before, 3) << what << ": the own kernel did not run every time";
  }
  const Tensor x = random_tensor({9, 64}, 75), w = random_tensor({37, 64}, 76, 0.125f), b = random_tensor({37}, 77);
  const auto plain = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); };
  const int64_t before = cuda::own_linear_launches();
  EXPECT_PARITY("own linear, odd width", plain, std::vector<Tensor>({x, w, b}), DType::BF16);
  EXPECT_PARITY("own linear, width 36", plain, std::vector<Tensor>({x, random_tensor({36, 64}, 84, 0.125f), random_tensor({36}, 85)}), DType::BF16);
  EXPECT_PARITY("own linear, f16", plain, std::vector<Tensor>({x, random_tensor({36, 64}, 78, 0.125f), random_tensor({36}, 79)}), DType::F16);
  EXPECT_EQ(cuda::own_linear_launches(), before) << "the own kernel took a case it does not handle";
  // ATELIER_OWN_LINEAR=residual: only the products with a residual.
  cuda::set_own_linear(cuda::OwnLinear::kResidual);
  const Tensor xe = random_tensor({9, 64}, 80), we = random_tensor({40, 64}, 81, 0.125f), be = random_tensor({40}, 82);
  const Tensor re = random_tensor({9, 40}, 83);
  const auto resid = [](const std::vector<Tensor>& in) { return ops::linear_residual(in[0], in[1], in[2], in[3]); };
  EXPECT_PARITY("own linear, residual mode, no residual", plain, std::vector<Tensor>({xe, we, be}), DType::BF16);
  EXPECT_EQ(cuda::own_linear_launches(), before) << "the residual mode took a product without a residual";
  EXPECT_PARITY("own linear, residual mode, residual", resid, std::vector<Tensor>({xe, we, be, re}), DType::BF16);
  EXPECT_EQ(cuda::own_linear_launches(), before + 1) << "the residual mode left a residual product to cuBLASLt";
}

// The default mode: a product of at least 1 GFLOP is timed once on cuBLASLt and on the own kernel (the kernel must
// have run while it was timed), and whichever was faster gives CPU's values, with a bias and with a residual, at
// the first call (the timing's) and at the next (the chosen kernel's).
TEST(CudaOps, OwnLinearTimedAgainstCublasMatchesCpu) {
  ATELIER_REQUIRE_HOPPER();
  OwnLinearScope timed(cuda::OwnLinear::kTimed);
  const Tensor x = random_tensor({1, 8200, 328}, 91), w = random_tensor({344, 328}, 92, 1.0f / std::sqrt(328.0f));
  const Tensor b = random_tensor({344}, 93, 0.5f), r = random_tensor({1, 8200, 344}, 94);
  const auto plain = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); };
  const auto resid = [](const std::vector<Tensor>& in) { return ops::linear_residual(in[0], in[1], in[2], in[3]); };
  for (int call = 0; call < 2; ++call) {
    const int64_t before = cuda::own_linear_launches();
    EXPECT_PARITY("timed linear, call " + std::to_string(call), plain, std::vector<Tensor>({x, w, b}), DType::BF16);
    EXPECT_PARITY("timed linear + residual, call " + std::to_string(call), resid, std::vector<Tensor>({x, w, b, r}), DType::BF16);
    if (call == 0) EXPECT_GE(cuda::own_linear_launches() - before, 2) << "the own kernel was not timed";
  }
}

}  // namespace
}  // namespace atelier
