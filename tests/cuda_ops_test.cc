// CUDA backend, part 1: registration, memory, data movement and elementwise ops, each compared with the CPU
// backend (the reference implementation) on random inputs with odd sizes and strided views, in f32 and in
// bf16/f16 (criteria in cuda_test_util.h). Every test skips with the reason when cuda:0 is not usable.
// Part 2 (GEMM, convolution, normalisation, attention) is cuda_linalg_test.cc.
#include <gtest/gtest.h>

#include <functional>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"

namespace atelier {
namespace {

using test::check_parity;
using test::cuda0;
using test::kLowp;
using test::random_tensor;
using test::to_gpu;

// --- registration ------------------------------------------------------------------------------------------

TEST(CudaOps, RegistrationReportsWhyADeviceIsMissing) {
  // Runs everywhere: without a GPU it checks the error message, then reports itself skipped.
  const std::string why = test::cuda_unavailable_reason();
  if (!why.empty()) {
    EXPECT_NE(why.find("device cuda:0 is not available: "), std::string::npos) << why;
    EXPECT_FALSE(backend_available(Device::cuda(0)));
    GTEST_SKIP() << "no usable CUDA device: " << why;
  }
  Backend& be = backend_for(cuda0());
  EXPECT_EQ(be.device(), cuda0());
  EXPECT_NE(be.name().find("cuda:0"), std::string::npos) << be.name();
  std::printf("[ device   ] %s, %d SMs, conv: %s\n", be.name().c_str(), test::cuda_be().sm_count(), test::cuda_be().conv_impl_name().c_str());
  EXPECT_FALSE(backend_available(Device::cuda(15)));
  try {
    backend_for(Device::cuda(15));
    ADD_FAILURE() << "cuda:15 should not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device cuda:15 is not available"), std::string::npos) << e.what();
    EXPECT_EQ(e.status().code(), ErrorCode::kUnsupported);
  }
}

// --- memory ------------------------------------------------------------------------------------------------

TEST(CudaOps, HostDeviceRoundTripIsExact) {
  ATELIER_REQUIRE_CUDA();
  // Sizes around the 8 MiB staging slots and past the 4-slot ring.
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1000), int64_t(3) << 20, int64_t(9) << 20}) {
    const Tensor x = random_tensor({n}, uint32_t(n + 1));
    const Tensor g = x.to(cuda0());
    EXPECT_EQ(g.device(), cuda0());
    const Tensor back = g.to(Device::cpu());
    ASSERT_EQ(back.numel(), n);
    EXPECT_EQ(std::memcmp(back.raw(), x.raw(), x.nbytes()), 0) << "n " << n;
    const Tensor dd = ops::clone(g);  // device-to-device
    EXPECT_EQ(dd.to_vector(), x.to_vector()) << "n " << n;
  }
  // Integer and 16-bit payloads move as bytes.
  Tensor ids = Tensor::empty({5}, DType::I64);
  const int64_t vals[5] = {0, -1, (int64_t(1) << 40) + 3, 123456789012345, 7};
  std::memcpy(ids.raw(), vals, sizeof(vals));
  const Tensor ids_back = ids.to(cuda0()).to(Device::cpu());
  EXPECT_EQ(std::memcmp(ids_back.raw(), vals, sizeof(vals)), 0);
  const Tensor h = ops::cast(random_tensor({4097}, 5), DType::BF16);
  const Tensor h_back = h.to(cuda0()).to(Device::cpu());
  EXPECT_EQ(std::memcmp(h_back.raw(), h.raw(), h.nbytes()), 0);
}

TEST(CudaOps, AllocatorReusesBlocksAndReleasesThem) {
  ATELIER_REQUIRE_CUDA();
  Backend& be = backend_for(cuda0());
  // Warm the engines (their workspaces stay allocated), then measure from a clean cache.
  const Tensor x = to_gpu(random_tensor({2, 16, 9, 9}, 1));
  const Tensor w = to_gpu(random_tensor({8, 16, 3, 3}, 2));
  auto work = [&] {
    Tensor y = ops::conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1});
    Tensor z = ops::linear(y.reshape({2 * 8, 81}), to_gpu(random_tensor({33, 81}, 3)));
    Tensor a = ops::attention(z.reshape({2, 2, 4, 33}), z.reshape({2, 2, 4, 33}), z.reshape({2, 2, 4, 33}));
    return ops::add(ops::group_norm(y, 4, Tensor(), Tensor(), 1e-5f).reshape({2, 8, 81}).narrow(2, 0, 33),
                    a.reshape({2, 8, 33})).to_vector();
  };
  const std::vector<float> first = work();
  be.synchronize();
  be.release_cached();
  const size_t base = be.bytes_reserved();
  const std::vector<float> second = work();
  const size_t after_one = be.bytes_reserved();
  EXPECT_GT(after_one, base);
  for (int i = 0; i < 5; ++i) EXPECT_LE(test::rel_l2(work(), first), 1e-6);
  EXPECT_EQ(be.bytes_reserved(), after_one) << "the same shapes must reuse cached blocks";
  be.release_cached();
  EXPECT_EQ(be.bytes_reserved(), base) << "everything allocated by the ops was returned (no leak)";
  EXPECT_LE(test::rel_l2(second, first), 1e-6);
}

