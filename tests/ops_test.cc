// Op API tests, part 1: layout ops, elementwise ops, validation and memory. Every op is compared with a
// naive double-precision reference written here, on random inputs with odd sizes and strided views.
// Part 2 (linear algebra, convolution, normalisation, attention) is in ops_linalg_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "backend/ops.h"
#include "core/dtype.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::random_tensor;
using test::to_double;
using test::ref_unary;


const UnaryOp kAllUnary[] = {UnaryOp::kIdentity, UnaryOp::kSilu, UnaryOp::kGelu, UnaryOp::kGeluTanh, UnaryOp::kQuickGelu,
                             UnaryOp::kRelu, UnaryOp::kSigmoid, UnaryOp::kTanh, UnaryOp::kExp, UnaryOp::kSqrt,
                             UnaryOp::kRsqrt, UnaryOp::kSquare, UnaryOp::kNeg, UnaryOp::kSin, UnaryOp::kCos};

bool positive_domain(UnaryOp op) { return op == UnaryOp::kSqrt || op == UnaryOp::kRsqrt; }

TEST(OpsUnary, AllOpsMatchDoubleReference) {
  for (int64_t n : {1, 7, 129, 100003}) {
    for (UnaryOp op : kAllUnary) {
      Tensor x = positive_domain(op) ? random_tensor({n}, 11, 0.5f, 3.0f) : random_tensor({n}, 11, 3.0f);
      const std::vector<double> xv = to_double(x);
      const std::vector<float> out = ops::unary(x, op).to_vector();
      // Per element: f32 rounding of the result, plus an absolute floor where the formula cancels
      // (1 + erf(x) for very negative x computes a tiny difference of two numbers near 1, in torch too).
      for (int64_t i = 0; i < n; ++i) {
        const double want = ref_unary(xv[i], op);
        ASSERT_NEAR(out[i], want, 2e-6 * std::abs(want) + 1e-6) << "op " << int(op) << " x " << xv[i];
      }
    }
  }
}

TEST(OpsUnary, StridedInputAndExtremes) {
  Tensor x = test::strided_copy(random_tensor({13, 17}, 3, 4.0f));
  std::vector<double> ref = to_double(x);
  for (double& v : ref) v = ref_unary(v, UnaryOp::kGelu);
  EXPECT_OPS_CLOSE(ops::gelu(x), ref);
  // Large magnitudes must not produce NaN (silu of -100 is -0, of 100 is 100).
  Tensor big = Tensor::from_vector({-100.0f, 100.0f, -30.0f, 0.0f}, {4});
  const std::vector<float> s = ops::silu(big).to_vector();
  EXPECT_EQ(s[1], 100.0f);
  EXPECT_NEAR(s[0], 0.0f, 1e-30);
  EXPECT_FALSE(std::isnan(s[2]));
}

double ref_binary(double a, double b, BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
    case BinaryOp::kMax: return std::max(a, b);
    case BinaryOp::kMin: return std::min(a, b);
  }
  return 0;
}

// Reference numpy broadcasting over logical (row-major) values.
std::vector<double> ref_broadcast(const Tensor& a, const Tensor& b, BinaryOp op, Shape* out_shape) {
  const std::vector<double> av = to_double(a), bv = to_double(b);
  const size_t r = std::max(a.dim(), b.dim());
  Shape as(r, 1), bs(r, 1), os(r);
  for (int64_t i = 0; i < a.dim(); ++i) as[r - a.dim() + i] = a.shape()[i];
  for (int64_t i = 0; i < b.dim(); ++i) bs[r - b.dim() + i] = b.shape()[i];
  for (size_t i = 0; i < r; ++i) os[i] = std::max(as[i], bs[i]);
  *out_shape = os;
  std::vector<double> out(size_t(numel_of(os)));
  for (int64_t flat = 0; flat < int64_t(out.size()); ++flat) {
    int64_t rem = flat, ai = 0, bi = 0, amul = 1, bmul = 1;
    for (int64_t d = int64_t(r) - 1; d >= 0; --d) {
      const int64_t idx = rem % os[d];
      rem /= os[d];
      ai += (as[d] == 1 ? 0 : idx) * amul;
      bi += (bs[d] == 1 ? 0 : idx) * bmul;
      amul *= as[d];
      bmul *= bs[d];
    }
    out[flat] = ref_binary(av[ai], bv[bi], op);
  }
  return out;
}

