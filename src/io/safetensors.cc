// safetensors reader and writer. Layout: u64 little-endian header length N, N bytes of JSON header, then the
// data section. Header entries: name -> {"dtype": "F16", "shape": [..], "data_offsets": [begin, end]} with
// offsets relative to the data section, plus an optional "__metadata__" object of strings.
// Everything read from the file is untrusted: each field is checked before any byte of the data section is
// touched, so that a malformed file gives a Status and never an out-of-range read.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <stdexcept>

#include "io/float_convert.h"
#include "io/json_util.h"

namespace atelier {
namespace {

using json = nlohmann::json;

constexpr size_t kLengthPrefixBytes = 8;
// Real headers are a few MB at most (tens of thousands of tensors); a larger length is corruption, and
// capping it keeps a hostile file from making us parse gigabytes of JSON.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;
constexpr int kMaxHeaderDepth = 4;  // a tensor entry is 3 levels deep: {name: {"shape": [...]}}
constexpr size_t kHeaderAlignment = 8;       // writer pads the header so the data section is 8-byte aligned
constexpr int64_t kParallelMinElements = 1 << 16;  // below this, conversion threads cost more than they save
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {
    {"F64", DType::F64}, {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16},
    {"I64", DType::I64}, {"I32", DType::I32}, {"I16", DType::I16}, {"I8", DType::I8},
    {"U8", DType::U8},   {"BOOL", DType::BOOL}, {"F8_E4M3", DType::F8E4M3},
};

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  return "?";
}

std::string supported_dtype_list() {
  std::string s;
  for (const auto& d : kDTypeNames) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

bool is_float_dtype(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64 || t == DType::F8E4M3;
}

// Reads element i of a source buffer (possibly unaligned inside the mapping) as double; exact for every
// supported source type except i64 magnitudes above 2^53, which no weight file holds.
double read_as_double(const char* src, DType t, int64_t i) {
  switch (t) {
    case DType::F32: { float v; std::memcpy(&v, src + i * 4, 4); return v; }
    case DType::F64: { double v; std::memcpy(&v, src + i * 8, 8); return v; }
    case DType::F16: { uint16_t v; std::memcpy(&v, src + i * 2, 2); return f16_to_float(v); }
    case DType::BF16: { uint16_t v; std::memcpy(&v, src + i * 2, 2); return bf16_to_float(v); }
    case DType::I64: { int64_t v; std::memcpy(&v, src + i * 8, 8); return double(v); }
    case DType::I32: { int32_t v; std::memcpy(&v, src + i * 4, 4); return v; }
    case DType::I16: { int16_t v; std::memcpy(&v, src + i * 2, 2); return v; }
    case DType::I8: return double(static_cast<int8_t>(src[i]));
    case DType::U8: return double(static_cast<uint8_t>(src[i]));
    case DType::BOOL: return src[i] != 0 ? 1.0 : 0.0;
    case DType::F8E4M3: return f8e4m3_to_float(static_cast<uint8_t>(src[i]));
  }
  return 0.0;
}

// Converts n elements from `src` (type `from`) to `dst` (type `to`, a float type). Going through double is
// exact for every pair (f32/f16/bf16 values are all representable), and the final narrowing rounds once.
void convert_elements(const char* src, DType from, char* dst, DType to, int64_t n) {
#pragma omp parallel for if (n >= kParallelMinElements) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const double v = read_as_double(src, from, i);
    switch (to) {
      case DType::F32: { const float f = float(v); std::memcpy(dst + i * 4, &f, 4); break; }
      case DType::F64: std::memcpy(dst + i * 8, &v, 8); break;
      case DType::F16: { const uint16_t h = float_to_f16(float(v)); std::memcpy(dst + i * 2, &h, 2); break; }
      case DType::BF16: { const uint16_t h = float_to_bf16(float(v)); std::memcpy(dst + i * 2, &h, 2); break; }
      default: break;  // callers only pass float targets
    }
  }
}

// A JSON value that is a non-negative integer fitting in uint64 (floats such as 2.0 are rejected: the
// format stores integers, and accepting 2.5 would silently truncate).
bool as_nonnegative_integer(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) { *out = v.get<uint64_t>(); return true; }
  if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = uint64_t(s);
    return true;
  }
  return false;
}

