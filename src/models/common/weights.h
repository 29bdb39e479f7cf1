// Weights: a WeightStore is a flat key -> tensor view over one or more safetensors files (read lazily);
// a WeightLoader binds the typed fields of a model struct to keys, checks every shape, converts to the
// compute dtype on the target device, and collects every problem into one error report.
//
// Model code names keys in ONE canonical layout (diffusers' names). A checkpoint in another layout
// (CompVis single files, BFL, ...) is read through a KeyMap that translates a canonical key into the
// file's key — one key map per checkpoint layout, written once, next to the model.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "models/common/layers.h"

namespace atelier {

// Builds one tensor directly on `device` in `dtype` (synthetic stores: random-weight benchmark models).
using WeightGenerator = std::function<Tensor(const std::string& key, const Shape& shape, Device device, DType dtype)>;

class WeightStore {
 public:
  WeightStore() = default;
  // A store that holds every key, with whatever shape a loader asks for: WeightLoader builds each tensor
  // with `make` on the target device instead of reading it (so a 12B-parameter random model never passes
  // through host memory). Model loaders that probe layouts see every candidate key present.
  static WeightStore synthetic(WeightGenerator make);
  bool is_synthetic() const { return static_cast<bool>(generator_); }
  // Opens every file; a key present in two files is an error.
  static Expected<WeightStore> open(const std::vector<std::string>& files);
  bool contains(const std::string& key) const;
  const TensorInfo* info(const std::string& key) const;
  std::optional<Shape> shape(const std::string& key) const;
  std::vector<std::string> keys() const;
  // Keys starting with `prefix`.
  std::vector<std::string> keys_with_prefix(const std::string& prefix) const;
  bool any_with_prefix(const std::string& prefix) const;
  // Reads `key` as a tensor in `dtype` on `device` (SafeTensorsFile::load: no host copy on the way to a GPU).
  Expected<Tensor> read(const std::string& key, DType dtype = DType::F32, Device device = Device::cpu()) const;
  const std::vector<std::string>& files() const { return paths_; }
  // Total elements of the tensors under `prefix` (parameter counts for `atelier info`).
  int64_t count_params(const std::string& prefix = "") const;

 private:
  struct Entry { size_t file; const TensorInfo* info; };
  std::vector<std::shared_ptr<SafeTensorsFile>> files_;
  std::vector<std::string> paths_;
  std::shared_ptr<std::vector<std::pair<std::string, Entry>>> index_;  // sorted by key
  WeightGenerator generator_;  // synthetic stores only
  const Entry* find(const std::string& key) const;
  friend class WeightLoader;
};

// Canonical (diffusers) key -> key in the file. Identity for the canonical layout.
using KeyMap = std::function<std::string(const std::string&)>;

// The most layers (per level, or per encoder) a configuration may ask for: real models have up to ~48 (SDXL's
// transformer depth 10, CLIP-bigG 32, T5-XXL 24); a config or file asking for a million built a million layers' worth
// of missing-tensor errors (gigabytes) before failing.
constexpr int kMaxLayerCount = 256;

// Whether a probed shape (WeightStore::shape) has `rank` dimensions, all positive: what a configuration detected from
// a file's tensors may divide by or index (a malformed file's [] or [0] crashed the probes).
inline bool shape_is(const std::optional<Shape>& s, size_t rank) {
  if (!s || s->size() != rank) return false;
  for (int64_t d : *s)
    if (d < 1) return false;
  return true;
}

class WeightLoader {
 public:
  // `prefix` is prepended (after mapping) to every key, e.g. "text_model." or "model.diffusion_model.".
  WeightLoader(const WeightStore& store, Device device, DType dtype, KeyMap map = {}, std::string prefix = "");

  // Loads `key` (canonical name relative to the current scope) into `field`, checking `shape`.
  // A file tensor whose shape differs from `shape` only by trailing 1s (1x1 convs stored for linears) is
  // reshaped. Problems are recorded, not thrown; see finish().
  void tensor(Tensor& field, const std::string& key, const Shape& shape);
  void optional_tensor(Tensor& field, const std::string& key, const Shape& shape);
  void linear(Linear& l, const std::string& key, int64_t in, int64_t out, bool bias = true);
  void conv(Conv2d& c, const std::string& key, int64_t in, int64_t out, int k, int stride = 1, int pad = -1);
  void group_norm(GroupNorm& n, const std::string& key, int64_t channels, int groups, float eps);
  void layer_norm(LayerNorm& n, const std::string& key, int64_t dim, float eps);
  void rms_norm(RMSNorm& n, const std::string& key, int64_t dim, float eps);
  void embedding(Embedding& e, const std::string& key, int64_t vocab, int64_t dim);

  // A loader scoped to `name` ("down_blocks.0" -> keys "down_blocks.0.<key>").
  WeightLoader scope(const std::string& name) const;
  // Linear weights stored as f8e4m3 in the file are kept as they are (Linear::is_fp8, row scales 1) instead
  // of converted to the compute dtype: an FP8 checkpoint run with FP8 products (`--dtype fp8`) uses exactly
  // its stored weights. Scopes made after this call inherit it.
  void keep_fp8_linears(bool keep) { keep_fp8_ = keep; }

  // Whether a canonical key (relative to this scope) exists in the file.
  bool has(const std::string& key) const;
  // Shape of a canonical key in the file, if present.
  std::optional<Shape> shape_of(const std::string& key) const;
  // Ok, or one error listing every missing or mis-shaped tensor (first 20) with what was expected.
  Status finish() const;

 private:
  std::string file_key(const std::string& key) const;
  // tensor() in `dtype` (linear's f8e4m3 weights kept as stored).
  void load(Tensor& field, const std::string& key, const Shape& shape, DType dtype);
  struct Shared {
    std::vector<std::string> errors;
    int loaded = 0;
  };
  const WeightStore* store_;
  Device device_;
  DType dtype_;
  KeyMap map_;
  std::string prefix_;
  std::string scope_;
  bool keep_fp8_ = false;
  std::shared_ptr<Shared> shared_;
};

}  // namespace atelier
