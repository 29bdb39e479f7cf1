// Op API tests, part 2: matrix products, convolution, normalisation and attention against naive
// double-precision references (odd sizes, broadcasting, strided views, masks, GQA, groups, strides).
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "backend/cpu/cpu_kernels.h"
#include "backend/ops.h"
#include "ops_test_util.h"

namespace atelier {
namespace {

using test::random_tensor;
using test::to_double;

// [M, K] (row-major) @ [K, N] in double.
std::vector<double> ref_mm(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k, int64_t n) {
  std::vector<double> c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + p] * b[p * n + j];
  return c;
}

std::vector<double> transpose2(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> t(x.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * cols + j];
  return t;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

TEST(OpsLinear, OddSizesBiasActivationAndResidual) {
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 7, 5}, {77, 129, 33}, {2, 320, 1280}, {300, 64, 96}}) {
    Tensor x = random_tensor({m, k}, 1), w = random_tensor({n, k}, 2, 0.1f), b = random_tensor({n}, 3);
    const std::vector<double> y = ref_mm(to_double(x), transpose2(to_double(w), n, k), m, k, n);
    std::vector<double> yb = y, ya = y;
    const std::vector<double> bv = to_double(b);
    for (int64_t i = 0; i < m * n; ++i) {
      yb[i] += bv[i % n];
      ya[i] = silu(yb[i]);
    }
    EXPECT_OPS_CLOSE(ops::linear(x, w), y) << m << "x" << k << "x" << n;
    EXPECT_OPS_CLOSE(ops::linear(x, w, b), yb);
    EXPECT_OPS_CLOSE(ops::linear(x, w, b, UnaryOp::kSilu), ya);
    Tensor r = random_tensor({m, n}, 4);
    std::vector<double> yr = yb;
    const std::vector<double> rv = to_double(r);
    for (int64_t i = 0; i < m * n; ++i) yr[i] += rv[i];
    EXPECT_OPS_CLOSE(ops::linear_residual(x, w, b, r), yr);
    EXPECT_OPS_CLOSE(r, rv);  // the residual input is left untouched
  }
}

// A residual given up by the caller (linear_residual's Tensor&& overload): accumulated onto in place when nothing
// else shares its buffer, read where it is (and left untouched) when a view or another handle still does.
TEST(OpsLinear, GivenUpResidualIsAccumulatedOntoInPlace) {
  const int64_t m = 37, k = 24, n = 20;
  const Tensor x = random_tensor({1, m, k}, 30), w = random_tensor({n, k}, 31, 0.2f), b = random_tensor({n}, 32);
  std::vector<double> want = ref_mm(to_double(x), transpose2(to_double(w), n, k), m, k, n);
  const std::vector<double> bv = to_double(b), rv = to_double(random_tensor({1, m, n}, 33));
  for (int64_t i = 0; i < m * n; ++i) want[i] += bv[i % n] + rv[i];

  Tensor sole = random_tensor({1, m, n}, 33);
  const void* where = sole.data<float>();
  const Tensor out = ops::linear_residual(x, w, b, std::move(sole));
  EXPECT_EQ(out.data<float>(), where) << "a residual nothing else holds was not accumulated onto in place";
  EXPECT_OPS_CLOSE(out, want);

  const Tensor kept = random_tensor({1, m, n}, 33);
  Tensor handle = kept;  // a second handle on the same buffer
  const Tensor out_shared = ops::linear_residual(x, w, b, std::move(handle));
  EXPECT_NE(out_shared.data<float>(), kept.data<float>());
  EXPECT_OPS_CLOSE(out_shared, want);
  EXPECT_OPS_CLOSE(kept, rv);  // the shared residual is left untouched

  const Tensor wide = random_tensor({1, m, 2 * n}, 34);
  const Tensor out_view = ops::linear_residual(x, w, b, wide.narrow(2, 0, n));  // a strided view: not in place
  EXPECT_EQ(out_view.shape(), (Shape{1, m, n}));
  EXPECT_OPS_CLOSE(wide, to_double(random_tensor({1, m, 2 * n}, 34)));
}

// linear_glu: the first half of the product's columns times the activation of the second half (GEGLU's
// value * gelu(gate), diffusers' chunk(2, -1) order), with leading dims and a strided x; bad operands refused.
TEST(OpsLinear, LinearGluIsValueTimesActivatedGate) {
  for (auto [m, k, h, act] : {std::tuple<int64_t, int64_t, int64_t, UnaryOp>{1, 1, 1, UnaryOp::kGelu}, {77, 40, 33, UnaryOp::kGelu},
                              {12, 64, 16, UnaryOp::kSilu}}) {
    const Tensor xb = random_tensor({m, 2 * k}, 20), w = random_tensor({2 * h, k}, 21, 0.2f), b = random_tensor({2 * h}, 22);
    const Tensor x = xb.narrow(1, 1, k).unsqueeze(0);  // [1, m, k], rows 2k apart
    const std::vector<double> y = ref_mm(to_double(x), transpose2(to_double(w), 2 * h, k), m, k, 2 * h);
    const std::vector<double> bv = to_double(b);
    std::vector<double> want(size_t(m * h)), want_nobias(size_t(m * h));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < h; ++j) {
        const auto f = [&](double v, double g) {
          return v * (act == UnaryOp::kSilu ? silu(g) : 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0))));
        };
        want[i * h + j] = f(y[i * 2 * h + j] + bv[j], y[i * 2 * h + h + j] + bv[h + j]);
        want_nobias[i * h + j] = f(y[i * 2 * h + j], y[i * 2 * h + h + j]);
      }
    const Tensor out = ops::linear_glu(x, w, b, act);
    EXPECT_EQ(out.shape(), (Shape{1, m, h}));
    EXPECT_OPS_CLOSE(out, want) << m << "x" << k << " -> " << h;
    EXPECT_OPS_CLOSE(ops::linear_glu(x, w, Tensor(), act), want_nobias);
  }
  const auto refused_with = [](const std::function<void()>& call, const std::string& text) {
    try {
      call();
    } catch (const Error& e) {
      const std::string what = e.what();
      return what.find("linear_glu") != std::string::npos && what.find(text) != std::string::npos;
    }
    return false;
  };
  const Tensor x = random_tensor({3, 8}, 23);
  EXPECT_TRUE(refused_with([&] { ops::linear_glu(x, random_tensor({5, 8}, 24), Tensor(), UnaryOp::kGelu); }, "[2H, in]"));
  EXPECT_TRUE(refused_with([&] { ops::linear_glu(x, random_tensor({6, 7}, 25), Tensor(), UnaryOp::kGelu); }, "does not match"));
  EXPECT_TRUE(refused_with([&] { ops::linear_glu(x, random_tensor({6, 8}, 26), random_tensor({3}, 27), UnaryOp::kGelu); }, "bias must be [6]"));
}

