// Channels-last convolutions as one cuBLASLt GEMM: out [N*Ho*Wo, O] = col [N*Ho*Wo, kh*kw*C] x w [O, kh*kw*C]^T
// (+ bias + a same-layout addend in the GEMM's epilogue), col gathered from x by an NHWC im2col kernel (a 1x1
// stride-1 unpadded convolution multiplies x itself). Channel counts that are not whole 16-byte vectors (the latents'
// 4 into conv_in) get rows padded with zeros to whole vectors, in col and in a padded copy of the weights.
//
// Why: cuDNN's plans for convolutions with few output pixels use few blocks. At SD 1.5's CFG batch (2) the 8x8
// level's 3x3 convolutions (M = 128 pixels, K = 11,520, N = 1,280) took 42 us each at 90 TFLOP/s on the H200
// (docs/performance.md, session 23), against a ~7 us floor for reading their 29 MB of weights; cuBLASLt's
// candidates include split-K algorithms for such shapes. Which path is faster is timed per shape at its first
// eager call (conv_path_choice, with cuDNN and the implicit-GEMM kernel of our own), as attention chooses between
// cuDNN and the flash kernel.
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

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

// Largest column matrix the GEMM path builds: the small-spatial convolutions it is for need a few MB (SD's 8x8
// level at batch 2: 2.9 MB); a large image's would be hundreds and cuDNN's implicit GEMM is fast there anyway.
constexpr int64_t kMaxColBytes = int64_t(32) << 20;
constexpr int kIm2colThreads = 256;

// col[p, (i * kw + j) * C + c] = x[n, ho * sh + i * dh - ph, wo * sw + j * dw - pw, c] (0 outside), p = (n, ho, wo):
// one thread per 16-byte vector of channels (C a multiple of the vector width).
template <typename T>
__global__ void im2col_nhwc_kernel(T* col, const T* x, int64_t total_vecs, int c_vecs, int h, int w, int ho, int wo, int kh,
                                   int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total_vecs) return;
  const int v = int(idx % c_vecs);
  int64_t rest = idx / c_vecs;
  const int tap = int(rest % (kh * kw));
  const int64_t p = rest / (kh * kw);
  const int ox = int(p % wo), oy = int((p / wo) % ho);
  const int64_t n = p / (int64_t(wo) * ho);
  const int iy = oy * sh + (tap / kw) * dh - ph, ix = ox * sw + (tap % kw) * dw - pw;
  uint4 value = make_uint4(0, 0, 0, 0);
  if (iy >= 0 && iy < h && ix >= 0 && ix < w)
    value = reinterpret_cast<const uint4*>(x + ((n * h + iy) * w + ix) * int64_t(c_vecs) * (16 / sizeof(T)))[v];
  reinterpret_cast<uint4*>(col)[idx] = value;
}

// The same for channel counts that are not whole 16-byte vectors (the 4-channel latents of conv_in): one thread per
// element, the row's columns k = tap * C + c, zero past kh * kw * C up to k_pad (a multiple of the vector width, so
// that every row of col starts 16-byte aligned, as cuBLASLt's fast kernels need).
template <typename T>
__global__ void im2col_nhwc_padded_kernel(T* col, const T* x, int64_t total, int k, int k_pad, int c, int h, int w, int ho, int wo,
                                          int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int col_k = int(idx % k_pad);
  const int64_t p = idx / k_pad;
  T value = from_f32<T>(0.0f);
  if (col_k < k) {
    const int tap = col_k / c, ci = col_k % c;
    const int ox = int(p % wo), oy = int((p / wo) % ho);
    const int64_t n = p / (int64_t(wo) * ho);
    const int iy = oy * sh + (tap / kw) * dh - ph, ix = ox * sw + (tap % kw) * dw - pw;
    if (iy >= 0 && iy < h && ix >= 0 && ix < w) value = x[((n * h + iy) * w + ix) * c + ci];
  }
  col[idx] = value;
}

int64_t round_up(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

}  // namespace

ConvGemm conv_gemm_default() {
  if (env_is("ATELIER_CONV_GEMM", "0")) return ConvGemm::kOff;
  if (env_is("ATELIER_CONV_GEMM", "force")) return ConvGemm::kForce;
  return ConvGemm::kAuto;
}