TEST(OpsBinary, BroadcastingCases) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{7}, {7}}, {{2, 3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{5, 7, 9}, {5, 1, 1}}, {{1}, {3, 129}},
      {{2, 320, 9, 11}, {1, 320, 1, 1}}, {{2, 77, 33}, {2, 1, 33}}, {{4, 1}, {1, 5}}, {{2, 64, 300}, {2, 64, 300}}};
  const BinaryOp all[] = {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv, BinaryOp::kMax, BinaryOp::kMin};
  uint32_t seed = 1;
  for (const auto& [sa, sb] : cases) {
    for (BinaryOp op : all) {
      Tensor a = random_tensor(sa, seed++), b = random_tensor(sb, seed++, 1.0f, op == BinaryOp::kDiv ? 4.0f : 0.0f);
      Shape os;
      const std::vector<double> ref = ref_broadcast(a, b, op, &os);
      Tensor out = ops::binary(a, b, op);
      EXPECT_EQ(out.shape(), os);
      EXPECT_OPS_CLOSE(out, ref) << shape_str(sa) << " op " << int(op) << " " << shape_str(sb);
    }
  }
}

TEST(OpsBinary, StridedAndPermutedViews) {
  Tensor a = random_tensor({3, 5, 7}, 5).permute({2, 0, 1});  // [7, 3, 5] strided
  Tensor b = test::strided_copy(random_tensor({3, 5}, 6));    // [3, 5] strided
  Shape os;
  const std::vector<double> ref = ref_broadcast(a, b, BinaryOp::kMul, &os);
  EXPECT_OPS_CLOSE(ops::mul(a, b), ref);
  Tensor n = random_tensor({4, 10}, 7).narrow(1, 3, 5);
  Tensor m = random_tensor({4, 1}, 8);
  EXPECT_OPS_CLOSE(ops::sub(n, m), ref_broadcast(n, m, BinaryOp::kSub, &os));
}

TEST(OpsBinary, NanPropagatesThroughMaxMin) {
  Tensor a = Tensor::from_vector({NAN, 1.0f, 2.0f}, {3});
  Tensor b = Tensor::from_vector({0.0f, NAN, 1.0f}, {3});
  for (BinaryOp op : {BinaryOp::kMax, BinaryOp::kMin}) {
    const std::vector<float> r = ops::binary(a, b, op).to_vector();
    EXPECT_TRUE(std::isnan(r[0]) && std::isnan(r[1]));
  }
}

TEST(OpsLincomb, SharedAndPerSampleCoefficients) {
  const Shape shape{3, 4, 7, 129};
  std::vector<Tensor> xs = {random_tensor(shape, 1), random_tensor(shape, 2), test::strided_copy(random_tensor(shape, 3))};
  const std::vector<float> c = {0.5f, -1.25f, 3.0f};
  std::vector<std::vector<double>> xv;
  for (const Tensor& x : xs) xv.push_back(to_double(x));
  std::vector<double> ref(xv[0].size());
  for (size_t j = 0; j < ref.size(); ++j) ref[j] = c[0] * xv[0][j] + c[1] * xv[1][j] + c[2] * xv[2][j];
  EXPECT_OPS_CLOSE(ops::lincomb(xs, c), ref);

  const std::vector<float> cs = {1, 2, 3, -1, 0.5f, 0.25f, 0, 0, 7};  // [3 samples, 3 inputs]
  const size_t per = ref.size() / 3;
  for (size_t j = 0; j < ref.size(); ++j) {
    const size_t s = j / per;
    ref[j] = cs[s * 3] * xv[0][j] + cs[s * 3 + 1] * xv[1][j] + cs[s * 3 + 2] * xv[2][j];
  }
  EXPECT_OPS_CLOSE(ops::lincomb_per_sample(xs, cs), ref);
  EXPECT_THROW(ops::lincomb_per_sample(xs, c), Error);  // 3 coefficients for 3 samples x 3 inputs
}

// Classifier-free guidance, row by row with its own scale, rounded as u + g * (c - u) in f32 op by op; packed and
// channels-last inputs alike; bad shapes and scale counts refused.
TEST(OpsGuidance, CombinesEachRowWithItsScale) {
  const Tensor c = random_tensor({3, 4, 5, 6}, 21), u = random_tensor({3, 4, 5, 6}, 22);
  const std::vector<float> g = {7.5f, 1.0f, -2.25f};
  const std::vector<float> cv = c.to_vector(), uv = u.to_vector();
  std::vector<float> want(cv.size());
  for (size_t j = 0; j < want.size(); ++j) {
    const volatile float d = cv[j] - uv[j];  // volatile: each op rounded on its own, no contraction into an FMA
    const volatile float m = d * g[j / 120];
    want[j] = uv[j] + m;
  }
  EXPECT_EQ(ops::guidance_combine(c, u, g).to_vector(), want);
  const auto channels_last = [](const Tensor& x) { return ops::contiguous(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2}); };
  const Tensor cl = channels_last(c), ul = channels_last(u);
  ASSERT_TRUE(cl.is_channels_last());
  EXPECT_EQ(ops::contiguous(ops::guidance_combine(cl, ul, g)).to_vector(), want);
  EXPECT_THROW(ops::guidance_combine(c, u, {7.5f}), Error);                                  // one scale, three rows
  EXPECT_THROW(ops::guidance_combine(c, random_tensor({3, 4, 5, 5}, 23), g), Error);         // shapes differ
  EXPECT_THROW(ops::guidance_combine(ops::cast(c, DType::BF16), ops::cast(u, DType::BF16), g), Error);  // f32 only
}