// A request takes a cached block of a larger class (up to twice its size) instead of a new cudaMalloc:
// batches that shrink by a few rows reuse what the larger ones left. Smaller than half the block: a new one.
TEST(CudaOps, AllocatorServesSmallerRequestsFromLargerCachedBlocks) {
  ATELIER_REQUIRE_CUDA();
  auto& be = static_cast<cuda::CudaBackend&>(backend_for(cuda0()));
  auto count = [&](const char* name) {
    for (const auto& [k, v] : be.counters())
      if (k == name) return int64_t(v);
    ADD_FAILURE() << "no counter " << name;
    return int64_t(-1);
  };
  be.synchronize();
  be.release_cached();
  constexpr int64_t kMiB = int64_t(1) << 20;
  { Tensor big = Tensor::empty({48 * kMiB / 4}, DType::F32, cuda0()); }  // a 48 MiB block, now cached
  const int64_t mallocs = count("cuda_mallocs"), reuses = count("allocator_larger_reuses");
  { Tensor smaller = Tensor::empty({30 * kMiB / 4}, DType::F32, cuda0()); }  // 30 MiB: served by the 48 MiB block
  EXPECT_EQ(count("cuda_mallocs"), mallocs);
  EXPECT_EQ(count("allocator_larger_reuses"), reuses + 1);
  { Tensor tiny = Tensor::empty({8 * kMiB / 4}, DType::F32, cuda0()); }  // 8 MiB: under half of it, its own block
  EXPECT_EQ(count("cuda_mallocs"), mallocs + 1);
  be.release_cached();
}

