// FP8 (e4m3) linear layers on the CPU backend: the e4m3 rounding against a brute-force nearest-value search,
// row-wise quantization, linear_fp8 against the product of the dequantized operands, the Linear helpers
// (column and row views of a quantized weight), and the op's input validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "core/dtype.h"
#include "models/common/layers.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::random_tensor;

// The e4m3 byte nearest to f by exhaustive search over every finite value, ties to the even mantissa,
// saturating at +-448: the rounding rule, stated independently of float_to_f8e4m3's bit manipulation.
uint8_t nearest_e4m3(float f) {
  if (std::isnan(f)) return f < 0 || std::signbit(f) ? 0xff : 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const double mag = std::min(std::fabs(double(f)), double(kF8E4M3Max));
  uint8_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int b = 0; b <= 0x7e; ++b) {
    const double d = std::fabs(double(f8e4m3_to_float(uint8_t(b))) - mag);
    if (d < best_d || (d == best_d && (b & 1) == 0)) {
      best_d = d;
      best = uint8_t(b);
    }
  }
  return sign | best;
}

TEST(Fp8, EveryValueRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(float_to_f8e4m3(f8e4m3_to_float(uint8_t(b))), b) << "byte " << b;
  }
}

TEST(Fp8, RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(float_to_f8e4m3(1.0625f), 0x38);   // halfway 1 .. 1.125: to the even 1.0
  EXPECT_EQ(float_to_f8e4m3(1.1875f), 0x3a);   // halfway 1.125 .. 1.25: to the even 1.25
  EXPECT_EQ(float_to_f8e4m3(1.0f / 1024), 0);  // half the smallest subnormal: to even 0
  EXPECT_EQ(float_to_f8e4m3(3.0f / 1024), 2);  // halfway subnormals 1 .. 2: to the even 2
  EXPECT_EQ(float_to_f8e4m3(460.0f), 0x7e);    // beyond 448: saturated, never NaN
  EXPECT_EQ(float_to_f8e4m3(-1e30f), 0xfe);
  EXPECT_EQ(float_to_f8e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(float_to_f8e4m3(std::nanf("")) & 0x7f, 0x7f);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    const float v = (i & 1 ? -1.0f : 1.0f) * std::exp2(exponent(rng));
    ASSERT_EQ(float_to_f8e4m3(v), nearest_e4m3(v)) << v;
  }
}

std::vector<float> dequantize(const Tensor& q, const Tensor& scale) {
  const int64_t rows = q.size(0), cols = q.size(1);
  std::vector<float> out(size_t(rows * cols));
  const uint8_t* p = static_cast<const uint8_t*>(q.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(r * cols + c)] = f8e4m3_to_float(p[r * cols + c]) * scale.data<float>()[r];
  return out;
}

// f8e4m3_scale: the smallest power of two s with amax / s <= 448, at least 2^-126; 1 where there is nothing to
// scale (zero, infinite or NaN amax).
TEST(Fp8, ScaleIsTheSmallestPowerOfTwoThatFitsTheMaximum) {
  EXPECT_EQ(f8e4m3_scale(448.0f), 1.0f);
  EXPECT_EQ(f8e4m3_scale(std::nextafter(448.0f, 1000.0f)), 2.0f);
  EXPECT_EQ(f8e4m3_scale(224.0f), 0.5f);
  EXPECT_EQ(f8e4m3_scale(std::nextafter(224.0f, 1000.0f)), 1.0f);
  EXPECT_EQ(f8e4m3_scale(1.0f), std::ldexp(1.0f, -8));  // 1 / 2^-8 = 256 <= 448 < 512
  EXPECT_EQ(f8e4m3_scale(3.0f), std::ldexp(1.0f, -7));  // 384
  EXPECT_EQ(f8e4m3_scale(std::numeric_limits<float>::max()), std::ldexp(1.0f, 120));
  EXPECT_EQ(f8e4m3_scale(std::numeric_limits<float>::denorm_min()), std::ldexp(1.0f, -126));
  EXPECT_EQ(f8e4m3_scale(1e-37f), std::ldexp(1.0f, -126));
  for (float none : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    EXPECT_EQ(f8e4m3_scale(none), 1.0f) << none;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-100, 100);
  for (int i = 0; i < 10000; ++i) {
    const float amax = std::ldexp(mant(rng), ex(rng)), s = f8e4m3_scale(amax);
    int e = 0;
    ASSERT_EQ(std::frexp(s, &e), 0.5f) << amax << ": not a power of two";
    ASSERT_LE(amax / s, kF8E4M3Max) << amax;
    ASSERT_GT(amax / (s / 2), kF8E4M3Max) << amax << ": not the smallest";
  }
}