// A UNet's timestep features: sin then cos of t * freq (cos first with flip), zeros past them, one timestep for
// every row or one per row, rounded to the asked dtype; bad shapes refused.
TEST(OpsDiffusion, TimestepFeaturesAreSinesThenCosines) {
  const Tensor t = Tensor::from_vector({999.0f, 1.0f, 500.5f}, {3}), freqs = Tensor::from_vector({1.0f, 0.1f, 0.001f}, {1, 3});
  for (const bool flip : {false, true}) {
    const Tensor f = ops::timestep_features(t, freqs, flip, 7, 3, DType::F32);
    ASSERT_EQ(f.shape(), (Shape{3, 7}));
    const std::vector<float> v = f.to_vector();
    for (int r = 0; r < 3; ++r)
      for (int j = 0; j < 3; ++j) {
        const double arg = double(t.to_vector()[r]) * double(freqs.to_vector()[j]);
        EXPECT_NEAR(v[r * 7 + (flip ? 3 : 0) + j], std::sin(arg), 2e-4) << r << " " << j;
        EXPECT_NEAR(v[r * 7 + (flip ? 0 : 3) + j], std::cos(arg), 2e-4) << r << " " << j;
      }
    for (int r = 0; r < 3; ++r) EXPECT_EQ(v[r * 7 + 6], 0.0f);
  }
  const Tensor one = ops::timestep_features(Tensor::from_vector({1.0f}, {1}), freqs, false, 6, 4, DType::F32);
  const Tensor many = ops::timestep_features(Tensor::from_vector({1.0f, 1.0f, 1.0f, 1.0f}, {4}), freqs, false, 6, 4, DType::F32);
  EXPECT_EQ(one.to_vector(), many.to_vector());
  EXPECT_EQ(ops::timestep_features(t, freqs, false, 6, 3, DType::BF16).dtype(), DType::BF16);
  EXPECT_THROW(ops::timestep_features(t, freqs, false, 5, 3, DType::F32), Error);  // 3 frequencies need 6 features
  EXPECT_THROW(ops::timestep_features(t, freqs, false, 6, 2, DType::F32), Error);  // 3 timesteps for 2 rows
}

// The unfused sequence the models used before ops::rope (and the reference runs): pairs split, four
// products, a difference and a sum, concatenated back. x [B, A, C, D] contiguous, cos/sin [S, D/2].
Tensor rope_reference(const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim) {
  const Shape s = x.shape();
  const Tensor pairs = ops::contiguous(x).reshape({s[0], s[1], s[2], s[3] / 2, 2});
  const Tensor x0 = pairs.narrow(4, 0, 1), x1 = pairs.narrow(4, 1, 1);
  const Shape table = seq_dim == 1 ? Shape{s[1], 1, s[3] / 2, 1} : Shape{s[2], s[3] / 2, 1};
  const Tensor c = cos.reshape(table), sn = sin.reshape(table);
  const Tensor even = ops::sub(ops::mul(x0, c), ops::mul(x1, sn));
  const Tensor odd = ops::add(ops::mul(x0, sn), ops::mul(x1, c));
  return ops::concat({even, odd}, 4).reshape(s);
}

TEST(OpsRope, EqualsTheUnfusedSequenceOnViewsAlongEitherDim) {
  for (int seq_dim : {1, 2}) {
    // A permuted view, as FLUX passes q [B, N, H, D] permuted to [B, H, N, D].
    const Tensor base = random_tensor({2, 5, 3, 8}, 21 + seq_dim);
    const Tensor x = base.permute({0, 2, 1, 3});  // [2, 3, 5, 8]
    const int64_t s = x.size(seq_dim);
    const Tensor cos = random_tensor({s, 4}, 31), sin = random_tensor({s, 4}, 32);
    const Tensor got = ops::rope(x, cos, sin, seq_dim);
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_EQ(got.shape(), x.shape());
    const std::vector<float> want = rope_reference(x, cos, sin, seq_dim).to_vector(), g = got.to_vector();
    ASSERT_EQ(g.size(), want.size());
    for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(g[i], want[i]) << "seq_dim " << seq_dim << " at " << i;
  }
  EXPECT_THROW(ops::rope(random_tensor({1, 2, 3, 5}, 1), random_tensor({3, 2}, 2), random_tensor({3, 2}, 3), 2), Error);
  EXPECT_THROW(ops::rope(random_tensor({1, 2, 3, 4}, 1), random_tensor({2, 2}, 2), random_tensor({2, 2}, 3), 2), Error);
}