TEST(CudaOps, OutOfMemoryIsAnErrorNotACrash) {
  ATELIER_REQUIRE_CUDA();
  try {
    Tensor huge = Tensor::empty({int64_t(1) << 50}, DType::F32, cuda0());  // 4 PiB
    ADD_FAILURE() << "a 4 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.status().code(), ErrorCode::kResourceExhausted) << e.what();
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  // The device still works afterwards.
  const Tensor x = random_tensor({100}, 9);
  EXPECT_EQ(ops::clone(x.to(cuda0())).to_vector(), x.to_vector());
}

// --- data movement -----------------------------------------------------------------------------------------

TEST(CudaOps, StridedCopiesAndCastsMatchTheCpu) {
  ATELIER_REQUIRE_CUDA();
  const Tensor x = random_tensor({3, 4, 5, 6}, 21);
  const Tensor g = to_gpu(x);
  // Permutations, narrows and broadcasts: exact in f32.
  const std::vector<std::vector<int>> perms = {{0, 2, 1, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}};
  for (const auto& perm : perms) EXPECT_EQ(ops::contiguous(g.permute(perm)).to_vector(), ops::contiguous(x.permute(perm)).to_vector());
  EXPECT_EQ(ops::contiguous(g.narrow(3, 1, 4).narrow(1, 1, 2)).to_vector(), ops::contiguous(x.narrow(3, 1, 4).narrow(1, 1, 2)).to_vector());
  EXPECT_EQ(ops::upsample_nearest2d(g, 3).to_vector(), ops::upsample_nearest2d(x, 3).to_vector());
  // The CUDA upsample kernel in bf16 and on a strided input (packed first).
  EXPECT_EQ(ops::upsample_nearest2d(to_gpu(x, DType::BF16), 2).to_vector(),
            ops::upsample_nearest2d(test::rounded(x, DType::BF16), 2).to_vector());
  EXPECT_EQ(ops::upsample_nearest2d(g.permute({0, 1, 3, 2}), 2).to_vector(), ops::upsample_nearest2d(x.permute({0, 1, 3, 2}), 2).to_vector());
  EXPECT_EQ(ops::pad2d(g, 1, 2, 3, 0, -7.5f).to_vector(), ops::pad2d(x, 1, 2, 3, 0, -7.5f).to_vector());
  EXPECT_EQ(ops::concat({g, g.narrow(1, 0, 1), g}, 1).to_vector(), ops::concat({x, x.narrow(1, 0, 1), x}, 1).to_vector());
  const auto parts_g = ops::chunk(g, 3, 3), parts_x = ops::chunk(x, 3, 3);
  EXPECT_EQ(ops::contiguous(parts_g[1]).to_vector(), ops::contiguous(parts_x[1]).to_vector());
  // Casts round to nearest even on both backends: bit-identical.
  for (DType dt : kLowp) {
    const Tensor cpu_cast = ops::cast(x.permute({0, 3, 2, 1}), dt);
    const Tensor gpu_cast = ops::cast(g.permute({0, 3, 2, 1}), dt).to(Device::cpu());
    EXPECT_EQ(std::memcmp(cpu_cast.raw(), gpu_cast.raw(), cpu_cast.nbytes()), 0) << dtype_name(dt);
    // 16-bit -> f32 -> other 16-bit, strided.
    const Tensor back = ops::cast(ops::cast(ops::cast(g, dt).transpose(1, 2), DType::F32), DType::F16);
    const Tensor back_cpu = ops::cast(ops::cast(ops::cast(x, dt).transpose(1, 2), DType::F32), DType::F16);
    EXPECT_EQ(back.to_vector(), back_cpu.to_vector()) << dtype_name(dt);
  }
  // Integers: same-dtype copies move bits (values beyond 2^24 survive); int -> float converts.
  Tensor ids = Tensor::empty({2, 3}, DType::I64);
  const int64_t vals[6] = {1, (int64_t(1) << 40) + 1, -5, 3, 4, 99};
  std::memcpy(ids.raw(), vals, sizeof(vals));
  const Tensor idt = ops::contiguous(ids.to(cuda0()).transpose(0, 1)).to(Device::cpu());
  const int64_t* it = idt.data<int64_t>();
  EXPECT_EQ(it[0], vals[0]);
  EXPECT_EQ(it[2], vals[1]);
  EXPECT_EQ(it[5], vals[5]);
  EXPECT_EQ(ops::cast(ids.to(cuda0()).narrow(1, 0, 1), DType::F32).to_vector(), (std::vector<float>{1.0f, 3.0f}));
  const Tensor as_i32 = ops::cast(to_gpu(Tensor::from_vector({1.7f, -2.2f, 40000.0f}, {3})), DType::I32).to(Device::cpu());
  EXPECT_EQ(as_i32.data<int32_t>()[0], 1);
  EXPECT_EQ(as_i32.data<int32_t>()[1], -2);
  EXPECT_EQ(as_i32.data<int32_t>()[2], 40000);
  // A 7-dim view that cannot be merged still copies; 9 unmergeable dims are refused with a message.
  const Tensor x7 = random_tensor({2, 3, 2, 3, 2, 3, 2}, 4);
  const std::vector<int> p7 = {6, 4, 2, 0, 1, 3, 5};
  EXPECT_EQ(ops::contiguous(to_gpu(x7).permute(p7)).to_vector(), ops::contiguous(x7.permute(p7)).to_vector());
  const Tensor x9 = to_gpu(random_tensor({2, 2, 2, 2, 2, 2, 2, 2, 2}, 5));
  EXPECT_THROW(ops::contiguous(x9.permute({8, 7, 6, 5, 4, 3, 2, 1, 0})), Error);
}

TEST(CudaOps, FillAndZeros) {
  ATELIER_REQUIRE_CUDA();
  EXPECT_EQ(Tensor::full({3, 7}, 2.5f, cuda0()).to_vector(), std::vector<float>(21, 2.5f));
  EXPECT_EQ(Tensor::zeros({1000}, DType::BF16, cuda0()).to_vector(), std::vector<float>(1000, 0.0f));
  Tensor t = Tensor::zeros({4, 6}, DType::F16, cuda0());
  Tensor view = t.narrow(1, 2, 3);
  backend_for(cuda0()).fill(view, -1.25f);  // strided fill
  const std::vector<float> v = t.to_vector();
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 6; ++c) EXPECT_EQ(v[r * 6 + c], (c >= 2 && c < 5) ? -1.25f : 0.0f);
}

TEST(CudaOps, EmbeddingGathersRows) {
  ATELIER_REQUIRE_CUDA();
  const Tensor table = random_tensor({50, 19}, 7);
  for (DType id_t : {DType::I32, DType::I64}) {
    Tensor ids = Tensor::empty({2, 5}, id_t);
    const int64_t v[10] = {0, 49, 3, 3, 17, 8, 1, 0, 22, 49};
    for (int i = 0; i < 10; ++i) {
      if (id_t == DType::I64) ids.data<int64_t>()[i] = v[i];
      else ids.data<int32_t>()[i] = int32_t(v[i]);
    }
    const std::vector<float> want = ops::embedding(ids, table).to_vector();
    EXPECT_EQ(ops::embedding(ids.to(cuda0()), to_gpu(table)).to_vector(), want);
    // A bf16 table gathers the bf16 values exactly.
    const Tensor t16 = to_gpu(table, DType::BF16);
    EXPECT_EQ(ops::embedding(ids.to(cuda0()), t16).to_vector(), ops::embedding(ids, test::rounded(table, DType::BF16)).to_vector());
  }
}

