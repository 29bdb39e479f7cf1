// Typed building blocks for model definitions. Field names follow checkpoint keys (weight, bias), so a
// model struct reads like its state dict; the forward passes call only the op API (backend/ops.h).
#pragma once
#include "backend/ops.h"

namespace atelier {

struct Linear {
  Tensor weight;  // [out, in]
  Tensor bias;    // [out] or undefined
  // x [..., in] -> [..., out]
  Tensor operator()(const Tensor& x, UnaryOp act = UnaryOp::kIdentity) const { return ops::linear(x, weight, bias, act); }
  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }
};

struct Conv2d {
  Tensor weight;  // [out, in/groups, kh, kw]
  Tensor bias;    // [out] or undefined
  Conv2dParams params;
  // x [N, in, H, W] -> [N, out, Ho, Wo]
  Tensor operator()(const Tensor& x) const { return ops::conv2d(x, weight, bias, params); }
};

struct GroupNorm {
  Tensor weight, bias;  // [C]
  int groups = 32;
  float eps = 1e-5f;
  // x [N, C, *] -> same; act fused after the affine (GroupNorm + SiLU in resnets)
  Tensor operator()(const Tensor& x, UnaryOp act = UnaryOp::kIdentity) const {
    return ops::group_norm(x, groups, weight, bias, eps, act);
  }
};

struct LayerNorm {
  Tensor weight, bias;  // [D]
  float eps = 1e-5f;
  // x [..., D] -> same
  Tensor operator()(const Tensor& x) const { return ops::layer_norm(x, weight, bias, eps); }
};

struct RMSNorm {
  Tensor weight;  // [D]
  float eps = 1e-6f;
  Tensor operator()(const Tensor& x) const { return ops::rms_norm(x, weight, eps); }
};

struct Embedding {
  Tensor weight;  // [V, D]
  // ids [N] -> [N, D]
  Tensor operator()(const Tensor& ids) const { return ops::embedding(ids, weight); }
};

}  // namespace atelier