TEST(OpsLinear, LeadingDimsAndStridedInput) {
  // x a narrow of the last dim of [2, 5, 48] (rows 48 apart): read in place; a permuted x is packed.
  Tensor big = random_tensor({2, 5, 48}, 1);
  Tensor x = big.narrow(2, 16, 16);
  Tensor w = random_tensor({8, 16}, 2);
  const std::vector<double> ref = ref_mm(to_double(x), transpose2(to_double(w), 8, 16), 10, 16, 8);
  Tensor out = ops::linear(x, w);
  EXPECT_EQ(out.shape(), (Shape{2, 5, 8}));
  EXPECT_OPS_CLOSE(out, ref);
  Tensor xp = random_tensor({5, 2, 16}, 3).permute({1, 0, 2});
  EXPECT_OPS_CLOSE(ops::linear(xp, w), ref_mm(to_double(xp), transpose2(to_double(w), 8, 16), 10, 16, 8));
  // A transposed weight view (unit stride on the wrong dim) is packed first.
  Tensor wt = test::strided_copy(w);
  EXPECT_OPS_CLOSE(ops::linear(x, wt), ref);
}

// linear_into / linear_fp8_into / rope_into: the same values as the ops that allocate, written into row ranges
// of one buffer (what FLUX's double blocks do with their streams); a destination that is not contiguous or of
// the wrong shape or dtype is an error, not a silent copy.
TEST(OpsInto, LinearRopeAndFp8IntoRowRangesOfOneBuffer) {
  const Tensor a = random_tensor({1, 3, 16}, 11), b = random_tensor({1, 5, 16}, 12);
  const Tensor w = random_tensor({8, 16}, 13), bias = random_tensor({8}, 14);
  Tensor joint = Tensor::empty({1, 8, 8}, DType::F32, Device::cpu());
  Tensor rows_a = joint.narrow(1, 0, 3), rows_b = joint.narrow(1, 3, 5);
  ops::linear_into(rows_a, a, w, bias, UnaryOp::kSilu);
  ops::linear_into(rows_b, b, w, bias, UnaryOp::kSilu);
  EXPECT_EQ(joint.to_vector(), ops::concat({ops::linear(a, w, bias, UnaryOp::kSilu), ops::linear(b, w, bias, UnaryOp::kSilu)}, 1).to_vector());

  const auto [w8, ws] = ops::quantize_rows_fp8(w);
  ops::linear_fp8_into(rows_b, ops::quantize_activation_fp8(b), w8, ws, bias);
  EXPECT_EQ(rows_b.to_vector(), ops::linear_fp8(b, w8, ws, bias).to_vector());
  // Accumulated in place onto a row range: linear_fp8 with that range as the residual, the rows around it
  // untouched.
  const std::vector<float> before = joint.to_vector();
  const Tensor residual = ops::clone(rows_b);
  ops::linear_fp8_accumulate(rows_b, ops::quantize_activation_fp8(b), w8, ws);
  EXPECT_EQ(rows_b.to_vector(), ops::linear_fp8(b, w8, ws, Tensor(), UnaryOp::kIdentity, residual).to_vector());
  EXPECT_NE(rows_b.to_vector(), residual.to_vector());
  const std::vector<float> after = joint.to_vector();
  EXPECT_TRUE(std::equal(after.begin(), after.begin() + 3 * 8, before.begin()));

  // Rope over [1, N, H, D] token-major rows (positions along dim 1), each part with its own RMS weight.
  const Tensor x = random_tensor({1, 8, 2, 8}, 15), cos = random_tensor({8, 4}, 16), sin = random_tensor({8, 4}, 17);
  Tensor roped = Tensor::empty(x.shape(), DType::F32, Device::cpu());
  Tensor first = roped.narrow(1, 0, 3), rest = roped.narrow(1, 3, 5);
  const RopeRms r1{true, random_tensor({8}, 18), 1e-6f}, r2{true, random_tensor({8}, 19), 1e-6f};
  ops::rope_into(first, x.narrow(1, 0, 3), cos.narrow(0, 0, 3), sin.narrow(0, 0, 3), 1, r1);
  ops::rope_into(rest, x.narrow(1, 3, 5), cos.narrow(0, 3, 5), sin.narrow(0, 3, 5), 1, r2);
  EXPECT_EQ(first.to_vector(), ops::rope(x.narrow(1, 0, 3), cos.narrow(0, 0, 3), sin.narrow(0, 0, 3), 1, r1).to_vector());
  EXPECT_EQ(rest.to_vector(), ops::rope(x.narrow(1, 3, 5), cos.narrow(0, 3, 5), sin.narrow(0, 3, 5), 1, r2).to_vector());

  Tensor wide = Tensor::empty({1, 3, 16}, DType::F32, Device::cpu());
  Tensor strided = wide.narrow(2, 0, 8);  // rows 16 apart: not contiguous
  EXPECT_THROW(ops::linear_into(strided, a, w), Error);
  EXPECT_THROW(ops::linear_into(rows_b, a, w), Error);  // 5 rows for a result of 3
  Tensor half = Tensor::empty({1, 3, 8}, DType::F16, Device::cpu());
  EXPECT_THROW(ops::linear_into(half, a, w), Error);
  EXPECT_THROW(ops::rope_into(rows_a, x.narrow(1, 0, 3), cos.narrow(0, 0, 3), sin.narrow(0, 0, 3), 1), Error);
}