// --- elementwise -------------------------------------------------------------------------------------------

const UnaryOp kAllUnary[] = {UnaryOp::kIdentity, UnaryOp::kSilu, UnaryOp::kGelu, UnaryOp::kGeluTanh, UnaryOp::kQuickGelu,
                             UnaryOp::kRelu, UnaryOp::kSigmoid, UnaryOp::kTanh, UnaryOp::kExp, UnaryOp::kSqrt,
                             UnaryOp::kRsqrt, UnaryOp::kSquare, UnaryOp::kNeg, UnaryOp::kSin, UnaryOp::kCos};

bool positive_domain(UnaryOp op) { return op == UnaryOp::kSqrt || op == UnaryOp::kRsqrt; }

TEST(CudaOps, UnaryMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  for (int64_t n : {1, 7, 1029, 100003}) {
    for (UnaryOp op : kAllUnary) {
      const Tensor x = positive_domain(op) ? random_tensor({n}, 11, 0.5f, 3.0f) : random_tensor({n}, 11, 3.0f);
      const auto fn = [op](const std::vector<Tensor>& in) { return ops::unary(in[0], op); };
      const std::string what = "unary op " + std::to_string(int(op)) + " n " + std::to_string(n);
      // f32 against the formula in double (not the CPU's f32 result: that one cancels in 1 + erf(x) for
      // x << 0, where the GPU computes erfc and is accurate); the same per-element rule as the CPU test.
      const std::vector<float> got = ops::unary(to_gpu(x), op).to_vector();
      const std::vector<double> xv = test::to_double(x);
      for (int64_t i = 0; i < n; ++i) {
        const double want = test::ref_unary(xv[i], op);
        ASSERT_NEAR(got[size_t(i)], want, 2e-6 * std::abs(want) + 1e-6) << what << " x " << xv[i];
      }
      // exp of the 3-sigma inputs would overflow f16 (max 65504): a narrower range for the 16-bit runs.
      const Tensor xl = op == UnaryOp::kExp ? random_tensor({n}, 11, 1.5f) : x;
      for (DType dt : kLowp) EXPECT_PARITY(what, fn, {xl}, dt);
    }
  }
  // Strided input (made contiguous by the op API) and extremes.
  const Tensor xs = test::strided_copy(random_tensor({13, 17}, 3, 4.0f));
  EXPECT_PARITY("gelu strided", [](const std::vector<Tensor>& in) { return ops::gelu(in[0]); }, {xs}, DType::F32, 2e-6);
  const std::vector<float> s = ops::silu(to_gpu(Tensor::from_vector({-100.0f, 100.0f, -30.0f, 0.0f}, {4}))).to_vector();
  EXPECT_EQ(s[1], 100.0f);
  EXPECT_NEAR(s[0], 0.0f, 1e-30);
  EXPECT_FALSE(std::isnan(s[2]));
}

TEST(CudaOps, BinaryBroadcastMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 5, 7}, {3, 5, 7}}, {{2, 3, 4, 5}, {3, 1, 5}}, {{1}, {13, 17}}, {{4, 1, 6}, {1, 5, 1}}, {{2, 320, 9, 9}, {2, 320, 1, 1}},
      {{100003}, {100003}}, {{1, 77, 768}, {77, 768}}};
  const BinaryOp all[] = {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv, BinaryOp::kMax, BinaryOp::kMin};
  for (const auto& [sa, sb] : shapes) {
    const Tensor a = random_tensor(sa, 31), b = random_tensor(sb, 32, 1.0f, 0.25f);
    for (BinaryOp op : all) {
      const auto fn = [op](const std::vector<Tensor>& in) { return ops::binary(in[0], in[1], op); };
      const std::string what = "binary op " + std::to_string(int(op)) + " " + shape_str(sa) + " x " + shape_str(sb);
      EXPECT_PARITY(what, fn, std::vector<Tensor>({a, b}), DType::F32, 1e-7);  // one correctly rounded operation
      EXPECT_PARITY(what, fn, std::vector<Tensor>({a, b}), DType::BF16);
    }
  }
  // Strided operands.
  const Tensor a = test::strided_copy(random_tensor({6, 10}, 41)), b = random_tensor({6, 20}, 42).narrow(1, 3, 10);
  EXPECT_PARITY("binary strided", [](const std::vector<Tensor>& in) { return ops::mul(in[0], in[1]); },
                std::vector<Tensor>({a, b}), DType::F32, 1e-7);
}

