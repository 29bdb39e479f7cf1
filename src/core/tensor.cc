#include "core/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "backend/backend.h"

namespace atelier {

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

Expected<Device> Device::parse(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string n = s.substr(5);
    if (!n.empty() && n.size() < 4 && std::all_of(n.begin(), n.end(), ::isdigit)) return Device::cuda(std::stoi(n));
  }
  return invalid_argument("unknown device '" + s + "': supported are cpu, cuda, cuda:N");
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = int64_t(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

Tensor::Tensor(std::shared_ptr<Buffer> buf, Shape shape, DType dtype, int64_t offset)
    : buf_(std::move(buf)), shape_(std::move(shape)), strides_(contiguous_strides(shape_)), dtype_(dtype), offset_(offset) {}

Tensor::Tensor(std::shared_ptr<Buffer> buf, Shape shape, Shape strides, DType dtype, int64_t offset)
    : buf_(std::move(buf)), shape_(std::move(shape)), strides_(std::move(strides)), dtype_(dtype), offset_(offset) {}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device dev) {
  for (int64_t d : shape) ATELIER_CHECK(d >= 0, "negative dimension in " + shape_str(shape));
  const size_t bytes = size_t(numel_of(shape)) * dtype_size(dtype);
  return Tensor(backend_for(dev).allocate(bytes), shape, dtype);
}

Tensor Tensor::from_host(const Shape& shape, DType dtype, Device dev, const HostFill& fill) {
  Tensor t = empty(shape, dtype, dev);
  if (t.nbytes() > 0) backend_for(dev).upload(t, fill);
  return t;
}

Tensor Tensor::empty_channels_last(const Shape& nchw, DType dtype, Device dev) {
  ATELIER_CHECK(nchw.size() == 4, "empty_channels_last: [N, C, H, W] expected, got " + shape_str(nchw));
  const Tensor nhwc = empty({nchw[0], nchw[2], nchw[3], nchw[1]}, dtype, dev);
  return nhwc.permute({0, 3, 1, 2});
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device dev) {
  Tensor t = empty(shape, dtype, dev);
  backend_for(dev).fill(t, 0.0f);
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, Device dev) {
  Tensor t = empty(shape, DType::F32, dev);
  backend_for(dev).fill(t, value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape) {
  ATELIER_CHECK(int64_t(values.size()) == numel_of(shape),
                "from_vector: " + std::to_string(values.size()) + " values for shape " + shape_str(shape));
  Tensor t = empty(shape, DType::F32, Device::cpu());
  if (!values.empty()) std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
  return t;
}

int64_t Tensor::size(int64_t d) const {
  if (d < 0) d += dim();
  ATELIER_CHECK(d >= 0 && d < dim(), "dimension out of range for shape " + shape_str(shape_));
  return shape_[d];
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

bool Tensor::is_channels_last() const {
  if (dim() != 4 || is_contiguous()) return false;
  const int64_t c = shape_[1], h = shape_[2], w = shape_[3];
  const auto same = [&](int d, int64_t stride) { return shape_[d] == 1 || strides_[d] == stride; };
  return same(1, 1) && same(3, c) && same(2, w * c) && same(0, h * w * c);
}

Tensor Tensor::reshape(const Shape& shape) const {
  ATELIER_CHECK(is_contiguous(), "reshape of a non-contiguous tensor; call ops::contiguous first");
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      ATELIER_CHECK(infer < 0, "reshape: more than one -1");
      infer = int64_t(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known ? numel() / known : 0;
  ATELIER_CHECK(numel_of(s) == numel(), "reshape " + shape_str(shape_) + " to " + shape_str(shape));
  return Tensor(buf_, s, dtype_, offset_);
}

Tensor Tensor::permute(const std::vector<int>& order) const {
  ATELIER_CHECK(int64_t(order.size()) == dim(), "permute: order has the wrong length");
  Shape s(order.size()), st(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    s[i] = shape_[order[i]];
    st[i] = strides_[order[i]];
  }
  return Tensor(buf_, s, st, dtype_, offset_);
}

Tensor Tensor::transpose(int a, int b) const {
  if (a < 0) a += int(dim());
  if (b < 0) b += int(dim());
  std::vector<int> order(dim());
  for (int i = 0; i < dim(); ++i) order[i] = i;
  std::swap(order[a], order[b]);
  return permute(order);
}

Tensor Tensor::narrow(int d, int64_t start, int64_t length) const {
  if (d < 0) d += int(dim());
  ATELIER_CHECK(d >= 0 && d < dim() && start >= 0 && length >= 0 && start + length <= shape_[d],
                "narrow out of range on " + shape_str(shape_));
  Shape s = shape_;
  s[d] = length;
  return Tensor(buf_, s, strides_, dtype_, offset_ + start * strides_[d]);
}

Tensor Tensor::select(int d, int64_t index) const {
  if (d < 0) d += int(dim());
  Tensor t = narrow(d, index, 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::unsqueeze(int d) const {
  if (d < 0) d += int(dim()) + 1;
  Tensor t = *this;
  const int64_t st = d < dim() ? strides_[d] * shape_[d] : 1;
  t.shape_.insert(t.shape_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, st);
  return t;
}

Tensor Tensor::squeeze(int d) const {
  if (d < 0) d += int(dim());
  ATELIER_CHECK(shape_[d] == 1, "squeeze of a dimension that is not 1");
  Tensor t = *this;
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

std::vector<float> Tensor::to_vector() const {
  Tensor host = to(Device::cpu());
  Tensor packed = Tensor::empty(shape_, DType::F32, Device::cpu());
  backend_for(Device::cpu()).copy(packed, host);
  const float* p = packed.data<float>();
  return std::vector<float>(p, p + packed.numel());
}

Tensor Tensor::to(Device dev) const {
  if (device() == dev) return *this;
  Backend& from = backend_for(device());
  Backend& mover = dev.is_cpu() ? from : backend_for(dev);  // the accelerator's backend moves the bytes
  Tensor packed = *this;
  if (!is_contiguous()) {  // pack on the source device first: device copies move whole buffers
    packed = Tensor::empty(shape_, dtype_, device());
    from.copy(packed, *this);
  }
  Tensor out = Tensor::empty(shape_, dtype_, dev);
  mover.copy_between_devices(out, packed);
  return out;
}

}  // namespace atelier