// Parses the header, rejecting duplicate keys at any depth: nlohmann keeps the last of two equal keys
// silently, and two tensors with one name is an ambiguity we refuse to resolve by guessing.
Expected<json> parse_header_json(const char* text, size_t len, const std::string& label) {
  std::vector<std::set<std::string>> key_stack;
  std::string duplicate;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    // {name: {"shape": [...], ...}} is three levels deep; a hostile header nested far deeper would overflow the stack
    // in nlohmann's recursive copy and dump.
    if (depth > kMaxHeaderDepth) throw std::length_error("header nests deeper than " + std::to_string(kMaxHeaderDepth) + " levels");
    if (event == json::parse_event_t::object_start) {
      key_stack.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!key_stack.empty()) key_stack.pop_back();
    } else if (event == json::parse_event_t::key && !key_stack.empty() && parsed.is_string()) {
      if (!key_stack.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + len, callback);
  } catch (const json::exception& e) {
    return corrupt(label + ": header is not valid JSON: " + e.what());
  } catch (const std::length_error& e) {
    return corrupt(label + ": " + e.what());
  }
  if (!duplicate.empty()) return corrupt(label + ": header has the key '" + duplicate + "' more than once");
  if (!header.is_object()) return corrupt(label + ": header must be a JSON object, got " + header.type_name());
  return header;
}

// Validates one tensor entry of the header and fills `info`. `data_bytes` is the data section's size.
Status parse_entry(const std::string& label, const std::string& name, const json& entry, size_t data_bytes,
                   TensorInfo* info) {
  const std::string where = label + ": tensor '" + name + "': ";
  if (!entry.is_object()) return corrupt(where + "entry must be an object, got " + entry.type_name());
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(field)) return corrupt(where + "missing field '" + field + "'");

  const json& dt = entry["dtype"];
  if (!dt.is_string()) return corrupt(where + "dtype must be a string");
  const std::string dts = dt.get<std::string>();
  auto it = std::find_if(std::begin(kDTypeNames), std::end(kDTypeNames),
                         [&](const DTypeName& d) { return dts == d.name; });
  if (it == std::end(kDTypeNames))
    return unsupported(where + "unknown dtype '" + dts + "' (supported: " + supported_dtype_list() + ")");
  info->name = name;
  info->dtype = it->dtype;

  const json& shape = entry["shape"];
  if (!shape.is_array()) return corrupt(where + "shape must be an array");
  info->shape.clear();
  // The product of the dimensions, with zeros counted as 1, must fit in int64: that bounds both numel and
  // the strides Tensor computes (an empty tensor of shape [0, 2^62, 2^62] is still rejected).
  uint64_t span = 1;
  bool overflow = false;
  bool has_zero_dim = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    uint64_t d = 0;
    if (!as_nonnegative_integer(shape[i], &d))
      return corrupt(where + "shape entry " + std::to_string(i) + " (" + json_excerpt(shape[i]) +
                     ") is not a non-negative integer");
    if (d > uint64_t(std::numeric_limits<int64_t>::max()))
      return corrupt(where + "shape entry " + std::to_string(i) + " (" + std::to_string(d) + ") is too large");
    info->shape.push_back(int64_t(d));
    if (d == 0) has_zero_dim = true;
    const uint64_t f = std::max<uint64_t>(d, 1);
    if (span > uint64_t(std::numeric_limits<int64_t>::max()) / f) overflow = true;
    else span *= f;
  }
  const uint64_t elem = dtype_size(info->dtype);
  if (overflow || span > uint64_t(std::numeric_limits<int64_t>::max()) / elem)
    return corrupt(where + "shape " + json_excerpt(shape) + " overflows the addressable size");
  const uint64_t numel = has_zero_dim ? 0 : span;

  const json& off = entry["data_offsets"];
  uint64_t begin = 0, end = 0;
  if (!off.is_array() || off.size() != 2 || !as_nonnegative_integer(off[0], &begin) ||
      !as_nonnegative_integer(off[1], &end))
    return corrupt(where + "data_offsets must be [begin, end] non-negative integers, got " + json_excerpt(off));
  if (end < begin)
    return corrupt(where + "data_offsets end " + std::to_string(end) + " is before begin " + std::to_string(begin));
  if (end > data_bytes)
    return corrupt(where + "data_offsets end " + std::to_string(end) + " is past the data section (" +
                   std::to_string(data_bytes) + " bytes; file truncated?)");
  if (end - begin != numel * elem)
    return corrupt(where + "holds " + std::to_string(end - begin) + " bytes but shape " + shape.dump() + " of " +
                   dts + " needs " + std::to_string(numel * elem));
  info->begin = size_t(begin);
  info->end = size_t(end);
  return Status::ok();
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

