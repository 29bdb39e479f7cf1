// Micro-benchmarks of the CUDA backend's main kernels, timed with CUDA events on the backend's stream:
// for each case, warm-up calls (plans, algorithm choice, allocator), then 20 timed calls; the median is
// reported with the throughput it implies. Prints one table; exits 0 with a message when there is no GPU.
//
//   cuda_ops_bench [--iters N] [--only SECTION[,SECTION...]]
// Sections: gemm, linear, fp8, copy, conv, attention, glue, dit, units (the MUFU exponential's rate), products (the
// Hopper attention's products at head dim 40, bench/cuda_product_probes.h), d40 (the d40 attention on the UNet's
// q/k/v layout at SD's three step shapes): --only
// runs those alone (a device call that needs one figure need not pay for the whole table).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_attention_wgmma.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_group_norm_grid.h"
#include "backend/cuda/cuda_group_norm_slice.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_sdpa_fp8.h"
#include "backend/ops.h"
#include "cuda_product_probes.h"
#include "cuda_unit_probes.h"

namespace atelier {
namespace {

constexpr int kWarmup = 3;

struct Row {
  std::string name;
  double median_ms;
  double amount;      // FLOPs or bytes per call
  const char* unit;   // "TFLOP/s" or "GB/s"
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Median time of fn over `iters` calls, each bracketed by events on the backend's stream.
double time_ms(cuda::CudaBackend& be, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  be.synchronize();
  std::vector<cudaEvent_t> ev(size_t(2 * iters));
  for (auto& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(ev[size_t(2 * i)], be.stream()), "cudaEventRecord");
    fn();
    check(cudaEventRecord(ev[size_t(2 * i + 1)], be.stream()), "cudaEventRecord");
  }
  be.synchronize();
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) check(cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(2 * i)], ev[size_t(2 * i + 1)]), "elapsed");
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Tensor random_on(const Shape& shape, DType dt, Device dev, float scale = 1.0f) {
  std::vector<float> v(size_t(numel_of(shape)));
  uint32_t s = 12345;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (float(s >> 8) / float(1 << 24) - 0.5f);
  }
  Tensor t = Tensor::from_vector(v, shape);
  if (dt != DType::F32) t = ops::cast(t, dt);
  return t.to(dev);
}

// x [N, C, H, W] with channels-last strides (the layout the UNet's activations have on CUDA).
Tensor channels_last(const Tensor& x) { return ops::contiguous(x.permute({0, 2, 3, 1})).permute({0, 3, 1, 2}); }

// The sections asked for with --only (all when empty).
struct Sections {
  std::vector<std::string> only;
  bool operator()(const char* name) const {
    return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
  }
};

void print(const Row& r) {
  const double rate = r.amount / (r.median_ms * 1e-3) / (std::strcmp(r.unit, "GB/s") == 0 ? 1e9 : 1e12);
  std::printf("| %-52s | %10.3f | %9.1f %-7s |\n", r.name.c_str(), r.median_ms, rate, r.unit);
}

// The tensor pipe beside the MUFU: each mix of warpgroup roles (bench/cuda_unit_probes.h) timed alone, with the
// sum and the max of its roles' times alone beside it. A mix near the max overlaps; near the sum, the units take turns.
void overlap_rates(cuda::CudaBackend& be, int iters, uint32_t* sink) {
  if (!bench::overlap_probe_runs()) {
    std::printf("| overlap probe                                          | (not run: needs sm_90)\n");
    return;
  }
  const int sms = be.sm_count();
  const auto run = [&](const char* roles) {
    const double ms = time_ms(be, iters, [&] { bench::launch_overlap_probe(roles, sms, sink, be.stream()); });
    check(cudaGetLastError(), "overlap probe");
    return ms;
  };
  const double t = run("T"), r = run("R"), m = run("M"), sm = run("S"), f = run("F");
  const double flops = bench::overlap_probe_tensor_flops_per_role() * sms, exps = bench::overlap_probe_exp2_per_role() * sms;
  std::printf("| overlap T (wgmma SS alone)                             | %10.3f | %9.1f TFLOP/s |\n", t, flops / (t * 1e9));
  std::printf("| overlap R (wgmma RS alone)                             | %10.3f | %9.1f TFLOP/s |\n", r, flops / (r * 1e9));
  std::printf("| overlap M (MUFU alone)                                 | %10.3f | %9.1f G/s     |\n", m, exps / (m * 1e6));
  std::printf("| overlap F (FFMA alone)                                 | %10.3f | %9.1f TFLOP/s |\n", f,
              bench::overlap_probe_fma_flops_per_role() * sms / (f * 1e9));
  std::printf("| overlap S (softmax mix alone)                          | %10.3f | %9.1f G/s     |\n", sm, exps / (sm * 1e6));
  // A mix's roles' times alone: "sum" if its units took turns, "max" if they overlapped (roles on one unit add).
  const auto alone = [&](char role) { return role == 'T' ? t : role == 'R' ? r : role == 'M' ? m : role == 'S' ? sm : f; };
  const auto unit = [](char role) { return role == 'T' || role == 'R' ? 0 : role == 'F' ? 2 : 1; };  // tensor, MUFU, FMA
  for (const char* roles : {"TT", "MM", "SS", "TM", "RM", "TS", "RS", "TF", "MF", "TMM", "RMM", "TSS", "RSS", "TRM", "TMF"}) {
    const double ms = run(roles);
    double sum = 0.0, per_unit[3] = {0.0, 0.0, 0.0};
    for (const char* c = roles; *c; ++c) {
      sum += alone(*c);
      per_unit[unit(*c)] += alone(*c);
    }
    const double max = std::max({per_unit[0], per_unit[1], per_unit[2]});
    std::printf("| overlap %-46s | %10.3f | sum %.3f, max %.3f: %s\n", roles, ms, sum, max,
                ms > 0.5 * (sum + max) ? "nearer the sum" : "nearer the max");
  }
}