TEST(Fp8, QuantizeRowsScalesEachRowByItsMaximum) {
  Tensor x = random_tensor({5, 37}, 1, 3.0f);
  for (int c = 0; c < 37; ++c) x.data<float>()[2 * 37 + c] = 0.0f;  // a row of zeros
  const auto [q, scale] = ops::quantize_rows_fp8(x);
  ASSERT_EQ(q.dtype(), DType::F8E4M3);
  ASSERT_EQ(scale.shape(), Shape({5}));
  const float* xp = x.data<float>();
  for (int64_t r = 0; r < 5; ++r) {
    float amax = 0.0f;
    for (int c = 0; c < 37; ++c) amax = std::max(amax, std::fabs(xp[r * 37 + c]));
    // The smallest power of two s with amax / s <= 448 (1 for the zero row).
    float s = 1.0f;
    if (r != 2) {
      s = std::ldexp(1.0f, -140);
      while (amax / s > kF8E4M3Max) s *= 2.0f;
    }
    EXPECT_EQ(scale.data<float>()[r], s) << "row " << r;
    for (int c = 0; c < 37; ++c)
      ASSERT_EQ(static_cast<const uint8_t*>(q.raw())[r * 37 + c], float_to_f8e4m3(xp[r * 37 + c] / s)) << r << "," << c;
  }
  // Each element within half an e4m3 step (relative 2^-4) of its row's largest magnitude... or better.
  const std::vector<float> back = dequantize(q, scale), want = x.to_vector();
  EXPECT_LE(test::rel_l2(back, want), 0.04);
}

// The reference: x quantized per row, w per row, the exact products summed in double, both scales applied.
std::vector<float> reference_fp8_linear(const Tensor& x2, const Tensor& w, const Tensor& b, UnaryOp act) {
  const auto [xq, xs] = ops::quantize_rows_fp8(x2);
  const auto [wq, ws] = ops::quantize_rows_fp8(w);
  const std::vector<float> xd = dequantize(xq, Tensor::from_vector(std::vector<float>(size_t(xs.numel()), 1.0f), xs.shape()));
  const std::vector<float> wd = dequantize(wq, Tensor::from_vector(std::vector<float>(size_t(ws.numel()), 1.0f), ws.shape()));
  const int64_t m = x2.size(0), k = x2.size(1), n = w.size(0);
  std::vector<float> out(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t c = 0; c < k; ++c) acc += double(xd[size_t(i * k + c)]) * double(wd[size_t(j * k + c)]);
      double v = acc * xs.data<float>()[i] * ws.data<float>()[j] + (b.defined() ? b.data<float>()[j] : 0.0f);
      if (act == UnaryOp::kGeluTanh) v = 0.5 * v * (1.0 + std::tanh(0.7978845608 * (v + 0.044715 * v * v * v)));
      out[size_t(i * n + j)] = float(v);
    }
  return out;
}

// norm_modulate_fp8: the norm_modulate result and its rows quantized as quantize_activation_fp8 quantizes
// them (the CPU backend runs the two; the CUDA backend's one pass is held to the same bytes in cuda_fp8_test).
TEST(Fp8, NormModulateFp8IsNormModulateThenItsQuantizedRows) {
  const Tensor x = random_tensor({2, 5, 24}, 61, 3.0f), scale = random_tensor({2, 1, 24}, 62), shift = random_tensor({2, 1, 24}, 63);
  const NormModulation m{.scale = scale, .shift = shift};
  const ops::Fp8Rows r = ops::norm_modulate_fp8(x, NormKind::kLayer, 1e-6f, Tensor(), m);
  const Tensor want = ops::norm_modulate(x, NormKind::kLayer, 1e-6f, Tensor(), m);
  const ops::Fp8Rows wq = ops::quantize_activation_fp8(want);
  EXPECT_EQ(r.x.to_vector(), want.to_vector());
  ASSERT_EQ(r.q.shape(), (Shape{10, 24}));
  const auto* got = static_cast<const uint8_t*>(r.q.raw());
  const auto* ref = static_cast<const uint8_t*>(wq.q.raw());
  EXPECT_EQ(std::vector<uint8_t>(got, got + r.q.numel()), std::vector<uint8_t>(ref, ref + wq.q.numel()));
  EXPECT_EQ(r.scale.to_vector(), wq.scale.to_vector());
  EXPECT_THROW(ops::norm_modulate_fp8(x, NormKind::kLayer, 1e-6f, Tensor(), {.gate = scale}), Error);  // a gate needs a residual
}

