#include "models/common/layers.h"

#include <algorithm>
#include <cmath>

namespace atelier {

namespace {
// Whether the 2-D contiguous tensors lie back to back in one buffer, in order.
bool adjacent(const std::vector<Tensor>& ts) {
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].is_contiguous() || ts[i].buffer() != ts[0].buffer()) return false;
    if (i > 0 && ts[i].offset() != ts[i - 1].offset() + ts[i - 1].numel()) return false;
  }
  return true;
}

// ts stacked along dim 0: a view where they are adjacent, else a copy. ts: [r_i, ...] -> [sum r_i, ...].
Tensor stack_rows(const std::vector<Tensor>& ts) {
  if (!adjacent(ts)) return ops::concat(ts, 0);
  Shape shape = ts[0].shape();
  shape[0] = 0;
  for (const Tensor& t : ts) shape[0] += t.size(0);
  return Tensor(ts[0].buffer(), shape, ts[0].dtype(), ts[0].offset());
}
}  // namespace

bool stack_linears(Linear& stacked, const std::vector<Linear*>& parts) {
  if (parts.empty()) return false;
  const Linear& first = *parts.front();
  std::vector<Tensor> w, b;
  for (const Linear* p : parts) {
    if (!p->weight.defined() || p->is_fp8() || p->weight.dim() != 2 || p->bias.defined() != first.bias.defined() ||
        p->in_features() != first.in_features() || p->weight.dtype() != first.weight.dtype())
      return false;
    w.push_back(p->weight);
    if (p->bias.defined()) b.push_back(p->bias);
  }
  stacked = Linear{stack_rows(w), b.empty() ? Tensor() : stack_rows(b), Tensor()};
  point_into(stacked, parts);
  return true;
}

void point_into(const Linear& stacked, const std::vector<Linear*>& parts) {
  int64_t at = 0;
  for (Linear* p : parts) {
    const int64_t rows = p->out_features();
    *p = stacked.output_rows(at, rows);
    at += rows;
  }
}

void quantize_stacked(Linear& stacked, const std::vector<Linear*>& parts) {
  if (!stacked.weight.defined()) {
    for (Linear* p : parts) p->quantize_fp8();
    return;
  }
  stacked.quantize_fp8();
  point_into(stacked, parts);
}

std::array<Tensor, 3> qkv_heads(const Linear& qkv, const Linear& q, const Linear& k, const Linear& v, const ops::Fp8Rows& x,
                                int64_t heads) {
  const int64_t b = x.x.size(0), n = x.x.size(1);
  if (qkv.weight.defined()) {
    const Tensor all = qkv(x);
    const Tensor h5 = all.reshape({b, n, 3, heads, all.size(2) / (3 * heads)});
    return {h5.select(2, 0), h5.select(2, 1), h5.select(2, 2)};
  }
  const auto split = [&](const Tensor& t) { return t.reshape({b, n, heads, t.size(2) / heads}); };
  return {split(q(x)), split(k(x)), split(v(x))};
}

ops::Fp8Rows token_rows(const ops::Fp8Rows& r, int64_t start, int64_t n) {
  const Tensor x = r.x.narrow(1, start, n);
  if (r.q.defined() && r.x.size(0) == 1) return {x, r.q.narrow(0, start, n), r.scale.narrow(0, start, n), r.x_values};
  ATELIER_CHECK(r.x_values, "token_rows: batched rows without their activations (ask attention_rows_for for x_values)");
  return {ops::contiguous(x), Tensor(), Tensor()};
}

float rms_rope_bound(const RMSNorm& norm, int64_t dim) {
  constexpr float kRoundingMargin = 1.0f + 1.0f / 32.0f;
  float gamma_max = 1.0f;  // no weight: gamma = 1
  if (norm.weight.defined()) {
    gamma_max = 0.0f;
    for (float g : ops::cast(norm.weight, DType::F32).to_vector()) gamma_max = std::max(gamma_max, std::fabs(g));
  }
  return float(std::sqrt(double(dim))) * gamma_max * kRoundingMargin;
}

ops::Fp8Rows norm_modulate_for(const Tensor& x, NormKind kind, float eps, const Tensor& gamma, const NormModulation& m,
                               const std::vector<const Linear*>& readers) {
  const bool any_fp8 = std::any_of(readers.begin(), readers.end(), [](const Linear* l) { return l->is_fp8(); });
  const bool all_fp8 = std::all_of(readers.begin(), readers.end(), [](const Linear* l) { return l->is_fp8(); });
  // Where only FP8 products read the result, its 16-bit rows need not be written (a third of the pass's bytes).
  if (any_fp8) return ops::norm_modulate_fp8(x, kind, eps, gamma, m, /*keep_values=*/!all_fp8);
  return {ops::norm_modulate(x, kind, eps, gamma, m), Tensor(), Tensor()};
}

}  // namespace atelier