TEST(OpsRope, WithRmsNormEqualsRmsNormThenRope) {
  for (int seq_dim : {1, 2}) {
    // The heads of a fused q/k/v projection: [B, N, 3, H, D] with q selected, permuted as FLUX passes it.
    const Tensor qkv = random_tensor({2, 5, 3, 4, 8}, 51 + seq_dim, 3.0f);
    const Tensor x = seq_dim == 2 ? qkv.select(2, 1).permute({0, 2, 1, 3}) : qkv.select(2, 1);
    const int64_t s = x.size(seq_dim);
    const Tensor cos = random_tensor({s, 4}, 61), sin = random_tensor({s, 4}, 62), gamma = random_tensor({8}, 63);
    for (const Tensor& g : {gamma, Tensor()}) {
      const Tensor got = ops::rope(x, cos, sin, seq_dim, {.on = true, .gamma = g, .eps = 1e-6f});
      const Tensor want = ops::rope(ops::rms_norm(x, g, 1e-6f), cos, sin, seq_dim);
      EXPECT_TRUE(got.is_contiguous());
      ASSERT_EQ(got.shape(), want.shape());
      const std::vector<float> gv = got.to_vector(), wv = want.to_vector();
      for (size_t i = 0; i < gv.size(); ++i) ASSERT_EQ(gv[i], wv[i]) << "seq_dim " << seq_dim << " at " << i;
    }
  }
  EXPECT_THROW(ops::rope(random_tensor({1, 2, 3, 4}, 1), random_tensor({3, 2}, 2), random_tensor({3, 2}, 3), 2,
                         {.on = true, .gamma = random_tensor({5}, 4), .eps = 1e-6f}),
               Error);
}

// rope_runs: each run of positions roped with its own norm and its rows of the tables, the runs in order along
// the sequence (FLUX's double blocks: text then image tokens). Batch 1 writes one token-major buffer, larger
// batches concatenate: both equal the runs' ropes concatenated.
TEST(OpsRope, RunsAreEachRunsRopeInOrder) {
  constexpr int64_t kDim = 8, kText = 2, kImage = 5, kSeq = kText + kImage;
  const Tensor cos = random_tensor({kSeq, kDim / 2}, 71), sin = random_tensor({kSeq, kDim / 2}, 72);
  const RopeRms text{true, random_tensor({kDim}, 73), 1e-6f}, image{true, random_tensor({kDim}, 74), 1e-5f};
  for (int64_t batch : {1, 2}) {
    const Tensor x = random_tensor({batch, kSeq, 3, 4, kDim}, 75 + batch, 3.0f).select(2, 0).permute({0, 2, 1, 3});  // [B, 4, 7, 8]
    const Tensor got = ops::rope_runs(x, cos, sin, {{kText, text}, {kImage, image}});
    const Tensor want = ops::concat({ops::rope(x.narrow(2, 0, kText), cos.narrow(0, 0, kText), sin.narrow(0, 0, kText), 2, text),
                                     ops::rope(x.narrow(2, kText, kImage), cos.narrow(0, kText, kImage), sin.narrow(0, kText, kImage), 2, image)},
                                    2);
    ASSERT_EQ(got.shape(), want.shape());
    const std::vector<float> gv = got.to_vector(), wv = want.to_vector();
    for (size_t i = 0; i < gv.size(); ++i) ASSERT_EQ(gv[i], wv[i]) << "batch " << batch << " at " << i;
    if (batch == 1) EXPECT_EQ(got.strides()[2], 4 * kDim) << "batch 1: a token-major buffer, no concatenation";
  }
  const Tensor x = random_tensor({1, 4, kSeq, kDim}, 79);
  EXPECT_EQ(ops::rope_runs(x, cos, sin, {{kSeq, text}}).to_vector(), ops::rope(x, cos, sin, 2, text).to_vector());
  EXPECT_THROW(ops::rope_runs(x, cos, sin, {{kText, text}, {kImage - 1, image}}), Error);  // 6 of 7 positions
  EXPECT_THROW(ops::rope_runs(x, cos, sin, {{kText, text}, {kImage + 1, image}}), Error);  // past the sequence
  EXPECT_THROW(ops::rope_runs(x, cos, sin, {{0, text}, {kSeq, image}}), Error);            // an empty run
  EXPECT_THROW(ops::rope_runs(x, cos, sin, {}), Error);
}

