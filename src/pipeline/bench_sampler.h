// What the benchmarks (sd_bench.cc, dit_bench.cc) watch during their timed run besides the trace: the device's
// reserved bytes at every step and stage (the report's peak), and the backend's counters from the run's start
// (BenchReport::timed_counters: a cudaMalloc there is a shape the warm-up missed).
#pragma once
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "pipeline/sd_bench.h"
#include "pipeline/sd_pipeline.h"

namespace atelier {

struct TimedRunSampler {
  Backend& backend;
  size_t peak = 0;
  std::vector<std::pair<std::string, double>> counters_at_start = backend.counters();
  void sample() { peak = std::max(peak, backend.bytes_reserved()); }
  // A denoise loop's progress callback that samples at every step.
  ProgressCallback progress() {
    return [this](const StepProgress&) {
      sample();
      return true;
    };
  }
  // The peak and the counters' changes into `r` (after the run's device work is complete).
  void finish(BenchReport& r) const {
    r.peak_bytes_reserved = peak;
    r.timed_counters = counter_changes(counters_at_start, backend.counters());
  }
};

}  // namespace atelier