TEST(Fp8, LinearIsTheScaledProductOfTheQuantizedOperands) {
  const Tensor x = random_tensor({2, 3, 40}, 2), w = random_tensor({24, 40}, 3, 0.2f), b = random_tensor({24}, 4);
  const auto [wq, ws] = ops::quantize_rows_fp8(w);
  for (UnaryOp act : {UnaryOp::kIdentity, UnaryOp::kGeluTanh}) {
    const Tensor y = ops::linear_fp8(x, wq, ws, b, act);
    ASSERT_EQ(y.shape(), Shape({2, 3, 24}));
    EXPECT_LE(test::rel_l2(y.to_vector(), reference_fp8_linear(x.reshape({6, 40}), w, b, act)), 1e-6);
  }
  // Against the full-precision layer: e4m3's 3 mantissa bits on both operands.
  const double err = test::rel_l2(ops::linear_fp8(x, wq, ws, b).to_vector(), ops::linear(x, w, b).to_vector());
  std::cout << "[fp8] linear 6x40x24 vs f32: rel L2 " << err << "\n";
  EXPECT_LE(err, 0.05);
  // A residual accumulates onto the product.
  const Tensor r = random_tensor({2, 3, 24}, 5);
  const std::vector<float> with = ops::linear_fp8(x, wq, ws, b, UnaryOp::kIdentity, r).to_vector();
  const std::vector<float> plain = ops::linear_fp8(x, wq, ws, b).to_vector(), rv = r.to_vector();
  for (size_t i = 0; i < with.size(); ++i) EXPECT_NEAR(with[i], plain[i] + rv[i], 1e-5f);
}

TEST(Fp8, LinearViewsOfAQuantizedWeight) {
  Linear l{random_tensor({12, 20}, 6, 0.3f), random_tensor({12}, 7), Tensor()};
  const Tensor x = random_tensor({4, 20}, 8);
  l.quantize_fp8();
  ASSERT_TRUE(l.is_fp8());
  const std::vector<float> full = l(x).to_vector();
  // Outputs 4..9 of the layer are the layer's output_rows(4, 6).
  const std::vector<float> part = l.output_rows(4, 6)(x).to_vector();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 6; ++j) EXPECT_NEAR(part[size_t(i * 6 + j)], full[size_t(i * 12 + 4 + j)], 1e-5f);
  // The inputs split in two column blocks: the sum of both products (bias once) is the whole product, to
  // within the activation's per-part quantization.
  Linear left = l.input_columns(0, 8);
  left.bias = l.bias;
  const Tensor y = l.input_columns(8, 12).with_residual(x.narrow(1, 8, 12), left(x.narrow(1, 0, 8)));
  EXPECT_LE(test::rel_l2(y.to_vector(), full), 0.05);
}

TEST(Fp8, LinearRejectsWhatItCannotUse) {
  const Tensor x = random_tensor({3, 16}, 9), w = random_tensor({8, 16}, 10);
  const auto [wq, ws] = ops::quantize_rows_fp8(w);
  EXPECT_THROW(ops::linear_fp8(x, w, ws), Error);                          // not an e4m3 weight
  EXPECT_THROW(ops::linear_fp8(x, wq, ws.narrow(0, 0, 4)), Error);         // scales of the wrong length
  EXPECT_THROW(ops::linear_fp8(random_tensor({3, 15}, 11), wq, ws), Error);  // inner dims differ
  EXPECT_THROW(ops::linear_fp8(x, wq, ws, random_tensor({7}, 12)), Error);   // bias length
  EXPECT_THROW(ops::quantize_rows_fp8(random_tensor({2, 3, 4}, 13)), Error);  // not a matrix
  // Rows whose activations were never written (Fp8Rows::x_values false) and not quantized either; and a layer
  // not in FP8 given such rows.
  EXPECT_THROW(ops::linear_fp8(ops::Fp8Rows{x, Tensor(), Tensor(), false}, wq, ws), Error);
  const Linear plain{w, Tensor(), Tensor()};
  EXPECT_THROW(plain(ops::Fp8Rows{x, Tensor(), Tensor(), false}), Error);
  EXPECT_NO_THROW(plain(ops::Fp8Rows{x, Tensor(), Tensor(), true}));
}

