// The upsamplers (nearest 2x, then a 3x3 stride-1 padding-1 convolution: SD's UNet and VAE) without the
// upsampled tensor. Output pixel (2i + a, 2j + b) reads upsampled rows 2i + a - 1 .. 2i + a + 1, which are input
// rows i + floor((a + dy - 1) / 2) for the taps dy = 0, 1, 2: two distinct rows per phase, the same for columns.
// Per output phase (a, b) the 3x3 convolution of the upsampled tensor is therefore a 2x2 convolution of x whose
// weights are sums of the 3x3 taps that land on the same input pixel: 4 of the 9 multiply-adds per output.
//
// All four phases are one convolution: a 2x2 kernel with padding 1 over x gives [N, H + 1, W + 1] outputs, and
// phase (a, b)'s output (i, j) is its pixel (i + a, j + b) with the phase's weights, so the four phases' weights
// are stacked as 4 * O output channels. One shuffle pass then writes each phase's channels to its output pixels.
// The convolution goes through conv2d_nhwc_packed (cuDNN or the GEMM path, whichever is timed faster for its
// shape); the extra (H + W + 1) / (H * W) of the padded rim costs 27% at 8x8 and 3% at 64x64. On sm_90 the own
// implicit-GEMM kernel also takes the four phases as one product without the rim: each phase's tiles start their
// taps at the phase's offset, and their staged output leaves through a 5-D tensor map that puts pixel (i, j) at
// (2i + a, 2j + b), so no shuffle pass follows either (OwnConvArgs::upsample_phases).
//
// Why: the UNet's three upsampler convolutions took 0.25 ms of a CFG UNet call and 1.4 ms at 16 rows, the VAE's
// 0.9 ms of its 6.7 ms decode plus 0.12 ms of upsample passes (docs/performance.md, session 23).
#include <cstdio>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_conv.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_event_timing.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_nvtx.h"
#include "backend/cuda/cudnn_graph_api.h"