TEST(OpsMatmul, TransposesAndBatchBroadcasting) {
  const int64_t m = 13, k = 29, n = 7;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (auto [ba, bb] : {std::pair<int64_t, int64_t>{3, 3}, {1, 3}, {3, 1}}) {
        Tensor a = random_tensor(ta ? Shape{ba, k, m} : Shape{ba, m, k}, 1);
        Tensor b = random_tensor(tb ? Shape{bb, n, k} : Shape{bb, k, n}, 2);
        const std::vector<double> av = to_double(a), bv = to_double(b);
        std::vector<double> ref;
        for (int64_t i = 0; i < std::max(ba, bb); ++i) {
          std::vector<double> ai(av.begin() + (ba == 1 ? 0 : i) * m * k, av.begin() + ((ba == 1 ? 0 : i) + 1) * m * k);
          std::vector<double> bi(bv.begin() + (bb == 1 ? 0 : i) * k * n, bv.begin() + ((bb == 1 ? 0 : i) + 1) * k * n);
          if (ta) ai = transpose2(ai, k, m);
          if (tb) bi = transpose2(bi, n, k);
          const std::vector<double> c = ref_mm(ai, bi, m, k, n);
          for (double v : c) ref.push_back(0.5 * v);
        }
        Tensor out = ops::matmul(a, b, ta, tb, 0.5f);
        EXPECT_EQ(out.shape(), (Shape{std::max(ba, bb), m, n}));
        EXPECT_OPS_CLOSE(out, ref) << ta << tb << " " << ba << "," << bb;
      }
  // 2-D operands and a permuted (strided) batch operand.
  Tensor a = random_tensor({m, k}, 3), b = random_tensor({k, n}, 4);
  EXPECT_OPS_CLOSE(ops::matmul(a, b), ref_mm(to_double(a), to_double(b), m, k, n));
  Tensor a3 = random_tensor({m, 2, k}, 5).permute({1, 0, 2});  // [2, m, k] with row stride 2k
  const std::vector<double> av = to_double(a3);
  std::vector<double> ref;
  for (int i = 0; i < 2; ++i) {
    const std::vector<double> c = ref_mm(std::vector<double>(av.begin() + i * m * k, av.begin() + (i + 1) * m * k), to_double(b), m, k, n);
    ref.insert(ref.end(), c.begin(), c.end());
  }
  EXPECT_OPS_CLOSE(ops::matmul(a3, b), ref);
  // Transposed views are read in place with the transpose flag flipped: (b^T)^T @ ... and a^T given as a view.
  Tensor bt = test::strided_copy(b);  // [k, n] view of a [n, k] matrix
  EXPECT_OPS_CLOSE(ops::matmul(a, bt), ref_mm(to_double(a), to_double(b), m, k, n));
  Tensor at_view = random_tensor({k, m}, 6).transpose(0, 1);  // [m, k] view
  EXPECT_OPS_CLOSE(ops::matmul(at_view, b), ref_mm(to_double(at_view), to_double(b), m, k, n));
  EXPECT_OPS_CLOSE(ops::matmul(at_view, bt, false, false, 1.0f), ref_mm(to_double(at_view), to_double(bt), m, k, n));
  Tensor q = random_tensor({2, 5, 8}, 7), kk = random_tensor({2, 9, 8}, 8);
  std::vector<double> qk;
  for (int i = 0; i < 2; ++i) {
    const std::vector<double> qv = to_double(q.select(0, i)), kv = to_double(kk.select(0, i));
    const std::vector<double> c = ref_mm(qv, transpose2(kv, 9, 8), 5, 8, 9);
    qk.insert(qk.end(), c.begin(), c.end());
  }
  EXPECT_OPS_CLOSE(ops::matmul(q, kk.transpose(1, 2)), qk);  // q @ k^T with k^T as a view
  EXPECT_OPS_CLOSE(ops::matmul(q, kk, false, true), qk);
}

// Direct convolution in double: x [N, C, H, W], w [O, C/g, kh, kw].
std::vector<double> ref_conv(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p, Shape* out_shape) {
  const std::vector<double> xv = to_double(x), wv = to_double(w);
  const std::vector<double> bv = b.defined() ? to_double(b) : std::vector<double>();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t o = w.size(0), cg = w.size(1), kh = w.size(2), kw = w.size(3);
  const int64_t og = o / p.groups;
  const int64_t ho = (h + 2 * p.pad_h - p.dilation_h * (kh - 1) - 1) / p.stride_h + 1;
  const int64_t wo = (wd + 2 * p.pad_w - p.dilation_w * (kw - 1) - 1) / p.stride_w + 1;
  *out_shape = {n, o, ho, wo};
  std::vector<double> out(size_t(n * o * ho * wo));
  for (int64_t ni = 0; ni < n; ++ni)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t y = 0; y < ho; ++y)
        for (int64_t xx = 0; xx < wo; ++xx) {
          double acc = bv.empty() ? 0.0 : bv[oc];
          const int64_t g = oc / og;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = y * p.stride_h - p.pad_h + i * p.dilation_h, ix = xx * p.stride_w - p.pad_w + j * p.dilation_w;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                acc += xv[((ni * c + g * cg + ci) * h + iy) * wd + ix] * wv[((oc * cg + ci) * kh + i) * kw + j];
              }
          out[((ni * o + oc) * ho + y) * wo + xx] = acc;
        }
  return out;
}