TEST(OpsNormModulate, EqualsTheUnfusedSequence) {
  const Tensor x = random_tensor({2, 5, 24}, 41), res = random_tensor({2, 5, 24}, 42), gamma = random_tensor({24}, 43);
  const Tensor scale = random_tensor({2, 1, 24}, 44), shift = random_tensor({2, 1, 24}, 45), gate = random_tensor({2, 1, 24}, 46);
  const auto same = [](const Tensor& got, const Tensor& want, const char* what) {
    const std::vector<float> g = got.to_vector(), w = want.to_vector();
    ASSERT_EQ(g.size(), w.size()) << what;
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], w[i]) << what << " at " << i;
  };
  // FLUX's adaLN: layer_norm(x) * (1 + scale) + shift.
  same(ops::norm_modulate(x, NormKind::kLayer, 1e-6f, Tensor(), {.scale = scale, .shift = shift}),
       ops::add(ops::mul(ops::layer_norm(x, {}, {}, 1e-6f), ops::affine(scale, 1.0f, 1.0f)), shift), "layer + scale + shift");
  // FLUX's gated residual: res + gate * x.
  same(ops::norm_modulate(x, NormKind::kNone, 0.0f, Tensor(), {.gate = gate, .residual = res}), ops::add(res, ops::mul(gate, x)),
       "gated residual");
  // Z-Image's: rms_norm(x) * (1 + scale), and res + gate * rms_norm(x), and res + rms_norm(x).
  same(ops::norm_modulate(x, NormKind::kRms, 1e-5f, gamma, {.scale = scale}),
       ops::mul(ops::rms_norm(x, gamma, 1e-5f), ops::affine(scale, 1.0f, 1.0f)), "rms + scale");
  same(ops::norm_modulate(x, NormKind::kRms, 1e-5f, gamma, {.gate = gate, .residual = res}),
       ops::add(res, ops::mul(gate, ops::rms_norm(x, gamma, 1e-5f))), "res + gate * rms");
  same(ops::norm_modulate(x, NormKind::kRms, 1e-5f, gamma, {.residual = res}), ops::add(res, ops::rms_norm(x, gamma, 1e-5f)),
       "res + rms");
  EXPECT_THROW(ops::norm_modulate(x, NormKind::kLayer, 1e-6f, Tensor(), {.gate = gate}), Error);  // a gate needs a residual
  EXPECT_THROW(ops::norm_modulate(x, NormKind::kLayer, 1e-6f, Tensor(), {.scale = random_tensor({3, 24}, 1)}), Error);
}

TEST(OpsAttention, MergedHeadsEqualsPermutedAttention) {
  const Tensor q = random_tensor({2, 3, 9, 8}, 51), k = random_tensor({2, 3, 7, 8}, 52), v = random_tensor({2, 3, 7, 8}, 53);
  const Tensor want = ops::contiguous(ops::attention(q, k, v).permute({0, 2, 1, 3})).reshape({2, 9, 24});
  const Tensor got = ops::attention_merged(q, k, v);
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_EQ(got.to_vector(), want.to_vector());
}

TEST(OpsAffine, ScaleAndShift) {
  Tensor x = random_tensor({5, 33}, 9);
  std::vector<double> ref = to_double(x);
  for (double& v : ref) v = 0.18215 * v + 0.5;
  EXPECT_OPS_CLOSE(ops::affine(x, 0.18215f, 0.5f), ref);
  std::vector<double> ref2 = to_double(x);
  for (double& v : ref2) v *= -2.0;
  EXPECT_OPS_CLOSE(ops::affine(x, -2.0f), ref2);
}

TEST(OpsGlu, GegluAndOddWidth) {
  for (int64_t h : {1, 7, 640}) {
    Tensor x = random_tensor({2, 5, 2 * h}, uint32_t(h));
    const std::vector<double> xv = to_double(x);
    std::vector<double> ref;
    for (int64_t r = 0; r < 10; ++r)
      for (int64_t j = 0; j < h; ++j) ref.push_back(xv[r * 2 * h + j] * ref_unary(xv[r * 2 * h + h + j], UnaryOp::kGelu));
    Tensor out = ops::glu(x, UnaryOp::kGelu);
    EXPECT_EQ(out.shape(), (Shape{2, 5, h}));
    EXPECT_OPS_CLOSE(out, ref);
  }
}

std::vector<double> ref_softmax(const std::vector<double>& x, int64_t d) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / d; ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < d; ++j) mx = std::max(mx, x[r * d + j]);
    for (int64_t j = 0; j < d; ++j) sum += std::exp(x[r * d + j] - mx);
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = std::exp(x[r * d + j] - mx) / sum;
  }
  return out;
}