namespace atelier::cuda {
namespace {

constexpr int kPhases = 4;     // (row parity, column parity) of the output pixels
constexpr int kPhaseTaps = 2;  // each phase's kernel is 2x2
constexpr int kTaps = 3;       // the upsampler's kernel is 3x3

// The 2x2 tap that the 3x3 tap d of phase a lands on: input offset floor((a + d - 1) / 2), shifted by the padding-1
// window's origin at output pixel i + a.
__host__ __device__ constexpr int phase_tap(int a, int d) { return (a + d + 1) / 2 - a; }

// out [4 * O, 2, 2, C] (phase p = 2a + b major, channels last) = the sums of w [O, C, 3, 3]'s taps per phase tap,
// in f32 and rounded once.
template <typename T>
__global__ void phase_weights_kernel(T* out, const T* w, int64_t o, int64_t c) {
  const int64_t idx = global_thread();
  if (idx >= kPhases * o * kPhaseTaps * kPhaseTaps * c) return;
  const int64_t ci = idx % c;
  int64_t rest = idx / c;
  const int kx = int(rest % kPhaseTaps);
  rest /= kPhaseTaps;
  const int ky = int(rest % kPhaseTaps);
  rest /= kPhaseTaps;
  const int64_t oi = rest % o;
  const int phase = int(rest / o), a = phase >> 1, b = phase & 1;
  const T* taps = w + (oi * c + ci) * kTaps * kTaps;
  float sum = 0.0f;
  for (int dy = 0; dy < kTaps; ++dy)
    for (int dx = 0; dx < kTaps; ++dx)
      if (phase_tap(a, dy) == ky && phase_tap(b, dx) == kx) sum += to_f32(taps[dy * kTaps + dx]);
  out[idx] = from_f32<T>(sum);
}

// out [N, 2H, 2W, O] (channels-last bytes) from the four phases' outputs y [N, H + 1, W + 1, 4 * O]: pixel (y, x)
// of phase (y & 1, x & 1) sits at ((y + 1) / 2, (x + 1) / 2). One thread per 16-byte vector of channels.
__global__ void phase_shuffle_kernel(uint4* out, const uint4* y, int64_t total_vecs, int o_vecs, int h, int w) {
  const int64_t idx = global_thread();
  if (idx >= total_vecs) return;
  const int v = int(idx % o_vecs);
  int64_t rest = idx / o_vecs;
  const int ox = int(rest % (2 * w));
  rest /= 2 * w;
  const int oy = int(rest % (2 * h));
  const int64_t n = rest / (2 * h);
  const int phase = (oy & 1) * 2 + (ox & 1);
  const int64_t pixel = (n * (h + 1) + (oy + 1) / 2) * (w + 1) + (ox + 1) / 2;
  out[idx] = y[(pixel * kPhases + phase) * o_vecs + v];
}

// The own implicit-GEMM kernel's arguments for the four phases at once (OwnConvArgs::upsample_phases): x [N, C, H, W]
// and out [N, O, 2H, 2W] dense channels-last bf16, the phase weights [4 O, 2, 2, C] and bias [4 O] (or undefined);
// false where the kernel does not take the case.
bool own_phase_args(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, int sm_count, size_t max_smem,
                    int cc_major, OwnConvArgs& a) {
  if (out.dtype() != DType::BF16 || own_conv_mode() == OwnConv::kOff) return false;
  a.upsample_phases = true;
  a.input = x.raw(), a.weight = weight.raw(), a.out = out.raw();
  a.bias = bias.defined() ? bias.raw() : nullptr;
  a.n = x.size(0), a.c = x.size(1), a.h = a.ho = x.size(2), a.w = a.wo = x.size(3);
  a.o = weight.size(0), a.kh = a.kw = kPhaseTaps, a.pad_h = a.pad_w = 1;
  a.sm_count = sm_count, a.max_smem = max_smem;
  return conv_implicit_takes(a, cc_major);
}

}  // namespace

// A candidate by default (session 61, H200: its test passed; it won at every SD shape, e.g. 0.307 against the packed
// phases' 0.386 ms at [16, 1280, 16, 16]); ATELIER_OWN_PHASES=0 leaves it out.
bool CudaBackend::own_phases_default() { return !env_is("ATELIER_OWN_PHASES", "0"); }

UpsamplePhases upsample_phases_default() {
  if (env_is("ATELIER_UPSAMPLE_PHASES", "0")) return UpsamplePhases::kOff;
  if (env_is("ATELIER_UPSAMPLE_PHASES", "force")) return UpsamplePhases::kForce;
  return UpsamplePhases::kAuto;
}

// w [O, C, 3, 3] -> the stacked phase weights [4 * O, 2, 2, C] and bias [O] -> [4 * O] (undefined without one),
// cached per weight buffer as nhwc_weight caches (model weights keep their buffers).
CudaBackend::PhaseWeights CudaBackend::phase_weights(const Tensor& w, const Tensor& bias) {
  const int64_t o = w.size(0), c = w.size(1);
  std::lock_guard<std::mutex> lock(nhwc_mu_);
  const auto fits = [&](const PhaseWeights& e) {
    const bool same_bias = bias.defined() ? e.bias_source == bias.raw() && e.bias.defined() : !e.bias.defined();
    return same_bias && e.weight.size(0) == kPhases * o && e.weight.size(3) == c;
  };
  return weight_entry(phase_weights_, w, fits, [&](PhaseWeights& e) { make_phase_weights(e, w, bias); });
}

// e's weight and bias made from w [O, C, 3, 3] and bias (phase_weights' cache entry).
void CudaBackend::make_phase_weights(PhaseWeights& e, const Tensor& w, const Tensor& bias) {
  const int64_t o = w.size(0), c = w.size(1);
  e.weight = Tensor::empty({kPhases * o, kPhaseTaps, kPhaseTaps, c}, w.dtype(), device());
  const int64_t total = e.weight.numel();
  dispatch_float(w.dtype(), "upsample2x_conv2d", [&](auto tag) {
    using T = decltype(tag);
    phase_weights_kernel<T><<<grid_for(total), kThreads, 0, stream_>>>(e.weight.data<T>(), w.data<T>(), o, c);
  });
  ATELIER_CUDA_LAUNCHED();
  e.bias = Tensor();
  e.bias_source = bias.defined() ? bias.raw() : nullptr;
  if (bias.defined()) {
    e.bias = Tensor::empty({kPhases * o}, bias.dtype(), device());
    Tensor rows = e.bias.reshape({kPhases, o});
    copy(rows, Tensor(bias.buffer(), {kPhases, o}, {0, bias.strides()[0]}, bias.dtype(), bias.offset()));  // repeated per phase
  }
}

// out [N, O, 2H, 2W] = conv3x3(upsample2x(x), w) + bias, x [N, C, H, W] and out channels-last (the file's comment).
// The phases run as one convolution (cuDNN or the GEMM path) and a shuffle pass, or as the own kernel's product
// that stores each phase's pixels where they go (no padded rim, no shuffle; ATELIER_OWN_CONV=force forces it where
// the phases are forced). Where neither is timed faster for the shape, false: ops::upsample2x_conv2d upsamples and
// convolves.
bool CudaBackend::upsample2x_conv2d(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const DType dt = out.dtype();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3), o = out.size(1);
  const int64_t vec = 16 / int64_t(dtype_size(dt));
  if (upsample_phases_ == UpsamplePhases::kOff || !prefers_channels_last(dt) || x.dtype() != dt || w.dtype() != dt || o % vec != 0 ||
      !x.is_channels_last() || !out.is_channels_last())
    return false;
  NvtxRange range("upsample2x_conv2d");
  DeviceGuard guard(index_);
  if (!conv_engine().available()) return false;
  const PhaseWeights pw = phase_weights(w, bias);
  const auto packed = [&] {
    Tensor y = Tensor::empty_channels_last({n, kPhases * o, h + 1, wd + 1}, dt, device());
    Conv2dParams pp;
    pp.pad_h = pp.pad_w = 1;
    const ConvShape s{n, c, h, wd, kPhases * o, kPhaseTaps, kPhaseTaps, h + 1, wd + 1};
    if (!conv2d_nhwc_packed(y, x, s, pw.weight, pw.bias, pp, Tensor())) return false;
    const int o_vecs = int(o / vec);
    const int64_t total = n * kPhases * h * wd * o_vecs;  // each input pixel makes one output pixel per phase
    phase_shuffle_kernel<<<grid_for(total), kThreads, 0, stream_>>>(static_cast<uint4*>(out.raw()), static_cast<const uint4*>(y.raw()),
                                                                    total, o_vecs, int(h), int(wd));
    ATELIER_CUDA_LAUNCHED();
    return true;
  };
  OwnConvArgs own_args;
  const bool own_takes = own_phases_ && conv_impl_ == ConvImpl::kAuto &&
                         own_phase_args(out, x, pw.weight, pw.bias, sm_count_, max_smem_optin_, cc_major_, own_args);
  const auto own = [&](int split) { return launch_own_conv(own_args, split); };
  bool ran = false;
  if (upsample_phases_ == UpsamplePhases::kForce) {
    ran = own_takes && own_conv_mode() == OwnConv::kForce ? own(std::max(1, own_conv_split())) : packed();
  } else {
    std::vector<std::function<bool()>> candidates{[&] {
                                                    Tensor up = Tensor::empty_channels_last({n, c, 2 * h, 2 * wd}, dt, device());
                                                    upsample_nearest2d_channels_last(up, x, 2);
                                                    conv2d(out, up, w, bias, Conv2dParams{1, 1, 1, 1}, Tensor());
                                                    return true;
                                                  },
                                                  packed};
    std::vector<const char*> names{"upsample + conv", "phases"};
    if (own_takes) {
      candidates.push_back([&] { return own(1); });
      names.push_back("phases, own kernel");
      add_split_candidates(own_args, own, candidates, names);
    }
    const int pick = upsample_phase_choice(out, x, bias, candidates, names);
    if (pick == 0) return false;
    ran = candidates[size_t(pick)]();
  }
  if (ran) upsample_phase_calls_.fetch_add(1);
  return ran;
}

