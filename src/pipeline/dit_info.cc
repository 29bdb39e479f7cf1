#include "pipeline/dit_info.h"

#include <filesystem>

#include "io/hash.h"
#include "io/json_util.h"
#include "models/common/component_files.h"
#include "models/common/weights.h"
#include "models/flux/flux_config.h"
#include "models/zimage/zimage_transformer.h"

namespace atelier {
namespace fs = std::filesystem;

namespace {

// Configs of the components: diffusers models and transformers models write config.json, schedulers
// scheduler_config.json, tokenizers tokenizer_config.json.
constexpr const char* kConfigFiles[] = {"config.json", "scheduler_config.json", "tokenizer_config.json"};

// FLUX.1-dev has the guidance embedder (distilled guidance), schnell has none.
const char* flux_variant(bool guidance_embeds) { return guidance_embeds ? "FLUX.1-dev (guidance-distilled)" : "FLUX.1-schnell"; }

// One component folder of a diffusers model: its class (model_index.json), parameter count and config.
Expected<nlohmann::json> describe_component(const fs::path& dir, const nlohmann::json& entry, std::string* first_file) {
  nlohmann::json c = {{"class", entry.is_array() && entry.size() == 2 && entry[1].is_string() ? entry[1] : nlohmann::json()}};
  std::error_code ec;
  for (const char* name : kConfigFiles) {
    if (!fs::exists(dir / name, ec)) continue;
    ATELIER_ASSIGN_OR_RETURN(nlohmann::json cfg, read_json_file((dir / name).string()));
    c["config"] = std::move(cfg);
    break;
  }
  bool has_weights = false;
  for (const auto& e : fs::directory_iterator(dir, ec)) has_weights |= e.path().extension() == ".safetensors";
  if (!has_weights) return c;
  const std::string stem = fs::exists(dir / "model.safetensors", ec) || fs::exists(dir / "model.safetensors.index.json", ec)
                               ? "model" : "diffusion_pytorch_model";
  ATELIER_ASSIGN_OR_RETURN(std::vector<std::string> files, component_weight_files(dir, stem));
  ATELIER_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open(files));
  c["parameters"] = store.count_params();
  if (first_file) *first_file = files.front();
  return c;
}

Status describe_folder(const fs::path& root, nlohmann::json& d) {
  ATELIER_ASSIGN_OR_RETURN(nlohmann::json index, read_json_file((root / "model_index.json").string()));
  d["layout"] = "diffusers";
  std::string transformer_file;
  for (const auto& [name, entry] : index.items()) {
    std::error_code ec;
    if (name.empty() || name[0] == '_' || !entry.is_array() || entry.empty() || entry[0].is_null() ||
        !fs::is_directory(root / name, ec))
      continue;  // metadata, and the optional components this model does not have
    ATELIER_ASSIGN_OR_RETURN(d["components"][name],
                             describe_component(root / name, entry, name == "transformer" ? &transformer_file : nullptr));
  }
  if (transformer_file.empty()) return invalid_argument(root.string() + ": no transformer weights (transformer/*.safetensors)");
  ATELIER_ASSIGN_OR_RETURN(std::string hash, model_hash(transformer_file));
  d["hash"] = hash;
  const nlohmann::json& cfg = d["components"]["transformer"].value("config", nlohmann::json::object());
  if (d["family"] == "flux") d["variant"] = flux_variant(cfg.value("guidance_embeds", false));
  return Status::ok();
}

Status describe_file(const std::string& file, ModelFamily family, nlohmann::json& d) {
  ATELIER_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open({file}));
  nlohmann::json t;
  if (family == ModelFamily::kFlux) {
    const auto prefix = flux_bfl_prefix(store);
    if (!prefix) return unsupported(file + " holds no FLUX transformer in BFL layout");
    ATELIER_ASSIGN_OR_RETURN(FluxConfig cfg, FluxConfig::detect(store, FluxLayout::kBfl, *prefix));
    d["layout"] = "single-file (BFL)";
    d["variant"] = flux_variant(cfg.guidance_embeds);
    t = {{"class", "FluxTransformer2DModel"}, {"parameters", store.count_params(*prefix)},
         {"config", {{"num_layers", cfg.num_layers}, {"num_single_layers", cfg.num_single_layers},
                     {"num_attention_heads", cfg.num_heads}, {"guidance_embeds", cfg.guidance_embeds}}}};
  } else {
    std::string prefix;
    ATELIER_ASSIGN_OR_RETURN(ZImageLayout layout, detect_zimage_layout(store, &prefix));
    d["layout"] = layout == ZImageLayout::kDiffusers ? "single-file (diffusers keys)" : "single-file (original)";
    t = {{"class", "ZImageTransformer2DModel"}, {"parameters", store.count_params(prefix)}};
  }
  d["components"]["transformer"] = std::move(t);
  d["note"] = "a single transformer file: the text encoders and the VAE are given apart (atelier generate --help)";
  ATELIER_ASSIGN_OR_RETURN(std::string hash, model_hash(file));
  d["hash"] = hash;
  return Status::ok();
}

}  // namespace

Expected<nlohmann::json> describe_dit_model(const std::string& path, ModelFamily family) {
  if (family == ModelFamily::kSd) return invalid_argument(path + ": describe_dit_model takes FLUX and Z-Image models");
  nlohmann::json d = {{"path", path}, {"family", model_family_name(family)},
                      {"components", nlohmann::json::object()}};
  if (family == ModelFamily::kZImage) d["variant"] = "Z-Image";
  std::error_code ec;
  const Status st = catch_status([&] {
    return fs::is_directory(path, ec) ? describe_folder(path, d) : describe_file(path, family, d);
  });
  if (!st.is_ok()) return st;
  int64_t total = 0;
  for (const auto& [name, c] : d["components"].items()) total += c.value("parameters", int64_t(0));
  d["parameters_total"] = total;
  return d;
}

}  // namespace atelier
