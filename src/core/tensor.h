// Tensor: a typed, strided view of a buffer that lives on one device. Cheap to copy (the buffer is shared).
// Shapes are row-major; image activations are NCHW, sequences [batch, tokens, channels], attention heads
// [batch, heads, tokens, head_dim]. Views (reshape of contiguous, permute, slice, narrow) share the buffer;
// ops::contiguous makes a packed copy where an op needs one.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace atelier {

struct Device {
  enum class Kind : uint8_t { kCPU, kCUDA };
  Kind kind = Kind::kCPU;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {Kind::kCUDA, i}; }
  bool is_cpu() const { return kind == Kind::kCPU; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  std::string str() const;
  // Parses "cpu", "cuda", "cuda:N".
  static Expected<Device> parse(const std::string& s);
};

// Owns device memory; the deleter returns it to whichever allocator gave it out.
class Buffer {
 public:
  Buffer(void* data, size_t bytes, Device dev, std::function<void(void*)> deleter)
      : data_(data), bytes_(bytes), device_(dev), deleter_(std::move(deleter)) {}
  ~Buffer() { if (deleter_) deleter_(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  std::function<void(void*)> deleter_;
};

using Shape = std::vector<int64_t>;

// Writes bytes [offset, offset + bytes) of a new tensor's contents to `dst` (host memory): how Tensor::from_host
// gets a tensor's bytes (a checkpoint's values, converted as they are written). A device may ask for the contents in
// pieces, in order; each piece starts and ends on an element boundary.
using HostFill = std::function<void(void* dst, size_t offset, size_t bytes)>;

int64_t numel_of(const Shape& s);
std::string shape_str(const Shape& s);
Shape contiguous_strides(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buf, Shape shape, DType dtype, int64_t offset = 0);
  Tensor(std::shared_ptr<Buffer> buf, Shape shape, Shape strides, DType dtype, int64_t offset);

  // New uninitialised tensor from the device's allocator (the backend's arena).
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device dev = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device dev = Device::cpu());
  // Host f32 tensor holding a copy of `values` (size must equal numel).
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);
  static Tensor full(const Shape& shape, float value, Device dev = Device::cpu());
  // New contiguous tensor on `dev` whose bytes `fill` writes (see HostFill): on the CPU straight into the tensor, on
  // a GPU into pinned staging buffers, each sent while the next is filled. No host copy of the whole tensor is made.
  static Tensor from_host(const Shape& shape, DType dtype, Device dev, const HostFill& fill);
  // New uninitialised [N, C, H, W] tensor stored channels-last: element (n, c, h, w) at
  // ((n * H + h) * W + w) * C + c, the layout the GPU's convolutions read and write without transposes.
  static Tensor empty_channels_last(const Shape& nchw, DType dtype, Device dev);

  bool defined() const { return buf_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_of(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return buf_ ? buf_->device() : Device::cpu(); }
  int64_t offset() const { return offset_; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  // A 4-D [N, C, H, W] tensor packed channels-last (see empty_channels_last), and not also contiguous
  // (a tensor with C == 1 or H == W == 1 is both; it counts as contiguous).
  bool is_channels_last() const;
  const std::shared_ptr<Buffer>& buffer() const { return buf_; }

  void* raw() const { return static_cast<char*>(buf_->data()) + offset_ * int64_t(dtype_size(dtype_)); }
  template <typename T> T* data() const { return static_cast<T*>(raw()); }

  // Views: share the buffer.
  Tensor reshape(const Shape& shape) const;  // contiguous only; one dim may be -1
  Tensor view(const Shape& shape) const { return reshape(shape); }
  Tensor permute(const std::vector<int>& order) const;
  Tensor transpose(int a, int b) const;
  Tensor narrow(int d, int64_t start, int64_t length) const;  // slice along d
  Tensor select(int d, int64_t index) const;                  // drops dim d
  Tensor unsqueeze(int d) const;
  Tensor squeeze(int d) const;

  // Host copies (any device, any float dtype): values as f32 in logical (row-major) order.
  std::vector<float> to_vector() const;
  Tensor to(Device dev) const;  // copy to another device (same dtype); returns *this if already there

 private:
  std::shared_ptr<Buffer> buf_;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::F32;
  int64_t offset_ = 0;
};

}  // namespace atelier