TEST(CudaOps, LincombAndAffineMatchCpu) {
  ATELIER_REQUIRE_CUDA();
  for (int n_in : {1, 3, 8, 11}) {  // more than 8 inputs accumulate over several launches
    std::vector<Tensor> xs;
    std::vector<float> c;
    for (int i = 0; i < n_in; ++i) {
      xs.push_back(random_tensor({4, 3, 33, 17}, uint32_t(50 + i)));
      c.push_back(0.37f * float(i + 1) * (i % 2 ? -1.0f : 1.0f));
    }
    const auto fn = [c](const std::vector<Tensor>& in) { return ops::lincomb(in, c); };
    EXPECT_PARITY("lincomb " + std::to_string(n_in) + " inputs", fn, xs, DType::F32, 1e-6);
    EXPECT_PARITY("lincomb " + std::to_string(n_in) + " inputs", fn, xs, DType::BF16);
    std::vector<float> per;
    for (int s = 0; s < 4; ++s)
      for (int i = 0; i < n_in; ++i) per.push_back(float(s + 1) * 0.1f - float(i) * 0.2f);
    const auto fn_ps = [per](const std::vector<Tensor>& in) { return ops::lincomb_per_sample(in, per); };
    EXPECT_PARITY("lincomb per sample " + std::to_string(n_in) + " inputs", fn_ps, xs, DType::F32, 1e-6);
  }
  // 100 samples x 3 inputs = 300 coefficients: more than one launch's argument table.
  std::vector<Tensor> xs = {random_tensor({100, 5, 7}, 61), random_tensor({100, 5, 7}, 62), random_tensor({100, 5, 7}, 63)};
  std::vector<float> per(300);
  for (size_t i = 0; i < per.size(); ++i) per[i] = std::sin(float(i));
  EXPECT_PARITY("lincomb 100 samples", [per](const std::vector<Tensor>& in) { return ops::lincomb_per_sample(in, per); }, xs, DType::F32, 1e-6);
  EXPECT_PARITY("affine", [](const std::vector<Tensor>& in) { return ops::affine(in[0], 2.0f, -1.0f); },
                {random_tensor({3, 1001}, 64)}, DType::F32, 1e-7);
  EXPECT_PARITY("affine", [](const std::vector<Tensor>& in) { return ops::affine(in[0], 0.5f, 0.25f); },
                {random_tensor({3, 1001}, 64)}, DType::BF16);
}

// The guidance kernel gives the CPU's three ops' bits: packed and channels-last rows, 1-64 rows (the kernel) and 65
// (sub, mul and add), odd row sizes.
TEST(CudaOps, GuidanceCombineMatchesCpuBitForBit) {
  ATELIER_REQUIRE_CUDA();
  for (const Shape& shape : {Shape{1, 4, 64, 64}, Shape{3, 4, 7, 9}, Shape{64, 4, 3, 5}, Shape{65, 2, 3, 3}}) {
    const Tensor c = random_tensor(shape, 31, 3.0f), u = random_tensor(shape, 32, 3.0f);
    std::vector<float> g;
    for (int64_t s = 0; s < shape[0]; ++s) g.push_back(1.0f + 0.37f * float(s));
    const std::vector<float> want = ops::guidance_combine(c, u, g).to_vector();
    const int64_t launches = shape[0] <= 64 ? 1 : 0;  // past 64 rows: the three ops (the same bits, so count them)
    int64_t before = cuda::guidance_combine_launches();
    EXPECT_EQ(ops::guidance_combine(to_gpu(c), to_gpu(u), g).to(Device::cpu()).to_vector(), want) << shape_str(shape);
    EXPECT_EQ(cuda::guidance_combine_launches() - before, launches) << "packed " << shape_str(shape);
    const Tensor cl = test::channels_last(to_gpu(c)), ul = test::channels_last(to_gpu(u));
    before = cuda::guidance_combine_launches();
    EXPECT_EQ(ops::contiguous(ops::guidance_combine(cl, ul, g)).to(Device::cpu()).to_vector(), want) << shape_str(shape);
    EXPECT_EQ(cuda::guidance_combine_launches() - before, launches) << "channels-last " << shape_str(shape);
  }
}