struct ConvCase {
  Shape x, w;
  Conv2dParams p;
  bool bias;
};

TEST(OpsConv2d, PaddingStridesGroupsDilationAndPointwise) {
  const std::vector<ConvCase> cases = {
      {{1, 3, 7, 9}, {5, 3, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true},
      {{2, 8, 17, 13}, {6, 8, 3, 3}, {2, 2, 1, 1, 1, 1, 1}, true},    // stride 2 with padding (SD downsample)
      {{2, 8, 16, 16}, {8, 8, 3, 3}, {2, 2, 0, 0, 1, 1, 1}, false},   // stride 2 without padding (VAE, after pad2d)
      {{1, 8, 9, 9}, {12, 2, 3, 3}, {1, 1, 1, 1, 1, 1, 4}, true},     // groups
      {{1, 4, 11, 10}, {4, 1, 3, 3}, {1, 1, 2, 2, 2, 2, 4}, true},    // depthwise, dilated
      {{2, 33, 7, 5}, {17, 33, 1, 1}, {}, true},                      // pointwise
      {{1, 6, 5, 5}, {4, 3, 1, 1}, {1, 1, 0, 0, 1, 1, 2}, false},                        // pointwise, grouped
      {{1, 2, 6, 5}, {3, 2, 2, 3}, {1, 2, 0, 1, 1, 1, 1}, true},      // asymmetric kernel and strides
      {{1, 32, 40, 36}, {64, 32, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true}, // several pixel blocks per thread
      {{1, 4, 3, 3}, {8, 4, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true},
  };
  uint32_t seed = 1;
  for (const ConvCase& cc : cases) {
    Tensor x = random_tensor(cc.x, seed++), w = random_tensor(cc.w, seed++, 0.2f);
    Tensor b = cc.bias ? random_tensor({cc.w[0]}, seed++) : Tensor();
    Shape os;
    const std::vector<double> ref = ref_conv(x, w, b, cc.p, &os);
    Tensor out = ops::conv2d(x, w, b, cc.p);
    EXPECT_EQ(out.shape(), os) << shape_str(cc.x) << " * " << shape_str(cc.w);
    EXPECT_OPS_CLOSE(out, ref) << shape_str(cc.x) << " * " << shape_str(cc.w);
  }
  // A strided input is packed by the front end.
  Tensor x = test::strided_copy(random_tensor({1, 3, 6, 8}, 99)), w = random_tensor({2, 3, 3, 3}, 98);
  Shape os;
  EXPECT_OPS_CLOSE(ops::conv2d(x, w, Tensor(), {1, 1, 1, 1, 1, 1, 1}), ref_conv(x, w, Tensor(), {1, 1, 1, 1, 1, 1, 1}, &os));
}

// 3x3 stride-1 convolutions big enough for the Winograd path, run through it and through im2col.
TEST(OpsConv2d, WinogradAndIm2colAgreeWithReference) {
  const std::vector<ConvCase> cases = {
      {{1, 16, 17, 19}, {24, 16, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true},   // odd output: partial tiles
      {{2, 8, 33, 31}, {8, 8, 3, 3}, {1, 1, 0, 0, 1, 1, 1}, false},     // no padding
      {{1, 12, 20, 20}, {9, 12, 3, 3}, {1, 1, 2, 2, 1, 1, 1}, true},    // padding 2
      {{1, 64, 24, 24}, {32, 64, 3, 3}, {1, 1, 1, 0, 1, 1, 1}, true},   // asymmetric padding
      {{2, 32, 64, 64}, {40, 32, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true},   // several tasks per image
  };
  uint32_t seed = 50;
  for (bool winograd : {true, false}) {
    cpu::set_winograd_conv(winograd);
    for (const ConvCase& cc : cases) {
      Tensor x = random_tensor(cc.x, seed), w = random_tensor(cc.w, seed + 1, 0.2f);
      Tensor b = cc.bias ? random_tensor({cc.w[0]}, seed + 2) : Tensor();
      Shape os;
      const std::vector<double> ref = ref_conv(x, w, b, cc.p, &os);
      Tensor out = ops::conv2d(x, w, b, cc.p);
      EXPECT_EQ(out.shape(), os);
      EXPECT_OPS_CLOSE(out, ref) << (winograd ? "winograd " : "im2col ") << shape_str(cc.x) << " * " << shape_str(cc.w);
      seed += 3;
    }
  }
  cpu::set_winograd_conv(true);
}

// An upsampler (nearest 2x, then a convolution) against the reference convolution of the upsampled tensor, at odd sizes
// and with a kernel other than 3x3; operands that do not fit are refused with the convolution's messages.
TEST(OpsConv2d, Upsample2xConvEqualsConvOfTheUpsampledInput) {
  const std::vector<ConvCase> cases = {{{1, 3, 5, 7}, {4, 3, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, true},
                                       {{2, 8, 4, 4}, {6, 8, 3, 3}, {1, 1, 1, 1, 1, 1, 1}, false},
                                       {{1, 4, 3, 2}, {5, 4, 1, 1}, {}, true}};
  uint32_t seed = 70;
  for (const ConvCase& cc : cases) {
    const Tensor x = random_tensor(cc.x, seed++), w = random_tensor(cc.w, seed++, 0.2f);
    const Tensor b = cc.bias ? random_tensor({cc.w[0]}, seed++) : Tensor();
    Shape os;
    const std::vector<double> ref = ref_conv(ops::upsample_nearest2d(x, 2), w, b, cc.p, &os);
    const Tensor out = ops::upsample2x_conv2d(x, w, b, cc.p);
    EXPECT_EQ(out.shape(), os) << shape_str(cc.x) << " * " << shape_str(cc.w);
    EXPECT_OPS_CLOSE(out, ref) << shape_str(cc.x) << " * " << shape_str(cc.w);
  }
  // The message names the op and what does not fit.
  const auto refused_with = [](const std::function<void()>& call, const std::string& text) {
    try {
      call();
    } catch (const Error& e) {
      EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
      const std::string what = e.what();
      return what.find("upsample2x_conv2d") != std::string::npos && what.find(text) != std::string::npos;
    }
    return false;
  };
  const Tensor x = random_tensor({1, 3, 4, 4}, 80), w = random_tensor({4, 3, 3, 3}, 81);
  const Conv2dParams p{1, 1, 1, 1};
  EXPECT_TRUE(refused_with([&] { ops::upsample2x_conv2d(x, random_tensor({4, 5, 3, 3}, 82), Tensor(), p); }, "does not match x"));
  EXPECT_TRUE(refused_with([&] { ops::upsample2x_conv2d(random_tensor({3, 4, 4}, 83), w, Tensor(), p); }, "[N, C, H, W]"));
  EXPECT_TRUE(refused_with([&] { ops::upsample2x_conv2d(x, w, random_tensor({3}, 84), p); }, "bias must be [4]"));
}

// Per (sample, group) normalisation in double.
std::vector<double> ref_group_norm(const Tensor& x, int groups, const Tensor& gamma, const Tensor& beta, double eps, bool silu_act) {
  std::vector<double> xv = to_double(x);
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c), per = c / groups * s;
  const std::vector<double> g = gamma.defined() ? to_double(gamma) : std::vector<double>(c, 1.0);
  const std::vector<double> b = beta.defined() ? to_double(beta) : std::vector<double>(c, 0.0);
  for (int64_t item = 0; item < n * groups; ++item) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < per; ++i) mean += xv[item * per + i];
    mean /= double(per);
    for (int64_t i = 0; i < per; ++i) var += (xv[item * per + i] - mean) * (xv[item * per + i] - mean);
    var /= double(per);
    for (int64_t i = 0; i < per; ++i) {
      const int64_t ch = (item % groups) * (c / groups) + i / s;
      double y = (xv[item * per + i] - mean) / std::sqrt(var + eps) * g[ch] + b[ch];
      xv[item * per + i] = silu_act ? silu(y) : y;
    }
  }
  return xv;
}

TEST(OpsNorm, GroupNormWithAffineAndSilu) {
  Tensor x = random_tensor({2, 64, 9, 7}, 1, 2.0f, 0.5f);
  Tensor g = random_tensor({64}, 2), b = random_tensor({64}, 3);
  EXPECT_OPS_CLOSE(ops::group_norm(x, 32, g, b, 1e-5f), ref_group_norm(x, 32, g, b, 1e-5, false));
  EXPECT_OPS_CLOSE(ops::group_norm(x, 32, g, b, 1e-6f, UnaryOp::kSilu), ref_group_norm(x, 32, g, b, 1e-6, true));
  EXPECT_OPS_CLOSE(ops::group_norm(x, 1, Tensor(), Tensor(), 1e-5f), ref_group_norm(x, 1, Tensor(), Tensor(), 1e-5, false));
  // [N, C, L] sequences, strided input.
  Tensor s = test::strided_copy(random_tensor({3, 6, 129}, 4));
  EXPECT_OPS_CLOSE(ops::group_norm(s, 3, Tensor(), Tensor(), 1e-5f), ref_group_norm(s, 3, Tensor(), Tensor(), 1e-5, false));
}

// The norm of x + offset[:, :, None, None] (a resnet's time embedding joining its second norm): offset a narrow of a
// wider [N, K] tensor (the stacked time projections), with and without channels-last test layout; bad offsets are
// refused with a message.
TEST(OpsNorm, GroupNormWithPerSampleChannelOffset) {
  const Tensor x = random_tensor({2, 12, 5, 3}, 11, 1.0f, 0.5f), g = random_tensor({12}, 12), b = random_tensor({12}, 13);
  const Tensor stacked = random_tensor({2, 30}, 14, 3.0f), offset = stacked.narrow(1, 7, 12);
  const Tensor sum = ops::add(x, ops::contiguous(offset).reshape({2, 12, 1, 1}));
  EXPECT_OPS_CLOSE(ops::group_norm(x, 4, g, b, 1e-5f, UnaryOp::kSilu, offset), ref_group_norm(sum, 4, g, b, 1e-5, true));
  EXPECT_OPS_CLOSE(ops::group_norm(x, 3, Tensor(), Tensor(), 1e-6f, UnaryOp::kIdentity, offset),
                   ref_group_norm(sum, 3, Tensor(), Tensor(), 1e-6, false));
  {
    test::ChannelsLastOnCpu channels_last;
    const Tensor xl = ops::contiguous(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});
    const Tensor y = ops::group_norm(xl, 4, g, b, 1e-5f, UnaryOp::kSilu, offset);
    EXPECT_TRUE(y.is_channels_last());
    EXPECT_OPS_CLOSE(y, ref_group_norm(sum, 4, g, b, 1e-5, true));
  }
  EXPECT_THROW(ops::group_norm(x, 4, g, b, 1e-5f, UnaryOp::kSilu, stacked), Error);                       // [2, 30]
  EXPECT_THROW(ops::group_norm(x, 4, g, b, 1e-5f, UnaryOp::kSilu, offset.reshape({2, 12, 1, 1})), Error);  // not [N, C]
  EXPECT_THROW(ops::group_norm(x, 4, g, b, 1e-5f, UnaryOp::kSilu, random_tensor({1, 12}, 15)), Error);    // one sample
}

TEST(OpsNorm, GroupNormLargeOffsetAndLongRows) {
  // Mean far from zero relative to the spread, over 64k-element groups: naive f32 statistics fail here.
  Tensor x = random_tensor({1, 4, 128, 128}, 5, 0.01f, 100.0f);
  EXPECT_OPS_CLOSE(ops::group_norm(x, 2, Tensor(), Tensor(), 1e-6f), ref_group_norm(x, 2, Tensor(), Tensor(), 1e-6, false));
}

// ops::ChannelConcat's readers on a device that reads no parts in place (the CPU): the values of the ops over the
// concatenation, which is made once and kept for the next reader; parts that cannot sit side by side are refused.
TEST(OpsChannelConcat, ReadersSeeTheConcatenationMadeOnce) {
  const Tensor a = random_tensor({2, 6, 3, 4}, 31), b = random_tensor({2, 10, 3, 4}, 32);
  const Tensor joined = ops::concat({a, b}, 1);
  const ops::ChannelConcat x(a, b);
  EXPECT_EQ(x.shape(), joined.shape());
  EXPECT_EQ(x.size(1), 16);
  const Tensor gamma = random_tensor({16}, 33), beta = random_tensor({16}, 34);
  const Tensor norm = ops::group_norm(x, 4, gamma, beta, 1e-5f, UnaryOp::kSilu);
  EXPECT_EQ(norm.to_vector(), ops::group_norm(joined, 4, gamma, beta, 1e-5f, UnaryOp::kSilu).to_vector());
  ASSERT_TRUE(x.is_joined());
  const void* made = x.joined().raw();
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  const Tensor w = random_tensor({5, 16, 3, 3}, 35), bias = random_tensor({5}, 36), r = random_tensor({2, 5, 3, 4}, 37);
  EXPECT_EQ(ops::conv2d(x, w, bias, p, r).to_vector(), ops::conv2d(joined, w, bias, p, r).to_vector());
  EXPECT_EQ(x.joined().raw(), made) << "the concatenation was made again";
  EXPECT_THROW(ops::ChannelConcat(a, random_tensor({2, 6, 3, 5}, 38)), Error);            // widths differ
  EXPECT_THROW(ops::ChannelConcat(a, ops::cast(b, DType::BF16)), Error);                  // dtypes differ
  EXPECT_THROW(ops::group_norm(ops::ChannelConcat(a, b), 5, Tensor(), Tensor(), 1e-5f), Error);  // 16 channels, 5 groups
  EXPECT_THROW(ops::conv2d(ops::ChannelConcat(a, b), random_tensor({5, 15, 3, 3}, 39), Tensor(), p), Error);  // w's channels
}

// conv2 plus a 1x1 shortcut in one op: on the CPU (which declines Backend::conv2d_shortcut) the shortcut's output is
// conv2's addend, the same values as composing the two convolutions; from one tensor or a skip concatenation's parts.
TEST(OpsConvShortcut, Conv2PlusTheShortcut) {
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  const Tensor h = random_tensor({2, 5, 3, 4}, 41), w = random_tensor({5, 5, 3, 3}, 42), b = random_tensor({5}, 43);
  const Tensor a = random_tensor({2, 6, 3, 4}, 44), c = random_tensor({2, 10, 3, 4}, 45), joined = ops::concat({a, c}, 1);
  const Tensor ws = random_tensor({5, 16, 1, 1}, 46), bs = random_tensor({5}, 47);
  const std::vector<float> want = ops::conv2d(h, w, b, p, ops::conv2d(joined, ws, bs, Conv2dParams{})).to_vector();
  EXPECT_EQ(ops::conv2d_with_shortcut(h, w, b, p, joined, ws, bs).to_vector(), want);
  EXPECT_EQ(ops::conv2d_with_shortcut(h, w, b, p, ops::ChannelConcat(a, c), ws, bs).to_vector(), want);
  // Without biases.
  EXPECT_EQ(ops::conv2d_with_shortcut(h, w, Tensor(), p, joined, ws, Tensor()).to_vector(),
            ops::conv2d(h, w, Tensor(), p, ops::conv2d(joined, ws, Tensor(), Conv2dParams{})).to_vector());
  EXPECT_THROW(ops::conv2d_with_shortcut(h, w, b, p, joined, random_tensor({5, 16, 3, 3}, 48), bs), Error);  // not 1x1
  EXPECT_THROW(ops::conv2d_with_shortcut(h, w, b, p, random_tensor({2, 16, 3, 5}, 49), ws, bs), Error);   // 3x5 against 3x4
  EXPECT_THROW(ops::conv2d_with_shortcut(h, w, b, p, joined, random_tensor({4, 16, 1, 1}, 50), bs), Error);  // 4 outputs, not 5
}

std::vector<double> ref_layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, bool rms) {
  std::vector<double> xv = to_double(x);
  const int64_t d = x.size(-1);
  const std::vector<double> g = gamma.defined() ? to_double(gamma) : std::vector<double>(d, 1.0);
  const std::vector<double> b = beta.defined() ? to_double(beta) : std::vector<double>(d, 0.0);
  for (size_t r = 0; r < xv.size() / d; ++r) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += xv[r * d + j];
    mean = rms ? 0.0 : mean / double(d);
    for (int64_t j = 0; j < d; ++j) var += (xv[r * d + j] - mean) * (xv[r * d + j] - mean);
    var /= double(d);
    for (int64_t j = 0; j < d; ++j) xv[r * d + j] = (xv[r * d + j] - mean) / std::sqrt(var + eps) * g[j] + (rms ? 0.0 : b[j]);
  }
  return xv;
}

