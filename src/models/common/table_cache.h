// The last tables a model derived from its inputs' positions, kept on its device. FLUX and Z-Image rebuild
// their rotary tables from the position ids on every call otherwise: at 1024² that is ~300k float64
// trigonometric evaluations on the host plus an upload per transformer call, while the GPU waits.
#pragma once
#include <functional>
#include <mutex>
#include <vector>

#include "core/tensor.h"

namespace atelier {

class TableCache {
 public:
  // The tables for `key` (values that determine them, e.g. the flattened position ids): make() runs when
  // the key differs from the last one asked for. Thread-safe; the tensors are shared, never written.
  std::vector<Tensor> get(const std::vector<float>& key, const std::function<std::vector<Tensor>()>& make) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!valid_ || key != key_) {
      tables_ = make();
      key_ = key;
      valid_ = true;
    }
    return tables_;
  }

 private:
  std::mutex mu_;
  bool valid_ = false;
  std::vector<float> key_;
  std::vector<Tensor> tables_;
};

}  // namespace atelier
