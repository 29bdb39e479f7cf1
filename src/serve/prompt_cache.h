// A worker's cache of encoded prompts: most requests share a negative prompt (often the empty one), and a
// client that asks for several seeds of one prompt sends the same positive prompt again and again. Encoding
// one is a whole text-encoder call on the worker's device, taken between two denoising steps of everyone
// else's batch, so a hit saves the batch that wait.
//
// Entries are keyed by the model they were encoded with (by identity: a model evicted and loaded again is a
// new model, and its stale entries are never returned), the text, clip skip and emphasis. Least recently
// used entries go first. Only the worker's thread uses it (no lock).
#pragma once
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace atelier {
struct SdModel;
}

namespace atelier::serve {

class PromptCache {
 public:
  static constexpr size_t kDefaultEntries = 64;  // [1, 77, 768] bf16 is 118 KB: 64 entries are ~8 MB
  explicit PromptCache(size_t capacity = kDefaultEntries) : capacity_(capacity) {}

  using Encode = std::function<Expected<Tensor>()>;
  // The cached encoding of (model, text, clip_skip, emphasis), or encode() (cached when it succeeds).
  Expected<Tensor> get(const std::shared_ptr<SdModel>& model, const std::string& text, int clip_skip, bool emphasis,
                       const Encode& encode);
  // Whether (model, text, clip_skip, emphasis) is cached (no hit counted, no reordering).
  bool contains(const std::shared_ptr<SdModel>& model, const std::string& text, int clip_skip, bool emphasis);
  // Caches an encoding made elsewhere (a batched prefetch), as the most recently used entry.
  void put(const std::shared_ptr<SdModel>& model, const std::string& text, int clip_skip, bool emphasis, const Tensor& value);

  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  struct Entry {
    std::weak_ptr<SdModel> model;
    const SdModel* model_id = nullptr;
    std::string text;
    int clip_skip = 0;
    bool emphasis = false;
    Tensor value;  // [1, tokens, hidden] on the model's device
  };
  // The live entry for the key (entries of unloaded models are dropped on the way), or end().
  std::list<Entry>::iterator find(const SdModel* model, const std::string& text, int clip_skip, bool emphasis);

  size_t capacity_;
  std::list<Entry> entries_;  // most recently used first
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace atelier::serve