// The timestep features' kernel gives the bits of the ops it replaced on the GPU (product, sin, cos, concatenations,
// a cast): SD's 320 features of 160 frequencies, both orders, one timestep or one per row, f32 and bf16, an odd dim.
TEST(CudaOps, TimestepFeaturesMatchTheUnfusedOpsBitForBit) {
  ATELIER_REQUIRE_CUDA();
  std::vector<float> fv;
  for (int i = 0; i < 160; ++i) fv.push_back(std::exp(-std::log(10000.0f) * float(i) / 160.0f));
  const Tensor freqs = to_gpu(Tensor::from_vector(fv, {1, 160}));
  const auto unfused = [&](const Tensor& t, bool flip, int64_t dim, int64_t rows, DType dt) {
    const Tensor tr = t.size(0) == rows ? t : ops::concat(std::vector<Tensor>(size_t(rows), t), 0);
    const Tensor args = ops::mul(tr.view({rows, 1}), freqs);
    const Tensor s = ops::unary(args, UnaryOp::kSin), c = ops::unary(args, UnaryOp::kCos);
    Tensor f = flip ? ops::concat({c, s}, 1) : ops::concat({s, c}, 1);
    if (dim > 320) f = ops::concat({f, Tensor::zeros({rows, dim - 320}, DType::F32, cuda0())}, 1);
    return ops::cast(f, dt);
  };
  const Tensor per_row = to_gpu(Tensor::from_vector({999.0f, 951.0f, 1.0f, 0.0f}, {4})), shared = to_gpu(Tensor::from_vector({761.0f}, {1}));
  for (const bool flip : {false, true})
    for (const DType dt : {DType::F32, DType::BF16})
      for (const int64_t dim : {320, 321})
        for (const Tensor& t : {per_row, shared}) {
          const int64_t before = cuda::timestep_features_launches();
          const Tensor got = ops::timestep_features(t, freqs, flip, dim, 4, dt);
          EXPECT_EQ(cuda::timestep_features_launches() - before, 1) << "the fused kernel ran";  // not the fallback
          ASSERT_EQ(got.dtype(), dt);
          EXPECT_EQ(ops::cast(got, DType::F32).to(Device::cpu()).to_vector(),
                    ops::cast(unfused(t, flip, dim, 4, dt), DType::F32).to(Device::cpu()).to_vector())
              << "flip " << flip << " dim " << dim << " rows of t " << t.size(0) << " " << dtype_name(dt);
        }
}

TEST(CudaOps, GluMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  // Widths of whole 16-byte vectors take the vectorised kernel (1280, 8), the others the scalar one.
  for (const Shape& s : {Shape{7, 2}, Shape{2, 77, 2 * 1280}, Shape{3, 5, 2 * 13}, Shape{9, 2 * 8}}) {
    for (UnaryOp act : {UnaryOp::kGelu, UnaryOp::kSilu, UnaryOp::kGeluTanh}) {
      const auto fn = [act](const std::vector<Tensor>& in) { return ops::glu(in[0], act); };
      EXPECT_PARITY("glu " + shape_str(s) + " act " + std::to_string(int(act)), fn, {random_tensor(s, 71, 2.0f)}, DType::F32, 2e-6);
      EXPECT_PARITY("glu " + shape_str(s) + " act " + std::to_string(int(act)), fn, {random_tensor(s, 71, 2.0f)}, DType::BF16);
    }
  }
}

TEST(CudaOps, RopeMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  // FLUX's layout (a [B, N, H, D] projection viewed as [B, H, N, D], positions along dim 2) and Z-Image's
  // ([B, S, H, D], positions along dim 1), odd sizes.
  for (int seq_dim : {1, 2}) {
    // (head dims 16 and 128 take the 16-bit vector kernel, 6 the scalar one)
    for (const Shape& s : {Shape{2, 7, 3, 16}, Shape{1, 77, 4, 128}, Shape{1, 5, 2, 6}}) {
      const int64_t n = seq_dim == 1 ? s[1] : s[2];
      const auto fn = [seq_dim](const std::vector<Tensor>& in) {
        return ops::rope(in[0].permute({0, 2, 1, 3}).permute({0, 2, 1, 3}), in[1], in[2], seq_dim);
      };
      const auto view = [seq_dim](const std::vector<Tensor>& in) {  // a strided (permuted) input
        return ops::rope(in[0].permute({0, 2, 1, 3}), in[1], in[2], seq_dim);
      };
      const std::vector<Tensor> in{random_tensor(s, 91, 2.0f), random_tensor({n, s[3] / 2}, 92), random_tensor({n, s[3] / 2}, 93)};
      const std::vector<Tensor> in_view{random_tensor({s[0], s[2], s[1], s[3]}, 94, 2.0f), random_tensor({n, s[3] / 2}, 95),
                                        random_tensor({n, s[3] / 2}, 96)};
      for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
        EXPECT_PARITY("rope " + shape_str(s) + " seq dim " + std::to_string(seq_dim), fn, in, dt);
        EXPECT_PARITY("rope (permuted view) " + shape_str(s) + " seq dim " + std::to_string(seq_dim), view, in_view, dt);
      }
    }
  }
}

