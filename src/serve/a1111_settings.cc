#include "serve/a1111_settings.h"

#include "serve/json_fields.h"

namespace atelier::serve {
namespace {

constexpr const char* kAppliedKeys[] = {"sd_model_checkpoint", "CLIP_stop_at_last_layers", "randn_source", "samples_format"};

bool is_applied_key(const std::string& key) {
  for (const char* k : kAppliedKeys)
    if (key == k) return true;
  return false;
}

}  // namespace

A1111Defaults A1111Settings::get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return d_;
}

Status read_a1111_options(FieldReader& f, A1111Defaults& d) {
  ATELIER_RETURN_IF_ERROR(f.string("sd_model_checkpoint", d.model, 256));
  ATELIER_RETURN_IF_ERROR(f.integer("CLIP_stop_at_last_layers", 1, 12, d.clip_skip));
  std::string rng, format;
  ATELIER_RETURN_IF_ERROR(f.choice("randn_source", {"GPU", "CPU"}, rng));
  if (!rng.empty()) d.rng = rng == "CPU" ? "cpu" : "cuda";
  ATELIER_RETURN_IF_ERROR(f.choice("samples_format", {"png", "jpg", "jpeg", "webp"}, format));
  if (!format.empty()) d.output_format = format == "jpg" ? "jpeg" : format;
  return Status::ok();
}

Expected<nlohmann::json> A1111Settings::apply(const nlohmann::json& body, const ModelRegistry& registry) {
  if (!body.is_object()) return invalid_argument("options: expected a JSON object of option names and values");
  A1111Defaults next = get();
  FieldReader f(body);
  ATELIER_RETURN_IF_ERROR(read_a1111_options(f, next));
  if (f.has("sd_model_checkpoint")) {
    const ModelEntry* e = registry.find(next.model);
    if (!e) return invalid_argument("sd_model_checkpoint: unknown model '" + next.model + "'; available: " + registry.names());
    next.model = e->name;
  }
  nlohmann::json applied = nlohmann::json::array(), ignored = nlohmann::json::array();
  for (const auto& [key, value] : body.items()) (is_applied_key(key) ? applied : ignored).push_back(key);
  std::lock_guard<std::mutex> lock(mu_);
  d_ = std::move(next);
  return nlohmann::json{{"applied", applied}, {"ignored", ignored}};
}

nlohmann::json A1111Settings::to_json(const ModelRegistry& registry, const std::string& output_dir) const {
  const A1111Defaults d = get();
  const ModelEntry* m = d.model.empty() ? registry.default_model() : registry.find(d.model);
  const std::string hash = registry.hash(*m);
  return {{"sd_model_checkpoint", hash.empty() ? m->name : m->name + " [" + hash + "]"},
          {"CLIP_stop_at_last_layers", d.clip_skip}, {"samples_format", d.output_format == "jpeg" ? "jpg" : d.output_format},
          {"randn_source", d.rng == "cpu" ? "CPU" : "GPU"}, {"live_previews_enable", false}, {"outdir_samples", output_dir}};
}

}  // namespace atelier::serve
