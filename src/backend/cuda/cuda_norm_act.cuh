// The activation a channels-last group-norm kernel applies as it writes (cuda_group_norm_grid.cu,
// cuda_group_norm_slice.cu), fixed at compile time for SD's two (identity, SiLU), else chosen at run time. A run-time
// switch in every unrolled apply is most of such a kernel's code: the grid kernel was ~450 KB of it, and ncu found its
// warps waiting on instruction fetch (session 31); the slice kernel's 6,496 instructions spilled under its 64-register
// cap and stalled on the switch's branches (session 55).
#pragma once
#include <type_traits>

#include "backend/cuda/cuda_device.cuh"
#include "core/tensor.h"

namespace atelier::cuda {

enum class Act { kIdentity, kSilu, kAny };

inline Act act_of(UnaryOp op) { return op == UnaryOp::kIdentity ? Act::kIdentity : op == UnaryOp::kSilu ? Act::kSilu : Act::kAny; }

// fn(tag) with op's Act as a type (std::integral_constant<Act, ...>): the launchers pick their kernel's instantiation
// by decltype(tag)::value.
template <class Fn>
auto with_act(UnaryOp op, const Fn& fn) {
  switch (act_of(op)) {
    case Act::kIdentity: return fn(std::integral_constant<Act, Act::kIdentity>{});
    case Act::kSilu: return fn(std::integral_constant<Act, Act::kSilu>{});
    default: return fn(std::integral_constant<Act, Act::kAny>{});
  }
}

// act(v) for a result stored as T: kAct where it is fixed, else the run-time `act`.
template <typename T, Act kAct>
__device__ __forceinline__ float activate(float v, UnaryOp act) {
  if constexpr (kAct == Act::kIdentity) return v;
  else if constexpr (kAct == Act::kSilu) return apply_unary_for<T>(v, UnaryOp::kSilu);
  else return apply_unary_for<T>(v, act);
}

}  // namespace atelier::cuda
