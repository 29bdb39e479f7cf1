// Which models the server may run, by name, and each device worker's resident replicas.
//
// ModelRegistry: names from --model NAME=PATH (or a bare PATH, named after the folder/file) and from
// --model-dir DIR (every sub-folder with a model_index.json, every *.safetensors file), in that order; the
// first is the default. Nothing is loaded until a request needs it.
// ModelCache: one per worker. Loads a model onto the worker's device on first use and evicts the least
// recently used models that no running job holds when the memory budget or the model count is exceeded.
// Models of three families: SD 1.x/2.x (step-level batched by the worker), FLUX.1 and Z-Image (diffusers
// folders; the worker runs their requests whole, see worker.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "pipeline/flux_model.h"
#include "pipeline/model_family.h"
#include "pipeline/sd_model.h"
#include "pipeline/zimage_pipeline.h"

namespace atelier::serve {

struct ModelEntry {
  std::string name;
  std::string path;
  ModelFamily family = ModelFamily::kSd;  // read from the folder or file when the registry is made

  bool is_dit() const { return family != ModelFamily::kSd; }
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
  std::string dtype = "auto";     // parse_model_dtype's names; fp8 applies to FLUX and Z-Image (SD keeps "auto")
  bool offload = false;           // FLUX / Z-Image text encoders off the device between requests' prompts
};

// A resident model: exactly one of the three is set, by the entry's family.
struct LoadedModel {
  std::shared_ptr<SdModel> sd;
  std::shared_ptr<FluxModel> flux;
  std::shared_ptr<const ZImageModel> zimage;

  // How many holders share the model (the cache's own slot is one): above 1, a job is using it.
  long use_count() const;
};

class ModelCache {
 public:
  explicit ModelCache(ModelCacheOptions o) : options_(std::move(o)) {}
  // The model on this device, loading it (and evicting) when needed. `load_s` receives the load time
  // (0 when resident). Called from the worker thread only.
  Expected<LoadedModel> acquire(const ModelEntry& entry, double* load_s);
  // The SD model when it is resident (nothing loaded, the LRU order unchanged), else nullptr.
  std::shared_ptr<SdModel> resident(const std::string& name) const;
  void clear();  // after a device failure: replicas on a failed device are not trusted
  size_t loaded() const;
  size_t bytes() const;

 private:
  struct Slot {
    std::string name;
    LoadedModel model;
    size_t bytes = 0;
  };
  void evict_for(size_t incoming_bytes);
  Expected<LoadedModel> load(const ModelEntry& entry, size_t* bytes) const;

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
// Bytes of the weight files at `path` (a .safetensors file, or every one under a folder): a DiT model's size for
// the cache's budget (its components keep their file dtypes on a GPU; on the CPU they widen to f32).
size_t weight_file_bytes(const std::string& path);

}  // namespace atelier::serve
