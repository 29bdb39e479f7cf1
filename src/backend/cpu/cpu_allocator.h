// Host memory pool for activations: freed blocks are kept in size classes and reused, so a denoising loop
// that allocates the same shapes every step touches the system allocator only in its first step. A request
// takes the smallest cached block of its class or a larger one up to kMaxReuseFactor times its size (as the
// CUDA pool does): a server's batches change size from call to call, and with exact classes only, every new
// batch size kept a new set of blocks (in the 500-request server test the cache held 48-62 MiB, with the reuse
// 21-33 MiB).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"

namespace atelier {

class CpuAllocator {
 public:
  static constexpr size_t kAlignment = 64;           // cache line / AVX-512 width
  static constexpr size_t kMaxCachedBytes = size_t(8) << 30;
  static constexpr size_t kMaxReuseFactor = 2;  // a cached block serves requests down to half its size
  ~CpuAllocator();
  std::shared_ptr<Buffer> allocate(size_t bytes);
  size_t bytes_reserved() const;
  size_t bytes_in_use() const;
  // Blocks taken from the system allocator so far (the cache had none of the size): the bench reports how many
  // its timed run added.
  int64_t system_allocations() const;
  void release_cached();

 private:
  static size_t round_size(size_t bytes);
  void give_back(void* p, size_t size);
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // size class -> blocks
  size_t cached_ = 0;
  size_t in_use_ = 0;
  int64_t system_allocations_ = 0;
};

}  // namespace atelier
