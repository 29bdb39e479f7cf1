// FP8 (e4m3) linear layers on cuda:0 against the CPU backend: row-wise quantization byte for byte (both
// divide with IEEE rounding and round to nearest even), linear_fp8 through cuBLASLt's FP8 tensor cores (or
// the dequantizing fallback where cuBLASLt declines a shape) within bf16 output rounding, and the FLUX
// fixture's transformer with FP8 blocks on both backends. Skips with the reason when cuda:0 is not usable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_sdpa_fp8.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "models/common/layers.h"
#include "models/common/weights.h"
#include "models/flux/flux_transformer.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::random_tensor;
using test::to_gpu;

// linear_fp8 on the GPU (bf16 activations and output) against the CPU's on the same bf16-rounded inputs: the
// quantized operands are identical, so what differs is the accumulation order, cuBLASLt's fast FP8
// accumulation and the bf16 output (2^-9 relative per element).
constexpr double kFp8ParityTol = 8e-3;

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = ops::to_device(t, Device::cpu());
  std::vector<uint8_t> v(size_t(h.numel()));
  std::memcpy(v.data(), h.raw(), v.size());
  return v;
}

TEST(CudaFp8, QuantizeRowsMakesTheCpuBytes) {
  ATELIER_REQUIRE_CUDA();
  // Rows in registers (3072, 12288, 15360, 18432 columns), the two-read kernel's vector path (40960 columns: more
  // than the 4096 vectors a block holds) and its scalar path (37); a row of zeros; large and tiny magnitudes;
  // rows scaled to 1e-15 and 1e-25 (scales far below 1: powers of two, so the reciprocal stays exact).
  for (const Shape& shape : {Shape{9, 3072}, Shape{4, 12288}, Shape{5, 15360}, Shape{5, 37}, Shape{1, 18432}, Shape{2, 40960}}) {
    Tensor raw = random_tensor(shape, 1, 5.0f);
    float* p = raw.data<float>();
    for (int64_t c = 0; c < shape[1]; ++c) p[c] = 0.0f;
    if (shape[0] > 2) p[shape[1] + 3] = 3.0e4f, p[2 * shape[1]] = 1.0e-6f;
    if (shape[0] > 4)
      for (int64_t c = 0; c < shape[1]; ++c) p[3 * shape[1] + c] *= 1e-15f, p[4 * shape[1] + c] *= 1e-25f;
    const Tensor x = test::rounded(raw, DType::BF16);  // the values both backends see
    const auto [qc, sc] = ops::quantize_rows_fp8(x);
    const auto [qg, sg] = ops::quantize_rows_fp8(to_gpu(x, DType::BF16));
    EXPECT_EQ(bytes_of(qg), bytes_of(qc)) << shape_str(shape);
    EXPECT_EQ(ops::to_device(sg, Device::cpu()).to_vector(), sc.to_vector()) << shape_str(shape);
  }
}

