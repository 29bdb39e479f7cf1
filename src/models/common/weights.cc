#include "models/common/weights.h"

#include <algorithm>

#include "backend/ops.h"

namespace atelier {

Expected<WeightStore> WeightStore::open(const std::vector<std::string>& files) {
  WeightStore ws;
  ws.index_ = std::make_shared<std::vector<std::pair<std::string, Entry>>>();
  for (const auto& path : files) {
    ATELIER_ASSIGN_OR_RETURN(auto f, SafeTensorsFile::open(path));
    for (const auto& t : f->tensors()) ws.index_->push_back({t.name, Entry{ws.files_.size(), &t}});
    ws.files_.push_back(std::move(f));
    ws.paths_.push_back(path);
  }
  std::sort(ws.index_->begin(), ws.index_->end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < ws.index_->size(); ++i)
    if ((*ws.index_)[i].first == (*ws.index_)[i - 1].first)
      return corrupt("tensor '" + (*ws.index_)[i].first + "' appears in two weight files");
  return ws;
}

const WeightStore::Entry* WeightStore::find(const std::string& key) const {
  if (!index_) return nullptr;
  auto it = std::lower_bound(index_->begin(), index_->end(), key, [](const auto& e, const std::string& k) { return e.first < k; });
  if (it == index_->end() || it->first != key) return nullptr;
  return &it->second;
}

WeightStore WeightStore::synthetic(WeightGenerator make) {
  WeightStore ws;
  ws.generator_ = std::move(make);
  return ws;
}

bool WeightStore::contains(const std::string& key) const { return generator_ || find(key) != nullptr; }

const TensorInfo* WeightStore::info(const std::string& key) const {
  const Entry* e = find(key);
  return e ? e->info : nullptr;
}

std::optional<Shape> WeightStore::shape(const std::string& key) const {
  const TensorInfo* i = info(key);
  if (!i) return std::nullopt;
  return i->shape;
}

std::vector<std::string> WeightStore::keys() const { return keys_with_prefix(""); }

std::vector<std::string> WeightStore::keys_with_prefix(const std::string& prefix) const {
  std::vector<std::string> out;
  if (!index_) return out;
  auto it = std::lower_bound(index_->begin(), index_->end(), prefix, [](const auto& e, const std::string& k) { return e.first < k; });
  for (; it != index_->end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) out.push_back(it->first);
  return out;
}

bool WeightStore::any_with_prefix(const std::string& prefix) const {
  if (generator_) return true;
  if (!index_) return false;
  auto it = std::lower_bound(index_->begin(), index_->end(), prefix, [](const auto& e, const std::string& k) { return e.first < k; });
  return it != index_->end() && it->first.compare(0, prefix.size(), prefix) == 0;
}

Expected<Tensor> WeightStore::read(const std::string& key, DType dtype, Device device) const {
  const Entry* e = find(key);
  if (!e) return not_found("tensor '" + key + "' is not in the weights");
  return files_[e->file]->load(*e->info, dtype, device);
}

int64_t WeightStore::count_params(const std::string& prefix) const {
  int64_t n = 0;
  for (const auto& k : keys_with_prefix(prefix)) n += numel_of(find(k)->info->shape);
  return n;
}

WeightLoader::WeightLoader(const WeightStore& store, Device device, DType dtype, KeyMap map, std::string prefix)
    : store_(&store), device_(device), dtype_(dtype), map_(std::move(map)), prefix_(std::move(prefix)),
      shared_(std::make_shared<Shared>()) {}

std::string WeightLoader::file_key(const std::string& key) const {
  const std::string canonical = scope_.empty() ? key : scope_ + "." + key;
  return prefix_ + (map_ ? map_(canonical) : canonical);
}

WeightLoader WeightLoader::scope(const std::string& name) const {
  WeightLoader l = *this;
  l.scope_ = scope_.empty() ? name : scope_ + "." + name;
  return l;
}

bool WeightLoader::has(const std::string& key) const { return store_->contains(file_key(key)); }

std::optional<Shape> WeightLoader::shape_of(const std::string& key) const { return store_->shape(file_key(key)); }

namespace {
// Shapes equal once trailing singleton dims are dropped ([C, C, 1, 1] conv vs [C, C] linear).
bool same_but_trailing_ones(Shape a, Shape b) {
  while (a.size() > 1 && a.back() == 1) a.pop_back();
  while (b.size() > 1 && b.back() == 1) b.pop_back();
  return a == b;
}
}  // namespace

void WeightLoader::tensor(Tensor& field, const std::string& key, const Shape& shape) { load(field, key, shape, dtype_); }

void WeightLoader::load(Tensor& field, const std::string& key, const Shape& shape, DType dtype) {
  const std::string fk = file_key(key);
  if (store_->generator_) {
    field = store_->generator_(fk, shape, device_, dtype);
    ++shared_->loaded;
    return;
  }
  const TensorInfo* info = store_->info(fk);
  if (!info) {
    shared_->errors.push_back("missing tensor '" + fk + "' (expected shape " + shape_str(shape) + ")");
    return;
  }
  if (info->shape != shape && !same_but_trailing_ones(info->shape, shape)) {
    shared_->errors.push_back("tensor '" + fk + "' has shape " + shape_str(info->shape) + ", expected " + shape_str(shape));
    return;
  }
  auto t = store_->read(fk, dtype, device_);  // converted as it is written to the device
  if (!t) {
    shared_->errors.push_back(t.status().message());
    return;
  }
  field = t->reshape(shape);
  ++shared_->loaded;
}

void WeightLoader::optional_tensor(Tensor& field, const std::string& key, const Shape& shape) {
  if (has(key)) tensor(field, key, shape);
}

void WeightLoader::linear(Linear& l, const std::string& key, int64_t in, int64_t out, bool bias) {
  const TensorInfo* info = keep_fp8_ ? store_->info(file_key(key + ".weight")) : nullptr;
  const bool keep = info && info->dtype == DType::F8E4M3;  // the stored bytes, as they are
  load(l.weight, key + ".weight", {out, in}, keep ? DType::F8E4M3 : dtype_);
  if (keep && l.weight.defined()) l.weight_scale = Tensor::full({out}, 1.0f, device_);
  if (bias) tensor(l.bias, key + ".bias", {out});
}

void WeightLoader::conv(Conv2d& c, const std::string& key, int64_t in, int64_t out, int k, int stride, int pad) {
  tensor(c.weight, key + ".weight", {out, in, k, k});
  tensor(c.bias, key + ".bias", {out});
  c.params.stride_h = c.params.stride_w = stride;
  c.params.pad_h = c.params.pad_w = pad < 0 ? k / 2 : pad;
}

void WeightLoader::group_norm(GroupNorm& n, const std::string& key, int64_t channels, int groups, float eps) {
  tensor(n.weight, key + ".weight", {channels});
  tensor(n.bias, key + ".bias", {channels});
  n.groups = groups;
  n.eps = eps;
}

void WeightLoader::layer_norm(LayerNorm& n, const std::string& key, int64_t dim, float eps) {
  tensor(n.weight, key + ".weight", {dim});
  tensor(n.bias, key + ".bias", {dim});
  n.eps = eps;
}

void WeightLoader::rms_norm(RMSNorm& n, const std::string& key, int64_t dim, float eps) {
  tensor(n.weight, key + ".weight", {dim});
  n.eps = eps;
}

void WeightLoader::embedding(Embedding& e, const std::string& key, int64_t vocab, int64_t dim) {
  tensor(e.weight, key + ".weight", {vocab, dim});
}

Status WeightLoader::finish() const {
  const auto& errs = shared_->errors;
  if (errs.empty()) return Status::ok();
  constexpr size_t kMaxListed = 20;
  std::string msg = std::to_string(errs.size()) + " weight problem(s) in " +
                    (store_->files().empty() ? std::string("<no file>") : store_->files().front()) + ":";
  for (size_t i = 0; i < errs.size() && i < kMaxListed; ++i) msg += "\n  " + errs[i];
  if (errs.size() > kMaxListed) msg += "\n  ... and " + std::to_string(errs.size() - kMaxListed) + " more";
  return corrupt(msg);
}

}  // namespace atelier
