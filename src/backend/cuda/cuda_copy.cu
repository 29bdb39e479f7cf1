// Data movement on the GPU: strided copies with dtype conversion (up to kMaxDims dims after merging), contiguous
// copies (many in one kernel), channels-last concatenation in one pass, fill, embedding gathers.
#include <atomic>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_nvtx.h"
#include "backend/cuda/cuda_upload.h"

namespace atelier::cuda {
namespace {

// --- element conversions for any dtype (the CPU backend's load_as_float / store_float) ----------------

__device__ float load_as_float(const char* base, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return reinterpret_cast<const float*>(base)[i];
    case DType::F16: return __half2float(reinterpret_cast<const __half*>(base)[i]);
    case DType::BF16: return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(base)[i]);
    case DType::F64: return float(reinterpret_cast<const double*>(base)[i]);
    case DType::I32: return float(reinterpret_cast<const int32_t*>(base)[i]);
    case DType::I64: return float(reinterpret_cast<const int64_t*>(base)[i]);
    case DType::I16: return float(reinterpret_cast<const int16_t*>(base)[i]);
    case DType::I8: return float(reinterpret_cast<const int8_t*>(base)[i]);
    case DType::U8: case DType::BOOL: return float(reinterpret_cast<const uint8_t*>(base)[i]);
    default: return 0.0f;  // rejected on the host (supported_copy_dtype)
  }
}

__device__ void store_float(char* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32: reinterpret_cast<float*>(base)[i] = v; return;
    case DType::F16: reinterpret_cast<__half*>(base)[i] = __float2half_rn(v); return;
    case DType::BF16: reinterpret_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); return;
    case DType::F64: reinterpret_cast<double*>(base)[i] = double(v); return;
    case DType::I32: reinterpret_cast<int32_t*>(base)[i] = int32_t(v); return;
    case DType::I64: reinterpret_cast<int64_t*>(base)[i] = int64_t(v); return;
    case DType::I16: reinterpret_cast<int16_t*>(base)[i] = int16_t(v); return;
    case DType::I8: reinterpret_cast<int8_t*>(base)[i] = int8_t(v); return;
    case DType::U8: case DType::BOOL: reinterpret_cast<uint8_t*>(base)[i] = uint8_t(v); return;
    default: return;
  }
}

bool supported_copy_dtype(DType t) { return t != DType::F8E4M3; }

// --- kernels ----------------------------------------------------------------------------------------------

// Same dtype: elements moved as raw bits of their size (exact for every dtype, NaN payloads included).
template <typename Bits, typename Index>
__global__ void copy_bits_kernel(Bits* dst, const Bits* src, StridedLayout<2> l, Index n) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[2];
    strided_offsets(l, i, off);
    dst[off[0]] = src[off[1]];
  }
}

// Float dtypes (f32/bf16/f16) converted through f32 with round-to-nearest-even.
template <typename D, typename S, typename Index>
__global__ void copy_cast_kernel(D* dst, const S* src, StridedLayout<2> l, Index n) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[2];
    strided_offsets(l, i, off);
    dst[off[0]] = from_f32<D>(to_f32(src[off[1]]));
  }
}

// Any other dtype pair, through f32 as the CPU backend does.
template <typename Index>
__global__ void copy_generic_kernel(char* dst, DType dt, const char* src, DType st, StridedLayout<2> l, Index n) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[2];
    strided_offsets(l, i, off);
    store_float(dst, dt, off[0], load_as_float(src, st, off[1]));
  }
}

template <typename Bits, typename Index>
__global__ void fill_kernel(Bits* dst, Bits value, StridedLayout<1> l, Index n) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[1];
    strided_offsets(l, i, off);
    dst[off[0]] = value;
  }
}

// out[r, c] = table[ids[r], c]; an id outside [0, V) gives a NaN row (it cannot be reported without a sync).
template <typename T, typename Id>
__global__ void embedding_kernel(T* out, const Id* ids, const T* table, int64_t n, int64_t v, int64_t d) {
  const int64_t total = n * d;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t r = i / d, c = i % d;
    const int64_t id = int64_t(ids[r]);
    out[i] = (id >= 0 && id < v) ? table[id * d + c] : from_f32<T>(NAN);
  }
}