TEST(OpsNorm, LayerNormAndRmsNorm) {
  for (int64_t d : {1, 7, 320, 1281}) {
    Tensor x = random_tensor({3, 77, d}, uint32_t(d), 3.0f, 1.0f);
    Tensor g = random_tensor({d}, 2), b = random_tensor({d}, 3);
    if (d > 1) EXPECT_OPS_CLOSE(ops::layer_norm(x, g, b, 1e-5f), ref_layer_norm(x, g, b, 1e-5, false)) << d;
    EXPECT_OPS_CLOSE(ops::layer_norm(x, Tensor(), Tensor(), 1e-6f), ref_layer_norm(x, Tensor(), Tensor(), 1e-6, false)) << d;
    EXPECT_OPS_CLOSE(ops::rms_norm(x, g, 1e-6f), ref_layer_norm(x, g, Tensor(), 1e-6, true)) << d;
  }
  Tensor xs = random_tensor({5, 2, 64}, 9).permute({1, 0, 2});
  EXPECT_OPS_CLOSE(ops::layer_norm(xs, Tensor(), Tensor(), 1e-5f), ref_layer_norm(xs, Tensor(), Tensor(), 1e-5, false));
}

// softmax(q k^T * scale + mask) v per (b, h) in double; mask given as logical [B, H, Sq, Sk] values.
std::vector<double> ref_attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<double>* mask, double scale) {
  const std::vector<double> qv = to_double(q), kv = to_double(k), vv = to_double(v);
  const int64_t b = q.size(0), h = q.size(1), sq = q.size(2), d = q.size(3), hk = k.size(1), sk = k.size(2), dv = v.size(3);
  std::vector<double> out(static_cast<size_t>(b * h * sq * dv), 0.0), s(static_cast<size_t>(sk));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi) {
      const int64_t kh = hi / (h / hk);
      for (int64_t i = 0; i < sq; ++i) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < sk; ++j) {
          double acc = 0;
          for (int64_t p = 0; p < d; ++p) acc += qv[((bi * h + hi) * sq + i) * d + p] * kv[((bi * hk + kh) * sk + j) * d + p];
          s[j] = acc * scale + (mask ? (*mask)[((bi * h + hi) * sq + i) * sk + j] : 0.0);
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j < sk; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j < sk; ++j)
          for (int64_t p = 0; p < dv; ++p) out[((bi * h + hi) * sq + i) * dv + p] += s[j] / sum * vv[((bi * hk + kh) * sk + j) * dv + p];
      }
    }
  return out;
}

