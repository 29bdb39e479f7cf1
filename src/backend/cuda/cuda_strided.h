// Strided layouts for the CUDA elementwise and copy kernels: a shape with up to kMaxDims dims and one
// stride list per operand, passed to kernels by value. Built on the host by collapse(), which drops size-1
// dims and merges adjacent dims wherever every operand allows, so that a contiguous or simply broadcast
// operation becomes one or two dims and the kernels' index arithmetic stays short.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace atelier::cuda {

constexpr int kMaxDims = 8;

template <int N>
struct StridedLayout {
  int rank = 1;
  int64_t shape[kMaxDims] = {1};
  int64_t stride[N][kMaxDims] = {};
};

// Collapses `shape` with the operands' `strides` (same rank as shape). Throws atelier::Error (unsupported)
// when more than kMaxDims dims remain.
template <int N>
StridedLayout<N> collapse(const Shape& shape, const std::vector<const Shape*>& strides) {
  std::vector<int64_t> cs;
  std::vector<std::vector<int64_t>> st(N);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;  // a size-1 dim never moves an offset
    bool merge = !cs.empty();
    for (int o = 0; o < N && merge; ++o) merge = st[o].back() == (*strides[o])[d] * shape[d];
    if (merge) {
      cs.back() *= shape[d];
      for (int o = 0; o < N; ++o) st[o].back() = (*strides[o])[d];
    } else {
      cs.push_back(shape[d]);
      for (int o = 0; o < N; ++o) st[o].push_back((*strides[o])[d]);
    }
  }
  StridedLayout<N> l;
  if (cs.empty()) {  // a single element
    l.rank = 1;
    l.shape[0] = 1;
    for (int o = 0; o < N; ++o) l.stride[o][0] = 1;
    return l;
  }
  ATELIER_CHECK(cs.size() <= size_t(kMaxDims),
                "CUDA strided op: " + std::to_string(cs.size()) + " dims remain after merging " + shape_str(shape) +
                    "; at most " + std::to_string(kMaxDims) + " are supported (make an operand contiguous first)");
  l.rank = int(cs.size());
  for (int d = 0; d < l.rank; ++d) {
    l.shape[d] = cs[d];
    for (int o = 0; o < N; ++o) l.stride[o][d] = st[o][d];
  }
  return l;
}

// True when operand `o` of the collapsed layout is one packed run (rank 1, unit stride).
template <int N>
bool is_flat(const StridedLayout<N>& l, int o) {
  return l.rank == 1 && l.stride[o][0] == 1;
}

}  // namespace atelier::cuda