// rope with its RMS-norm prologue (FLUX's and Z-Image's q/k norms), reading heads out of a fused q/k/v
// projection [B, N, 3, H, D] in place, positions along dim 1 (Z-Image) or 2 (FLUX, permuted). Head dims 128
// and 64 take the 16-bit vector kernel (16 and 8 lanes), 16 and 6 the warp-per-row kernel; f32 always the latter.
TEST(CudaOps, RopeWithRmsNormMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  for (int seq_dim : {1, 2}) {
    for (const Shape& s : {Shape{1, 77, 3, 4, 128}, Shape{2, 9, 3, 3, 64}, Shape{2, 7, 3, 3, 16}, Shape{1, 5, 3, 2, 6}}) {
      const int64_t n = s[1], d = s[4];
      for (bool gamma : {true, false}) {
        const auto fn = [seq_dim, gamma](const std::vector<Tensor>& in) {
          const Tensor k = in[0].select(2, 1);  // [B, N, H, D], token stride 3 H D
          const Tensor x = seq_dim == 2 ? k.permute({0, 2, 1, 3}) : k;
          return ops::rope(x, in[1], in[2], seq_dim, {.on = true, .gamma = gamma ? in[3] : Tensor(), .eps = 1e-6f});
        };
        const std::vector<Tensor> in{random_tensor(s, 97, 3.0f), random_tensor({n, d / 2}, 98), random_tensor({n, d / 2}, 99),
                                     random_tensor({d}, 100)};
        for (DType dt : {DType::F32, DType::BF16, DType::F16})
          EXPECT_PARITY("rope+rms " + shape_str(s) + " seq dim " + std::to_string(seq_dim) + (gamma ? " gamma" : ""), fn, in, dt);
      }
    }
  }
}

TEST(CudaOps, NormModulateMatchesCpu) {
  ATELIER_REQUIRE_CUDA();
  // FLUX's row width (3072) and small ones; every kind with each modulation the models use. Widths that are
  // multiples of the 16-byte vector take the register-resident kernel (3072, 40; 20 in f32), the others the
  // scalar one (20 in 16 bits, 18).
  // 3 x 401 rows of 3072: enough rows for blocks of four (norm_modulate_rows_kernel), samples changing inside
  // a block.
  for (const Shape& s : {Shape{2, 9, 3072}, Shape{3, 401, 3072}, Shape{1, 7, 40}, Shape{2, 3, 20}, Shape{1, 3, 18}}) {
    const int64_t d = s[2];
    const std::vector<Tensor> in{random_tensor(s, 101, 2.0f), random_tensor(s, 102), random_tensor({d}, 103),
                                 random_tensor({s[0], 1, d}, 104), random_tensor({s[0], 1, d}, 105), random_tensor({s[0], 1, d}, 106)};
    const struct {
      const char* what;
      std::function<Tensor(const std::vector<Tensor>&)> fn;
    } cases[] = {
        {"layer * (1 + scale) + shift", [](const std::vector<Tensor>& v) {
           return ops::norm_modulate(v[0], NormKind::kLayer, 1e-6f, Tensor(), {.scale = v[3], .shift = v[4]});
         }},
        {"res + gate * x", [](const std::vector<Tensor>& v) {
           return ops::norm_modulate(v[0], NormKind::kNone, 0.0f, Tensor(), {.gate = v[5], .residual = v[1]});
         }},
        {"rms * gamma * (1 + scale)", [](const std::vector<Tensor>& v) {
           return ops::norm_modulate(v[0], NormKind::kRms, 1e-5f, v[2], {.scale = v[3]});
         }},
        {"res + gate * rms * gamma", [](const std::vector<Tensor>& v) {
           return ops::norm_modulate(v[0], NormKind::kRms, 1e-5f, v[2], {.gate = v[5], .residual = v[1]});
         }},
    };
    for (const auto& c : cases)
      for (DType dt : {DType::F32, DType::BF16, DType::F16}) EXPECT_PARITY(std::string("norm_modulate ") + c.what + " " + shape_str(s), c.fn, in, dt);
  }
  // Rows far from zero (mean 1000, spread ~1; f32): the layer norm's statistics must not cancel (a one-pass
  // sum of squares would lose the variance to the mean's square).
  const Shape s{2, 9, 3072};
  Tensor far = random_tensor(s, 107);
  for (int64_t i = 0; i < far.numel(); ++i) far.data<float>()[i] += 1000.0f;
  EXPECT_PARITY("norm_modulate layer, rows of mean 1000",
                [](const std::vector<Tensor>& v) {
                  return ops::norm_modulate(v[0], NormKind::kLayer, 1e-6f, Tensor(), {.scale = v[1], .shift = v[2]});
                },
                (std::vector<Tensor>{far, random_tensor({2, 1, 3072}, 108), random_tensor({2, 1, 3072}, 109)}), DType::F32);
}