template <typename Bits>
void launch_copy_bits(void* dst, const void* src, const StridedLayout<2>& l, int64_t n, cudaStream_t s) {
  if (fits_u32(n))
    copy_bits_kernel<Bits, uint32_t><<<grid_for(n), kThreads, 0, s>>>(static_cast<Bits*>(dst), static_cast<const Bits*>(src), l, uint32_t(n));
  else
    copy_bits_kernel<Bits, uint64_t><<<grid_for(n), kThreads, 0, s>>>(static_cast<Bits*>(dst), static_cast<const Bits*>(src), l, uint64_t(n));
}

// Same-dtype copies whose innermost merged dim is a unit-stride run in both tensors made of whole 16-byte
// vectors, every other stride a whole number of vectors and both buffers 16-byte aligned: moved one vector per
// thread (the channel runs of channels-last concatenation and upsampling; 2-byte elements one by one, with
// their index arithmetic, ran at a fifth of the bandwidth). False (nothing enqueued) otherwise.
bool launch_copy_vectors(void* dst, const void* src, StridedLayout<2> l, int64_t n, size_t elem, cudaStream_t s) {
  constexpr size_t kVecBytes = 16;
  if (elem == 0 || kVecBytes % elem != 0) return false;
  const int64_t per = int64_t(kVecBytes / elem), r = l.rank - 1;
  if (reinterpret_cast<uintptr_t>(dst) % kVecBytes != 0 || reinterpret_cast<uintptr_t>(src) % kVecBytes != 0) return false;
  if (l.stride[0][r] != 1 || l.stride[1][r] != 1 || l.shape[r] % per != 0) return false;
  for (int64_t d = 0; d < r; ++d)
    if (l.stride[0][d] % per != 0 || l.stride[1][d] % per != 0) return false;
  l.shape[r] /= per;
  for (int64_t d = 0; d < r; ++d) {
    l.stride[0][d] /= per;
    l.stride[1][d] /= per;
  }
  launch_copy_bits<uint4>(dst, src, l, n / per, s);
  return true;
}

template <typename D, typename S>
void launch_copy_cast(void* dst, const void* src, const StridedLayout<2>& l, int64_t n, cudaStream_t s) {
  if (fits_u32(n))
    copy_cast_kernel<D, S, uint32_t><<<grid_for(n), kThreads, 0, s>>>(static_cast<D*>(dst), static_cast<const S*>(src), l, uint32_t(n));
  else
    copy_cast_kernel<D, S, uint64_t><<<grid_for(n), kThreads, 0, s>>>(static_cast<D*>(dst), static_cast<const S*>(src), l, uint64_t(n));
}

template <typename D>
bool launch_copy_float_src(void* dst, const void* src, DType st, const StridedLayout<2>& l, int64_t n, cudaStream_t s) {
  switch (st) {
    case DType::F32: launch_copy_cast<D, float>(dst, src, l, n, s); return true;
    case DType::BF16: launch_copy_cast<D, __nv_bfloat16>(dst, src, l, n, s); return true;
    case DType::F16: launch_copy_cast<D, __half>(dst, src, l, n, s); return true;
    default: return false;
  }
}

// Float-to-float conversions through the typed kernel; false for other pairs.
bool launch_copy_float(void* dst, DType dt, const void* src, DType st, const StridedLayout<2>& l, int64_t n, cudaStream_t s) {
  switch (dt) {
    case DType::F32: return launch_copy_float_src<float>(dst, src, st, l, n, s);
    case DType::BF16: return launch_copy_float_src<__nv_bfloat16>(dst, src, st, l, n, s);
    case DType::F16: return launch_copy_float_src<__half>(dst, src, st, l, n, s);
    default: return false;
  }
}

template <typename Bits>
void launch_fill(void* dst, Bits value, const StridedLayout<1>& l, int64_t n, cudaStream_t s) {
  if (fits_u32(n))
    fill_kernel<Bits, uint32_t><<<grid_for(n), kThreads, 0, s>>>(static_cast<Bits*>(dst), value, l, uint32_t(n));
  else
    fill_kernel<Bits, uint64_t><<<grid_for(n), kThreads, 0, s>>>(static_cast<Bits*>(dst), value, l, uint64_t(n));
}

