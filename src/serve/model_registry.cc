#include "serve/model_registry.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "pipeline/builtin_models.h"
#include "pipeline/flux_model.h"
#include "pipeline/demo_model.h"
#include "io/hash.h"

namespace atelier::serve {
namespace fs = std::filesystem;

namespace {

std::string name_of(const fs::path& p) {
  const fs::path clean = p.has_filename() ? p : p.parent_path();
  return fs::is_directory(clean) ? clean.filename().string() : clean.stem().string();
}

bool is_model_path(const fs::path& p) {
  if (!builtin_name_of(p.string()).empty()) return true;  // checked when it loads
  std::error_code ec;
  if (fs::is_directory(p, ec)) return fs::exists(p / "model_index.json", ec);
  return fs::is_regular_file(p, ec) && p.extension() == ".safetensors";
}

}  // namespace

std::vector<std::string> specs_with_default_model(const std::vector<std::string>& specs, const std::string& model_dir,
                                                  const std::string& exe_dir) {
  if (!specs.empty() || !model_dir.empty()) return specs;
  auto demo = find_demo_model(exe_dir);
  if (!demo) return specs;
  return {"demo=" + *demo};
}

Expected<ModelRegistry> ModelRegistry::create(const std::vector<std::string>& specs, const std::string& model_dir) {
  ModelRegistry r;
  auto add = [&](std::string name, const std::string& path) -> Status {
    if (name.empty()) return invalid_argument("--model: empty model name in '" + name + "=" + path + "'");
    for (const auto& e : r.entries_)
      if (e.name == name) return invalid_argument("--model: two models are named '" + name + "'; use NAME=PATH");
    const ModelFamily family = detect_model_family(path);
    // A DiT's single transformer file needs its other parts named (atelier generate's --vae, --clip-l, --t5,
    // --components): the server has no such flags per model, so it takes the diffusers folder.
    std::error_code ec;
    if (family != ModelFamily::kSd && !fs::is_directory(path, ec))
      return invalid_argument("--model: '" + path + "' is a single " + model_family_name(family) +
                              " transformer file; the server loads FLUX and Z-Image models from their diffusers folders "
                              "(with model_index.json)");
    r.entries_.push_back({std::move(name), path, family});
    return Status::ok();
  };
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    const std::string path = eq == std::string::npos ? spec : spec.substr(eq + 1);
    if (!is_model_path(path))
      return not_found("--model: '" + path + "' is not a diffusers folder (with model_index.json) or a .safetensors file");
    ATELIER_RETURN_IF_ERROR(add(eq == std::string::npos ? name_of(path) : spec.substr(0, eq), path));
  }
  if (!model_dir.empty()) {
    std::error_code ec;
    if (!fs::is_directory(model_dir, ec)) return not_found("--model-dir: '" + model_dir + "' is not a folder");
    std::vector<fs::path> found;
    for (const auto& d : fs::directory_iterator(model_dir, ec))
      if (is_model_path(d.path())) found.push_back(d.path());
    std::sort(found.begin(), found.end());
    for (const auto& p : found) ATELIER_RETURN_IF_ERROR(add(name_of(p), p.string()));
  }
  if (r.entries_.empty()) return invalid_argument("no model: give --model NAME=PATH or --model-dir DIR");
  return r;
}

const ModelEntry* ModelRegistry::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  // A1111 titles: "name [hash]" or "name.safetensors [hash]".
  const std::string base = name.substr(0, name.find(" ["));
  for (const auto& e : entries_)
    if (e.name == base || e.name + ".safetensors" == base) return &e;
  return nullptr;
}

std::string ModelRegistry::names() const {
  std::string out;
  for (const auto& e : entries_) out += (out.empty() ? "" : ", ") + e.name;
  return out;
}

std::string ModelRegistry::hash(const ModelEntry& e) const {
  std::lock_guard<std::mutex> lock(*hash_mu_);
  for (const auto& [name, h] : hashes_)
    if (name == e.name) return h;
  auto h = model_hash(e.path);
  hashes_.push_back({e.name, h ? *h : std::string()});
  return hashes_.back().second;
}