// norm_modulate_fp8 in one pass (the vector kernel quantizes the rows it holds) against its two passes
// (norm_modulate, then quantize_rows_fp8: set_fused_fp8_norm_modulate(false)): the same result bits, the same
// e4m3 bytes and row scales, for FLUX's adaLN (layer norm, scale, shift), Z-Image's (RMS with gamma, scale)
// and a gated residual; 3072 and 40 columns take the fused kernel (3 x 401 rows: blocks of four rows), 18 the
// two passes either way; a zero row.
TEST(CudaFp8, NormModulateFp8InOnePassMakesTheBytesOfTwo) {
  ATELIER_REQUIRE_CUDA();
  cuda::CudaBackend& be = test::cuda_be();
  for (const Shape& s : {Shape{2, 9, 3072}, Shape{3, 401, 3072}, Shape{1, 7, 40}, Shape{1, 3, 18}}) {
    const int64_t d = s[2];
    Tensor raw = random_tensor(s, 111, 3.0f);
    // Row 0 of x: zeros. Where the output row stays zero (RMS norm with scale only) its scale is 1.
    for (int64_t c = 0; c < d; ++c) raw.data<float>()[c] = 0.0f;
    for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
      const auto dev = [&](const Tensor& t) { return to_gpu(test::rounded(t, dt), dt); };
      const Tensor x = dev(raw), res = dev(random_tensor(s, 112)), gamma = dev(random_tensor({d}, 113));
      const Tensor scale = dev(random_tensor({s[0], 1, d}, 114)), shift = dev(random_tensor({s[0], 1, d}, 115));
      const Tensor gate = dev(random_tensor({s[0], 1, d}, 116));
      const struct {
        const char* what;
        NormKind kind;
        Tensor gamma;
        NormModulation m;
      } cases[] = {{"layer * (1 + scale) + shift", NormKind::kLayer, Tensor(), {.scale = scale, .shift = shift}},
                   {"rms * gamma * (1 + scale)", NormKind::kRms, gamma, {.scale = scale}},
                   {"res + gate * x", NormKind::kNone, Tensor(), {.gate = gate, .residual = res}}};
      for (const auto& c : cases) {
        const std::string what = std::string(c.what) + " " + shape_str(s) + " " + std::string(dtype_name(dt));
        be.set_fused_fp8_norm_modulate(true);
        const ops::Fp8Rows one = ops::norm_modulate_fp8(x, c.kind, 1e-6f, c.gamma, c.m);
        // The e4m3 rows alone (the 16-bit rows left unwritten): the same bytes and scales.
        const ops::Fp8Rows rows_only = ops::norm_modulate_fp8(x, c.kind, 1e-6f, c.gamma, c.m, /*keep_values=*/false);
        EXPECT_FALSE(rows_only.x_values) << what;
        EXPECT_EQ(bytes_of(rows_only.q), bytes_of(one.q)) << what;
        EXPECT_EQ(ops::to_device(rows_only.scale, Device::cpu()).to_vector(), ops::to_device(one.scale, Device::cpu()).to_vector()) << what;
        be.set_fused_fp8_norm_modulate(false);
        const ops::Fp8Rows two = ops::norm_modulate_fp8(x, c.kind, 1e-6f, c.gamma, c.m);
        be.set_fused_fp8_norm_modulate(true);
        EXPECT_EQ(bytes_of(ops::cast(one.x, DType::F32)), bytes_of(ops::cast(two.x, DType::F32))) << what;
        EXPECT_EQ(bytes_of(one.q), bytes_of(two.q)) << what;
        EXPECT_EQ(ops::to_device(one.scale, Device::cpu()).to_vector(), ops::to_device(two.scale, Device::cpu()).to_vector()) << what;
        if (c.kind == NormKind::kRms)
          EXPECT_EQ(ops::to_device(one.scale, Device::cpu()).to_vector()[0], 1.0f) << what << ": the zero row's scale";
      }
    }
  }
}

// norm_modulate's vector kernels specialised for the operand combinations the models use (absent operands
// compiled out) against the form that tests its pointers at run time: the same 16-bit rows, e4m3 bytes and row
// scales, for every kind, with and without gamma, and every subset of scale / shift / gate / residual (those
// without a kernel of their own run the run-time form both ways); rows of 3072 (four vectors per thread) and 40
// (one), bf16 and f16.
TEST(CudaFp8, NormModulateSpecializedKernelsMakeTheBytesOfTheGeneralOne) {
  ATELIER_REQUIRE_CUDA();
  cuda::CudaBackend& be = test::cuda_be();
  struct Restore {
    cuda::CudaBackend& be;
    ~Restore() { be.set_specialized_norm_modulate(true); }
  } restore{be};
  int combos = 0;
  for (const Shape& s : {Shape{2, 9, 3072}, Shape{1, 7, 40}}) {
    const int64_t d = s[2];
    for (DType dt : {DType::BF16, DType::F16}) {
      const auto dev = [&](const Tensor& t) { return to_gpu(test::rounded(t, dt), dt); };
      const Tensor x = dev(random_tensor(s, 121, 3.0f)), res = dev(random_tensor(s, 122)), gamma = dev(random_tensor({d}, 123));
      const Tensor vecs[] = {dev(random_tensor({s[0], 1, d}, 124)), dev(random_tensor({s[0], 1, d}, 125)),
                             dev(random_tensor({s[0], 1, d}, 126))};  // scale, shift, gate
      for (NormKind kind : {NormKind::kLayer, NormKind::kRms, NormKind::kNone})
        for (bool with_gamma : {false, true})
          for (unsigned mods = 0; mods < 16; ++mods) {
            if ((kind == NormKind::kNone && with_gamma) || ((mods & 4) && !(mods & 8))) continue;  // (a gate needs a residual)
            const NormModulation m{.scale = mods & 1 ? vecs[0] : Tensor(), .shift = mods & 2 ? vecs[1] : Tensor(),
                                   .gate = mods & 4 ? vecs[2] : Tensor(), .residual = mods & 8 ? res : Tensor()};
            const Tensor g = with_gamma ? gamma : Tensor();
            const std::string what = "kind " + std::to_string(int(kind)) + (with_gamma ? " gamma" : "") + " mods " +
                                     std::to_string(mods) + " " + shape_str(s) + " " + std::string(dtype_name(dt));
            be.set_specialized_norm_modulate(true);
            const ops::Fp8Rows a = ops::norm_modulate_fp8(x, kind, 1e-6f, g, m);
            const Tensor a16 = ops::norm_modulate(x, kind, 1e-6f, g, m);
            be.set_specialized_norm_modulate(false);
            const ops::Fp8Rows b = ops::norm_modulate_fp8(x, kind, 1e-6f, g, m);
            const Tensor b16 = ops::norm_modulate(x, kind, 1e-6f, g, m);
            EXPECT_EQ(bytes_of(ops::cast(a16, DType::F32)), bytes_of(ops::cast(b16, DType::F32))) << what;
            EXPECT_EQ(bytes_of(ops::cast(a.x, DType::F32)), bytes_of(ops::cast(b.x, DType::F32))) << what;
            EXPECT_EQ(bytes_of(a.q), bytes_of(b.q)) << what;
            EXPECT_EQ(ops::to_device(a.scale, Device::cpu()).to_vector(), ops::to_device(b.scale, Device::cpu()).to_vector()) << what;
            ++combos;
          }
    }
  }
  std::printf("[ figures  ] %d norm_modulate calls compared, specialised against run-time form\n", combos);
}