// The bit pattern of `value` in dtype t (the CPU backend's store_float), widened to 64 bits.
uint64_t fill_bits(DType t, float value) {
  switch (t) {
    case DType::F32: return float_to_bits(value);
    case DType::BF16: return float_to_bf16(value);
    case DType::F16: return float_to_f16(value);
    case DType::F64: { double d = value; uint64_t b; std::memcpy(&b, &d, 8); return b; }
    case DType::I32: return uint32_t(int32_t(value));
    case DType::I64: return uint64_t(int64_t(value));
    case DType::I16: return uint16_t(int16_t(value));
    case DType::I8: return uint8_t(int8_t(value));
    case DType::U8: case DType::BOOL: return uint8_t(value);
    default: throw Error(unsupported("fill: dtype " + std::string(dtype_name(t)) + " is not supported on CUDA"));
  }
}

}  // namespace

// --- channels-last concatenation in one pass -------------------------------------------------------------
namespace {

constexpr int kMaxConcatParts = 4;  // a UNet's skip concatenation has two
constexpr size_t kConcatChunk = 16;  // bytes a thread moves
std::atomic<int64_t> g_concat_launches{0};
std::atomic<bool> g_concat_one_pass{!env_is("ATELIER_CONCAT_ONE_PASS", "0")};

// Output rows of `total` 16-byte chunks; part p's rows of chunks[p] chunks start at chunk first[p] of a row.
struct ConcatRows {
  const uint4* src[kMaxConcatParts];
  uint32_t chunks[kMaxConcatParts];
  uint32_t first[kMaxConcatParts];
  uint32_t total;
  int parts;
};

// out [rows, total] chunks from the parts' rows; n = rows * total. The part is picked by selects, not by indexing
// the parameter arrays (a dynamic index would copy them to local memory).
template <typename Index>
__global__ void concat_rows_kernel(uint4* out, ConcatRows a, Index n) {
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += Index(gridDim.x) * blockDim.x) {
    const Index r = i / a.total;
    const uint32_t c = uint32_t(i - r * a.total);
    const uint4* src = a.src[0];
    uint32_t chunks = a.chunks[0], first = 0;
#pragma unroll
    for (int q = 1; q < kMaxConcatParts; ++q)
      if (q < a.parts && c >= a.first[q]) src = a.src[q], chunks = a.chunks[q], first = a.first[q];
    out[i] = src[r * chunks + (c - first)];
  }
}

}  // namespace

int64_t concat_one_pass_launches() { return g_concat_launches.load(); }
void set_concat_one_pass(bool on) { g_concat_one_pass.store(on); }

// out [N, C, H, W] and parts [N, C_i, H, W], channels-last: one kernel where every part's channel run is whole
// 16-byte chunks (SD's 320-1280 channels in 2 bytes), instead of one strided copy per part (each a launch and a
// tail: 2.8 us apiece for SD's CFG skip concatenations, session 39).
bool CudaBackend::concat_channels_last(Tensor& out, const std::vector<Tensor>& parts) {
  if (!g_concat_one_pass.load() || parts.empty() || parts.size() > size_t(kMaxConcatParts)) return false;
  if (out.dim() != 4 || !out.is_channels_last() || !aligned16(out.raw())) return false;
  const size_t elem = dtype_size(out.dtype());
  ConcatRows a{};
  uint32_t at = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    const Tensor& x = parts[p];
    const size_t row_bytes = size_t(x.size(1)) * elem;
    if (x.dtype() != out.dtype() || !x.is_channels_last() || row_bytes % kConcatChunk != 0 || !aligned16(x.raw())) return false;
    a.src[p] = static_cast<const uint4*>(x.raw());
    a.chunks[p] = uint32_t(row_bytes / kConcatChunk);
    a.first[p] = at;
    at += a.chunks[p];
  }
  a.total = at;
  a.parts = int(parts.size());
  const int64_t rows = out.numel() / out.size(1);
  if (rows == 0 || size_t(at) * kConcatChunk != size_t(out.size(1)) * elem) return false;
  const int64_t n = rows * int64_t(at);
  NvtxRange range("concat");
  DeviceGuard guard(index_);
  auto* dst = static_cast<uint4*>(out.raw());
  if (fits_u32(n))
    concat_rows_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream_>>>(dst, a, uint32_t(n));
  else
    concat_rows_kernel<uint64_t><<<grid_for(n), kThreads, 0, stream_>>>(dst, a, uint64_t(n));
  ATELIER_CUDA_LAUNCHED();
  g_concat_launches.fetch_add(1);
  return true;
}