TEST(OpsSoftmax, RowsWithLargeValuesAndMaskedEntries) {
  for (int64_t d : {1, 3, 77, 4099}) {
    Tensor x = random_tensor({3, 5, d}, uint32_t(d), 30.0f);  // large logits: max subtraction matters
    EXPECT_OPS_CLOSE(ops::softmax(x), ref_softmax(to_double(x), d)) << d;
  }
  Tensor m = Tensor::from_vector({1.0f, -INFINITY, 2.0f, -INFINITY}, {1, 4});
  const std::vector<float> r = ops::softmax(m).to_vector();
  EXPECT_EQ(r[1], 0.0f);
  EXPECT_NEAR(r[0] + r[2], 1.0f, 1e-6);
}

// --- layout ---------------------------------------------------------------------------------------

TEST(OpsLayout, ConcatAlongEachDim) {
  Tensor a = random_tensor({2, 3, 4}, 1), b = test::strided_copy(random_tensor({2, 3, 4}, 2));
  for (int dim = 0; dim < 3; ++dim) {
    Shape sb = {2, 3, 4};
    sb[dim] = 5;
    Tensor c = random_tensor(sb, 3);
    Tensor out = ops::concat({a, c, b}, dim);
    // Reference: the element at index i along dim comes from the input owning that range.
    const std::vector<float> av = a.to_vector(), bv = b.to_vector(), cv = c.to_vector(), ov = out.to_vector();
    Shape os = out.shape();
    for (int64_t flat = 0; flat < out.numel(); ++flat) {
      int64_t idx[3], rem = flat;
      for (int d = 2; d >= 0; --d) { idx[d] = rem % os[d]; rem /= os[d]; }
      // Segments along dim: a [0, la), c [la, la + 5), b [la + 5, 2 la + 5).
      const int64_t la = a.shape()[dim];
      const std::vector<float>* src = &av;
      Shape ss = {2, 3, 4};
      if (idx[dim] >= la + 5) {
        src = &bv;
        idx[dim] -= la + 5;
      } else if (idx[dim] >= la) {
        src = &cv;
        ss = sb;
        idx[dim] -= la;
      }
      const int64_t si = (idx[0] * ss[1] + idx[1]) * ss[2] + idx[2];
      ASSERT_EQ(ov[flat], (*src)[si]) << "dim " << dim << " flat " << flat;
    }
  }
  EXPECT_THROW(ops::concat({a, random_tensor({2, 4, 4}, 4)}, 2), Error);
}

// Backend::copy_many copies every pair by copy's rules: plain runs of bytes, a cast, a strided destination.
TEST(OpsLayout, CopyManyCopiesEveryPair) {
  const Tensor a = random_tensor({3, 5}, 11), b = random_tensor({7}, 12), c = random_tensor({4, 6}, 13);
  Tensor da = Tensor::empty({3, 5}, DType::F32, Device::cpu()), db = Tensor::empty({7}, DType::BF16, Device::cpu());
  Tensor wide = Tensor::zeros({4, 12}, DType::F32, Device::cpu());
  backend_for(Device::cpu()).copy_many({{da, a}, {db, b}, {wide.narrow(1, 3, 6), c}});
  EXPECT_EQ(da.to_vector(), a.to_vector());
  EXPECT_EQ(db.to_vector(), ops::cast(b, DType::BF16).to_vector());
  EXPECT_EQ(ops::contiguous(wide.narrow(1, 3, 6)).to_vector(), c.to_vector());
  EXPECT_EQ(ops::contiguous(wide.narrow(1, 0, 3)).to_vector(), std::vector<float>(12, 0.0f));
  EXPECT_THROW(backend_for(Device::cpu()).copy_many({{da, c}}), Error);  // shapes differ
}