// attention_merged_fp8: q, k, v each quantized per tensor (s = f8e4m3_scale(amax)), then attention of s * e4m3(x / s).
// Values already on a tensor's e4m3 grid (every element an e4m3 value times 2^-5, one of them the largest, so
// that s is exactly 2^-5) pass the quantization unchanged: the result is attention_merged's. Random values
// (unit-variance logits) move by the format's rounding: measurably (4.6% measured), and by under 10%.
// An adaLN gated residual branch through an FP8 layer: the CPU folds no gate into its product, so the op is
// linear_fp8 then norm_modulate's gated residual pass, the residual left as it was; and its operands are
// checked (a CUDA device accumulates in place instead: CudaFp8.GatedResidualMatchesTheCpu).
TEST(Fp8, GatedResidualIsTheProductThenTheGatedPass) {
  Linear l{random_tensor({24, 32}, 91, 0.2f), random_tensor({24}, 92), Tensor()};
  l.quantize_fp8();
  const Tensor x = random_tensor({1, 5, 32}, 93), res = random_tensor({1, 5, 24}, 94), gate = random_tensor({1, 1, 24}, 95, 2.0f);
  const std::vector<float> res_before = res.to_vector();
  Tensor taken = res;
  const Tensor got = l.gated_residual(std::move(taken), gate, ops::Fp8Rows{x, Tensor(), Tensor()});
  const Tensor want = ops::norm_modulate(l(x), NormKind::kNone, 0.0f, Tensor(), {.gate = gate, .residual = res});
  EXPECT_EQ(got.to_vector(), want.to_vector());
  EXPECT_EQ(res.to_vector(), res_before) << "a residual held elsewhere was written";
  const ops::Fp8Rows rows{x, Tensor(), Tensor()};
  EXPECT_THROW(ops::linear_fp8_gated_residual(Tensor(res), rows, l.weight, l.weight_scale, l.bias, gate.narrow(2, 0, 20)),
               Error);  // a gate of 20 values for 24 outputs
  EXPECT_THROW(ops::linear_fp8_gated_residual(res.narrow(2, 0, 20), rows, l.weight, l.weight_scale, l.bias, gate),
               Error);  // a residual of 20 columns
  EXPECT_THROW(ops::linear_fp8_gated_residual(Tensor(), rows, l.weight, l.weight_scale, l.bias, gate), Error);
}

TEST(Fp8, AttentionQuantizesEachOperandPerTensor) {
  constexpr float kGrid = 0x1p-5f;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 0xfd);  // finite e4m3 values (0x7e / 0xfe: 448; 0x7f / 0xff: NaN)
  const auto on_grid = [&](const Shape& shape) {
    Tensor t = Tensor::empty(shape, DType::F32, Device::cpu());
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint8_t b = uint8_t(byte(rng));
      if ((b & 0x7f) == 0x7f) b = 0x7e;
      p[i] = f8e4m3_to_float(b) * kGrid;
    }
    p[1] = kF8E4M3Max * kGrid;  // the tensor's amax
    return t;
  };
  const Tensor q = on_grid({1, 2, 9, 16}), k = on_grid({1, 2, 11, 16}), v = on_grid({1, 2, 11, 16});
  const float scale = 0.01f;  // the grid's values reach 14: keep the softmax from being one-hot
  EXPECT_EQ(test::max_abs_diff(ops::attention_merged_fp8(q, k, v, scale).to_vector(),
                               ops::attention_merged(q, k, v, Tensor(), scale).to_vector()),
            0.0);

  const Tensor rq = random_tensor({2, 3, 17, 32}, 31), rk = random_tensor({2, 3, 13, 32}, 32),
               rv = random_tensor({2, 3, 13, 32}, 33);
  const double moved = test::rel_l2(ops::attention_merged_fp8(rq, rk, rv).to_vector(), ops::attention_merged(rq, rk, rv).to_vector());
  std::cout << "[fp8] attention of per-tensor e4m3 q/k/v against f32: rel L2 " << moved << "\n";
  EXPECT_GT(moved, 1e-4);
  EXPECT_LT(moved, 0.1);
  // No mask and no grouped heads: what cuDNN's FP8 graph takes.
  EXPECT_THROW(ops::attention_merged_fp8(rq, rk.narrow(1, 0, 1), rv.narrow(1, 0, 1)), Error);
}