TEST(CudaFp8, LinearMatchesTheCpu) {
  ATELIER_REQUIRE_CUDA();
  struct Case { int64_t m, k, n; UnaryOp act; bool bias, residual; };
  const Case cases[] = {
      {512, 3072, 3072, UnaryOp::kIdentity, true, false},  // a DiT projection
      {256, 3072, 1536, UnaryOp::kGeluTanh, true, false},  // MLP up with the fused GELU
      {256, 1536, 3072, UnaryOp::kIdentity, false, true},  // MLP down onto a residual
      {1, 3072, 18432, UnaryOp::kIdentity, true, false},   // adaLN modulation: one row (the GEMV kernel)
      {1, 1024, 640, UnaryOp::kSilu, true, true},          // one row with an activation and a residual
      {77, 40, 24, UnaryOp::kSilu, true, false},           // odd sizes: cuBLASLt declines, the fallback runs
  };
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  const bool hopper = prop.major >= 9;  // FP8 tensor cores: cuBLASLt must not need the dequantizing fallback
  for (const Case& c : cases) {
    auto& stats = cuda::fp8_gemm_stats();
    const int64_t outer0 = stats.outer_vector, unscaled0 = stats.unscaled_then_epilogue, deq0 = stats.dequantized, gemv0 = stats.gemv;
    const Tensor x = test::rounded(random_tensor({c.m, c.k}, 2), DType::BF16);
    const Tensor w = random_tensor({c.n, c.k}, 3, 1.0f / std::sqrt(float(c.k)));
    const Tensor b = c.bias ? test::rounded(random_tensor({c.n}, 4), DType::BF16) : Tensor();
    const Tensor r = c.residual ? test::rounded(random_tensor({c.m, c.n}, 5), DType::BF16) : Tensor();
    const auto [wq, ws] = ops::quantize_rows_fp8(w);
    const Tensor want = ops::linear_fp8(x, wq, ws, b, c.act, r);
    const Tensor got = ops::linear_fp8(to_gpu(x, DType::BF16), ops::to_device(wq, test::cuda0()), ops::to_device(ws, test::cuda0()),
                                       c.bias ? to_gpu(b, DType::BF16) : Tensor(), c.act,
                                       c.residual ? to_gpu(r, DType::BF16) : Tensor());
    ASSERT_EQ(got.dtype(), DType::BF16);
    const double err = test::rel_l2(ops::cast(got, DType::F32).to_vector(), want.to_vector());
    const Tensor full = c.residual ? ops::linear_residual(x, w, b, r) : ops::linear(x, w, b, c.act);
    const double vs_full = test::rel_l2(want.to_vector(), full.to_vector());
    const char* path = stats.gemv > gemv0                   ? "FP8 GEMV kernel"
                       : stats.outer_vector > outer0 ? "cuBLASLt outer-vector scales"
                       : stats.unscaled_then_epilogue > unscaled0 ? "cuBLASLt unscaled + scale epilogue"
                       : stats.dequantized > deq0 ? "dequantized bf16 GEMM" : "?";
    std::printf("[ figures  ] linear_fp8 %lldx%lldx%lld (%s): GPU vs CPU rel L2 %.3g (fp8 vs f32 layer %.3g)\n",
                (long long)c.m, (long long)c.k, (long long)c.n, path, err, vs_full);
    if (hopper && c.k % 16 == 0 && c.n % 16 == 0) EXPECT_EQ(stats.dequantized, deq0) << "FP8 tensor cores unused";
    if (c.m == 1) EXPECT_EQ(stats.gemv, gemv0 + 1) << "the one-row product did not take the GEMV kernel";
    EXPECT_LE(err, kFp8ParityTol) << c.m << "x" << c.k << "x" << c.n;
  }
}