TEST(CudaOps, SoftmaxMatchesCpuAndMasksLikeTorch) {
  ATELIER_REQUIRE_CUDA();
  const auto fn = [](const std::vector<Tensor>& in) { return ops::softmax(in[0]); };
  for (const Shape& s : {Shape{7, 1}, Shape{5, 77}, Shape{3, 4099}, Shape{2, 20000}, Shape{2, 3, 129}}) {
    EXPECT_PARITY("softmax " + shape_str(s), fn, {random_tensor(s, 81, 4.0f)}, DType::F32, 2e-6);
    for (DType dt : kLowp) EXPECT_PARITY("softmax " + shape_str(s), fn, {random_tensor(s, 81, 4.0f)}, dt);
  }
  // -inf entries get probability 0; a fully masked row is NaN (torch's result).
  std::vector<float> v = {1.0f, -INFINITY, 2.0f, -INFINITY, -INFINITY, -INFINITY};
  const std::vector<float> out = ops::softmax(to_gpu(Tensor::from_vector(v, {2, 3}))).to_vector();
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_NEAR(out[0] + out[2], 1.0f, 1e-6);
  EXPECT_TRUE(std::isnan(out[3]) && std::isnan(out[4]) && std::isnan(out[5]));
}

TEST(CudaOps, LongChainsOfAsyncOpsStayOrdered) {
  ATELIER_REQUIRE_CUDA();
  // Hundreds of ops without a host synchronisation: stream order and stream-ordered block reuse must hold.
  Tensor c = random_tensor({3, 257}, 91);
  Tensor g = to_gpu(c);
  for (int i = 0; i < 300; ++i) {
    c = ops::add(ops::affine(ops::silu(c), 0.9f), ops::softmax(c));
    g = ops::add(ops::affine(ops::silu(g), 0.9f), ops::softmax(g));
  }
  EXPECT_LE(test::rel_l2(g.to_vector(), c.to_vector()), 1e-5);
}

TEST(CudaOps, CopiesBetweenTwoGpus) {
  ATELIER_REQUIRE_CUDA();
  if (!backend_available(Device::cuda(1))) GTEST_SKIP() << "only one CUDA device";
  const Tensor x = random_tensor({1000, 77}, 95);
  const Tensor on1 = x.to(cuda0()).to(Device::cuda(1));
  EXPECT_EQ(on1.device(), Device::cuda(1));
  EXPECT_EQ(ops::silu(on1).to(cuda0()).to_vector(), ops::silu(x.to(cuda0())).to_vector());
}

}  // namespace
}  // namespace atelier

namespace atelier {
namespace {
// The host-made 32-bit divisors of the row arithmetic (cuda::FastDivU32): n / d exactly for every n < 2^31,
// here on the host (the device takes the same formula with __umulhi; the rope parity tests cover it there).
TEST(CudaDevice, FastDivisionEqualsIntegerDivision) {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (uint32_t d : {4607u, 4608u, 24576u, 98304u, 110592u, 1u << 20, (1u << 30) + 1, (1u << 31) - 1}) divisors.push_back(d);
  uint64_t state = 12345;
  const auto next = [&] { state = state * 6364136223846793005ull + 1442695040888963407ull; return uint32_t(state >> 33); };  // < 2^31
  for (uint32_t d : divisors) {
    const cuda::FastDivU32 f = cuda::FastDivU32::of(d);
    std::vector<uint32_t> ns{0, 1, d - 1, d, d + 1, 2 * d - 1, (1u << 31) - 1, (1u << 31) - 1 - ((1u << 31) - 1) % d};
    for (int i = 0; i < 2000; ++i) ns.push_back(next());
    for (uint32_t n : ns) {
      if (n >= (1u << 31)) continue;
      ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
    }
  }
}

// Timing with a cold L2 (the per-shape choices' timing unless ATELIER_TIMING_COLD=0): its scratch outgrows this
// device's L2, each of the runs calls the work once (timed alone), and a failing call fails the timing.
TEST(CudaTiming, ColdRunsCallEachRunOnceAfterOverwritingTheL2) {
  ATELIER_REQUIRE_CUDA();
  if (!std::getenv("ATELIER_TIMING_COLD")) EXPECT_TRUE(cuda::timing_cold()) << "cold timing is the default";
  int l2 = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), cudaSuccess);
  EXPECT_GT(cuda::kColdBytes, size_t(l2)) << "the scratch must overwrite the whole L2";
  void* scratch = cuda::cold_scratch();
  ASSERT_NE(scratch, nullptr);
  EXPECT_EQ(cuda::cold_scratch(), scratch);  // kept per device
  constexpr size_t kBytes = size_t(8) << 20;
  void* src = nullptr;
  void* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, kBytes), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  int calls = 0;
  const auto copy = [&] {
    ++calls;
    return cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess;
  };
  cuda::EventPair ev;
  ASSERT_TRUE(ev.ok);
  EXPECT_GT(cuda::time_runs_cold(ev, stream, 5, copy, scratch), 0.0f);
  EXPECT_EQ(calls, 5);
  int failing_calls = 0;
  const auto failing = [&] { return ++failing_calls < 2; };
  EXPECT_EQ(cuda::time_runs_cold(ev, stream, 5, failing, scratch), -1.0f);
  EXPECT_EQ(failing_calls, 2);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  cudaFree(src);
  cudaFree(dst);
}
}  // namespace
}  // namespace atelier