// Fp8Bounds: q/k bounded in advance are quantized with f8e4m3_scale(bound) and no amax. A bound equal to the amax gives
// the amax's bytes, hence the same result; rms_rope_bound bounds what an RMS-normed rotation can produce, also
// for a row whose whole energy sits in one pair (the worst case the bound is made for).
TEST(Fp8, AttentionBoundsReplaceTheAmax) {
  const Tensor q = random_tensor({1, 2, 9, 16}, 41), k = random_tensor({1, 2, 11, 16}, 42), v = random_tensor({1, 2, 11, 16}, 43);
  const auto amax = [](const Tensor& t) {
    float m = 0.0f;
    for (float x : t.to_vector()) m = std::max(m, std::fabs(x));
    return m;
  };
  EXPECT_EQ(ops::attention_merged_fp8(q, k, v, 0.0f, {amax(q), amax(k)}).to_vector(), ops::attention_merged_fp8(q, k, v).to_vector());
  // (256x: the scales are powers of two, and scales 2^n apart quantize to the same values short of e4m3's
  // subnormals, which the smaller values of q and k reach under a scale 256 times larger)
  const Tensor loose = ops::attention_merged_fp8(q, k, v, 0.0f, {256 * amax(q), 256 * amax(k)});
  EXPECT_NE(loose.to_vector(), ops::attention_merged_fp8(q, k, v).to_vector()) << "the bounds were not used";
  EXPECT_LT(test::rel_l2(loose.to_vector(), ops::attention_merged(q, k, v).to_vector()), 0.1);
  EXPECT_THROW(ops::attention_merged_fp8(q, k, v, 0.0f, {-1.0f, 0.0f}), Error);

  constexpr int64_t kDim = 16;
  const RMSNorm norm{random_tensor({kDim}, 44, 2.0f), 1e-6f};
  const float bound = rms_rope_bound(norm, kDim);
  Tensor x = random_tensor({1, 6, 2, kDim}, 45);
  float* p = x.data<float>();
  for (int64_t c = 0; c < kDim; ++c) p[c] = c == 4 ? 7.0f : (c == 5 ? -3.0f : 0.0f);  // row 0: one pair only
  const Tensor cos = random_tensor({6, kDim / 2}, 46), sin = random_tensor({6, kDim / 2}, 47);
  // Unit-norm angles, as rope tables hold.
  Tensor c2 = cos, s2 = sin;
  for (int64_t i = 0; i < cos.numel(); ++i) {
    const float a = cos.data<float>()[i] * 3.0f;
    c2.data<float>()[i] = std::cos(a);
    s2.data<float>()[i] = std::sin(a);
  }
  const Tensor r = ops::rope(x, c2, s2, 1, rope_rms(&norm));
  EXPECT_LE(amax(r), bound);
  EXPECT_GT(amax(r), 0.5f * bound / 1.04f) << "the one-pair row comes near the bound";
}

// rope_attention_merged_fp8_rows is rope, rope and attention_merged_fp8_rows (the CPU runs that sequence; a
// backend that writes q and k in e4m3 from its rope pass must give the same bytes: CudaFp8 tests it), and
// checks its operands as those ops do.
TEST(Fp8, RopeAttentionIsRopeThenAttention) {
  constexpr int64_t kDim = 16;
  const Tensor joint = random_tensor({1, 7, 3, 2, kDim}, 51, 2.0f);
  const auto heads = [&](int which) { return joint.select(2, which).permute({0, 2, 1, 3}); };  // [1, 2, 7, 16] views
  Tensor cos = random_tensor({7, kDim / 2}, 52), sin = random_tensor({7, kDim / 2}, 53);
  const RMSNorm nq{random_tensor({kDim}, 54), 1e-6f}, nk{random_tensor({kDim}, 55), 1e-6f};
  const Fp8Bounds bounds{rms_rope_bound(nq, kDim), rms_rope_bound(nk, kDim)};
  const ops::Fp8Rows got = ops::rope_attention_merged_fp8_rows(heads(0), heads(1), heads(2), cos, sin, rope_rms(&nq), rope_rms(&nk), bounds);
  const ops::Fp8Rows want = ops::attention_merged_fp8_rows(ops::rope(heads(0), cos, sin, 2, rope_rms(&nq)),
                                                           ops::rope(heads(1), cos, sin, 2, rope_rms(&nk)), heads(2), 0.0f, bounds);
  EXPECT_EQ(got.x.to_vector(), want.x.to_vector());
  EXPECT_EQ(got.scale.to_vector(), want.scale.to_vector());
  EXPECT_EQ(std::vector<uint8_t>(static_cast<const uint8_t*>(got.q.raw()), static_cast<const uint8_t*>(got.q.raw()) + got.q.numel()),
            std::vector<uint8_t>(static_cast<const uint8_t*>(want.q.raw()), static_cast<const uint8_t*>(want.q.raw()) + want.q.numel()));
  EXPECT_THROW(ops::rope_attention_merged_fp8_rows(heads(0), heads(1), heads(2).narrow(2, 0, 5), cos, sin, rope_rms(&nq), rope_rms(&nk)),
               Error);  // v shorter than k
  EXPECT_THROW(ops::rope_attention_merged_fp8_rows(heads(0), heads(1), heads(2), cos.narrow(0, 0, 6), sin, rope_rms(&nq), rope_rms(&nk)),
               Error);  // tables for 6 positions, not 7
}