// An adaLN gated residual branch (FLUX's output projections with --dtype fp8): residual + gate * layer(x), the
// gate folded into the product's column scales and bias and the product accumulated onto the residual in place
// (one sample, a residual nothing else holds); a residual still held elsewhere, or a batch of two, gets a fresh
// result. Against the CPU's definition (the product, then the gated pass, in f32); a large bias and gates far
// from 1 make a missing or doubled gating O(1).
TEST(CudaFp8, GatedResidualMatchesTheCpu) {
  ATELIER_REQUIRE_CUDA();
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  constexpr int64_t kRows = 300, kIn = 512, kOut = 384;
  Linear l{random_tensor({kOut, kIn}, 21, 1.0f / std::sqrt(float(kIn))), test::rounded(random_tensor({kOut}, 22, 4.0f), DType::BF16),
           Tensor()};
  l.quantize_fp8();
  const Linear g{ops::to_device(l.weight, test::cuda0()), to_gpu(l.bias, DType::BF16), ops::to_device(l.weight_scale, test::cuda0())};
  for (int64_t batch : {1, 2}) {
    const Tensor x = test::rounded(random_tensor({batch, kRows, kIn}, 23), DType::BF16);
    const Tensor res = test::rounded(random_tensor({batch, kRows, kOut}, 24), DType::BF16);
    const Tensor gate = test::rounded(random_tensor({batch, 1, kOut}, 25, 2.0f), DType::BF16);
    const std::vector<float> want = l.gated_residual(Tensor(res), gate, ops::Fp8Rows{x, Tensor(), Tensor()}).to_vector();
    const Tensor gres = to_gpu(res, DType::BF16), ggate = to_gpu(gate, DType::BF16);
    const ops::Fp8Rows rows{to_gpu(x, DType::BF16), Tensor(), Tensor()};
    auto& stats = cuda::fp8_gemm_stats();
    // A residual nothing else holds: accumulated in place at batch 1.
    const int64_t gated0 = stats.gated, outer0 = stats.outer_vector;
    Tensor mine = ops::clone(gres);
    const void* where = mine.raw();
    const Tensor got = g.gated_residual(std::move(mine), ggate, rows);
    const double err = test::rel_l2(ops::cast(got, DType::F32).to_vector(), want);
    std::printf("[ figures  ] gated residual batch %lld (%s%s): GPU vs CPU rel L2 %.3g\n", (long long)batch,
                stats.gated > gated0 ? "gate folded into the product" : "product, then the gated pass",
                stats.outer_vector > outer0 ? ", cuBLASLt outer-vector scales" : "", err);
    EXPECT_LE(err, kFp8ParityTol) << "batch " << batch;
    if (batch == 1 && prop.major >= 9) {
      EXPECT_EQ(stats.gated, gated0 + 1) << "the gate was not folded into the product";
      EXPECT_EQ(got.raw(), where) << "not accumulated onto the residual in place";
    }
    if (batch > 1) EXPECT_EQ(stats.gated, gated0) << "one product cannot carry two samples' gates";
    // A residual still held (gres): left as it was, the same values in a fresh tensor.
    Tensor shared = gres;
    const Tensor fresh = g.gated_residual(std::move(shared), ggate, rows);
    EXPECT_NE(fresh.raw(), gres.raw());
    EXPECT_EQ(ops::cast(gres, DType::F32).to_vector(), res.to_vector()) << "a residual held elsewhere was written";
    EXPECT_LE(test::rel_l2(ops::cast(fresh, DType::F32).to_vector(), want), kFp8ParityTol) << "batch " << batch;
  }
}

TEST(CudaFp8, LinearOnAColumnViewOfTheWeight) {
  ATELIER_REQUIRE_CUDA();
  // FLUX's single blocks: proj_out over [attention | mlp] as two products over the weight's column blocks.
  Linear l{random_tensor({256, 1280}, 6, 0.03f), test::rounded(random_tensor({256}, 7), DType::BF16), Tensor()};
  l.quantize_fp8();
  const Tensor x = test::rounded(random_tensor({64, 1024}, 8), DType::BF16);
  const Tensor want = l.input_columns(256, 1024)(x);
  Linear g{ops::to_device(l.weight, test::cuda0()), Tensor(), ops::to_device(l.weight_scale, test::cuda0())};
  const Tensor got = g.input_columns(256, 1024)(to_gpu(x, DType::BF16));
  EXPECT_LE(test::rel_l2(ops::cast(got, DType::F32).to_vector(), want.to_vector()), kFp8ParityTol);
}

// FP8 attention (the DiT blocks' with --dtype fp8) on the GPU against the CPU's definition: the same per-tensor
// quantization of q, k, v; the CPU then computes in f32, cuDNN's FP8 kernel takes the probabilities and the
// output through e4m3 as well. e4m3 keeps 3 mantissa bits (a relative rounding error of up to 2^-4, ~2.5% RMS
// over many values), and O's rounding is not averaged away: rel L2 ~0.03 is the format, a wrong scale, layout
// or head gives O(1). On Hopper the FP8 path must run (not the 16-bit fallback).
constexpr double kFp8AttentionTol = 0.05;