// --- contiguous copies as one kernel for many ------------------------------------------------------------
namespace {

// Why kernels and not cudaMemcpyAsync: a device-to-device cudaMemcpyAsync runs on a copy engine, which the kernel
// tracer does not see as kernel time, and each one paid ~8-10 us of latency at a denoise step's boundary (session
// 39: ~34 us between the input preparation's last kernel and the replayed graph's first, its three input copies in
// between). One kernel moves all of a replay's inputs (or a concatenation's rows) 16 bytes per thread.
constexpr int kMaxCopySegments = 8;
constexpr uint64_t kCopyChunk = 16;
std::atomic<int64_t> g_copy_many_launches{0};
std::atomic<bool> g_driver_copies{env_is("ATELIER_DRIVER_COPIES", "1")};

// Segment q: bytes[q] bytes from src[q] to dst[q] (both 16-byte aligned), its chunks numbered from first[q].
struct CopySegments {
  char* dst[kMaxCopySegments];
  const char* src[kMaxCopySegments];
  uint64_t bytes[kMaxCopySegments];
  uint64_t first[kMaxCopySegments];
  int count;
};

// One 16-byte chunk per thread and step over all segments' chunks (n); a segment's last chunk may be partial and
// is then copied byte by byte. The segment is picked by selects, not by indexing the parameter arrays (a dynamic
// index would copy them to local memory).
__global__ void copy_segments_kernel(CopySegments a, uint64_t n) {
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    char* dst = a.dst[0];
    const char* src = a.src[0];
    uint64_t bytes = a.bytes[0], first = 0;
#pragma unroll
    for (int q = 1; q < kMaxCopySegments; ++q)
      if (q < a.count && i >= a.first[q]) dst = a.dst[q], src = a.src[q], bytes = a.bytes[q], first = a.first[q];
    const uint64_t at = (i - first) * kCopyChunk;
    if (at + kCopyChunk <= bytes) {
      *reinterpret_cast<uint4*>(dst + at) = *reinterpret_cast<const uint4*>(src + at);
    } else {
      for (uint64_t b = at; b < bytes; ++b) dst[b] = src[b];
    }
  }
}

// Whether dst = src is a plain run of bytes the segment kernel takes (same dtype, both contiguous and 16-byte
// aligned); shapes are checked as copy checks them.
bool is_segment(const Tensor& dst, const Tensor& src) {
  ATELIER_CHECK(dst.shape() == src.shape(), "copy: shape " + shape_str(src.shape()) + " to " + shape_str(dst.shape()));
  return dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() && !dst.device().is_cpu() &&
         !src.device().is_cpu() && aligned16(dst.raw()) && aligned16(src.raw());
}

// Gathers segments and launches the kernel for every kMaxCopySegments of them, or when flushed.
class SegmentBatch {
 public:
  explicit SegmentBatch(cudaStream_t stream) : stream_(stream) {}
  ~SegmentBatch() { flush(); }  // a launch cannot throw here: launch errors surface at the stream's next check
  void add(const Tensor& dst, const Tensor& src) {
    const uint64_t bytes = dst.nbytes();
    if (bytes == 0) return;
    a_.dst[a_.count] = static_cast<char*>(dst.raw());
    a_.src[a_.count] = static_cast<const char*>(src.raw());
    a_.bytes[a_.count] = bytes;
    a_.first[a_.count] = chunks_;
    chunks_ += (bytes + kCopyChunk - 1) / kCopyChunk;
    if (++a_.count == kMaxCopySegments) flush();
  }
  void flush() {
    if (a_.count == 0) return;
    copy_segments_kernel<<<grid_for(int64_t(chunks_)), kThreads, 0, stream_>>>(a_, chunks_);
    g_copy_many_launches.fetch_add(1);
    a_ = CopySegments{};
    chunks_ = 0;
  }

 private:
  cudaStream_t stream_;
  CopySegments a_{};
  uint64_t chunks_ = 0;
};

}  // namespace

// --- small uploads in a kernel's parameters ------------------------------------------------------------------
namespace {

constexpr size_t kSmallUploadBytes = 64;  // timesteps and CFG scales of a batch of up to 16 samples
constexpr int kUploadThreads = 128;
std::atomic<int64_t> g_inline_uploads{0};

template <size_t N>
struct UploadBytes {
  unsigned char b[N];
};

template <size_t N>
__global__ void upload_inline_kernel(unsigned char* dst, UploadBytes<N> src, uint32_t n) {
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src.b[i];
}

template <size_t N>
void launch_upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  UploadBytes<N> p{};
  std::memcpy(p.b, src, bytes);
  upload_inline_kernel<N><<<1, kUploadThreads, 0, stream>>>(static_cast<unsigned char*>(dst), p, uint32_t(bytes));
}

}  // namespace