// Per shape, the fastest of the candidates (TimedChoice: timed at the shape's first eager call; under capture an
// unknown shape takes the plain path). The phases read 16/9 of the weights (52 MB against 29 MB at SD's 1280
// channels), so where few output pixels leave the convolution bound by its weights' bytes (batch 1 or 2 at SD's 8x8
// level) they might lose; at every SD shape timed on the H200 they win (docs/performance.md). The names are part of
// the key (candidate_names_key): the switches (ATELIER_OWN_CONV, ATELIER_OWN_PHASES, the tests' setters) change which
// paths it holds.
int CudaBackend::upsample_phase_choice(const Tensor& out, const Tensor& x, const Tensor& bias,
                                       const std::vector<std::function<bool()>>& candidates, const std::vector<const char*>& names) {
  const auto key = std::make_tuple(x.shape(), out.size(1), int(out.dtype()), bias.defined(), candidate_names_key(names));
  return upsample_phase_choices_.fastest(key, stream_, candidates, [&](const std::vector<float>& ms, int pick) {
    if (cudnn_graph::log_enabled())  // ATELIER_CUDNN_LOG=1, beside the convolutions' choices
      std::fprintf(stderr, "[upsample conv] x%s -> %lld channels: %s: %s\n", shape_str(x.shape()).c_str(), (long long)out.size(1),
                   candidate_times(ms, names).c_str(), names[pick]);
  });
}

}  // namespace atelier::cuda
