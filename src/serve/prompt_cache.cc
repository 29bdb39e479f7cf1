#include "serve/prompt_cache.h"

namespace atelier::serve {

Expected<Tensor> PromptCache::get(const std::shared_ptr<SdModel>& model, const std::string& text, int clip_skip,
                                  bool emphasis, const Encode& encode) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->model.expired()) {  // its model was unloaded: the tensor would keep device memory for nothing
      it = entries_.erase(it);
      continue;
    }
    if (it->model_id == model.get() && it->clip_skip == clip_skip && it->emphasis == emphasis && it->text == text) {
      entries_.splice(entries_.begin(), entries_, it);
      ++hits_;
      return entries_.front().value;
    }
    ++it;
  }
  ++misses_;
  auto value = encode();
  if (!value || capacity_ == 0) return value;
  while (entries_.size() >= capacity_) entries_.pop_back();
  entries_.push_front(Entry{model, model.get(), text, clip_skip, emphasis, *value});
  return value;
}

}  // namespace atelier::serve