// max |x| over a CPU tensor: q/k bounds (Fp8Bounds) above the data's own amax.
float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (float x : t.to_vector()) m = std::max(m, std::fabs(x));
  return m;
}

TEST(CudaFp8, AttentionMatchesTheCpu) {
  ATELIER_REQUIRE_CUDA();
  cuda::CudaBackend& be = test::cuda_be();
  const test::Fp8AttentionScope fp8_attention(true);  // on by default; ATELIER_FP8_ATTENTION=0 would turn it off
  std::string why;
  {
    const Tensor probe = to_gpu(random_tensor({1, 1, 32, 64}, 1), DType::BF16);
    Tensor out = Tensor::empty(probe.shape(), DType::BF16, test::cuda0());
    if (!be.fp8_attention_takes(out, probe, probe, probe, &why)) GTEST_SKIP() << "no FP8 attention here: " << why;
  }
  struct Case { int64_t b, h, sq, sk, d; };
  // FLUX-like (head dim 128, queries as a strided view), unequal lengths at head dim 64, flux-tiny's head dim 16.
  for (const Case& c : {Case{1, 4, 512, 512, 128}, Case{2, 3, 200, 333, 64}, Case{1, 2, 24, 24, 16}}) {
    const Tensor q_rows = test::rounded(random_tensor({c.b, c.sq, c.h, c.d}, 21, 2.0f), DType::BF16);
    const Tensor q = q_rows.permute({0, 2, 1, 3});  // [B, H, Sq, D] with the heads' stride of a merged layout
    const Tensor k = test::rounded(random_tensor({c.b, c.h, c.sk, c.d}, 22, 2.0f), DType::BF16);
    const Tensor v = test::rounded(random_tensor({c.b, c.h, c.sk, c.d}, 23, 3.0f), DType::BF16);
    const Tensor want = ops::attention_merged_fp8(q, k, v);
    const Tensor exact = ops::attention_merged(q, k, v);
    const int64_t runs0 = cuda::sdpa_fp8_stats().runs;
    const Tensor gq = to_gpu(q_rows, DType::BF16).permute({0, 2, 1, 3});
    const Tensor got = ops::attention_merged_fp8(gq, to_gpu(k, DType::BF16), to_gpu(v, DType::BF16));
    ASSERT_EQ(got.shape(), want.shape());
    const std::vector<float> g = ops::cast(got, DType::F32).to_vector();
    if (cuda::sdpa_fp8_stats().runs == runs0) {
      // Declined: only the small head dims may be (FLUX's and Z-Image's 128 must run in FP8); the 16-bit
      // attention then ran on q, k, v themselves.
      Tensor probe_out = Tensor::empty(gq.shape(), DType::BF16, test::cuda0());
      be.fp8_attention_takes(probe_out, gq, gq, gq, &why);
      std::printf("[ figures  ] attention fp8 d%lld: cuDNN declined (%s); 16-bit attention vs f32 rel L2 %.3g\n", (long long)c.d,
                  why.c_str(), test::rel_l2(g, exact.to_vector()));
      ASSERT_NE(c.d, 128) << "the FP8 path did not run at head dim 128 (ATELIER_CUDNN_LOG=1 says why)";
      EXPECT_LE(test::rel_l2(g, exact.to_vector()), 2e-2);
      continue;
    }
    const double err = test::rel_l2(g, want.to_vector());
    std::printf("[ figures  ] attention fp8 %lldx%lldx%lldx%lld d%lld: GPU vs CPU rel L2 %.3g; GPU fp8 vs f32 attention %.3g, "
                "CPU fp8 vs f32 %.3g\n", (long long)c.b, (long long)c.h, (long long)c.sq, (long long)c.sk, (long long)c.d, err,
                test::rel_l2(g, exact.to_vector()), test::rel_l2(want.to_vector(), exact.to_vector()));
    EXPECT_LE(err, kFp8AttentionTol) << c.sq << "x" << c.sk << " d" << c.d;
    // q and k bounded in advance (no amax pass for them; the scale from the bound): the CPU's same definition.
    const Fp8Bounds bounds{2.0f * max_abs(q_rows), 1.5f * max_abs(k)};
    // The result as an FP8 GEMM's input: cuDNN's e4m3 bytes with the output's one scale on every row, and x
    // their dequantized values (bf16-rounded).
    const ops::Fp8Rows rows = ops::attention_merged_fp8_rows(gq, to_gpu(k, DType::BF16), to_gpu(v, DType::BF16));
    const std::vector<uint8_t> bytes = bytes_of(rows.q);
    const std::vector<float> row_scale = ops::to_device(rows.scale, Device::cpu()).to_vector();
    const std::vector<float> xr = ops::cast(rows.x, DType::F32).to_vector();
    ASSERT_EQ(bytes.size(), xr.size());
    const int64_t cols = c.h * c.d;
    double worst = 0.0;
    for (size_t i = 0; i < bytes.size(); ++i) {
      EXPECT_EQ(row_scale[i / size_t(cols)], row_scale[0]);
      const double deq = double(f8e4m3_to_float(bytes[i])) * row_scale[i / size_t(cols)];
      worst = std::max(worst, std::fabs(deq - double(xr[i])) / std::max(std::fabs(deq), 1e-6));
    }
    EXPECT_LE(worst, 1.0 / 256) << "x is not the rows' dequantized values";
    EXPECT_LE(test::rel_l2(xr, want.to_vector()), kFp8AttentionTol);
    EXPECT_TRUE(rows.x_values);
    // Only the rows asked for (the models' output projections read nothing else): the same bytes and scales.
    const ops::Fp8Rows bare = ops::attention_merged_fp8_rows(gq, to_gpu(k, DType::BF16), to_gpu(v, DType::BF16), 0.0f, {}, false);
    EXPECT_FALSE(bare.x_values);
    EXPECT_EQ(bytes_of(bare.q), bytes);
    EXPECT_EQ(ops::to_device(bare.scale, Device::cpu()).to_vector(), row_scale);
    const Tensor want_b = ops::attention_merged_fp8(q, k, v, 0.0f, bounds);
    const Tensor got_b = ops::attention_merged_fp8(gq, to_gpu(k, DType::BF16), to_gpu(v, DType::BF16), 0.0f, bounds);
    EXPECT_LE(test::rel_l2(ops::cast(got_b, DType::F32).to_vector(), want_b.to_vector()), kFp8AttentionTol) << "with bounds";
  }
}