// Every attention test runs twice: through the fused AVX-512 kernel (where the CPU has it) and through
// the portable GEMM path.
class OpsAttention : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { cpu::set_fused_attention(GetParam()); }
  void TearDown() override { cpu::set_fused_attention(true); }
};
INSTANTIATE_TEST_SUITE_P(OpsPaths, OpsAttention, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Fused" : "Gemm"; });

TEST_P(OpsAttention, OddLengthsGqaAndValueWidth) {
  struct Case { int64_t b, h, hk, sq, sk, d, dv; };
  for (const Case& c : {Case{1, 1, 1, 1, 1, 1, 1}, Case{2, 4, 4, 77, 77, 8, 8}, Case{1, 8, 2, 129, 7, 40, 40},
                        Case{2, 3, 1, 5, 300, 16, 24}, Case{1, 2, 2, 1000, 1100, 8, 8},
                        Case{1, 2, 1, 19, 600, 96, 90}, Case{1, 1, 1, 33, 513, 64, 64}, Case{1, 1, 1, 17, 256, 40, 48},
                        Case{1, 1, 1, 9, 70, 128, 100}}) {
    Tensor q = random_tensor({c.b, c.h, c.sq, c.d}, 1), k = random_tensor({c.b, c.hk, c.sk, c.d}, 2),
           v = random_tensor({c.b, c.hk, c.sk, c.dv}, 3);
    const double scale = 1.0 / std::sqrt(double(c.d));
    EXPECT_OPS_CLOSE(ops::attention(q, k, v), ref_attention(q, k, v, nullptr, scale)) << c.sq << "x" << c.sk << " h" << c.h << "/" << c.hk;
    EXPECT_OPS_CLOSE(ops::attention(q, k, v, Tensor(), 0.3f), ref_attention(q, k, v, nullptr, 0.3));
  }
}

TEST_P(OpsAttention, BroadcastMasks) {
  const int64_t b = 2, h = 3, sq = 9, sk = 11, d = 8;
  Tensor q = random_tensor({b, h, sq, d}, 1), k = random_tensor({b, h, sk, d}, 2), v = random_tensor({b, h, sk, d}, 3);
  const double scale = 1.0 / std::sqrt(double(d));
  // [Sq, Sk] causal-style mask with -inf, [B, 1, 1, Sk] padding mask, and a full [B, H, Sq, Sk] mask.
  std::vector<float> causal(size_t(sq * sk));
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < sk; ++j) causal[i * sk + j] = j > i + 2 ? -INFINITY : 0.0f;
  std::vector<float> pad(size_t(b * sk), 0.0f);
  for (int64_t j = 7; j < sk; ++j) pad[sk + j] = -10000.0f;
  const std::vector<std::pair<Tensor, Shape>> masks = {
      {Tensor::from_vector(causal, {sq, sk}), {sq, sk}},
      {Tensor::from_vector(pad, {b, 1, 1, sk}), {b, 1, 1, sk}},
      {random_tensor({b, h, sq, sk}, 4), {b, h, sq, sk}},
      {random_tensor({b, h, sq, 1}, 5), {b, h, sq, 1}}};
  for (const auto& [mask, shape] : masks) {
    // Logical full mask for the reference.
    std::vector<double> full(size_t(b * h * sq * sk));
    const std::vector<float> mv = mask.to_vector();
    Shape ms(4, 1);
    for (size_t i = 0; i < shape.size(); ++i) ms[4 - shape.size() + i] = shape[i];
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t i = 0; i < sq; ++i)
          for (int64_t j = 0; j < sk; ++j) {
            const int64_t idx = (((ms[0] == 1 ? 0 : bi) * ms[1] + (ms[1] == 1 ? 0 : hi)) * ms[2] + (ms[2] == 1 ? 0 : i)) * ms[3] + (ms[3] == 1 ? 0 : j);
            full[((bi * h + hi) * sq + i) * sk + j] = mv[idx];
          }
    EXPECT_OPS_CLOSE(ops::attention(q, k, v, mask), ref_attention(q, k, v, &full, scale)) << shape_str(shape);
  }
}

