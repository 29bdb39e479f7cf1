#include "backend/cuda/cuda_allocator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_common.h"

namespace atelier::cuda {

namespace {
constexpr size_t kSmallGranule = 256;         // cudaMalloc aligns to 256 B anyway
constexpr size_t kLargeThreshold = size_t(1) << 20;
constexpr size_t kLargeGranule = size_t(2) << 20;  // above 1 MiB: whole 2 MiB pages, as the driver maps them

// ATELIER_ALLOC_LOG=1: one stderr line per cudaMalloc of kLargeThreshold or more (its size, its time, and the
// cache it missed), to find the requests that still miss in a warmed-up run (docs/performance.md, session 22:
// the VAE decode's slow cudaMallocs).
bool alloc_log_enabled() {
  static const bool on = env_is("ATELIER_ALLOC_LOG", "1");
  return on;
}
}  // namespace

DeviceAllocator::~DeviceAllocator() {
  // The backend is never destroyed (tensors may outlive static destruction); nothing to do if it is.
}

size_t DeviceAllocator::round_size(size_t bytes) {
  if (bytes <= kSmallGranule) return kSmallGranule;
  if (bytes <= kLargeThreshold) {
    // Powers of two split into 8 steps: at most 12.5% waste, few distinct classes.
    size_t p = kSmallGranule;
    while (p < bytes) p <<= 1;
    const size_t step = std::max(p / 8, kSmallGranule);
    return (bytes + step - 1) / step * step;
  }
  size_t p = kLargeThreshold;
  while (p < bytes) p <<= 1;
  const size_t step = std::max(p / 8, kLargeGranule);
  return (bytes + step - 1) / step * step;
}

void* DeviceAllocator::malloc_or_retry(size_t size) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, size);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the error before retrying
    release_cached();
    err = cudaMalloc(&p, size);
  }
  if (err == cudaSuccess) return p;
  cudaGetLastError();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  // cudaMalloc reports requests beyond the device's size as invalid values on some drivers: out of memory too.
  if (err == cudaErrorMemoryAllocation || size > total_b)
    throw Error(Status(ErrorCode::kResourceExhausted,
                       "CUDA out of memory on cuda:" + std::to_string(device_) + ": asked for " + std::to_string(size >> 20) +
                           " MiB with " + std::to_string(bytes_in_use() >> 20) + " MiB in use by this process and " +
                           std::to_string(free_b >> 20) + " of " + std::to_string(total_b >> 20) + " MiB free on the device"));
  ATELIER_CUDA_OK(err);
  return p;
}

std::shared_ptr<Buffer> DeviceAllocator::allocate(size_t bytes) {
  size_t size = round_size(bytes);  // becomes the size of the block taken when a larger cached one serves
  void* p = nullptr;
  std::shared_ptr<Pool> pool;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool = routing_;
    auto& list = pool ? pool->free : free_;
    auto it = list.lower_bound(size);  // the smallest cached block that fits
    if (it != list.end() && it->first <= size * kMaxReuseFactor) {
      stats_.larger_reuses += it->first != size;
      size = it->first;  // the block keeps its class: it returns to it when freed
      p = it->second;
      list.erase(it);
      (pool ? pool_free_ : cached_) -= size;
    }
  }
  if (!p) {
    DeviceGuard guard(device_);
    const auto t0 = std::chrono::steady_clock::now();
    p = malloc_or_retry(size);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.mallocs;
    stats_.malloc_seconds += dt;
    if (pool) adopt(pool.get(), p, size);
    if (alloc_log_enabled() && size >= kLargeThreshold) log_miss(pool.get(), bytes, size, dt);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ += size;
  }
  return std::make_shared<Buffer>(p, bytes, Device::cuda(device_), [this, size](void* q) { give_back(q, size); });
}

void DeviceAllocator::log_miss(const Pool* pool, size_t bytes, size_t size, double seconds) const {
  const auto& list = pool ? pool->free : free_;
  const auto above = list.lower_bound(size);  // the cached block it could not take (more than kMaxReuseFactor x)
  const auto below = above == list.begin() ? list.end() : std::prev(above);
  std::fprintf(stderr, "[alloc] cuda:%d cudaMalloc %.1f MiB (asked %.1f) in %.2f ms%s; cached %zu blocks, %.0f MiB; "
               "nearest below %.1f MiB, above %.1f MiB; %lld cudaMallocs so far\n",
               device_, double(size) / (1 << 20), double(bytes) / (1 << 20), seconds * 1e3, pool ? " (recording pool)" : "",
               list.size(), double(pool ? pool_free_ : cached_) / (1 << 20),
               below == list.end() ? 0.0 : double(below->first) / (1 << 20),
               above == list.end() ? 0.0 : double(above->first) / (1 << 20), (long long)stats_.mallocs);
}

void DeviceAllocator::adopt(Pool* pool, void* p, size_t size) {
  pool->owned.emplace(p, size);
  pool->bytes += size;
  pool_of_[p] = pool;
}