bool upload_inline(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || bytes > kInlineUploadBytes || g_driver_copies.load()) return false;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  ATELIER_CUDA_OK(cudaStreamIsCapturing(stream, &capturing));
  // A recording replays its kernels' parameters as they were; a batch (run_batched) runs once, as eager work.
  if (capturing != cudaStreamCaptureStatusNone && !batching_on(stream)) return false;
  if (bytes <= kSmallUploadBytes)
    launch_upload<kSmallUploadBytes>(dst, src, bytes, stream);
  else
    launch_upload<kInlineUploadBytes>(dst, src, bytes, stream);
  ATELIER_CUDA_LAUNCHED();
  g_inline_uploads.fetch_add(1);
  return true;
}

int64_t inline_uploads() { return g_inline_uploads.load(); }

int64_t copy_many_launches() { return g_copy_many_launches.load(); }
void set_driver_copies(bool on) { g_driver_copies.store(on); }
bool driver_copies() { return g_driver_copies.load(); }

// Plain runs of bytes, up to kMaxCopySegments per launch; a pair the kernel does not take (a cast, a strided view)
// goes through copy between two launches.
void CudaBackend::copy_many(const std::vector<std::pair<Tensor, Tensor>>& pairs) {
  if (g_driver_copies.load()) {
    Backend::copy_many(pairs);
    return;
  }
  NvtxRange range("copy_many");
  DeviceGuard guard(index_);
  SegmentBatch batch(stream_);
  for (const auto& [dst, src] : pairs) {
    if (is_segment(dst, src)) {
      batch.add(dst, src);
      continue;
    }
    batch.flush();
    Tensor d = dst;
    copy(d, src);
  }
  batch.flush();
  ATELIER_CUDA_LAUNCHED();
}

// dst[i] = cast(src[i]) over dst's shape; both strided (src may broadcast with zero strides).
void CudaBackend::copy(Tensor& dst, const Tensor& src) {
  ATELIER_CHECK(dst.shape() == src.shape(), "copy: shape " + shape_str(src.shape()) + " to " + shape_str(dst.shape()));
  const int64_t n = dst.numel();
  if (n == 0) return;
  ATELIER_CHECK(!src.device().is_cpu() && !dst.device().is_cpu(), "CUDA copy: both tensors must be on the GPU");
  NvtxRange range("copy");
  DeviceGuard guard(index_);
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (!g_driver_copies.load() && aligned16(dst.raw()) && aligned16(src.raw())) {
      SegmentBatch batch(stream_);
      batch.add(dst, src);
      batch.flush();
      ATELIER_CUDA_LAUNCHED();
      return;
    }
    // A run off a 16-byte boundary (a view at an odd row, rows of odd byte counts) stays on the copy engine, which
    // takes any alignment at full rate: the element kernels below would move it at about a fifth of that.
    ATELIER_CUDA_OK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  if (!supported_copy_dtype(src.dtype()) || !supported_copy_dtype(dst.dtype()))
    throw Error(unsupported("copy: f8e4m3 tensors are copied only whole (contiguous, no cast) by the CUDA backend"));
  const StridedLayout<2> l = collapse<2>(dst.shape(), {&dst.strides(), &src.strides()});
  if (dst.dtype() == src.dtype()) {
    if (launch_copy_vectors(dst.raw(), src.raw(), l, n, dtype_size(dst.dtype()), stream_)) {
      ATELIER_CUDA_LAUNCHED();
      return;
    }
    switch (dtype_size(dst.dtype())) {
      case 1: launch_copy_bits<uint8_t>(dst.raw(), src.raw(), l, n, stream_); break;
      case 2: launch_copy_bits<uint16_t>(dst.raw(), src.raw(), l, n, stream_); break;
      case 4: launch_copy_bits<uint32_t>(dst.raw(), src.raw(), l, n, stream_); break;
      default: launch_copy_bits<uint64_t>(dst.raw(), src.raw(), l, n, stream_); break;
    }
  } else if (!launch_copy_float(dst.raw(), dst.dtype(), src.raw(), src.dtype(), l, n, stream_)) {
    auto* d = static_cast<char*>(dst.raw());
    const auto* s = static_cast<const char*>(src.raw());
    if (fits_u32(n))
      copy_generic_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream_>>>(d, dst.dtype(), s, src.dtype(), l, uint32_t(n));
    else
      copy_generic_kernel<uint64_t><<<grid_for(n), kThreads, 0, stream_>>>(d, dst.dtype(), s, src.dtype(), l, uint64_t(n));
  }
  ATELIER_CUDA_LAUNCHED();
}

