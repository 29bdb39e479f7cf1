// CudaBackend::conv2d_shortcut: a resnet's second convolution and its 1x1 shortcut as one implicit GEMM. The own
// kernel (cuda_gemm_wgmma.cu) runs conv2's kh x kw taps and then the shortcut's channels as further k-steps into the
// same accumulators: the shortcut's output (at 16 rows of SD 1.5, 15 tensors of 5-42 MB a UNet call) is neither
// written nor read back as conv2's addend, and its products run at conv2's tile efficiency instead of a short
// kernel's. The weights are packed once per conv2 weight ([O, kh, kw, C] and [O, Cs] side by side along k) and the
// two biases summed once. Timed per shape against the shortcut followed by conv2 with it as the addend; where that
// is faster the call declines and ops runs it.
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_conv.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_nvtx.h"
#include "backend/cuda/cudnn_graph_api.h"

namespace atelier::cuda {

// A timed candidate by default (session 61, H200: its test passed; it won at every 16-row shape, the 16-row call
// 24.347 against 24.780 ms); ATELIER_FOLD_SHORTCUT=force folds wherever the kernel takes the case, =0 never.
CudaBackend::FoldShortcut CudaBackend::fold_shortcut_default() {
  if (env_is("ATELIER_FOLD_SHORTCUT", "0")) return FoldShortcut::kOff;
  if (env_is("ATELIER_FOLD_SHORTCUT", "force")) return FoldShortcut::kForce;
  return FoldShortcut::kAuto;
}

// w [O, C, kh, kw] and its channels-last copy wn [O, kh, kw, C], ws [O, Cs, 1, 1] (one dtype), bias and bs [O]
// optional -> the packed weight [O, kh * kw * C + Cs] and the biases' sum [O] (undefined without either), cached per
// conv2 weight.
CudaBackend::ShortcutWeights CudaBackend::shortcut_weights(const Tensor& w, const Tensor& wn, const Tensor& bias, const Tensor& ws,
                                                           const Tensor& bs) {
  const int64_t o = w.size(0), k = wn.numel() / o, ks = ws.numel() / o;
  const size_t elem = dtype_size(w.dtype());
  std::lock_guard<std::mutex> lock(nhwc_mu_);
  const auto fits = [&](const ShortcutWeights& e) {
    return e.shortcut_source == ws.raw() && e.bias_source == (bias.defined() ? bias.raw() : nullptr) &&
           e.shortcut_bias_source == (bs.defined() ? bs.raw() : nullptr) && e.weight.shape() == Shape{o, k + ks};
  };
  return weight_entry(shortcut_weights_, w, fits, [&](ShortcutWeights& e) {
    e.shortcut_source = ws.raw();
    e.bias_source = bias.defined() ? bias.raw() : nullptr;
    e.shortcut_bias_source = bs.defined() ? bs.raw() : nullptr;
    e.weight = Tensor::empty({o, k + ks}, w.dtype(), device());
    const size_t row = size_t(k + ks) * elem;
    ATELIER_CUDA_OK(cudaMemcpy2DAsync(e.weight.raw(), row, wn.raw(), size_t(k) * elem, size_t(k) * elem, size_t(o),
                                      cudaMemcpyDeviceToDevice, stream_));
    ATELIER_CUDA_OK(cudaMemcpy2DAsync(static_cast<char*>(e.weight.raw()) + size_t(k) * elem, row, ws.raw(), size_t(ks) * elem,
                                      size_t(ks) * elem, size_t(o), cudaMemcpyDeviceToDevice, stream_));
    if (bias.defined() && bs.defined()) {
      e.bias = Tensor::empty({o}, w.dtype(), device());
      binary(e.bias, bias, bs, BinaryOp::kAdd);  // in f32, rounded once
    } else {
      e.bias = bias.defined() ? bias : bs;
    }
  });
}

// out [N, O, H, W] = conv(h [N, C, H, W], w [O, C, kh, kw]) + bias + conv1x1([s1, s2] [N, Cs, H, W], ws [O, Cs, 1, 1])
// + bs, all channels-last bf16; stride 1 and a padding that keeps H and W (the own kernel's conditions).
bool CudaBackend::conv2d_shortcut(Tensor& out, const Tensor& h, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                                  const Tensor& s1, const Tensor& s2, const Tensor& ws, const Tensor& bs) {
  if (fold_shortcut_ == FoldShortcut::kOff || out.numel() == 0 || conv_impl_ != ConvImpl::kAuto || own_conv_mode() == OwnConv::kOff)
    return false;
  const DType dt = out.dtype();
  if (h.dtype() != dt || w.dtype() != dt || ws.dtype() != dt || s1.dtype() != dt || (s2.defined() && s2.dtype() != dt) ||
      (bs.defined() && bs.dtype() != dt) || !prefers_channels_last(dt) || !s1.is_channels_last() || (s2.defined() && !s2.is_channels_last()))
    return false;
  NvtxRange range("conv2d_shortcut");
  DeviceGuard guard(index_);
  const Tensor wn = nhwc_weight(w, /*persistent=*/true);
  OwnConvArgs own_args;
  if (!conv_own_args(out, h, wn, bias, p, Tensor(), own_args)) return false;
  own_args.shortcut = s1.raw();
  own_args.shortcut2 = s2.defined() ? s2.raw() : nullptr;
  own_args.sc_c1 = s1.size(1);
  own_args.sc_c = s1.size(1) + (s2.defined() ? s2.size(1) : 0);
  if (s1.size(0) != out.size(0) || s1.size(2) != out.size(2) || s1.size(3) != out.size(3) || !conv_implicit_takes(own_args, cc_major_))
    return false;
  // The packed operands at the first folded launch: never under a capture that meets an untimed shape (that
  // answers "separate" without running a candidate), so the packing copies are never recorded into a graph.
  ShortcutWeights packed;
  const auto folded = [&](int split) {
    if (!packed.weight.defined()) {
      packed = shortcut_weights(w, wn, bias, ws, bs);
      own_args.weight = packed.weight.raw();
      own_args.bias = packed.bias.defined() ? packed.bias.raw() : nullptr;
    }
    NvtxRange own_range("conv2d_own_shortcut");
    return launch_own_conv(own_args, split);
  };
  const auto ran_folded = [&](int split) {
    if (!folded(split)) return false;
    folded_shortcuts_.fetch_add(1);
    return true;
  };
  if (fold_shortcut_ == FoldShortcut::kForce) return ran_folded(std::max(1, own_conv_split()));
  // The other candidate: what ops runs when this declines (the shortcut's own choice of path, then conv2's with
  // the shortcut's output as its addend).
  const auto separate = [&] {
    Tensor shortcut = Tensor::empty_channels_last(out.shape(), dt, device());
    const Conv2dParams one_by_one{};
    if (!s2.defined()) {
      conv2d(shortcut, s1, ws, bs, one_by_one, Tensor());
    } else if (!conv2d_concat(shortcut, s1, s2, ws, bs, one_by_one, Tensor())) {
      return false;
    }
    conv2d(out, h, w, bias, p, shortcut);
    return true;
  };
  std::vector<std::function<bool()>> candidates{separate, [&] { return folded(1); }};
  std::vector<const char*> names{"separate", "own kernel, folded"};
  const std::vector<int> splits = add_split_candidates(own_args, folded, candidates, names);
  const auto key = std::make_tuple(h.shape(), s1.shape(), s2.defined() ? s2.shape() : Shape{}, w.shape(), ws.shape(), p.pad_h, p.pad_w,
                                   bias.defined(), bs.defined());
  const int pick = conv_shortcut_choices_.fastest(key, stream_, candidates, [&](const std::vector<float>& ms, int best) {
    if (!cudnn_graph::log_enabled()) return;  // ATELIER_CUDNN_LOG=1, beside conv2d's [conv path] lines
    std::fprintf(stderr, "[conv shortcut] h%s w%s + x%s%s w%s -> %s: %s: %s\n", shape_str(h.shape()).c_str(), shape_str(w.shape()).c_str(),
                 shape_str(s1.shape()).c_str(), s2.defined() ? (" + " + shape_str(s2.shape())).c_str() : "", shape_str(ws.shape()).c_str(),
                 shape_str(out.shape()).c_str(), candidate_times(ms, names).c_str(), names[best]);
  });
  if (pick == 0) return false;  // separate: ops runs it (under capture an untimed shape lands here too)
  return ran_folded(pick == 1 ? 1 : splits[size_t(pick - 2)]);
}

}  // namespace atelier::cuda