TEST_P(OpsAttention, LeadingMaskedKeysAndFullyMaskedRow) {
  // Rows 0-3 see -inf over their first 400 keys (whole key chunks of the fused kernel masked before any
  // finite score), row 4 sees -inf everywhere: torch gives NaN there, and so must we.
  const int64_t sq = 5, sk = 700, d = 8;
  Tensor q = random_tensor({1, 1, sq, d}, 1), k = random_tensor({1, 1, sk, d}, 2), v = random_tensor({1, 1, sk, d}, 3);
  std::vector<float> mv(size_t(sq * sk), 0.0f);
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < sk; ++j)
      if (j < 400 || i == 4) mv[i * sk + j] = -INFINITY;
  Tensor mask = Tensor::from_vector(mv, {sq, sk});
  std::vector<double> full(mv.begin(), mv.end());
  const std::vector<double> ref = ref_attention(q, k, v, &full, 1.0 / std::sqrt(double(d)));
  const std::vector<float> out = ops::attention(q, k, v, mask).to_vector();
  EXPECT_LE(test::rel_l2(std::vector<float>(out.begin(), out.begin() + 4 * d), test::to_float(std::vector<double>(ref.begin(), ref.begin() + 4 * d))),
            test::kOpsTol);
  for (int64_t c = 0; c < d; ++c) EXPECT_TRUE(std::isnan(out[4 * d + c]));
}