// q, k and v as the models hand them over: views of one token-major [B, S, 3, H, D] q/k/v GEMM output (FLUX's
// and Z-Image's layout: heads merged, token rows three heads-widths apart), not the contiguous or merged-q
// layouts of AttentionMatchesTheCpu: the CPU's values, with and without q/k bounds, one and two samples.
TEST(CudaFp8, AttentionOnTokenRowsMatchesTheCpu) {
  ATELIER_REQUIRE_CUDA();
  cuda::CudaBackend& be = test::cuda_be();
  const test::Fp8AttentionScope fp8_attention(true);
  struct Case { int64_t b, h, s, d; };
  for (const Case& c : {Case{1, 4, 512, 128}, Case{2, 3, 200, 128}, Case{2, 2, 48, 64}}) {
    const Tensor joint = test::rounded(random_tensor({c.b, c.s, 3, c.h, c.d}, 31, 2.0f), DType::BF16);
    const auto heads = [&](const Tensor& t, int which) { return t.select(2, which).permute({0, 2, 1, 3}); };  // [B, H, S, D]
    const Tensor gjoint = to_gpu(joint, DType::BF16);
    std::string why;
    Tensor probe = Tensor::empty({c.b, c.h, c.s, c.d}, DType::BF16, test::cuda0());
    if (!be.fp8_attention_takes(probe, heads(gjoint, 0), heads(gjoint, 1), heads(gjoint, 2), &why)) {
      ASSERT_NE(c.d, 128) << "the FP8 path did not take head dim 128: " << why;
      continue;
    }
    const Fp8Bounds bounds{2.0f * max_abs(joint), 1.5f * max_abs(joint)};
    for (const Fp8Bounds& bd : {Fp8Bounds{}, bounds}) {
      const int64_t runs0 = cuda::sdpa_fp8_stats().runs;
      const Tensor got = ops::attention_merged_fp8(heads(gjoint, 0), heads(gjoint, 1), heads(gjoint, 2), 0.0f, bd);
      const bool ran = cuda::sdpa_fp8_stats().runs > runs0;
      if (!ran) ASSERT_NE(c.d, 128) << "cuDNN declined head dim 128";
      // Declined (small head dims only): the 16-bit attention ran, so the f32 attention is its reference.
      const Tensor want = ran ? ops::attention_merged_fp8(heads(joint, 0), heads(joint, 1), heads(joint, 2), 0.0f, bd)
                              : ops::attention_merged(heads(joint, 0), heads(joint, 1), heads(joint, 2));
      const double err = test::rel_l2(ops::cast(got, DType::F32).to_vector(), want.to_vector());
      std::printf("[ figures  ] attention fp8 on token rows %lldx%lldx%lldx%lld%s: GPU vs CPU rel L2 %.3g%s\n", (long long)c.b,
                  (long long)c.h, (long long)c.s, (long long)c.d, bd.q > 0 ? " (bounds)" : "", err, ran ? "" : " (16-bit: declined)");
      EXPECT_LE(err, ran ? kFp8AttentionTol : 2e-2) << c.b << "x" << c.s << " d" << c.d;
    }
  }
}

