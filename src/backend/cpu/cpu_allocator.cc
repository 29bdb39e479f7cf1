#include "backend/cpu/cpu_allocator.h"

#include <cstdlib>
#include <new>

namespace atelier {

CpuAllocator::~CpuAllocator() { release_cached(); }

size_t CpuAllocator::round_size(size_t bytes) {
  // Small blocks round to 256 B, larger to 1/8 of their power of two, so reuse is likely and waste small.
  if (bytes <= 256) return 256;
  size_t p = 1;
  while (p < bytes) p <<= 1;
  const size_t step = std::max<size_t>(p / 8, 256);
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<Buffer> CpuAllocator::allocate(size_t bytes) {
  size_t size = round_size(bytes);  // becomes the size of the block taken when a larger cached one serves
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(size);  // the smallest cached block that fits
    if (it != free_.end() && it->first <= size * kMaxReuseFactor) {
      size = it->first;  // the block keeps its class: it returns to it when freed
      p = it->second;
      free_.erase(it);
      cached_ -= size;
    }
    in_use_ += size;
  }
  if (!p) {
    p = std::aligned_alloc(kAlignment, size);
    std::lock_guard<std::mutex> lock(mu_);
    if (!p) {
      in_use_ -= size;
      throw std::bad_alloc();
    }
    ++system_allocations_;
  }
  return std::make_shared<Buffer>(p, bytes, Device::cpu(), [this, size](void* q) { give_back(q, size); });
}

int64_t CpuAllocator::system_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return system_allocations_;
}

void CpuAllocator::give_back(void* p, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= size;
  if (cached_ + size > kMaxCachedBytes) {
    std::free(p);
    return;
  }
  free_.emplace(size, p);
  cached_ += size;
}

size_t CpuAllocator::bytes_reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_ + in_use_;
}

size_t CpuAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

void CpuAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, p] : free_) std::free(p);
  free_.clear();
  cached_ = 0;
}

}  // namespace atelier