TEST_P(OpsAttention, PermutedViewsAndMultiHead) {
  // q/k/v as [B, S, H, D] permuted to [B, H, S, D]: strided views with unit last stride.
  const int64_t b = 2, s = 33, h = 4, d = 10, sk = 17;
  Tensor qs = random_tensor({b, s, h, d}, 1), ks = random_tensor({b, sk, h, d}, 2), vs = random_tensor({b, sk, h, d}, 3);
  Tensor q = qs.permute({0, 2, 1, 3}), k = ks.permute({0, 2, 1, 3}), v = vs.permute({0, 2, 1, 3});
  const std::vector<double> ref = ref_attention(q, k, v, nullptr, 1.0 / std::sqrt(double(d)));
  EXPECT_OPS_CLOSE(ops::attention(q, k, v), ref);
  // multi_head_attention on [B, S, H*D] gives the same numbers, heads merged back: [B, S, H*D].
  Tensor out = ops::multi_head_attention(qs.reshape({b, s, h * d}), ks.reshape({b, sk, h * d}), vs.reshape({b, sk, h * d}), int(h));
  ASSERT_EQ(out.shape(), (Shape{b, s, h * d}));
  Tensor merged_ref = ops::contiguous(ops::attention(q, k, v).permute({0, 2, 1, 3})).reshape({b, s, h * d});
  EXPECT_OPS_CLOSE(out, to_double(merged_ref));
  // Fused QKV projection chunked along the last dim (non-contiguous rows) with GQA (kv_heads 2).
  Tensor qkv = random_tensor({b, s, h * d + 2 * 2 * d}, 4);
  Tensor qv = qkv.narrow(2, 0, h * d), kv = qkv.narrow(2, h * d, 2 * d), vv = qkv.narrow(2, h * d + 2 * d, 2 * d);
  Tensor gqa = ops::multi_head_attention(qv, kv, vv, int(h), 2);
  Tensor qh = ops::contiguous(qv).reshape({b, s, h, d}).permute({0, 2, 1, 3});
  Tensor kh = ops::contiguous(kv).reshape({b, s, 2, d}).permute({0, 2, 1, 3});
  Tensor vh = ops::contiguous(vv).reshape({b, s, 2, d}).permute({0, 2, 1, 3});
  const std::vector<double> r4 = ref_attention(qh, kh, vh, nullptr, 1.0 / std::sqrt(double(d)));
  // Reference is [B, H, S, D]; merge heads.
  std::vector<double> merged(r4.size());
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t i = 0; i < s; ++i)
        for (int64_t p = 0; p < d; ++p) merged[((bi * s + i) * h + hi) * d + p] = r4[((bi * h + hi) * s + i) * d + p];
  EXPECT_OPS_CLOSE(gqa, merged);
}

TEST(OpsBlas, UsesVectorKernelsOnThisCpu) {
  // OpenBLAS 0.3.21 falls back to its SSE3 "Prescott" kernels on CPUs newer than it; the backend re-selects.
  ops::matmul(random_tensor({4, 4}, 1), random_tensor({4, 4}, 2));
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE set by the user";
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "CPU without AVX2";
  EXPECT_STRNE(openblas_get_corename(), "Prescott");
  EXPECT_EQ(openblas_get_parallel() == 1 ? openblas_get_num_threads() : 1, 1) << "OpenBLAS must not thread on its own";
}

}  // namespace
}  // namespace atelier