// The MUFU exponential's rate in its three forms: exponentials per second and per clock and SM at the rated
// clock (the floor of a softmax that computes one exponential per score).
void unit_rates(cuda::CudaBackend& be, int iters) {
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const int sms = be.sm_count();
  const std::shared_ptr<Buffer> sink = be.allocate(sizeof(uint32_t));
  const struct {
    bench::Exp2Form form;
    const char* name;
  } forms[] = {{bench::Exp2Form::kF32, "ex2.approx.ftz.f32"}, {bench::Exp2Form::kBf16x2, "ex2.approx.ftz.bf16x2"},
               {bench::Exp2Form::kF16x2, "ex2.approx.f16x2"}};
  for (const auto& f : forms) {
    if (!bench::exp2_form_runs(f.form)) {
      std::printf("| MUFU %-47s | (not run on this device)\n", f.name);
      continue;
    }
    const double ms = time_ms(be, iters, [&] { bench::launch_exp2_chains(f.form, sms, static_cast<uint32_t*>(sink->data()), be.stream()); });
    check(cudaGetLastError(), "exp2 probe");
    const double per_second = bench::exp2_per_launch(f.form, sms) / (ms * 1e-3);
    std::printf("| MUFU %-47s | %10.3f | %9.1f G/s     | %.2f per clock and SM at the rated %d MHz\n", f.name, ms,
                per_second / 1e9, per_second / (double(sms) * clock_khz * 1e3), clock_khz / 1000);
  }
  overlap_rates(be, iters, static_cast<uint32_t*>(sink->data()));
}

// Section "products": the Hopper attention kernel's products at head dim 40 on their own (bench/cuda_product_probes.h),
// as cycles per 128-key tile of all working warpgroups at the rated clock, against the tensor pipe's dense rate
// (kTensorFlopsPerClock per SM: m64n128k16 in 64 cycles).
void product_rates(cuda::CudaBackend& be, int iters) {
  constexpr double kTensorFlopsPerClock = 4096.0;
  if (!bench::product_probe_runs()) {
    std::printf("| products probe                                       | (not run: needs sm_90)\n");
    return;
  }
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const int sms = be.sm_count();
  const std::shared_ptr<Buffer> sink = be.allocate(sizeof(uint32_t));
  for (const bench::ProductProbe& p : bench::product_probes()) {
    const double ms = time_ms(be, iters, [&] {
      bench::launch_product_probe(p, sms, static_cast<uint32_t*>(sink->data()), be.stream());
    });
    check(cudaGetLastError(), "products probe");
    const double flops = bench::product_probe_flops(p, sms);
    const double cycles = ms * 1e-3 * clock_khz * 1e3 / bench::product_probe_tiles();
    const double ideal = flops / sms / bench::product_probe_tiles() / kTensorFlopsPerClock;
    std::printf("| %-52s | %10.3f | %9.1f TFLOP/s | %6.0f cycles a tile at %d MHz, ideal %4.0f (%3.0f%%)\n", p.name, ms,
                flops / (ms * 1e9), cycles, clock_khz / 1000, ideal, 100.0 * ideal / cycles);
  }
}

// Section "gemm": square 8192^3 products in each dtype (the card's GEMM ceiling).
void gemm_rates(cuda::CudaBackend& be, int iters) {
  const Device dev = Device::cuda(0);
  const int64_t n = 8192;
  for (DType dt : {DType::BF16, DType::F16}) {
    const Tensor a = random_on({n, n}, dt, dev), b = random_on({n, n}, dt, dev);
    const double ms = time_ms(be, iters, [&] { ops::matmul(a, b); });
    print({"matmul 8192^3 " + std::string(dtype_name(dt)), ms, 2.0 * n * n * n, "TFLOP/s"});
  }
  const Tensor a = random_on({n, n}, DType::F32, dev), b = random_on({n, n}, DType::F32, dev);
  print({"matmul 8192^3 f32 (no TF32)", time_ms(be, iters, [&] { ops::matmul(a, b); }), 2.0 * n * n * n, "TFLOP/s"});
  be.set_allow_tf32(true);
  print({"matmul 8192^3 f32 TF32", time_ms(be, iters, [&] { ops::matmul(a, b); }), 2.0 * n * n * n, "TFLOP/s"});
  be.set_allow_tf32(false);
}