// q and k written in e4m3 by the normalising rope itself (ops::rope_attention_merged_fp8_rows, FLUX's single
// blocks): the same e4m3 rows and scales, byte for byte, as rope, rope and attention_merged_fp8_rows, with q/k/v
// as views of one [B, S, 3, H, D] buffer (the models' layout). Head dim 64 and 128 take the fused path (the
// rope's register kernel and cuDNN's FP8 graph); 40 does not (rows of 5 vectors): the unfused sequence runs.
TEST(CudaFp8, RopeAttentionMakesTheBytesOfRopeThenAttention) {
  ATELIER_REQUIRE_CUDA();
  const test::Fp8AttentionScope fp8_attention(true);
  struct Case { int64_t b, h, s, d; };
  for (const Case& c : {Case{1, 4, 512, 128}, Case{2, 3, 200, 128}, Case{1, 2, 96, 64}, Case{1, 2, 64, 40}}) {
    const Tensor joint = to_gpu(test::rounded(random_tensor({c.b, c.s, 3, c.h, c.d}, 41, 2.0f), DType::BF16), DType::BF16);
    const auto heads = [&](int which) { return joint.select(2, which).permute({0, 2, 1, 3}); };  // [B, H, S, D]
    const Tensor angle = random_tensor({c.s, c.d / 2}, 42, 3.0f);
    const Tensor cos = to_gpu(ops::unary(angle, UnaryOp::kCos), DType::BF16), sin = to_gpu(ops::unary(angle, UnaryOp::kSin), DType::BF16);
    const Tensor gq = test::rounded(random_tensor({c.d}, 44), DType::BF16), gk = test::rounded(random_tensor({c.d}, 45), DType::BF16);
    const RopeRms rq{true, to_gpu(gq, DType::BF16), 1e-6f}, rk{true, to_gpu(gk, DType::BF16), 1e-6f};
    // Bounds as the models take them (rms_rope_bound's form: sqrt(D) * max|gamma| with room for rounding).
    const float bq = 1.05f * std::sqrt(float(c.d)) * max_abs(gq), bk = 1.05f * std::sqrt(float(c.d)) * max_abs(gk);
    const Fp8Bounds bounds{bq, bk};
    const int64_t runs0 = cuda::sdpa_fp8_stats().runs;
    const ops::Fp8Rows fused = ops::rope_attention_merged_fp8_rows(heads(0), heads(1), heads(2), cos, sin, rq, rk, bounds, false);
    const bool ran = cuda::sdpa_fp8_stats().runs > runs0;
    if (c.d >= 64) EXPECT_TRUE(ran) << "cuDNN's FP8 attention did not run for head dim " << c.d;
    const ops::Fp8Rows two = ops::attention_merged_fp8_rows(ops::rope(heads(0), cos, sin, 2, rq), ops::rope(heads(1), cos, sin, 2, rk),
                                                            heads(2), 0.0f, bounds, false);
    const std::string what = std::to_string(c.b) + "x" + std::to_string(c.h) + "x" + std::to_string(c.s) + " d" + std::to_string(c.d);
    EXPECT_EQ(fused.x_values, two.x_values) << what;
    EXPECT_EQ(bytes_of(fused.q), bytes_of(two.q)) << what;
    EXPECT_EQ(ops::to_device(fused.scale, Device::cpu()).to_vector(), ops::to_device(two.scale, Device::cpu()).to_vector()) << what;
  }
}

