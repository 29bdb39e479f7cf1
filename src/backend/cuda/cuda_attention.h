// Shared by the two attention paths (cuda_attention.cu, cuda_attention_gemm.cu): the additive mask as the
// kernels see it, a [B, H, Sq, Sk] broadcast view in any float dtype.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace atelier::cuda {

struct AttentionMask {
  const void* ptr = nullptr;  // null: no mask
  DType dtype = DType::F32;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // element strides over [B, H, Sq, Sk]
};

// Attention over at most 80 keys (the cross-attentions over CLIP's 77 tokens): at head dims 136-160 as one key tile of
// the mma.sync flash kernel (cuda_attention.cu, kShortKeys), and unmasked at head dims up to 48 (or 128: "all")
// through cuda_attention_short.cu; tried before the other flash kernels (and so raced against cuDNN's SDPA per shape
// like them). The switches (ATELIER_SHORT_KV_ATTENTION: "0" off, "all" the narrow kernel up to 128, "wide" the 136-160
// kernel only), the narrow kernel's largest head dim (the setter returns the previous one; 0: none) and launches of
// either so far (tests: which kernel took a case).
void set_short_kv_attention(bool on);
int set_short_kv_narrow_head_dims(int max_d);
int short_kv_narrow_head_dims_default();
int64_t short_kv_attention_launches();

inline AttentionMask attention_mask_of(const Tensor& mask) {
  AttentionMask m;
  if (!mask.defined()) return m;
  m.ptr = mask.raw();
  m.dtype = mask.dtype();
  m.s0 = mask.strides()[0];
  m.s1 = mask.strides()[1];
  m.s2 = mask.strides()[2];
  m.s3 = mask.strides()[3];
  return m;
}

}  // namespace atelier::cuda