// Section "linear": linear layers with bias at SD's attention projection and feed-forward sizes.
void linear_rates(cuda::CudaBackend& be, int iters) {
  const Device dev = Device::cuda(0);
  // cuBLASLt's rows: the own kernel is not timed against it here (its own rows say "own kernel").
  const cuda::OwnLinear mode_was = cuda::own_linear_mode();
  cuda::set_own_linear(cuda::OwnLinear::kOff);
  const Tensor x = random_on({2 * 4096, 320}, DType::BF16, dev), w = random_on({1280, 320}, DType::BF16, dev),
               b = random_on({1280}, DType::BF16, dev);
  print({"linear 8192x320 -> 1280 +bias bf16", time_ms(be, iters, [&] { ops::linear(x, w, b); }), 2.0 * 8192 * 320 * 1280, "TFLOP/s"});
  // The products that end in a residual at SD 1.5's 16 rows (attention out-projections and FF's second product per
  // level), each with and without it: whether the residual epilogue or the shape is what makes them slow; and the
  // level-0 GEGLU product with a plain epilogue (against the fused kernel below: what its GELU epilogue costs).
  struct Case { int64_t m, k, n; };
  for (const Case& c : {Case{16 * 4096, 320, 320}, Case{16 * 4096, 1280, 320}, Case{16 * 1024, 640, 640}, Case{16 * 1024, 2560, 640},
                        Case{16 * 256, 1280, 1280}, Case{16 * 256, 5120, 1280},
                        Case{16 * 4096, 320, 2560}}) {  // the last: the level-0 GEGLU's product, plain
    const Tensor xr = random_on({c.m, c.k}, DType::BF16, dev), wr = random_on({c.n, c.k}, DType::BF16, dev, 0.05f),
                 br = random_on({c.n}, DType::BF16, dev), res = random_on({c.m, c.n}, DType::BF16, dev);
    const std::string shape = std::to_string(c.m) + "x" + std::to_string(c.k) + " -> " + std::to_string(c.n);
    const double flops = 2.0 * double(c.m) * double(c.k) * double(c.n);
    print({"linear " + shape + " +bias", time_ms(be, iters, [&] { ops::linear(xr, wr, br); }), flops, "TFLOP/s"});
    print({"linear " + shape + " +bias +residual", time_ms(be, iters, [&] { ops::linear_residual(xr, wr, br, res); }), flops, "TFLOP/s"});
    // The residual accumulated in place (beta = 1 reading the output itself, C == D), against the separate addend
    // (C != D) above: whether cuBLASLt's kernels read C faster in place.
    Tensor acc = ops::clone(res).reshape({1, c.m, c.n});  // a copy: it grows with every timed call
    const Tensor x3 = xr.reshape({1, c.m, c.k}), w3 = wr.reshape({1, c.n, c.k});
    GemmParams in_place;
    in_place.trans_b = true;
    in_place.beta = 1.0f;
    print({"linear " + shape + " +bias +residual in place", time_ms(be, iters, [&] { be.gemm(acc, x3, w3, br, in_place); }), flops,
           "TFLOP/s"});
    // The same two on our own kernel (cuda_gemm_wgmma.cu, ATELIER_OWN_LINEAR).
    const cuda::OwnLinear own_was = cuda::own_linear_mode();
    cuda::set_own_linear(cuda::OwnLinear::kAll);
    const int64_t own_before = cuda::own_linear_launches();
    const double own_ms = time_ms(be, iters, [&] { ops::linear(xr, wr, br); });
    const double own_res_ms = time_ms(be, iters, [&] { ops::linear_residual(xr, wr, br, res); });
    cuda::set_own_linear(own_was);
    if (cuda::own_linear_launches() > own_before) {
      print({"linear " + shape + " +bias (own kernel)", own_ms, flops, "TFLOP/s"});
      print({"linear " + shape + " +bias +residual (own kernel)", own_res_ms, flops, "TFLOP/s"});
    }
  }
  // GEGLU's first product at 16 rows per level: cuBLASLt's product [M, 2H] then the glu pass, against the fused
  // kernel (cuda_gemm_wgmma.cu, ATELIER_FUSED_GLU) that never writes [M, 2H].
  const bool was = cuda::fused_glu_enabled();
  for (const Case& c : {Case{16 * 4096, 320, 1280}, Case{16 * 1024, 640, 2560}, Case{16 * 256, 1280, 5120}, Case{16 * 64, 1280, 5120}}) {
    const Tensor xg = random_on({c.m, c.k}, DType::BF16, dev), wg = random_on({2 * c.n, c.k}, DType::BF16, dev, 0.05f),
                 bg = random_on({2 * c.n}, DType::BF16, dev);
    const std::string shape = std::to_string(c.m) + "x" + std::to_string(c.k) + " -> 2x" + std::to_string(c.n);
    const double flops = 2.0 * double(c.m) * double(c.k) * double(2 * c.n);
    print({"linear+glu " + shape + " (two passes)", time_ms(be, iters, [&] { ops::glu(ops::linear(xg, wg, bg), UnaryOp::kGelu); }),
           flops, "TFLOP/s"});
    cuda::set_fused_glu(true);
    const int64_t before = cuda::fused_glu_launches();
    const double fused_ms = time_ms(be, iters, [&] { ops::linear_glu(xg, wg, bg, UnaryOp::kGelu); });
    cuda::set_fused_glu(was);
    if (cuda::fused_glu_launches() > before)
      print({"linear_glu " + shape + " (fused kernel)", fused_ms, flops, "TFLOP/s"});
    else
      std::printf("| linear_glu %-41s | (the fused kernel does not run on this device)\n", shape.c_str());
  }
  cuda::set_own_linear(mode_was);
}

// FLUX's FP8 block products (1024²: 4608 tokens), activations quantized beforehand as the blocks do. The
// K = 12288 products ran at ~1140 TFLOP/s inside a FLUX step but ~1440 while their plans were tuned:
// these rows time them alone, on random and on GELU-shaped activations (the MLP outputs they read).
void fp8_rates(cuda::CudaBackend& be, int iters) {
  const Device dev = Device::cuda(0);
  struct Case {
    int64_t m, k, n;
    bool gelu_input;
    const char* what;
  };
  for (const Case& c : {Case{4608, 3072, 12288, false, "mlp up"}, Case{4608, 12288, 3072, false, "mlp down"},
                        Case{4608, 12288, 3072, true, "mlp down, GELU-shaped input"}, Case{4608, 3072, 9216, false, "q/k/v"},
                        Case{4608, 3072, 3072, false, "attention out"}, Case{1, 3072, 1050624, false, "the stacked modulation: GEMV"}}) {
    Tensor x = random_on({1, c.m, c.k}, DType::BF16, dev);
    if (c.gelu_input) x = ops::unary(x, UnaryOp::kGeluTanh);
    const auto [w8, ws] = ops::quantize_rows_fp8(random_on({c.n, c.k}, DType::BF16, dev, 0.02f));
    const ops::Fp8Rows rows = ops::quantize_activation_fp8(x);
    const bool gemv = c.m == 1;  // memory-bound: its weight bytes per second
    print({"linear_fp8 " + std::to_string(c.m) + "x" + std::to_string(c.k) + " -> " + std::to_string(c.n) + " (" + c.what + ")",
           time_ms(be, iters, [&] { ops::linear_fp8(rows, w8, ws); }),
           gemv ? double(c.n) * double(c.k) : 2.0 * double(c.m) * double(c.k) * double(c.n), gemv ? "GB/s" : "TFLOP/s"});
  }
}