size_t model_bytes(const SdModel& m) {
  const int64_t params = m.text_encoder_params + m.unet_params + m.vae_params;
  return size_t(params) * dtype_size(m.unet ? m.unet->dtype() : DType::F32);
}

size_t weight_file_bytes(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return size_t(fs::file_size(path, ec));  // 0 on error
  size_t total = 0;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec) && it->path().extension() == ".safetensors") total += size_t(it->file_size(ec));
  return total;
}

// The load options the DiT families share (FluxLoadOptions, ZImageLoadOptions), from the cache's.
template <typename Options>
Options dit_load_options(const ModelCacheOptions& o, const ModelDtype& dt) {
  Options lo;
  lo.device = o.device;
  lo.dtype = dt.dtype;
  lo.fp8 = dt.fp8;
  lo.offload = o.offload;
  return lo;
}

long LoadedModel::use_count() const {
  if (sd) return sd.use_count();
  if (flux) return flux.use_count();
  return zimage.use_count();
}

// Every model takes the server's name (infotext "Model", A1111 sd_model_checkpoint).
Expected<LoadedModel> ModelCache::load(const ModelEntry& entry, size_t* bytes) const {
  ATELIER_ASSIGN_OR_RETURN(const ModelDtype dt, parse_model_dtype(options_.dtype));
  LoadedModel m;
  switch (entry.family) {
    case ModelFamily::kSd: {
      SdLoadOptions lo;
      lo.device = options_.device;
      lo.tokenizer_dir = options_.tokenizer_dir;
      lo.dtype = dt.dtype;  // fp8: SD has no FP8 path and runs in the device's default dtype
      ATELIER_ASSIGN_OR_RETURN(m.sd, load_sd_model(entry.path, lo));
      m.sd->name = entry.name;
      *bytes = model_bytes(*m.sd);
      return m;
    }
    case ModelFamily::kFlux: {
      ATELIER_ASSIGN_OR_RETURN(m.flux, load_flux_model(entry.path, dit_load_options<FluxLoadOptions>(options_, dt)));
      m.flux->name = entry.name;
      break;
    }
    case ModelFamily::kZImage: {
      ATELIER_ASSIGN_OR_RETURN(std::shared_ptr<const ZImageModel> loaded,
                               load_zimage_model(entry.path, dit_load_options<ZImageLoadOptions>(options_, dt)));
      auto named = std::make_shared<ZImageModel>(*loaded);  // shares the loaded components
      named->name = entry.name;
      m.zimage = std::move(named);
      break;
    }
  }
  *bytes = weight_file_bytes(entry.path);
  return m;
}

Expected<LoadedModel> ModelCache::acquire(const ModelEntry& entry, double* load_s) {
  if (load_s) *load_s = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = find_slot(slots_, entry.name); it != slots_.end()) {
      slots_.splice(slots_.begin(), slots_, it);
      return slots_.front().model;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  size_t bytes = 0;
  ATELIER_ASSIGN_OR_RETURN(LoadedModel model, load(entry, &bytes));
  if (load_s) *load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  evict_for(bytes);
  slots_.push_front({entry.name, model, bytes});
  return model;
}

std::shared_ptr<SdModel> ModelCache::resident(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = find_slot(slots_, name);
  return it != slots_.end() ? it->model.sd : nullptr;
}

void ModelCache::evict_for(size_t incoming) {
  auto over = [&] {
    size_t total = incoming, count = 1;
    for (const Slot& s : slots_) {
      total += s.bytes;
      ++count;
    }
    return (options_.budget_bytes && total > options_.budget_bytes) || (options_.max_models && count > options_.max_models);
  };
  // From the least recently used end; a model a running job holds (use_count > 1) stays.
  for (auto it = slots_.end(); over() && it != slots_.begin();) {
    --it;
    if (it->model.use_count() == 1) it = slots_.erase(it);
  }
}

void ModelCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  slots_.clear();
}

size_t ModelCache::loaded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.size();
}

size_t ModelCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t b = 0;
  for (const Slot& s : slots_) b += s.bytes;
  return b;
}

}  // namespace atelier::serve
