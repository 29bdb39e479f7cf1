// Data movement on the CPU: strided copies with dtype conversion, fill, embedding gathers.
#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace atelier {

CpuBackend& cpu_backend() {
  static CpuBackend* b = new CpuBackend();  // never destroyed: tensors may outlive static destruction order
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

void CpuBackend::copy(Tensor& dst, const Tensor& src) {
  ATELIER_CHECK(dst.shape() == src.shape(), "copy: shape " + shape_str(src.shape()) + " to " + shape_str(dst.shape()));
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.raw(), src.raw(), dst.nbytes());
    return;
  }
  const Shape& shape = dst.shape();
  const int64_t inner = shape.empty() ? 1 : shape.back();
  const int64_t outer = n / inner;
  const int64_t ds = shape.empty() ? 1 : dst.strides().back();
  const int64_t ss = shape.empty() ? 1 : src.strides().back();
  const size_t dsz = dtype_size(dst.dtype()), ssz = dtype_size(src.dtype());
  char* dbase = static_cast<char*>(dst.raw());
  const char* sbase = static_cast<const char*>(src.raw());
  const bool f32_both = dst.dtype() == DType::F32 && src.dtype() == DType::F32;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t doff = offset_of(o * inner, shape, dst.strides());
    const int64_t soff = offset_of(o * inner, shape, src.strides());
    if (f32_both) {
      float* d = reinterpret_cast<float*>(dbase) + doff;
      const float* s = reinterpret_cast<const float*>(sbase) + soff;
      for (int64_t i = 0; i < inner; ++i) d[i * ds] = s[i * ss];
    } else {
      for (int64_t i = 0; i < inner; ++i)
        store_float(dbase + (doff + i * ds) * dsz, dst.dtype(), load_as_float(sbase + (soff + i * ss) * ssz, src.dtype()));
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