// device-to-device copy: bytes read + written
void copy_rates(cuda::CudaBackend& be, int iters) {
  const Device dev = Device::cuda(0);
  const int64_t elems = int64_t(1) << 29;  // 2 GiB of f32
  const Tensor x = Tensor::empty({elems}, DType::F32, dev);
  print({"device-to-device copy 2 GiB (read+write)", time_ms(be, iters, [&] { ops::clone(x); }), 2.0 * double(x.nbytes()), "GB/s"});
  const Tensor h = Tensor::empty({elems / 2}, DType::BF16, dev);
  print({"cast f32 -> bf16 512 Mi elements (read+write)", time_ms(be, iters, [&] { ops::cast(x.narrow(0, 0, elems / 2), DType::BF16); }),
         double(elems / 2) * 6.0, "GB/s"});
}

// Section "conv", NCHW: a 3x3 convolution of 320 channels at 64x64, batch 2, in each dtype and on each path,
// then the UNet's other 3x3 sizes.
void conv_nchw_rates(cuda::CudaBackend& be, int iters) {
  const Device dev = Device::cuda(0);
  const Conv2dParams p{1, 1, 1, 1, 1, 1, 1};
  const double flops = 2.0 * 2 * 320 * 64 * 64 * 320 * 9;
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    const Tensor x = random_on({2, 320, 64, 64}, dt, dev), w = random_on({320, 320, 3, 3}, dt, dev, 0.05f), b = random_on({320}, dt, dev);
    print({"conv3x3 2x320x64x64 -> 320 +bias " + std::string(dtype_name(dt)), time_ms(be, iters, [&] { ops::conv2d(x, w, b, p); }), flops,
           "TFLOP/s"});
  }
  const Tensor x = random_on({2, 320, 64, 64}, DType::BF16, dev), w = random_on({320, 320, 3, 3}, DType::BF16, dev, 0.05f),
               b = random_on({320}, DType::BF16, dev);
  be.set_conv_impl(cuda::ConvImpl::kCudnnNchw);
  print({"conv3x3 2x320x64x64 -> 320 +bias bf16, cuDNN NCHW", time_ms(be, iters, [&] { ops::conv2d(x, w, b, p); }), flops, "TFLOP/s"});
  be.set_conv_impl(cuda::ConvImpl::kIm2col);
  print({"conv3x3 2x320x64x64 -> 320 bf16, im2col path", time_ms(be, iters, [&] { ops::conv2d(x, w, Tensor(), p); }), flops, "TFLOP/s"});
  be.set_conv_impl(cuda::ConvImpl::kAuto);
  // The UNet's other 3x3 sizes (batch 16 at level 0, levels 1 and 2), as torch_reference_ops.py times them.
  struct ConvCase {
    int64_t n, c, hw;
  };
  for (const ConvCase& c : {ConvCase{16, 320, 64}, ConvCase{2, 640, 32}, ConvCase{2, 1280, 16}}) {
    const double f = 2.0 * double(c.n * c.c * c.hw * c.hw) * double(c.c) * 9;
    for (DType dt : {DType::BF16, DType::F16}) {
      const Tensor xc = random_on({c.n, c.c, c.hw, c.hw}, dt, dev), wc = random_on({c.c, c.c, 3, 3}, dt, dev, 0.05f),
                   bc = random_on({c.c}, dt, dev);
      print({"conv3x3 " + std::to_string(c.n) + "x" + std::to_string(c.c) + "x" + std::to_string(c.hw) + "x" + std::to_string(c.hw) +
                 " -> " + std::to_string(c.c) + " +bias " + std::string(dtype_name(dt)),
             time_ms(be, iters, [&] { ops::conv2d(xc, wc, bc, p); }), f, "TFLOP/s"});
    }
  }
}

// channels-last bf16, as the UNet runs them: each path alone, then kAuto's timed choice
void conv_channels_last_rates(cuda::CudaBackend& be, int iters) {
  const Device dev = Device::cuda(0);
  struct ClCase {
    int64_t n, c, hw, o;
    bool residual;
  };
  const ClCase cases[] = {{16, 320, 64, 320, false}, {16, 960, 64, 320, true}, {16, 640, 32, 640, false}, {16, 1280, 16, 1280, false},
                          {2, 320, 128, 320, false}, {2, 640, 128, 320, true}, {2, 320, 64, 320, false},  {2, 1280, 8, 1280, false}};
  const Conv2dParams p{1, 1, 1, 1, 1, 1, 1};
  const cuda::OwnConv own_was = cuda::own_conv_mode();
  for (const ClCase& c : cases) {
    const double f = 2.0 * double(c.n * c.hw * c.hw) * double(c.o) * double(c.c) * 9;
    const Tensor x = channels_last(random_on({c.n, c.c, c.hw, c.hw}, DType::BF16, dev)), w = random_on({c.o, c.c, 3, 3}, DType::BF16, dev, 0.02f),
                 b = random_on({c.o}, DType::BF16, dev);
    const Tensor r = c.residual ? channels_last(random_on({c.n, c.o, c.hw, c.hw}, DType::BF16, dev)) : Tensor();
    const std::string shape = "conv3x3 " + std::to_string(c.n) + "x" + std::to_string(c.c) + "x" + std::to_string(c.hw) + "x" +
                              std::to_string(c.hw) + " -> " + std::to_string(c.o) + (c.residual ? " +bias +residual" : " +bias") +
                              " channels-last bf16";
    struct Path {
      const char* name;
      cuda::ConvGemm gemm;
      cuda::OwnConv own;
    };
    for (const Path& path : {Path{"cuDNN", cuda::ConvGemm::kOff, cuda::OwnConv::kOff}, Path{"im2col GEMM", cuda::ConvGemm::kForce, cuda::OwnConv::kOff},
                             Path{"own kernel", cuda::ConvGemm::kOff, cuda::OwnConv::kForce}, Path{"auto", cuda::ConvGemm::kAuto, cuda::OwnConv::kAuto}}) {
      be.set_conv_gemm(path.gemm);
      cuda::set_own_conv(path.own);
      ops::conv2d(x, w, b, p, r);  // kAuto's choice is timed here, at the shape's first call
      const int64_t own_before = cuda::own_conv_launches();
      const double ms = time_ms(be, iters, [&] { ops::conv2d(x, w, b, p, r); });
      const bool own_ran = cuda::own_conv_launches() > own_before;
      if (path.own == cuda::OwnConv::kForce && !own_ran) continue;  // the kernel declined the shape
      print({shape + ", " + path.name + (path.own == cuda::OwnConv::kAuto && own_ran ? " (took own)" : ""), ms, f, "TFLOP/s"});
    }
  }
  be.set_conv_gemm(cuda::conv_gemm_default());
  cuda::set_own_conv(own_was);
}