// The same in runs of positions, each with its own q/k norms (FLUX's double blocks: text, then image tokens):
// rope_runs of q and k, then attention_merged_fp8_rows.
TEST(Fp8, RopeAttentionInRunsIsRopeRunsThenAttention) {
  constexpr int64_t kDim = 16, kText = 3, kImage = 4;
  const Tensor joint = random_tensor({1, kText + kImage, 3, 2, kDim}, 61, 2.0f);
  const auto heads = [&](int which) { return joint.select(2, which).permute({0, 2, 1, 3}); };  // [1, 2, 7, 16] views
  Tensor cos = random_tensor({kText + kImage, kDim / 2}, 62), sin = random_tensor({kText + kImage, kDim / 2}, 63);
  const RMSNorm nq_t{random_tensor({kDim}, 64), 1e-6f}, nk_t{random_tensor({kDim}, 65), 1e-6f};
  const RMSNorm nq_i{random_tensor({kDim}, 66, 3.0f), 1e-6f}, nk_i{random_tensor({kDim}, 67), 1e-6f};
  const Fp8Bounds bounds{std::max(rms_rope_bound(nq_t, kDim), rms_rope_bound(nq_i, kDim)),
                         std::max(rms_rope_bound(nk_t, kDim), rms_rope_bound(nk_i, kDim))};
  const std::vector<RopeRmsRun> q_runs{{kText, rope_rms(&nq_t)}, {kImage, rope_rms(&nq_i)}};
  const std::vector<RopeRmsRun> k_runs{{kText, rope_rms(&nk_t)}, {kImage, rope_rms(&nk_i)}};
  const ops::Fp8Rows got = ops::rope_attention_merged_fp8_rows(heads(0), heads(1), heads(2), cos, sin, q_runs, k_runs, bounds);
  const ops::Fp8Rows want = ops::attention_merged_fp8_rows(ops::rope_runs(heads(0), cos, sin, q_runs),
                                                           ops::rope_runs(heads(1), cos, sin, k_runs), heads(2), 0.0f, bounds);
  EXPECT_EQ(got.x.to_vector(), want.x.to_vector());
  EXPECT_EQ(got.scale.to_vector(), want.scale.to_vector());
  EXPECT_EQ(std::vector<uint8_t>(static_cast<const uint8_t*>(got.q.raw()), static_cast<const uint8_t*>(got.q.raw()) + got.q.numel()),
            std::vector<uint8_t>(static_cast<const uint8_t*>(want.q.raw()), static_cast<const uint8_t*>(want.q.raw()) + want.q.numel()));
  // The runs differ: one norm for the whole sequence is another result.
  const ops::Fp8Rows one = ops::rope_attention_merged_fp8_rows(heads(0), heads(1), heads(2), cos, sin, rope_rms(&nq_i), rope_rms(&nk_i), bounds);
  EXPECT_NE(one.x.to_vector(), got.x.to_vector());
  EXPECT_THROW(ops::rope_attention_merged_fp8_rows(heads(0), heads(1), heads(2), cos, sin, {{kText, rope_rms(&nq_t)}}, k_runs, bounds),
               Error);  // q's runs cover 3 of 7 positions
}

}  // namespace
}  // namespace atelier