void DeviceAllocator::give_back(void* p, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= size;
  auto it = pool_of_.find(p);
  Pool* pool = it != pool_of_.end() ? it->second : nullptr;
  if (!pool && routing_) {  // freed while recording: the recording may read it, so the pool keeps it
    pool = routing_.get();
    adopt(pool, p, size);
  }
  if (pool) {
    pool->free.emplace(size, p);
    pool_free_ += size;
  } else {
    free_.emplace(size, p);
    cached_ += size;
  }
}

std::shared_ptr<DeviceAllocator::Pool> DeviceAllocator::open_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  ATELIER_CHECK(!routing_, "a device memory pool is already open (one recording at a time per device)");
  routing_ = std::make_shared<Pool>();
  return routing_;
}

void DeviceAllocator::stop_routing() {
  std::lock_guard<std::mutex> lock(mu_);
  routing_.reset();
}

void DeviceAllocator::close_pool(const std::shared_ptr<Pool>& pool) {
  std::lock_guard<std::mutex> lock(mu_);
  if (routing_ == pool) routing_.reset();
  for (const auto& [p, size] : pool->owned) pool_of_.erase(p);
  for (const auto& [size, p] : pool->free) {
    free_.emplace(size, p);
    cached_ += size;
    pool_free_ -= size;
  }
  pool->free.clear();
  pool->owned.clear();
}

size_t DeviceAllocator::bytes_reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_ + in_use_ + pool_free_;
}

DeviceAllocator::Stats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

size_t DeviceAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

void DeviceAllocator::release_cached() {
  DeviceGuard guard(device_);
  // Blocks in the cache may still be read by work already enqueued (stream-ordered reuse): wait for it.
  cudaStreamSynchronize(stream_);
  std::multimap<size_t, void*> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(free_);
    cached_ = 0;
  }
  for (auto& [size, p] : blocks) cudaFree(p);
}

// --- pinned staging ---------------------------------------------------------------------------------------

namespace {
// Host copies cannot be part of a recorded graph (the host side would not run again on replay); refusing
// them before anything is enqueued also keeps the slots' events out of the recording.
void refuse_while_recording(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ATELIER_CUDA_OK(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone)
    throw Error(Status(ErrorCode::kUnsupported, "a copy between host and device cannot be recorded into a CUDA graph"));
}
}  // namespace

PinnedStaging::~PinnedStaging() = default;  // lives as long as the process (see DeviceAllocator)

void PinnedStaging::ensure() {
  if (slots_[0]) return;
  for (int i = 0; i < kSlots; ++i) {
    ATELIER_CUDA_OK(cudaHostAlloc(&slots_[i], kSlotBytes, cudaHostAllocPortable));
    ATELIER_CUDA_OK(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming));
  }
}

void PinnedStaging::host_to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  host_to_device(dst, bytes, [src](void* slot, size_t off, size_t len) {
    std::memcpy(slot, static_cast<const char*>(src) + off, len);
  }, stream);
}

void PinnedStaging::host_to_device(void* dst, size_t bytes, const HostFill& fill, cudaStream_t stream) {
  refuse_while_recording(stream);
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(device_);
  ensure();
  for (size_t off = 0; off < bytes; off += kSlotBytes) {
    const size_t len = std::min(kSlotBytes, bytes - off);
    const int s = next_;
    next_ = (next_ + 1) % kSlots;
    ATELIER_CUDA_OK(cudaEventSynchronize(done_[s]));  // the slot's previous transfer has finished
    fill(slots_[s], off, len);
    ATELIER_CUDA_OK(cudaMemcpyAsync(static_cast<char*>(dst) + off, slots_[s], len, cudaMemcpyHostToDevice, stream));
    ATELIER_CUDA_OK(cudaEventRecord(done_[s], stream));
  }
}

void PinnedStaging::device_to_host(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  refuse_while_recording(stream);
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(device_);
  ensure();
  // Chunk i goes through slot (next_ + i) % kSlots; the host copy of chunk i - 1 overlaps chunk i's transfer.
  const size_t chunks = (bytes + kSlotBytes - 1) / kSlotBytes;
  auto slot_of = [&](size_t i) { return int((size_t(next_) + i) % kSlots); };
  auto drain = [&](size_t i) {
    const int s = slot_of(i);
    const size_t off = i * kSlotBytes, len = std::min(kSlotBytes, bytes - off);
    ATELIER_CUDA_OK(cudaEventSynchronize(done_[s]));
    std::memcpy(static_cast<char*>(dst) + off, slots_[s], len);
  };
  for (size_t i = 0; i < chunks; ++i) {
    const int s = slot_of(i);
    const size_t off = i * kSlotBytes, len = std::min(kSlotBytes, bytes - off);
    // A slot may still be the source of an earlier host->device transfer: the stream orders that before
    // this device->host write, so no host wait is needed.
    ATELIER_CUDA_OK(cudaMemcpyAsync(slots_[s], static_cast<const char*>(src) + off, len, cudaMemcpyDeviceToHost, stream));
    ATELIER_CUDA_OK(cudaEventRecord(done_[s], stream));
    if (i >= 1) drain(i - 1);
  }
  if (chunks) drain(chunks - 1);
  next_ = slot_of(chunks);
}

}  // namespace atelier::cuda
