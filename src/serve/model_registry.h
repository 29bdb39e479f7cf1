// Which models the server may run, by name, and each device worker's resident replicas.
//
// ModelRegistry: names from --model NAME=PATH (or a bare PATH, named after the folder/file) and from
// --model-dir DIR (every sub-folder with a model_index.json, every *.safetensors file), in that order; the
// first is the default. Nothing is loaded until a request needs it.
// ModelCache: one per worker. Loads a model onto the worker's device on first use and evicts the least
// recently used models that no running job holds when the memory budget or the model count is exceeded.
#pragma once
#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipeline/sd_model.h"

namespace atelier::serve {

struct ModelEntry {
  std::string name;
  std::string path;
};

// The model specs to serve: `specs` as given, or — when neither a model nor a model folder is named — the
// bundled demo model as "demo=<path>" (pipeline/demo_model.h looks in $ATELIER_DEMO_MODEL, beside an installed
// `exe_dir`, then the source tree), so that `atelier serve` alone serves something. Empty when there is
// nothing to add and nothing was given (ModelRegistry::create then says what to pass).
std::vector<std::string> specs_with_default_model(const std::vector<std::string>& specs, const std::string& model_dir,
                                                  const std::string& exe_dir);

class ModelRegistry {
 public:
  // `specs`: NAME=PATH or PATH; `model_dir` may be empty. Errors name a missing path or a duplicate name.
  static Expected<ModelRegistry> create(const std::vector<std::string>& specs, const std::string& model_dir);

  // By name, or by A1111 title ("name [hash]"); nullptr when unknown.
  const ModelEntry* find(const std::string& name_or_title) const;
  const ModelEntry* default_model() const { return entries_.empty() ? nullptr : &entries_.front(); }
  const std::vector<ModelEntry>& entries() const { return entries_; }
  // "a, b, c" for error messages.
  std::string names() const;
  // A1111 model hash (first 10 hex digits of the SHA-256), computed once on first request; "" on error.
  std::string hash(const ModelEntry& e) const;

 private:
  std::vector<ModelEntry> entries_;
  std::shared_ptr<std::mutex> hash_mu_ = std::make_shared<std::mutex>();  // shared: the registry is movable
  mutable std::vector<std::pair<std::string, std::string>> hashes_;  // name -> hash
};

struct ModelCacheOptions {
  Device device = Device::cpu();
  std::string tokenizer_dir;      // for single-file checkpoints without a tokenizer
  size_t budget_bytes = 0;        // 0 = no memory budget
  size_t max_models = 2;          // resident models at most (0 = no limit)
};

class ModelCache {
 public:
  explicit ModelCache(ModelCacheOptions o) : options_(std::move(o)) {}
  // The model on this device, loading it (and evicting) when needed. `load_s` receives the load time
  // (0 when resident). Called from the worker thread only.
  Expected<std::shared_ptr<SdModel>> acquire(const ModelEntry& entry, double* load_s);
  // The model when it is resident (nothing loaded, the LRU order unchanged), else nullptr.
  std::shared_ptr<SdModel> resident(const std::string& name) const;
  void clear();  // after a device failure: replicas on a failed device are not trusted
  size_t loaded() const;
  size_t bytes() const;

 private:
  struct Slot {
    std::string name;
    std::shared_ptr<SdModel> model;
    size_t bytes = 0;
  };
  void evict_for(size_t incoming_bytes);

  ModelCacheOptions options_;
  mutable std::mutex mu_;    // guards slots_ for the metrics readers
  std::list<Slot> slots_;    // most recently used first
  // The slot of model `name` in `slots` (slots_, const or not; under mu_), or its end().
  template <typename Slots>
  static auto find_slot(Slots& slots, const std::string& name) {
    return std::find_if(slots.begin(), slots.end(), [&](const Slot& s) { return s.name == name; });
  }
};

// Weight bytes of a loaded model (text encoder + UNet + VAE).
size_t model_bytes(const SdModel& m);

}  // namespace atelier::serve