// The d40 wgmma kernel (3 x 128, forced here) with K and V laid out as the UNet has them, views of its fused
// projection's [b, s, 3 x 320] output (80-byte rows, half of them across two 128-byte lines), and as a projection
// whose stacked weight padded each K and V head to 64 columns would give them ([b, s, 320 + 2 x 512]: 128-byte-aligned
// rows; session 53: the copy engine's cost follows rows and lines, not bytes).
void kv_layout_rates(cuda::CudaBackend& be, int iters, const Tensor& q, int64_t b, int64_t h, int64_t sk, double flops) {
  constexpr int64_t kD = 40, kPadded = 64;
  const Device dev = Device::cuda(0);
  cuda::set_wgmma_attention_shape({3, 128});
  const Tensor fused = random_on({b, sk, 3 * h, kD}, DType::BF16, dev);  // q, k, v heads side by side in a row
  const Tensor fk = fused.narrow(2, h, h).permute({0, 2, 1, 3}), fv = fused.narrow(2, 2 * h, h).permute({0, 2, 1, 3});
  print({"  same, 3 x 128, K/V views of the UNet's fused [b, s, 3 h d]", time_ms(be, iters, [&] { ops::attention(q, fk, fv); }),
         flops, "TFLOP/s"});
  const int64_t q_chunks = h * kD / kPadded;  // q's 320 columns as 64-column chunks before the padded K and V heads
  const Tensor padded = random_on({b, sk, q_chunks + 2 * h, kPadded}, DType::BF16, dev);
  const Tensor pk = padded.narrow(2, q_chunks, h).narrow(3, 0, kD).permute({0, 2, 1, 3});
  const Tensor pv = padded.narrow(2, q_chunks + h, h).narrow(3, 0, kD).permute({0, 2, 1, 3});
  print({"  same, 3 x 128, K/V heads padded to 64 columns in the row", time_ms(be, iters, [&] { ops::attention(q, pk, pv); }),
         flops, "TFLOP/s"});
}

// Section "d40": the d40 wgmma kernel (each block shape) on K/V as the UNet passes them (views of its fused projection) at
// SD 1.5's three step shapes, the rows a change to that kernel is judged on (docs/cuda.md, session 53), alone.
void d40_unet_layout_rates(cuda::CudaBackend& be, int iters) {
  constexpr int64_t kHeads = 8, kD = 40;
  const Device dev = Device::cuda(0);
  const struct {
    int64_t b, s;
    const char* what;
  } cases[] = {{2, 4096, "CFG"}, {16, 4096, "16 rows"}, {2, 16384, "1024²"}};
  for (const auto& c : cases) {
    const double flops = 4.0 * double(c.b * kHeads) * double(c.s) * double(c.s) * double(kD);
    const Tensor fused = random_on({c.b, c.s, 3 * kHeads, kD}, DType::BF16, dev);
    const auto heads = [&](int64_t i) { return fused.narrow(2, i * kHeads, kHeads).permute({0, 2, 1, 3}); };
    const Tensor q = heads(0), k = heads(1), v = heads(2);
    for (const cuda::WgmmaAttentionShape sh : {cuda::WgmmaAttentionShape{3, 128}, cuda::WgmmaAttentionShape{4, 64}}) {
      cuda::set_wgmma_attention_shape(sh);
      print({"d40 " + std::to_string(sh.consumers) + " x " + std::to_string(sh.block_k) + ", UNet's fused q/k/v views, " + c.what +
                 " (" + std::to_string(c.b) + "x8x" + std::to_string(c.s) + "²)",
             time_ms(be, iters, [&] { ops::attention(q, k, v); }), flops, "TFLOP/s"});
    }
  }
  cuda::set_wgmma_attention_shape({});
}