// Channels-last activations (the GPU's layout), run on the CPU through its test switch: convolution outputs
// are channels-last, group norm, elementwise ops, channel concat and upsampling keep the layout, and every
// value equals the NCHW run's; the convolution's addend (a per-sample bias, a residual) equals a separate add.
TEST(OpsLayout, ChannelsLastPropagatesWithTheSameValues) {
  const Tensor x = random_tensor({2, 16, 5, 6}, 1), w = random_tensor({8, 16, 3, 3}, 2, 0.1f), b = random_tensor({8}, 3);
  const Tensor temb = random_tensor({2, 8, 1, 1}, 4), skip = random_tensor({2, 8, 5, 6}, 5);
  const Conv2dParams p{1, 1, 1, 1};
  const auto chain = [&](std::vector<Tensor>* stages) {
    const Tensor y = ops::conv2d(x, w, b, p, temb);
    const Tensor n = ops::group_norm(y, 4, Tensor(), Tensor(), 1e-5f, UnaryOp::kSilu);
    const Tensor r = ops::conv2d(n, random_tensor({8, 8, 3, 3}, 6, 0.1f), b, p, y);  // residual addend, channels-last
    const Tensor s = ops::add(r, ops::conv2d(skip, random_tensor({8, 8, 1, 1}, 7), Tensor(), {}));
    const Tensor c = ops::concat({s, ops::silu(r)}, 1);
    const Tensor u = ops::upsample_nearest2d(c, 2);
    *stages = {y, n, r, s, c, u};
  };
  std::vector<Tensor> nchw, cl;
  chain(&nchw);
  {
    test::ChannelsLastOnCpu on;
    chain(&cl);
  }
  const char* names[] = {"conv + per-sample addend", "group norm", "conv + residual addend", "add", "concat", "upsample"};
  for (size_t i = 0; i < nchw.size(); ++i) {
    EXPECT_TRUE(nchw[i].is_contiguous()) << names[i];
    EXPECT_TRUE(cl[i].is_channels_last()) << names[i] << ": " << shape_str(cl[i].strides());
    EXPECT_EQ(cl[i].to_vector(), nchw[i].to_vector()) << names[i];
  }
  // The addend equals conv + add.
  const Tensor sep = ops::add(ops::conv2d(x, w, b, p), temb);
  EXPECT_EQ(nchw[0].to_vector(), sep.to_vector());
}

TEST(OpsLayout, ChunkGivesViews) {
  Tensor x = random_tensor({2, 6, 5}, 1);
  std::vector<Tensor> parts = ops::chunk(x, 3, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].shape(), (Shape{2, 2, 5}));
  EXPECT_EQ(parts[2].to_vector(), x.narrow(1, 4, 2).to_vector());
  EXPECT_EQ(parts[0].buffer(), x.buffer());
  EXPECT_THROW(ops::chunk(x, 4, 1), Error);
  EXPECT_EQ(ops::chunk(x, 5, -1)[4].to_vector(), x.narrow(2, 4, 1).to_vector());
}

TEST(OpsLayout, UpsampleNearestMatchesTorchIndexing) {
  for (int f : {1, 2, 3}) {
    Tensor x = test::strided_copy(random_tensor({2, 3, 5, 7}, 1));
    Tensor out = ops::upsample_nearest2d(x, f);
    ASSERT_EQ(out.shape(), (Shape{2, 3, 5 * f, 7 * f}));
    const std::vector<float> xv = x.to_vector(), ov = out.to_vector();
    for (int64_t nc = 0; nc < 6; ++nc)
      for (int64_t y = 0; y < 5 * f; ++y)
        for (int64_t xx = 0; xx < 7 * f; ++xx)  // torch: src = floor(dst * (1 / f))
          ASSERT_EQ(ov[(nc * 5 * f + y) * 7 * f + xx], xv[(nc * 5 + int64_t(std::floor(y * (1.0 / f)))) * 7 + int64_t(std::floor(xx * (1.0 / f)))]);
    // The channels-last form (what a device that keeps activations so runs) makes the same values, channels-last.
    const Tensor xc = ops::contiguous(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2});
    Tensor outc = Tensor::empty_channels_last(out.shape(), xc.dtype(), xc.device());
    backend_for(Device::cpu()).upsample_nearest2d_channels_last(outc, xc, f);
    EXPECT_EQ(ops::contiguous(outc).to_vector(), ov) << "factor " << f;
  }
}

TEST(OpsLayout, AsymmetricPad2d) {
  Tensor x = random_tensor({1, 2, 3, 4}, 1);
  Tensor out = ops::pad2d(x, 0, 1, 2, 0, -7.0f);  // left 0, right 1, top 2, bottom 0 (the VAE's downsample pad is (0,1,0,1))
  ASSERT_EQ(out.shape(), (Shape{1, 2, 5, 5}));
  const std::vector<float> xv = x.to_vector(), ov = out.to_vector();
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t y = 0; y < 5; ++y)
      for (int64_t xx = 0; xx < 5; ++xx) {
        const bool inside = y >= 2 && xx < 4;
        const float want = inside ? xv[(c * 3 + y - 2) * 4 + xx] : -7.0f;
        ASSERT_EQ(ov[(c * 5 + y) * 5 + xx], want);
      }
  EXPECT_THROW(ops::pad2d(x, -1, 0, 0, 0), Error);
}