SafeTensorsFile::~SafeTensorsFile() {
  if (mapped_ && base_ != nullptr) munmap(const_cast<char*>(base_), size_);
}

Expected<std::shared_ptr<SafeTensorsFile>> SafeTensorsFile::open(const std::string& path) {
  std::shared_ptr<SafeTensorsFile> f(new SafeTensorsFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string why = std::strerror(err);
    return err == ENOENT ? not_found(path + ": no such safetensors file") : invalid_argument(path + ": cannot open: " + why);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  f->size_ = size_t(st.st_size);
  if (f->size_ < kLengthPrefixBytes) {
    ::close(fd);
    return corrupt(path + ": file is " + std::to_string(f->size_) + " bytes, too short for a safetensors header");
  }
  void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file open
  if (p == MAP_FAILED) return Status(ErrorCode::kResourceExhausted, path + ": mmap failed: " + errno_text());
  f->base_ = static_cast<const char*>(p);
  f->mapped_ = true;
  ATELIER_RETURN_IF_ERROR(f->parse());
  return f;
}

Expected<std::shared_ptr<SafeTensorsFile>> SafeTensorsFile::from_bytes(std::string bytes, const std::string& label) {
  std::shared_ptr<SafeTensorsFile> f(new SafeTensorsFile());
  f->path_ = label;
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  ATELIER_RETURN_IF_ERROR(f->parse());
  return f;
}

Status SafeTensorsFile::parse() {
  return catch_status([&]() -> Status {
    if (size_ < kLengthPrefixBytes)
      return corrupt(path_ + ": file is " + std::to_string(size_) + " bytes, too short for a safetensors header");
    uint64_t header_len = 0;
    for (size_t i = 0; i < kLengthPrefixBytes; ++i) header_len |= uint64_t(uint8_t(base_[i])) << (8 * i);
    if (header_len > kMaxHeaderBytes)
      return corrupt(path_ + ": header length " + std::to_string(header_len) + " exceeds the " +
                     std::to_string(kMaxHeaderBytes) + "-byte limit (not a safetensors file?)");
    if (header_len > size_ - kLengthPrefixBytes)
      return corrupt(path_ + ": header length " + std::to_string(header_len) + " is past the end of the " +
                     std::to_string(size_) + "-byte file (truncated?)");
    data_start_ = kLengthPrefixBytes + size_t(header_len);
    const size_t data_bytes = size_ - data_start_;

    ATELIER_ASSIGN_OR_RETURN(json header, parse_header_json(base_ + kLengthPrefixBytes, size_t(header_len), path_));
    metadata_ = json::object();
    tensors_.clear();
    for (auto& [name, entry] : header.items()) {
      if (name == kMetadataKey) {
        if (!entry.is_object()) return corrupt(path_ + ": __metadata__ must be an object");
        metadata_ = entry;
        continue;
      }
      TensorInfo info;
      ATELIER_RETURN_IF_ERROR(parse_entry(path_, name, entry, data_bytes, &info));
      tensors_.push_back(std::move(info));
    }
    // File order (by offset) makes sequential loading read the mapping front to back.
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    // Two tensors sharing bytes would alias each other's weights: a corrupt or hand-crafted file.
    const TensorInfo* prev = nullptr;
    for (const TensorInfo& t : tensors_) {
      if (t.begin == t.end) continue;
      if (prev != nullptr && t.begin < prev->end)
        return corrupt(path_ + ": tensors '" + prev->name + "' and '" + t.name + "' overlap in the data section");
      prev = &t;
    }
    sorted_index_.resize(tensors_.size());
    for (size_t i = 0; i < tensors_.size(); ++i) sorted_index_[i] = i;
    std::sort(sorted_index_.begin(), sorted_index_.end(),
              [&](size_t a, size_t b) { return tensors_[a].name < tensors_[b].name; });
    return Status::ok();
  });
}

const TensorInfo* SafeTensorsFile::find(const std::string& name) const {
  auto it = std::lower_bound(sorted_index_.begin(), sorted_index_.end(), name,
                             [&](size_t i, const std::string& n) { return tensors_[i].name < n; });
  if (it == sorted_index_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

const void* SafeTensorsFile::raw(const TensorInfo& t) const { return base_ + data_start_ + t.begin; }

Expected<Tensor> SafeTensorsFile::load(const std::string& name, DType dtype) const {
  const TensorInfo* info = find(name);
  if (info == nullptr) return not_found(path_ + ": no tensor named '" + name + "'");
  return load(*info, dtype);
}

Status SafeTensorsFile::check_load(const TensorInfo& info, DType dtype) const {
  // `info` may come from a caller; only trust it when it is one of ours.
  const TensorInfo* own = find(info.name);
  if (own == nullptr || own->begin != info.begin || own->end != info.end || own->dtype != info.dtype ||
      own->shape != info.shape)
    return invalid_argument(path_ + ": tensor info for '" + info.name + "' does not belong to this file");
  const std::string where = path_ + ": tensor '" + info.name + "': ";
  if (dtype != info.dtype && !is_float_dtype(dtype))
    return unsupported(where + "cannot load " + safetensors_dtype_name(info.dtype) + " as " +
                       std::string(dtype_name(dtype)) + " (integer targets need the same dtype; any dtype loads as f32/f16/bf16/f64)");
  if (dtype == DType::F8E4M3 && info.dtype != DType::F8E4M3)
    return unsupported(where + "converting to f8e4m3 is not supported");
  return Status::ok();
}

Expected<Tensor> SafeTensorsFile::load(const TensorInfo& info, DType dtype, Device device) const {
  if (Status st = check_load(info, dtype); !st.is_ok()) return st;
  Expected<Tensor> out = Status(ErrorCode::kInternal, "unset");
  Status st = catch_status([&]() -> Status {
    out = Tensor::from_host(info.shape, dtype, device, [&](void* dst, size_t offset, size_t bytes) {
      if (Status piece = convert_range(info, dtype, offset, bytes, dst); !piece.is_ok()) throw Error(piece);
    });
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Status SafeTensorsFile::read_range(const TensorInfo& info, DType dtype, size_t offset, size_t bytes, void* dst) const {
  if (Status st = check_load(info, dtype); !st.is_ok()) return st;
  return convert_range(info, dtype, offset, bytes, dst);
}

// check_load(info, dtype) has passed. The range must be whole elements inside the tensor (a device's staging pieces
// are): else an error, and nothing written.
Status SafeTensorsFile::convert_range(const TensorInfo& info, DType dtype, size_t offset, size_t bytes, void* dst) const {
  const size_t out_size = dtype_size(dtype), total = size_t(numel_of(info.shape)) * out_size;
  if (offset % out_size != 0 || bytes % out_size != 0 || offset > total || bytes > total - offset)
    return invalid_argument(path_ + ": tensor '" + info.name + "': bytes [" + std::to_string(offset) + ", +" +
                            std::to_string(bytes) + ") are not whole " + std::string(dtype_name(dtype)) +
                            " elements inside its " + std::to_string(total));
  const int64_t first = int64_t(offset / out_size), n = int64_t(bytes / out_size);
  const char* src = static_cast<const char*>(raw(info)) + size_t(first) * dtype_size(info.dtype);
  if (dtype == info.dtype) {
    copy_bytes(src, dst, bytes);
  } else if (info.dtype == DType::F16 && dtype == DType::F32) {  // the common cases: io/float_convert.h
    convert_f16_to_f32(src, static_cast<float*>(dst), n);
  } else if (info.dtype == DType::BF16 && dtype == DType::F32) {
    convert_bf16_to_f32(src, static_cast<float*>(dst), n);
  } else if (info.dtype == DType::F16 && dtype == DType::BF16) {
    convert_f16_to_bf16(src, static_cast<uint16_t*>(dst), n);
  } else if (info.dtype == DType::F32 && dtype == DType::BF16) {
    convert_f32_to_bf16(src, static_cast<uint16_t*>(dst), n);
  } else {
    convert_elements(src, info.dtype, static_cast<char*>(dst), dtype, n);
  }
  return Status::ok();
}

namespace {

// A packed host copy of `t` with its own dtype (the writer stores bytes as they are).
Tensor packed_host(const Tensor& t) {
  if (!t.device().is_cpu() && !t.is_contiguous())
    throw Error(invalid_argument("write_safetensors: non-contiguous " + t.device().str() +
                                 " tensor; call ops::contiguous first"));
  const Tensor host = t.to(Device::cpu());
  if (host.is_contiguous()) return host;
  Tensor packed = Tensor::empty(host.shape(), host.dtype(), Device::cpu());
  // Strided gather, element by element, in row-major order (the writer is not on a hot path).
  const size_t es = dtype_size(host.dtype());
  const int64_t n = host.numel();
  const int64_t rank = host.dim();
  std::vector<int64_t> idx(size_t(rank), 0);
  const char* base = static_cast<const char*>(host.buffer()->data());
  char* dst = static_cast<char*>(packed.raw());
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = host.offset();
    for (int64_t d = 0; d < rank; ++d) off += idx[d] * host.strides()[d];
    std::memcpy(dst + i * es, base + off * int64_t(es), es);
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++idx[d] < host.shape()[d]) break;
      idx[d] = 0;
    }
  }
  return packed;
}

}  // namespace

Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const nlohmann::json& metadata) {
  return catch_status([&]() -> Status {
    if (!metadata.is_object()) return invalid_argument(path + ": safetensors metadata must be a JSON object");
    for (auto& [k, v] : metadata.items())
      if (!v.is_string()) return invalid_argument(path + ": metadata value '" + k + "' must be a string (format rule)");
    json header = json::object();
    if (!metadata.empty()) header[kMetadataKey] = metadata;
    std::vector<Tensor> packed;
    size_t offset = 0;
    for (const auto& [name, t] : tensors) {
      if (name == kMetadataKey) return invalid_argument(path + ": '__metadata__' is reserved and cannot name a tensor");
      if (header.contains(name)) return invalid_argument(path + ": tensor name '" + name + "' given twice");
      if (!t.defined()) return invalid_argument(path + ": tensor '" + name + "' is undefined");
      packed.push_back(packed_host(t));
      const size_t bytes = packed.back().nbytes();
      header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                      {"shape", t.shape()},
                      {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    std::string text = header.dump();
    // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned, as the reference
    // writer does; readers that map the file can then use typed loads.
    while ((kLengthPrefixBytes + text.size()) % kHeaderAlignment != 0) text.push_back(' ');

    const std::string tmp = path + ".tmp";
    std::FILE* fp = std::fopen(tmp.c_str(), "wb");
    if (fp == nullptr) return invalid_argument(path + ": cannot create: " + errno_text());
    unsigned char len_bytes[kLengthPrefixBytes];
    for (size_t i = 0; i < kLengthPrefixBytes; ++i) len_bytes[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
    bool ok = std::fwrite(len_bytes, 1, sizeof len_bytes, fp) == sizeof len_bytes &&
              std::fwrite(text.data(), 1, text.size(), fp) == text.size();
    for (const Tensor& t : packed)
      if (ok && t.nbytes() > 0) ok = std::fwrite(t.raw(), 1, t.nbytes(), fp) == t.nbytes();
    ok = (std::fclose(fp) == 0) && ok;
    if (!ok) {
      std::remove(tmp.c_str());
      return Status(ErrorCode::kResourceExhausted, path + ": write failed (disk full?)");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);  // atomic: readers never see a half-written file
    if (ec) {
      std::remove(tmp.c_str());
      return invalid_argument(path + ": cannot rename the finished file into place: " + ec.message());
    }
    return Status::ok();
  });
}

}  // namespace atelier