// attention at the shapes the models run (SD 1.5 levels at 512 and 1024 px, batch 2 and 16; FLUX at 1024 px)
void attention_rates(cuda::CudaBackend& be, int iters) {
  const Device dev = Device::cuda(0);
  struct AttnCase {
    int64_t b, h, sq, sk, d;
    const char* what;
  };
  const AttnCase cases[] = {{2, 8, 4096, 4096, 40, "SD1.5 512 level 0"},   {16, 8, 4096, 4096, 40, "SD1.5 512 level 0, batch 16"},
                            {2, 8, 1024, 1024, 80, "SD1.5 512 level 1"},   {2, 8, 256, 256, 160, "SD1.5 512 level 2"},
                            {2, 8, 4096, 77, 40, "SD1.5 cross-attention"}, {2, 8, 16384, 16384, 40, "SD1.5 1024 level 0"},
                            {2, 8, 4096, 4096, 64, "head dim 64"},          {1, 24, 4608, 4608, 128, "FLUX 1024"}};
  for (const AttnCase& c : cases) {
    const double flops = 4.0 * double(c.b * c.h) * double(c.sq) * double(c.sk) * double(c.d);
    const std::string shape = std::to_string(c.b) + "x" + std::to_string(c.h) + "x" + std::to_string(c.sq) + "x" + std::to_string(c.sk) +
                              " d" + std::to_string(c.d);
    for (DType dt : {DType::BF16, DType::F16}) {
      if (dt == DType::F16 && c.d != 40) continue;
      const Tensor q = random_on({c.b, c.h, c.sq, c.d}, dt, dev), k = random_on({c.b, c.h, c.sk, c.d}, dt, dev),
                   v = random_on({c.b, c.h, c.sk, c.d}, dt, dev);
      print({"attention auto " + shape + " " + std::string(dtype_name(dt)) + " (" + c.what + ")",
             time_ms(be, iters, [&] { ops::attention(q, k, v); }), flops, "TFLOP/s"});
      if (c.d == 128 && dt == DType::BF16) {  // the DiT blocks' FP8 attention, quantization passes included
        std::string why;
        const Tensor merged = Tensor::empty({c.b, c.sq, c.h, c.d}, dt, dev);
        Tensor out = merged.permute({0, 2, 1, 3});
        be.set_fp8_attention(true);
        if (be.fp8_attention_takes(out, q, k, v, &why)) {
          print({"  same, FP8 (q/k/v quantized per tensor, cuDNN FP8 graph)",
                 time_ms(be, iters, [&] { ops::attention_merged_fp8(q, k, v); }), flops, "TFLOP/s"});
          const cuda::SdpaFp8Stats st = cuda::sdpa_fp8_stats();
          std::printf("  FP8 attention: %lld shapes planned, %lld declined, %lld runs\n", (long long)st.planned,
                      (long long)st.declined, (long long)st.runs);
        } else {
          std::printf("  same, FP8: not taken (%s)\n", why.c_str());
        }
        be.set_fp8_attention(cuda::CudaBackend::fp8_attention_default());
      }
      be.set_attention_impl(cuda::AttentionImpl::kFlash);
      print({"  same, flash kernel (wgmma/TMA on sm_90 where it takes the case)",
             time_ms(be, iters, [&] { ops::attention(q, k, v); }), flops, "TFLOP/s"});
      if (c.d <= 64 && dt == DType::BF16 && c.sk > 80) {  // the wgmma kernel's block shapes, each forced
        for (const cuda::WgmmaAttentionShape sh : {cuda::WgmmaAttentionShape{3, 128}, cuda::WgmmaAttentionShape{4, 64}}) {
          cuda::set_wgmma_attention_shape(sh);
          print({"  same, wgmma " + std::to_string(sh.consumers) + " consumers x " + std::to_string(sh.block_k) + "-key tiles",
                 time_ms(be, iters, [&] { ops::attention(q, k, v); }), flops, "TFLOP/s"});
        }
        if (c.d == 40) kv_layout_rates(be, iters, q, c.b, c.h, c.sk, flops);
        cuda::set_wgmma_attention_shape({});
      }
      cuda::set_wgmma_attention(false);  // this line and the flash variants below: the mma.sync kernel
      print({"  same, mma.sync flash kernel", time_ms(be, iters, [&] { ops::attention(q, k, v); }), flops, "TFLOP/s"});
      be.set_attention_impl(cuda::AttentionImpl::kCudnnSdpa);
      try {
        print({"  same, cuDNN SDPA", time_ms(be, iters, [&] { ops::attention(q, k, v); }), flops, "TFLOP/s"});
      } catch (const Error& e) {
        std::printf("  same, cuDNN SDPA: declined (%s)\n", e.what());
      }
      be.set_attention_impl(cuda::AttentionImpl::kFlash);  // the variants below are the mma.sync kernel's
      if (dt != DType::BF16) {
        be.set_attention_impl(cuda::AttentionImpl::kAuto);
        cuda::set_wgmma_attention(true);
        continue;
      }
      for (int rows : {64, 128}) {  // each block height forced (the line above is the automatic choice)
        be.set_flash_block_rows(rows);
        print({"  same, " + std::to_string(rows) + "-query blocks", time_ms(be, iters, [&] { ops::attention(q, k, v); }), flops, "TFLOP/s"});
      }
      if (c.d == 40 || c.d == 64 || c.d == 128) {  // both key tiles compiled for these (padded) head dims
        for (int tile : {cuda::CudaBackend::kFlashNarrowKeys, cuda::CudaBackend::kFlashWideKeys}) {
          be.set_flash_key_tile(tile);
          print({std::string("  same, 128-query blocks, ") + (tile == cuda::CudaBackend::kFlashWideKeys ? "wide" : "narrow") + " key tile",
                 time_ms(be, iters, [&] { ops::attention(q, k, v); }), flops, "TFLOP/s"});
        }
        be.set_flash_key_tile(0);
      }
      be.set_flash_block_rows(0);
      be.set_attention_impl(cuda::AttentionImpl::kAuto);
    }
    cuda::set_wgmma_attention(true);
  }
  for (int64_t d : {40, 64}) {
    const double flops = 4.0 * 2 * 8 * 4096.0 * 4096.0 * double(d);
    const Tensor q = random_on({2, 8, 4096, d}, DType::BF16, dev);
    be.set_attention_impl(cuda::AttentionImpl::kGemm);
    print({"attention gemm path 2x8x4096x4096 d" + std::to_string(d) + " bf16", time_ms(be, iters, [&] { ops::attention(q, q, q); }), flops,
           "TFLOP/s"});
    const Tensor qf = random_on({2, 8, 4096, d}, DType::F32, dev);
    print({"attention gemm path 2x8x4096x4096 d" + std::to_string(d) + " f32", time_ms(be, iters, [&] { ops::attention(qf, qf, qf); }), flops,
           "TFLOP/s"});
    be.set_attention_impl(cuda::AttentionImpl::kAuto);
  }
}