TEST(OpsLayout, EmbeddingGathersRows) {
  Tensor table = random_tensor({10, 6}, 1);
  std::vector<int32_t> ids = {3, 0, 9, 3};
  Tensor idt = Tensor::empty({2, 2}, DType::I32);
  std::copy(ids.begin(), ids.end(), idt.data<int32_t>());
  Tensor out = ops::embedding(idt, table);
  ASSERT_EQ(out.shape(), (Shape{2, 2, 6}));
  const std::vector<float> tv = table.to_vector(), ov = out.to_vector();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) ASSERT_EQ(ov[i * 6 + j], tv[ids[i] * 6 + j]);
  Tensor bad = Tensor::empty({1}, DType::I64);
  bad.data<int64_t>()[0] = 10;
  EXPECT_THROW(ops::embedding(bad, table), Error);
}

TEST(OpsLayout, CastsRoundTripHalfTypes) {
  Tensor x = random_tensor({3, 77}, 1, 10.0f);
  const std::vector<float> xv = x.to_vector();
  for (DType t : {DType::F16, DType::BF16}) {
    Tensor h = ops::cast(test::strided_copy(x), t);
    ASSERT_EQ(h.dtype(), t);
    Tensor back = ops::cast(h, DType::F32);
    const std::vector<float> bv = back.to_vector();
    for (size_t i = 0; i < xv.size(); ++i) {
      const float want = t == DType::F16 ? f16_to_float(float_to_f16(xv[i])) : bf16_to_float(float_to_bf16(xv[i]));
      ASSERT_EQ(bv[i], want) << i;
    }
  }
  EXPECT_THROW(ops::gelu(ops::cast(x, DType::F16)), Error);  // the CPU backend computes in f32 only
}

TEST(OpsLayout, ContiguousCloneAndToDevice) {
  Tensor x = random_tensor({4, 6}, 1);
  EXPECT_EQ(ops::contiguous(x).buffer(), x.buffer());
  EXPECT_NE(ops::clone(x).buffer(), x.buffer());
  Tensor t = ops::contiguous(x.transpose(0, 1));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_vector(), x.transpose(0, 1).to_vector());
  EXPECT_EQ(ops::to_device(x, Device::cpu()).buffer(), x.buffer());
}

// --- validation and memory ------------------------------------------------------------------------

TEST(OpsValidation, BadShapesGiveInvalidArgumentWithAMessage) {
  Tensor a = random_tensor({2, 3}, 1), b = random_tensor({4, 5}, 2);
  try {
    ops::matmul(a, b);
    FAIL() << "matmul of [2,3] @ [4,5] should throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos);
  }
  EXPECT_THROW(ops::add(a, b), Error);
  EXPECT_THROW(ops::linear(a, b), Error);
  EXPECT_THROW(ops::conv2d(a, b, Tensor(), {}), Error);
  EXPECT_THROW(ops::group_norm(random_tensor({1, 6, 2}, 3), 4, Tensor(), Tensor(), 1e-5f), Error);
  EXPECT_THROW(ops::attention(random_tensor({1, 3, 4, 8}, 1), random_tensor({1, 2, 4, 8}, 2), random_tensor({1, 2, 4, 8}, 3)), Error);
  EXPECT_THROW(ops::unary(Tensor(), UnaryOp::kSilu), Error);
  const Status st = catch_status([&] { ops::softmax(Tensor()); return Status::ok(); });
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
}

TEST(OpsMemory, RepeatedOpsKeepReservedBytesFlat) {
  Backend& be = backend_for(Device::cpu());
  Tensor x = random_tensor({2, 32, 16, 16}, 1);
  Tensor w = random_tensor({32, 32, 3, 3}, 2, 0.05f);
  Tensor lw = random_tensor({32, 32}, 3, 0.1f);
  auto step = [&] {
    Tensor h = ops::group_norm(x, 8, Tensor(), Tensor(), 1e-5f, UnaryOp::kSilu);
    h = ops::conv2d(h, w, Tensor(), {1, 1, 1, 1});
    Tensor s = ops::contiguous(h.reshape({2, 32, 256}).transpose(1, 2));
    s = ops::linear(s, lw);
    s = ops::multi_head_attention(s, s, s, 4);
    s = ops::layer_norm(s, Tensor(), Tensor(), 1e-5f);
    Tensor u = ops::upsample_nearest2d(h, 2);
    u = ops::pad2d(u, 0, 1, 0, 1);
    return ops::add(ops::lincomb({x, x}, {0.5f, 0.5f}), h);
  };
  step();
  step();
  const size_t after_warmup = be.bytes_reserved();
  for (int i = 0; i < 10; ++i) step();
  EXPECT_EQ(be.bytes_reserved(), after_warmup);
}

}  // namespace
}  // namespace atelier