void CudaBackend::fill(Tensor& dst, float value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  NvtxRange range("fill");
  DeviceGuard guard(index_);
  const uint64_t bits = fill_bits(dst.dtype(), value);
  if (bits == 0 && dst.is_contiguous()) {
    ATELIER_CUDA_OK(cudaMemsetAsync(dst.raw(), 0, dst.nbytes(), stream_));
    return;
  }
  const StridedLayout<1> l = collapse<1>(dst.shape(), {&dst.strides()});
  switch (dtype_size(dst.dtype())) {
    case 1: launch_fill<uint8_t>(dst.raw(), uint8_t(bits), l, n, stream_); break;
    case 2: launch_fill<uint16_t>(dst.raw(), uint16_t(bits), l, n, stream_); break;
    case 4: launch_fill<uint32_t>(dst.raw(), uint32_t(bits), l, n, stream_); break;
    default: launch_fill<uint64_t>(dst.raw(), bits, l, n, stream_); break;
  }
  ATELIER_CUDA_LAUNCHED();
}

// ids [N] (i32/i64) contiguous, table [V, D] contiguous, out [N, D] in the table's dtype.
void CudaBackend::embedding(Tensor& out, const Tensor& ids, const Tensor& table) {
  const int64_t n = ids.numel(), v = table.size(0), d = table.size(1);
  if (n == 0 || d == 0) return;
  ATELIER_CHECK(out.dtype() == table.dtype() && ids.is_contiguous() && table.is_contiguous(), "embedding: layout");
  NvtxRange range("embedding");
  DeviceGuard guard(index_);
  const unsigned blocks = grid_for(n * d);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    if (ids.dtype() == DType::I64)
      embedding_kernel<T, int64_t><<<blocks, kThreads, 0, stream_>>>(out.data<T>(), ids.data<int64_t>(), table.data<T>(), n, v, d);
    else
      embedding_kernel<T, int32_t><<<blocks, kThreads, 0, stream_>>>(out.data<T>(), ids.data<int32_t>(), table.data<T>(), n, v, d);
  };
  switch (table.dtype()) {
    case DType::F32: launch(float{}); break;
    case DType::BF16: launch(__nv_bfloat16{}); break;
    case DType::F16: launch(__half{}); break;
    default: throw Error(unsupported("embedding: table dtype " + std::string(dtype_name(table.dtype())) + " on CUDA"));
  }
  ATELIER_CUDA_LAUNCHED();
}


namespace {

// out [P, H*f, W*f] = x [P, H, W] repeated f x f (P = N*C planes), x contiguous; one thread per output
// element, consecutive threads along the output row (coalesced stores; each input element is read f times
// from L1/L2).
template <typename T>
__global__ void upsample_nearest_kernel(T* out, const T* x, int64_t h, int64_t w, int f, int64_t total) {
  const int64_t wo = w * f, ho = h * f;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t xo = i % wo, t = i / wo, yo = t % ho, plane = t / ho;
    out[i] = x[(plane * h + yo / f) * w + xo / f];
  }
}

}  // namespace

void CudaBackend::upsample_nearest2d(Tensor& out, const Tensor& x_in, int factor) {
  NvtxRange range("upsample_nearest2d");
  DeviceGuard guard(index_);
  Tensor x = x_in;
  if (!x.is_contiguous() || x.dtype() != out.dtype()) {
    x = Tensor::empty(x_in.shape(), out.dtype(), device());
    copy(x, x_in);
  }
  const int64_t total = out.numel();
  const int64_t h = x.size(2), w = x.size(3);
  switch (dtype_size(out.dtype())) {
    case 2:
      upsample_nearest_kernel<uint16_t><<<grid_for(total), kThreads, 0, stream_>>>(out.data<uint16_t>(), x.data<uint16_t>(), h, w, factor, total);
      break;
    case 4:
      upsample_nearest_kernel<uint32_t><<<grid_for(total), kThreads, 0, stream_>>>(out.data<uint32_t>(), x.data<uint32_t>(), h, w, factor, total);
      break;
    default:
      Backend::upsample_nearest2d(out, x, factor);
      return;
  }
  ATELIER_CUDA_LAUNCHED();
}

}  // namespace atelier::cuda