// memory-bound glue at SD sizes: bytes read + written
void glue_rates(cuda::CudaBackend& be, int iters) {
  const Device dev = Device::cuda(0);
  const Tensor x = random_on({2, 320, 64, 64}, DType::BF16, dev), g = random_on({320}, DType::BF16, dev);
  const double bytes = 2.0 * double(x.nbytes());
  print({"group_norm+silu 2x320x64x64 bf16", time_ms(be, iters, [&] { ops::group_norm(x, 32, g, g, 1e-5f, UnaryOp::kSilu); }), bytes, "GB/s"});
  // Channels-last (the layout SD's activations have on the GPU) against NCHW at a UNet and a VAE shape.
  // The batch-16 UNet's levels (16 = 8 images with CFG), a batch-2 one, the VAE's widest; NCHW beside two.
  // SD 1024²'s 128x128 level and the VAE's 128x128-256x256 norms too; channels-last rows that the one-kernel
  // path's clusters took (Hopper) are timed again with clusters off, those the whole-grid kernel took with it off
  // (the three kernels).
  for (const Shape& s : {Shape{16, 320, 64, 64}, Shape{1, 128, 512, 512}, Shape{2, 320, 64, 64}, Shape{16, 640, 32, 32},
                         Shape{16, 1280, 16, 16}, Shape{16, 2560, 8, 8}, Shape{16, 960, 64, 64}, Shape{2, 320, 128, 128}, Shape{2, 640, 128, 128},
                         Shape{1, 512, 128, 128}, Shape{1, 256, 256, 256}}) {
    const Tensor nchw = random_on(s, DType::BF16, dev), gs = random_on({s[1]}, DType::BF16, dev);
    const Tensor cl = channels_last(nchw);
    const bool with_nchw = s[0] != 2 && s[1] <= 320;
    for (const Tensor* t : {&cl, &nchw}) {
      if (t == &nchw && !with_nchw) continue;
      const auto run = [&] { ops::group_norm(*t, 32, gs, gs, 1e-5f, UnaryOp::kSilu); };
      const std::string name = "group_norm+silu " + shape_str(s) + (t == &cl ? " channels-last" : " NCHW");
      const int64_t clustered = cuda::group_norm_slice_cluster_launches(), gridded = cuda::group_norm_grid_launches();
      print({name, time_ms(be, iters, run), 2.0 * double(t->nbytes()), "GB/s"});
      const bool default_gridded = cuda::group_norm_grid_launches() != gridded;
      if (t != &cl) continue;
      if (cuda::group_norm_slice_cluster_launches() != clustered) {
        cuda::set_group_norm_cluster(false);
        print({name + " (clusters off)", time_ms(be, iters, run), 2.0 * double(t->nbytes()), "GB/s"});
        cuda::set_group_norm_cluster(true);
      }
      if (default_gridded) {
        cuda::set_group_norm_grid(false);
        print({name + " (grid off: three kernels)", time_ms(be, iters, run), 2.0 * double(t->nbytes()), "GB/s"});
        cuda::set_group_norm_grid(true);
      }
    }
  }
  for (const int64_t tokens : {int64_t(2 * 4096), int64_t(16 * 4096)}) {
    const Tensor t = random_on({tokens, 320}, DType::BF16, dev);
    print({"layer_norm " + std::to_string(tokens) + "x320 bf16", time_ms(be, iters, [&] { ops::layer_norm(t, g, g, 1e-5f); }),
           2.0 * double(t.nbytes()), "GB/s"});
    const Tensor ff = random_on({tokens, 2 * 1280}, DType::BF16, dev);
    print({"glu (GEGLU) " + std::to_string(tokens) + "x2560 bf16", time_ms(be, iters, [&] { ops::glu(ff, UnaryOp::kGelu); }),
           1.5 * double(ff.nbytes()), "GB/s"});
  }
  // SD's deeper levels at CFG batch 2 (latency-bound) and at 16 rows: rows of 640 and 1280 channels.
  for (const auto& [tokens, ch] : {std::pair<int64_t, int64_t>{2 * 1024, 640}, {2 * 256, 1280}, {16 * 1024, 640}, {16 * 256, 1280}}) {
    const Tensor t = random_on({tokens, ch}, DType::BF16, dev), gc = random_on({ch}, DType::BF16, dev);
    print({"layer_norm " + std::to_string(tokens) + "x" + std::to_string(ch) + " bf16",
           time_ms(be, iters, [&] { ops::layer_norm(t, gc, gc, 1e-5f); }), 2.0 * double(t.nbytes()), "GB/s"});
  }
  print({"add 2x320x64x64 bf16", time_ms(be, iters, [&] { ops::add(x, x); }), 3.0 * double(x.nbytes()), "GB/s"});
  // FLUX's q/k norms at 1024²: 4608 tokens x 24 heads of 128.
  const Tensor qk = random_on({4608 * 24, 128}, DType::BF16, dev), gq = random_on({128}, DType::BF16, dev);
  print({"rms_norm 110592x128 bf16", time_ms(be, iters, [&] { ops::rms_norm(qk, gq, 1e-6f); }), 2.0 * double(qk.nbytes()), "GB/s"});
}

