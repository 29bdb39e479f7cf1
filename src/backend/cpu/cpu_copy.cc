// Data movement on the CPU: strided copies with dtype conversion, fill, embedding gathers.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace atelier {

CpuBackend& cpu_backend() {
  // Never destroyed: tensors may outlive static destruction order. BLAS is set up here, on one thread,
  // before any product can run.
  static CpuBackend* b = [] {
    cpu::init_blas();
    return new CpuBackend();
  }();
  return *b;
}

namespace {

float load_as_float(const char* p, DType t) {
  switch (t) {
    case DType::F32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::F16: { uint16_t v; std::memcpy(&v, p, 2); return f16_to_float(v); }
    case DType::BF16: { uint16_t v; std::memcpy(&v, p, 2); return bf16_to_float(v); }
    case DType::F64: { double v; std::memcpy(&v, p, 8); return float(v); }
    case DType::I32: { int32_t v; std::memcpy(&v, p, 4); return float(v); }
    case DType::I64: { int64_t v; std::memcpy(&v, p, 8); return float(v); }
    case DType::I16: { int16_t v; std::memcpy(&v, p, 2); return float(v); }
    case DType::I8: return float(*reinterpret_cast<const int8_t*>(p));
    case DType::U8: case DType::BOOL: return float(*reinterpret_cast<const uint8_t*>(p));
    default: throw Error("copy: unsupported source dtype " + std::string(dtype_name(t)));
  }
}

void store_float(char* p, DType t, float v) {
  switch (t) {
    case DType::F32: std::memcpy(p, &v, 4); return;
    case DType::F16: { uint16_t h = float_to_f16(v); std::memcpy(p, &h, 2); return; }
    case DType::BF16: { uint16_t h = float_to_bf16(v); std::memcpy(p, &h, 2); return; }
    case DType::F64: { double d = v; std::memcpy(p, &d, 8); return; }
    case DType::I32: { int32_t i = int32_t(v); std::memcpy(p, &i, 4); return; }
    case DType::I64: { int64_t i = int64_t(v); std::memcpy(p, &i, 8); return; }
    case DType::U8: case DType::BOOL: *reinterpret_cast<uint8_t*>(p) = uint8_t(v); return;
    default: throw Error("copy: unsupported destination dtype " + std::string(dtype_name(t)));
  }
}

// Splits a flat logical index over `shape` into the element offset given `strides`.
inline int64_t offset_of(int64_t flat, const Shape& shape, const Shape& strides) {
  int64_t off = 0;
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    const int64_t i = flat % shape[d];
    flat /= shape[d];
    off += i * strides[d];
  }
  return off;
}

}  // namespace

void CpuBackend::copy_between_devices(Tensor& dst, const Tensor& src) {
  ATELIER_CHECK(dst.nbytes() == src.nbytes(), "copy_between_devices: size mismatch");
  std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

namespace {

// Shape and strides of a copy with size-1 dims dropped and adjacent dims merged wherever both operands
// allow it, padded to at least 2 dims: the last two form the 2-D kernel, the rest are outer iterations.
struct CopyPlan {
  Shape shape, ds, ss;
};

CopyPlan plan_copy(const Tensor& dst, const Tensor& src) {
  CopyPlan p;
  for (int64_t d = 0; d < dst.dim(); ++d) {
    const int64_t n = dst.shape()[d];
    if (n == 1) continue;
    const int64_t a = dst.strides()[d], b = src.strides()[d];
    if (!p.shape.empty() && p.ds.back() == a * n && p.ss.back() == b * n) {
      p.shape.back() *= n;
      p.ds.back() = a;
      p.ss.back() = b;
    } else {
      p.shape.push_back(n);
      p.ds.push_back(a);
      p.ss.push_back(b);
    }
  }
  while (p.shape.size() < 2) {
    p.shape.insert(p.shape.begin(), 1);
    p.ds.insert(p.ds.begin(), 0);
    p.ss.insert(p.ss.begin(), 0);
  }
  return p;
}

// Side of the square tiles a transposing copy walks, so both sides stay in cache.
constexpr int64_t kTransposeTile = 32;
constexpr int64_t kParallelCopyElems = 1 << 15;

// d[r * drs + c * dcs] = s[r * srs + c * scs] over [rows, cols], f32.
void copy2d_f32(float* d, int64_t drs, int64_t dcs, const float* s, int64_t srs, int64_t scs, int64_t rows, int64_t cols) {
  if (dcs == 1 && scs == 1) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * drs, s + r * srs, size_t(cols) * sizeof(float));
  } else if (dcs == 1 && scs == 0) {
    for (int64_t r = 0; r < rows; ++r) std::fill(d + r * drs, d + r * drs + cols, s[r * srs]);
  } else if (dcs == 1 && srs == 1) {  // transpose: read columns of the source in tiles
    for (int64_t r0 = 0; r0 < rows; r0 += kTransposeTile)
      for (int64_t c0 = 0; c0 < cols; c0 += kTransposeTile) {
        const int64_t r1 = std::min(rows, r0 + kTransposeTile), c1 = std::min(cols, c0 + kTransposeTile);
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t c = c0; c < c1; ++c) d[r * drs + c] = s[r + c * scs];
      }
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) d[r * drs + c * dcs] = s[r * srs + c * scs];
  }
}

}  // namespace

