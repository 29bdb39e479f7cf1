// Device memory pool of one GPU. All work of a device runs on its one stream, so a freed block may be handed
// to the next allocation at once: anything that still reads it was enqueued earlier on the same stream and
// runs first (stream-ordered reuse, no events). Blocks are kept in size classes (eighths of the next power of
// two, at least 256 B below 1 MiB and 2 MiB above; see round_size), so the same shapes allocated every step
// of a denoising loop never reach cudaMalloc after the first step. A request takes the smallest cached block
// of its class or a larger one up to kMaxReuseFactor times its size: a server's batches change size from
// call to call, and every new block is a cudaMalloc (with all GPUs of a process in one address space, a call
// that takes the driver's process-wide locks). Counted in stats(): on the two-H200 server benchmark 45-157
// calls, 4-12 ms in all per run, so not what had stalled the second GPU's worker (that was plan timing of
// new batch sizes: docs/performance.md, session 6). On cudaMalloc failure the cache is freed and the
// allocation retried once before an out-of-memory error is thrown.
//
// Also: the pinned host staging ring that host<->device copies go through.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace atelier::cuda {

class DeviceAllocator {
 public:
  DeviceAllocator(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~DeviceAllocator();
  std::shared_ptr<Buffer> allocate(size_t bytes);
  size_t bytes_reserved() const;
  size_t bytes_in_use() const;
  // Syncs the stream and returns every cached block to the driver.
  void release_cached();
  static size_t round_size(size_t bytes);
  static constexpr size_t kMaxReuseFactor = 2;  // a cached block serves requests down to half its size
  struct Stats {
    int64_t mallocs = 0;          // cudaMalloc calls
    double malloc_seconds = 0;    // host time inside them
    int64_t larger_reuses = 0;    // requests served by a cached block of a larger class
  };
  Stats stats() const;

  // Private pools for recorded work (CUDA graphs). While a pool is open every allocation is taken from it
  // (or from cudaMalloc, the block then belonging to it) and every freed block goes to it, also blocks
  // allocated before it opened (the recording may read them). A recording's addresses are therefore never
  // handed to other work while it lives: replays can overwrite them at any time. Closing a pool returns its
  // free blocks to the shared cache, and its blocks still in use go there when they are freed. No host
  // synchronisation is needed: all work of the device is ordered on its one stream.
  struct Pool {
    std::multimap<size_t, void*> free;  // size class -> blocks
    std::unordered_map<void*, size_t> owned;
    size_t bytes = 0;                   // sum of owned block sizes
  };
  std::shared_ptr<Pool> open_pool();
  void stop_routing();  // allocations and frees go to the shared cache again; the pool keeps its blocks
  void close_pool(const std::shared_ptr<Pool>& pool);

 private:
  void give_back(void* p, size_t size);
  void* malloc_or_retry(size_t size);
  // Registers `p` as `pool`'s (under mu_).
  void adopt(Pool* pool, void* p, size_t size);
  // ATELIER_ALLOC_LOG's line for a request of `bytes` that missed the cache (or `pool`'s) and took a new block of
  // `size` in `seconds`. Called with mu_ held.
  void log_miss(const Pool* pool, size_t bytes, size_t size, double seconds) const;
  int device_;
  cudaStream_t stream_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // size class -> blocks
  Stats stats_;                        // under mu_
  size_t cached_ = 0;
  size_t in_use_ = 0;
  size_t pool_free_ = 0;                        // bytes cached in pools (reserved, not in use)
  std::shared_ptr<Pool> routing_;               // the open pool, if any
  std::unordered_map<void*, Pool*> pool_of_;    // block -> the pool that owns it
};

// Pinned host buffers for host<->device copies: host->device copies are staged through a ring of slots
// (each guarded by an event, so the call returns without waiting for the transfer); device->host copies
// through two slots, overlapping the transfer of one chunk with the host copy of the previous one.
class PinnedStaging {
 public:
  static constexpr size_t kSlotBytes = size_t(8) << 20;
  static constexpr int kSlots = 4;
  explicit PinnedStaging(int device) : device_(device) {}
  ~PinnedStaging();
  void host_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream);
  // dst[0, bytes) = what `fill` writes (HostFill), a slot at a time: fill writes the next piece while the copy
  // engine sends the last. `fill` runs under the ring's lock: it must not copy to a device itself.
  void host_to_device(void* dst, size_t bytes, const HostFill& fill, cudaStream_t stream);
  void device_to_host(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  void ensure();
  int device_;
  std::mutex mu_;
  void* slots_[kSlots] = {};
  cudaEvent_t done_[kSlots] = {};
  int next_ = 0;
};

}  // namespace atelier::cuda
