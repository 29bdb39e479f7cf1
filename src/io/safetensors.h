// safetensors reader: the file is memory-mapped, the JSON header parsed and validated against the file
// size, and tensors are read lazily, one at a time, converted to the dtype asked for (f16/bf16/f32/...).
// Every malformed input (truncated file, bad header, overlapping or out-of-range offsets, unknown dtype,
// shape/size mismatch) gives a Status naming the file and the problem, never a crash.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace atelier {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  size_t begin = 0;  // byte offset into the data section
  size_t end = 0;
};

class SafeTensorsFile {
 public:
  // Maps and validates `path`.
  static Expected<std::shared_ptr<SafeTensorsFile>> open(const std::string& path);
  // Parses an in-memory image of a file (used by the fuzz tests); the bytes are copied.
  static Expected<std::shared_ptr<SafeTensorsFile>> from_bytes(std::string bytes, const std::string& label = "<memory>");
  ~SafeTensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // The header's "__metadata__" object (empty object when absent).
  const nlohmann::json& metadata() const { return metadata_; }
  // Raw bytes of one tensor inside the mapping.
  const void* raw(const TensorInfo& t) const;
  // Copies one tensor to a new Tensor of `dtype` on `device` (float dtypes convert; integer dtypes load as-is or to
  // f32). The values are converted as they are written to the device (Tensor::from_host): a GPU load passes through
  // no host copy of the tensor.
  Expected<Tensor> load(const std::string& name, DType dtype = DType::F32) const;
  Expected<Tensor> load(const TensorInfo& info, DType dtype = DType::F32, Device device = Device::cpu()) const;
  // Bytes [offset, offset + bytes) of what load(info, dtype) holds, written to host memory at dst: whole elements of
  // `dtype` inside the tensor, else an error.
  Status read_range(const TensorInfo& info, DType dtype, size_t offset, size_t bytes, void* dst) const;

 private:
  SafeTensorsFile() = default;
  Status parse();
  // Whether load(info, dtype) may run: `info` is this file's and `dtype` a target its dtype converts to.
  Status check_load(const TensorInfo& info, DType dtype) const;
  // read_range after check_load: the range's own check, then the conversion.
  Status convert_range(const TensorInfo& info, DType dtype, size_t offset, size_t bytes, void* dst) const;
  std::string path_;
  const char* base_ = nullptr;   // start of the whole file image
  size_t size_ = 0;
  size_t data_start_ = 0;
  bool mapped_ = false;
  std::string owned_;            // from_bytes keeps its copy here
  std::vector<TensorInfo> tensors_;
  std::vector<size_t> sorted_index_;  // tensors_ sorted by name, for find()
  nlohmann::json metadata_;
};

// Writes tensors (host, any dtype) as a safetensors file; used by tools and tests.
Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const nlohmann::json& metadata = nlohmann::json::object());

}  // namespace atelier
