// `atelier bench --kernels`: what the device's kernels did during the timed model calls, from a KernelTracer's
// events (backend/kernel_tracer.h, CUPTI on CUDA). Where the event timer sees a replayed CUDA graph as one busy
// range, these figures see its kernels: how many a call runs, their summed time, the device's idle time between
// them inside the call, the busy share of the denoise loop counted kernel by kernel, and the kernels that take
// the time.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/trace.h"

namespace atelier {

struct KernelGroup {
  std::string name;          // KernelTracer's short name (template arguments kept)
  double count_per_call = 0; // launches per model call
  double ms_per_call = 0;    // summed device time per model call
  double mean_us = 0;        // per launch
  double share_pct = 0;      // of all kernel time in the timed calls
};

struct KernelFigures {
  int calls = 0;                  // timed model calls the per-call figures cover
  double kernels_per_call = 0;    // medians over those calls:
  double kernel_ms_per_call = 0;  //   summed kernel durations
  double span_ms_per_call = 0;    //   first kernel's start to the last one's end
  double idle_ms_per_call = 0;    //   span minus the union of the kernels: the device idle inside the call
  double union_ms_per_call = 0;   //   the union of the kernels' intervals (each median is over the calls on its own,
                                  //   so span - idle may differ from it; compare this one with the summed time)
  std::optional<double> busy_pct; // union of all kernels over the window summarize_kernels is given / its length
  // The same from the second call's first kernel to the window's end: the loop in its steady state, without its
  // first call, whose kernels wait for the host's first launches (slower with the tracer attached: CUPTI made
  // each CFG graph launch ~0.6-0.8 ms of host time in session 48's trace, which run-ahead hides from the second
  // call on). None with fewer than two calls.
  std::optional<double> steady_busy_pct;
  // The queue's copies and memsets (copy engines' work, not kernels: kernel_tracer.h's bracketed names), medians per
  // call, and in the whole window (where the busy figure above does not count them).
  double copies_per_call = 0, copy_ms_per_call = 0;
  int window_copies = 0;
  double window_copy_ms = 0;
  std::vector<KernelGroup> top;   // the kernels with the most time per call, most first (kTopKernelGroups at most)

  nlohmann::json to_json() const;
  std::string to_text(const std::string& call) const;  // lines for BenchReport::to_text; `call` = "UNet"...
};

inline constexpr size_t kTopKernelGroups = 15;

// Figures from the kKernel events among `ev` (copies apart from kernels): per call for the events named `call_range` (a kernel belongs to the
// call whose device span, or host span where it has none, holds its start; `origin_ns` is the recorder's origin,
// which device spans count from), and busy over [window_from_ns, window_to_ns) when that is non-empty. None when
// no kernel fell inside a call.
std::optional<KernelFigures> summarize_kernels(const std::vector<trace::Event>& ev, int64_t origin_ns, const char* call_range,
                                               int64_t window_from_ns, int64_t window_to_ns);

}  // namespace atelier