// x, out channels-last [N, C, H, W] / [N, O, Ho, Wo]; wn [O, kh, kw, C] contiguous; addend undefined or
// channels-last with out's shape (strides) and dtype.
bool CudaBackend::conv_gemm_applies(const Tensor& out, const Tensor& x, const Tensor& wn, const Conv2dParams& p,
                                    const Tensor& addend) const {
  const int64_t c = x.size(1), o = out.size(1), m = out.size(0) * out.size(2) * out.size(3);
  const int64_t vec = 16 / int64_t(dtype_size(out.dtype()));
  const int64_t k_pad = round_up(wn.numel() / std::max<int64_t>(o, 1), vec);
  // Whole channel vectors, or an im2col matrix with padded rows (a 1x1 convolution then needs one too)
  const bool reads_x = c % vec == 0 && multiplies_input(wn.size(1), wn.size(2), p);
  return p.groups == 1 && x.is_channels_last() && out.is_channels_last() && x.dtype() == out.dtype() && o % vec == 0 &&
         (reads_x || m * k_pad * int64_t(dtype_size(out.dtype())) <= kMaxColBytes) &&
         (!addend.defined() || (addend.is_channels_last() && addend.shape() == out.shape() && addend.dtype() == out.dtype()));
}

// out = conv(x, w) + bias + addend through one GEMM (conv_gemm_applies must hold).
void CudaBackend::conv2d_nhwc_gemm(Tensor& out, const Tensor& x, const Tensor& wn, const Tensor& bias, const Conv2dParams& p,
                                   const Tensor& addend) {
  NvtxRange range("conv2d_gemm");
  conv_gemm_calls_.fetch_add(1);
  const DType dt = out.dtype();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), o = out.size(1), ho = out.size(2), wo = out.size(3);
  const int kh = int(wn.size(1)), kw = int(wn.size(2));
  const int64_t m = n * ho * wo, k = int64_t(kh) * kw * c;
  const auto nhwc_rows = [](const Tensor& t) { return t.permute({0, 2, 3, 1}).reshape({1, -1, t.size(1)}); };  // [1, N*H*W, C]
  const int64_t vec = 16 / int64_t(dtype_size(dt));
  Tensor a, wk = wn.reshape({1, o, k});
  if (c % vec != 0) {
    // Rows padded to whole vectors, in the column matrix and in a zero-padded copy of the weights (kilobytes)
    const int64_t k_pad = round_up(k, vec), total = m * k_pad;
    a = Tensor::empty({1, m, k_pad}, dt, device());
    dispatch_float(dt, "conv2d", [&](auto tag) {
      using T = decltype(tag);
      im2col_nhwc_padded_kernel<T><<<unsigned((total + kIm2colThreads - 1) / kIm2colThreads), kIm2colThreads, 0, stream_>>>(
          a.data<T>(), x.data<T>(), total, int(k), int(k_pad), int(c), int(h), int(w), int(ho), int(wo), kw, p.stride_h, p.stride_w,
          p.pad_h, p.pad_w, p.dilation_h, p.dilation_w);
    });
    ATELIER_CUDA_LAUNCHED();
    Tensor padded = Tensor::empty({1, o, k_pad}, dt, device());
    fill(padded, 0.0f);
    Tensor head = padded.narrow(2, 0, k);
    copy(head, wk);
    wk = padded;
  } else if (multiplies_input(kh, kw, p)) {
    a = nhwc_rows(x);
  } else {
    a = Tensor::empty({1, m, k}, dt, device());
    const int c_vecs = int(c / vec);
    const int64_t total = m * kh * kw * c_vecs;
    dispatch_float(dt, "conv2d", [&](auto tag) {
      using T = decltype(tag);
      im2col_nhwc_kernel<T><<<unsigned((total + kIm2colThreads - 1) / kIm2colThreads), kIm2colThreads, 0, stream_>>>(
          a.data<T>(), x.data<T>(), total, c_vecs, int(h), int(w), int(ho), int(wo), kh, kw, p.stride_h, p.stride_w, p.pad_h,
          p.pad_w, p.dilation_h, p.dilation_w);
    });
    ATELIER_CUDA_LAUNCHED();
  }
  Tensor y = nhwc_rows(out);
  GemmParams gp;
  gp.trans_b = true;
  if (addend.defined()) {
    gp.beta = 1.0f;
    gp.addend = nhwc_rows(addend);
  }
  gemm(y, a, wk, bias, gp);
}