// DiT glue at FLUX's 1024² sizes (4096 image tokens, 3072 channels): bytes read + written.
void dit_rates(cuda::CudaBackend& be, int iters) {
  const Device dev = Device::cuda(0);
  const int64_t l = 4096, d = 3072;
  const Tensor x = random_on({1, l, d}, DType::BF16, dev), res = random_on({1, l, d}, DType::BF16, dev);
  const Tensor sc = random_on({1, 1, d}, DType::BF16, dev, 0.2f), sh = random_on({1, 1, d}, DType::BF16, dev, 0.2f);
  const double row_bytes = double(x.nbytes());
  print({"norm_modulate layer*(1+scale)+shift 4096x3072",
         time_ms(be, iters, [&] { ops::norm_modulate(x, NormKind::kLayer, 1e-6f, Tensor(), {.scale = sc, .shift = sh}); }),
         2.0 * row_bytes, "GB/s"});
  print({"norm_modulate res+gate*x 4096x3072",
         time_ms(be, iters, [&] { ops::norm_modulate(x, NormKind::kNone, 0.0f, Tensor(), {.gate = sc, .residual = res}); }),
         3.0 * row_bytes, "GB/s"});
  for (bool fused : {true, false}) {  // one pass, or norm_modulate then quantize_rows_fp8
    be.set_fused_fp8_norm_modulate(fused);
    print({std::string("norm_modulate_fp8 layer 4096x3072") + (fused ? "" : " (two passes)"),
           time_ms(be, iters, [&] { ops::norm_modulate_fp8(x, NormKind::kLayer, 1e-6f, Tensor(), {.scale = sc, .shift = sh}); }),
           2.5 * row_bytes, "GB/s"});
  }
  be.set_fused_fp8_norm_modulate(true);
  print({"norm_modulate_fp8 layer 4096x3072, e4m3 rows only",
         time_ms(be, iters, [&] { ops::norm_modulate_fp8(x, NormKind::kLayer, 1e-6f, Tensor(), {.scale = sc, .shift = sh}, false); }),
         1.5 * row_bytes, "GB/s"});
  for (const Shape& s : {Shape{4096, 3072}, Shape{4096, 12288}, Shape{4608, 15360}}) {
    const Tensor a = random_on(s, DType::BF16, dev);
    print({"quantize_rows_fp8 " + shape_str(s), time_ms(be, iters, [&] { ops::quantize_rows_fp8(a); }), 1.5 * double(a.nbytes()), "GB/s"});
  }
  // q of the stacked q/k/v GEMM's output ([1, L, 3 x 3072]) normalised and rotated into [1, 24, L, 128].
  const Tensor qkv = random_on({1, l, 3 * d}, DType::BF16, dev), gq = random_on({128}, DType::BF16, dev);
  const Tensor cs = random_on({l, 64}, DType::BF16, dev), sn = random_on({l, 64}, DType::BF16, dev);
  const Tensor q = qkv.reshape({1, l, 3, 24, 128}).select(2, 0).permute({0, 2, 1, 3});
  const RopeRms rms{true, gq, 1e-6f};
  print({"rope with RMS norm, FLUX q 1x24x4096x128 from q/k/v", time_ms(be, iters, [&] { ops::rope(q, cs, sn, 2, rms); }), 2.0 * row_bytes,
         "GB/s"});
}

int run(int iters, const Sections& want) {
  if (!backend_available(Device::cuda(0))) {
    try {
      backend_for(Device::cuda(0));
    } catch (const Error& e) {
      std::printf("cuda_ops_bench: no usable CUDA device: %s\n", e.what());
    }
    return 0;
  }
  const Device dev = Device::cuda(0);
  auto& be = static_cast<cuda::CudaBackend&>(backend_for(dev));
  std::printf("device: %s, %d SMs; conv: %s; median of %d timed calls after %d warm-up calls\n\n", be.name().c_str(), be.sm_count(),
              be.conv_impl_name().c_str(), iters, kWarmup);
  std::printf("| %-52s | %10s | %17s |\n", "case", "median ms", "throughput");
  std::printf("|%s|%s|%s|\n", std::string(54, '-').c_str(), std::string(12, '-').c_str(), std::string(19, '-').c_str());

  const struct {
    const char* section;
    void (*run)(cuda::CudaBackend&, int);
  } sections[] = {{"gemm", gemm_rates},           {"linear", linear_rates},
                  {"fp8", fp8_rates},             {"copy", copy_rates},
                  {"conv", conv_nchw_rates},      {"conv", conv_channels_last_rates},
                  {"attention", attention_rates}, {"glue", glue_rates},
                  {"dit", dit_rates},             {"units", unit_rates},
                  {"products", product_rates},      {"d40", d40_unet_layout_rates}};
  for (const auto& s : sections)
    if (want(s.section)) s.run(be, iters);
  be.synchronize();
  return 0;
}

}  // namespace
}  // namespace atelier

int main(int argc, char** argv) {
  int iters = 20;
  atelier::Sections want;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--only") == 0)
      for (const char* p = argv[i + 1]; *p;) {
        const char* comma = std::strchr(p, ',');
        want.only.emplace_back(p, comma ? size_t(comma - p) : std::strlen(p));
        p = comma ? comma + 1 : p + std::strlen(p);
      }
  }
  const std::vector<std::string> known = {"gemm", "linear", "fp8", "copy", "conv", "attention", "glue", "dit", "units", "products", "d40"};
  for (const std::string& name : want.only)
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      std::fprintf(stderr, "cuda_ops_bench: unknown section '%s' (sections: %s)\n", name.c_str(), list.c_str());
      return 2;
    }
  try {
    return atelier::run(iters, want);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_ops_bench: %s\n", e.what());
    return 1;
  }
}
