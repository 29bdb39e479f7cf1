// The operands of one attention call as the CUDA attention kernels take them (cuda_attention.cu's flash kernels,
// cuda_attention_short.cu, cuda_attention_wgmma.cu); each kernel's arguments extend it with what only it needs.
#pragma once
#include <cstdint>

namespace atelier::cuda {

// q [B, H, Sq, D], k / v [B, H / group, Sk, D], out [B, H, Sq, D] (heads may be merged: [B, Sq, H, D]) as base
// pointers and element strides (batch, head, row; the head dim contiguous).
struct AttentionViews {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  int64_t qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2, os0, os1, os2;
  int batch, heads, group, sq, sk, d;
  float scale;  // of the scores, before the softmax
};

}  // namespace atelier::cuda