// dst[i] = cast(src[i]) over dst's shape; any strides (zero strides broadcast the source).
void CpuBackend::copy(Tensor& dst, const Tensor& src) {
  ATELIER_CHECK(dst.shape() == src.shape(), "copy: shape " + shape_str(src.shape()) + " to " + shape_str(dst.shape()));
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.raw(), src.raw(), dst.nbytes());
    return;
  }
  const CopyPlan p = plan_copy(dst, src);
  const int64_t r = int64_t(p.shape.size());
  const int64_t rows = p.shape[r - 2], cols = p.shape[r - 1];
  const Shape outer_shape(p.shape.begin(), p.shape.end() - 2);
  const Shape outer_ds(p.ds.begin(), p.ds.end() - 2), outer_ss(p.ss.begin(), p.ss.end() - 2);
  const int64_t outer = numel_of(outer_shape);
  // Work items: outer slices, each cut into row blocks so that a single large slice still spreads.
  const int64_t row_block = std::max<int64_t>(1, std::min(rows, kParallelCopyElems / std::max<int64_t>(cols, 1)));
  const int64_t blocks = (rows + row_block - 1) / row_block;
  const size_t dsz = dtype_size(dst.dtype()), ssz = dtype_size(src.dtype());
  char* dbase = static_cast<char*>(dst.raw());
  const char* sbase = static_cast<const char*>(src.raw());
  const bool f32_both = dst.dtype() == DType::F32 && src.dtype() == DType::F32;
  const DType dt = dst.dtype(), st = src.dtype();
#pragma omp parallel for schedule(static) if (n > kParallelCopyElems && outer * blocks > 1)
  for (int64_t it = 0; it < outer * blocks; ++it) {
    const int64_t o = it / blocks, r0 = (it % blocks) * row_block, nr = std::min(row_block, rows - r0);
    const int64_t doff = offset_of(o, outer_shape, outer_ds) + r0 * p.ds[r - 2];
    const int64_t soff = offset_of(o, outer_shape, outer_ss) + r0 * p.ss[r - 2];
    if (f32_both) {
      copy2d_f32(reinterpret_cast<float*>(dbase) + doff, p.ds[r - 2], p.ds[r - 1], reinterpret_cast<const float*>(sbase) + soff,
                 p.ss[r - 2], p.ss[r - 1], nr, cols);
    } else {
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t de = doff + i * p.ds[r - 2] + j * p.ds[r - 1], se = soff + i * p.ss[r - 2] + j * p.ss[r - 1];
          store_float(dbase + de * dsz, dt, load_as_float(sbase + se * ssz, st));
        }
    }
  }
}

void CpuBackend::fill(Tensor& dst, float value) {
  const int64_t n = dst.numel();
  if (dst.dtype() == DType::F32 && dst.is_contiguous()) {
    float* d = dst.data<float>();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) d[i] = value;
    return;
  }
  const size_t sz = dtype_size(dst.dtype());
  char* base = static_cast<char*>(dst.raw());
  for (int64_t i = 0; i < n; ++i) store_float(base + offset_of(i, dst.shape(), dst.strides()) * sz, dst.dtype(), value);
}

void CpuBackend::embedding(Tensor& out, const Tensor& ids, const Tensor& table) {
  const int64_t n = ids.numel(), v = table.size(0), d = table.size(1);
  const float* t = table.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids.dtype() == DType::I64 ? ids.data<int64_t>()[i] : ids.data<int32_t>()[i];
    ATELIER_CHECK(id >= 0 && id < v, "embedding: id " + std::to_string(id) + " outside the table of " + std::to_string(v));
    std::memcpy(o + i * d, t + id * d, size_t(d) * sizeof(float));
  }
}

}  // namespace atelier
