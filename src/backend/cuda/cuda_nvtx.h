// NVTX ranges around ops, so that Nsight Systems timelines show which op enqueued which kernels. NVTX 3 is
// header-only: without a profiler attached each range costs a branch on a null function pointer.
#pragma once
#include <nvtx3/nvToolsExt.h>

namespace atelier::cuda {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace atelier::cuda