// The same with q and k roped in two runs of positions, each with its own norms (FLUX's double blocks: text
// tokens, then image tokens): each run's rope pass writes its rows of the e4m3 q and k, byte for byte what
// rope_runs and attention_merged_fp8_rows make. Run lengths need not be multiples of anything.
TEST(CudaFp8, RopeAttentionInRunsMakesTheBytesOfRopeRunsThenAttention) {
  ATELIER_REQUIRE_CUDA();
  const test::Fp8AttentionScope fp8_attention(true);
  struct Case { int64_t b, h, text, image, d; };
  for (const Case& c : {Case{1, 4, 128, 448, 128}, Case{2, 3, 50, 150, 128}, Case{1, 2, 77, 123, 64}}) {
    const int64_t s = c.text + c.image;
    const Tensor joint = to_gpu(test::rounded(random_tensor({c.b, s, 3, c.h, c.d}, 51, 2.0f), DType::BF16), DType::BF16);
    const auto heads = [&](int which) { return joint.select(2, which).permute({0, 2, 1, 3}); };  // [B, H, S, D]
    const Tensor angle = random_tensor({s, c.d / 2}, 52, 3.0f);
    const Tensor cos = to_gpu(ops::unary(angle, UnaryOp::kCos), DType::BF16), sin = to_gpu(ops::unary(angle, UnaryOp::kSin), DType::BF16);
    std::vector<Tensor> gammas;  // q text, k text, q image, k image
    for (uint32_t seed = 53; seed < 57; ++seed) gammas.push_back(test::rounded(random_tensor({c.d}, seed, seed == 55 ? 3.0f : 1.0f), DType::BF16));
    const auto norm = [&](int i) { return RopeRms{true, to_gpu(gammas[size_t(i)], DType::BF16), 1e-6f}; };
    const std::vector<RopeRmsRun> q_runs{{c.text, norm(0)}, {c.image, norm(2)}}, k_runs{{c.text, norm(1)}, {c.image, norm(3)}};
    const float root = 1.05f * std::sqrt(float(c.d));
    const Fp8Bounds bounds{root * std::max(max_abs(gammas[0]), max_abs(gammas[2])), root * std::max(max_abs(gammas[1]), max_abs(gammas[3]))};
    const int64_t runs0 = cuda::sdpa_fp8_stats().runs;
    const ops::Fp8Rows fused = ops::rope_attention_merged_fp8_rows(heads(0), heads(1), heads(2), cos, sin, q_runs, k_runs, bounds, false);
    EXPECT_GT(cuda::sdpa_fp8_stats().runs, runs0) << "cuDNN's FP8 attention did not run for head dim " << c.d;
    const ops::Fp8Rows two = ops::attention_merged_fp8_rows(ops::rope_runs(heads(0), cos, sin, q_runs),
                                                            ops::rope_runs(heads(1), cos, sin, k_runs), heads(2), 0.0f, bounds, false);
    const std::string what = std::to_string(c.b) + "x" + std::to_string(c.h) + "x(" + std::to_string(c.text) + "+" +
                             std::to_string(c.image) + ") d" + std::to_string(c.d);
    EXPECT_EQ(bytes_of(fused.q), bytes_of(two.q)) << what;
    EXPECT_EQ(ops::to_device(fused.scale, Device::cpu()).to_vector(), ops::to_device(two.scale, Device::cpu()).to_vector()) << what;
  }
}

// The FLUX fixture's transformer with --dtype fp8 blocks: cuda:0 (bf16 activations) against the CPU (f32
// activations), both with the same quantized weights, on seeded inputs.
TEST(CudaFp8, FluxTinyTransformerMatchesTheCpu) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const WeightStore store = WeightStore::open({(dir / "model/transformer/diffusion_pytorch_model.safetensors").string()}).value();
  const FluxConfig cfg = FluxConfig::from_file((dir / "model/transformer/config.json").string()).value();
  FluxTransformer cpu = FluxTransformer::load(store, FluxLayout::kDiffusers, cfg, Device::cpu()).value();
  FluxTransformer gpu = FluxTransformer::load(store, FluxLayout::kDiffusers, cfg, test::cuda0(), DType::BF16).value();
  cpu.quantize_fp8();
  gpu.quantize_fp8();
  constexpr int64_t kTokens = 16, kText = 8;
  FluxInputs in;
  in.hidden_states = random_tensor({1, kTokens, cfg.in_channels}, 9);
  in.encoder_hidden_states = random_tensor({1, kText, cfg.joint_attention_dim}, 10);
  in.pooled = random_tensor({1, cfg.pooled_projection_dim}, 11);
  std::vector<float> img_ids, txt_ids(size_t(kText * 3), 0.0f);
  for (int64_t i = 0; i < kTokens; ++i) img_ids.insert(img_ids.end(), {0.0f, float(i / 4), float(i % 4)});
  in.img_ids = Tensor::from_vector(img_ids, {kTokens, 3});
  in.txt_ids = Tensor::from_vector(txt_ids, {kText, 3});
  in.timestep = {0.7f};
  in.guidance = {3.5f};
  const Tensor want = cpu.forward(in).value();
  FluxInputs gin = in;
  for (Tensor* t : {&gin.hidden_states, &gin.encoder_hidden_states, &gin.pooled}) *t = to_gpu(*t);
  const Tensor got = gpu.forward(gin).value();
  const double err = test::rel_l2(ops::to_device(got, Device::cpu()).to_vector(), want.to_vector());
  std::printf("[ figures  ] flux-tiny fp8 blocks, cuda bf16 vs cpu f32: rel L2 %.3g\n", err);
  EXPECT_LE(err, 3e-2);  // the bf16 model against the f32 one (cuda_models_test's kBf16Tol is 2e-2 for SD)
}

}  // namespace
}  // namespace atelier