// The implicit-GEMM kernel's arguments (cuda_gemm_wgmma.cu) for out = conv(x, w) + bias + addend; false where it does
// not take the case: bf16, groups 1, stride 1, no dilation, x / out / addend dense channels-last and the kernel's own
// conditions (conv_implicit_takes). With x2 (dense channels-last bf16, x's N, H and W), the convolution of x and x2
// side by side along channels.
bool CudaBackend::conv_own_args(const Tensor& out, const Tensor& x, const Tensor& wn, const Tensor& bias, const Conv2dParams& p,
                                const Tensor& addend, OwnConvArgs& a, const Tensor& x2) const {
  const auto bf16 = [](const Tensor& t) { return t.dtype() == DType::BF16; };
  if (p.groups != 1 || p.stride_h != 1 || p.stride_w != 1 || p.dilation_h != 1 ||
      p.dilation_w != 1 || !bf16(out) || !bf16(x) || !bf16(wn) || !x.is_channels_last() || !out.is_channels_last() ||
      !wn.is_contiguous() || (bias.defined() && (!bf16(bias) || !bias.is_contiguous())) ||
      (addend.defined() && (!bf16(addend) || !addend.is_channels_last() || addend.shape() != out.shape())))
    return false;
  a.input = x.raw(), a.weight = wn.raw(), a.out = out.raw();
  a.bias = bias.defined() ? bias.raw() : nullptr;
  a.residual = addend.defined() ? addend.raw() : nullptr;
  a.n = x.size(0), a.c = x.size(1), a.h = x.size(2), a.w = x.size(3);
  if (x2.defined()) {
    if (!bf16(x2) || !x2.is_channels_last() || x2.size(0) != a.n || x2.size(2) != a.h || x2.size(3) != a.w) return false;
    a.input2 = x2.raw(), a.c1 = a.c, a.c += x2.size(1);
  }
  a.o = out.size(1), a.ho = out.size(2), a.wo = out.size(3), a.kh = wn.size(1), a.kw = wn.size(2);
  a.pad_h = p.pad_h, a.pad_w = p.pad_w;
  a.sm_count = sm_count_, a.max_smem = max_smem_optin_;
  return conv_implicit_takes(a, cc_major_);
}

// The own kernel's split-K workspace (cuda_gemm_wgmma.h), allocated at its first use and kept: replays of recorded
// steps reuse its address. Its flags are zeroed once; every launch leaves them zero.
void* CudaBackend::conv_split_workspace() {
  if (!conv_split_ws_) {
    conv_split_ws_ = alloc_.allocate(conv_split_workspace_bytes(sm_count_));
    ATELIER_CUDA_OK(cudaMemsetAsync(conv_split_ws_->data(), 0, conv_split_flag_bytes(), stream_));
  }
  return conv_split_ws_->data();
}

// Per shape (and epilogue), which of the candidate paths (cuDNN first, then the GEMM path and the own kernel where
// they apply) is fastest (TimedChoice: timed at the shape's first eager call; under capture an unknown shape takes
// cuDNN). The candidates' names are part of the key: the answer is an index into this list, and the switches
// (ATELIER_CONV_GEMM, ATELIER_OWN_CONV, the tests' setters) change which paths it holds.
int CudaBackend::conv_path_choice(const Tensor& out, const Tensor& x, const Tensor& wn, const Tensor& bias, const Conv2dParams& p,
                                  const Tensor& addend, const std::vector<std::function<bool()>>& candidates,
                                  const std::vector<const char*>& names) {
  const auto key = std::make_tuple(out.shape(), x.shape(), int(wn.size(1)), int(wn.size(2)), p.stride_h, p.stride_w, p.pad_h, p.pad_w,
                                   int(out.dtype()), bias.defined(), addend.defined(), candidate_names_key(names));
  return conv_choices_.fastest(key, stream_, candidates, [&](const std::vector<float>& ms, int pick) {
    if (!cudnn_graph::log_enabled()) return;  // ATELIER_CUDNN_LOG=1: beside the cuDNN plans' lines
    std::fprintf(stderr, "[conv path] x%s w[%lld,%lld] stride %d pad %d -> %s: %s: %s\n", shape_str(x.shape()).c_str(),
                 (long long)wn.size(1), (long long)wn.size(2), p.stride_h, p.pad_h, shape_str(out.shape()).c_str(),
                 candidate_times(ms, names).c_str(), names[pick]);
  });
}

}  // namespace atelier::cuda
