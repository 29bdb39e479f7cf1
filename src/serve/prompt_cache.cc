#include "serve/prompt_cache.h"

namespace atelier::serve {

std::list<PromptCache::Entry>::iterator PromptCache::find(const SdModel* model, const std::string& text, int clip_skip,
                                                          bool emphasis) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->model.expired()) {  // its model was unloaded: the tensor would keep device memory for nothing
      it = entries_.erase(it);
      continue;
    }
    if (it->model_id == model && it->clip_skip == clip_skip && it->emphasis == emphasis && it->text == text) return it;
    ++it;
  }
  return entries_.end();
}

Expected<Tensor> PromptCache::get(const std::shared_ptr<SdModel>& model, const std::string& text, int clip_skip,
                                  bool emphasis, const Encode& encode) {
  if (auto it = find(model.get(), text, clip_skip, emphasis); it != entries_.end()) {
    entries_.splice(entries_.begin(), entries_, it);
    ++hits_;
    return entries_.front().value;
  }
  ++misses_;
  auto value = encode();
  if (value) put(model, text, clip_skip, emphasis, *value);
  return value;
}

bool PromptCache::contains(const std::shared_ptr<SdModel>& model, const std::string& text, int clip_skip, bool emphasis) {
  return find(model.get(), text, clip_skip, emphasis) != entries_.end();
}

void PromptCache::put(const std::shared_ptr<SdModel>& model, const std::string& text, int clip_skip, bool emphasis,
                      const Tensor& value) {
  if (capacity_ == 0) return;
  if (auto it = find(model.get(), text, clip_skip, emphasis); it != entries_.end()) entries_.erase(it);
  while (entries_.size() >= capacity_) entries_.pop_back();
  entries_.push_front(Entry{model, model.get(), text, clip_skip, emphasis, value});
}

}  // namespace atelier::serve
