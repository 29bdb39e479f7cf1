#include "pipeline/flux_model.h"

#include <algorithm>
#include <filesystem>

#include "models/common/component_files.h"
#include "io/hash.h"
#include "io/json_util.h"
#include "io/safetensors.h"
#include "models/clip/clip_keymaps.h"
#include "models/vae/vae_keymaps.h"
#include "pipeline/sd_model.h"

namespace atelier {

namespace {

namespace fs = std::filesystem;

constexpr const char* kPipelineClass = "FluxPipeline";
constexpr float kFluxVaeScaling = 0.3611f;  // ae.safetensors carries no config: FLUX's published values
constexpr float kFluxVaeShift = 0.1159f;
constexpr int kTinyClipHeadWidth = 8;       // head width assumed for CLIP files whose width is not a multiple of 64
constexpr int kClipHeadWidth = 64;

// FLUX.1-dev's scheduler_config.json; schnell's is the same with shift 1 and no dynamic shifting.
nlohmann::json builtin_scheduler(bool dev) {
  return {{"num_train_timesteps", 1000}, {"shift", dev ? 3.0 : 1.0}, {"use_dynamic_shifting", dev},
          {"base_shift", 0.5}, {"max_shift", 1.15}, {"base_image_seq_len", 256}, {"max_image_seq_len", 4096}};
}

// A component given as a folder (with its stem) or as one file.
Expected<std::vector<std::string>> component(const std::string& path, const std::string& stem) {
  if (fs::is_directory(path)) return component_weight_files(path, stem);
  if (!fs::exists(path)) return not_found(path + " does not exist");
  return std::vector<std::string>{path};
}

// The first candidate folder (or file) that holds `probe`; empty when none.
std::string find_beside(const std::vector<fs::path>& candidates, const std::string& probe) {
  for (const auto& c : candidates) {
    if (c.empty()) continue;
    if (fs::is_regular_file(c) && c.filename() == probe) return c.string();
    if (fs::exists(c / probe)) return c.string();
  }
  return "";
}

// Folder beside which a component's tokenizer is looked for: the folder itself, or a file's folder.
fs::path home_of(const std::string& path) { return fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path(); }

Status load_clip(FluxModel& m, const std::string& path, const std::string& tokenizer, const FluxLoadOptions& o) {
  ATELIER_ASSIGN_OR_RETURN(auto files, component(path, "model"));
  ATELIER_ASSIGN_OR_RETURN(auto store, WeightStore::open(files));
  const auto layout = detect_clip_layout(store);
  if (!layout || *layout != ClipLayout::kTransformers) return unsupported(path + ": no transformers CLIP text encoder (text_model.*) found");
  const fs::path home = home_of(path);
  std::optional<ClipTextConfig> cfg;
  if (fs::exists(home / "config.json")) {
    ATELIER_ASSIGN_OR_RETURN(auto c, ClipTextConfig::from_file((home / "config.json").string()));
    cfg = c;
  } else {
    const std::string prefix = clip_tower_prefix(store, *layout);
    const auto emb = store.shape(prefix + "embeddings.token_embedding.weight");
    const int64_t width = emb && emb->size() == 2 ? (*emb)[1] : 0;
    const int heads = int(std::max<int64_t>(1, width % kClipHeadWidth == 0 ? width / kClipHeadWidth : width / kTinyClipHeadWidth));
    ATELIER_ASSIGN_OR_RETURN(auto c, ClipTextConfig::detect(store, prefix, heads));
    cfg = c;
  }
  ATELIER_ASSIGN_OR_RETURN(auto te, ClipTextModel::load(store, *layout, *cfg, o.device, flux_text_dtype(o)));
  m.clip.emplace(std::move(te));
  if (m.clip_tokenizer) return Status::ok();  // a reload after an offload: the tokenizer stayed
  const std::string tok = !tokenizer.empty() ? tokenizer : find_beside({home, home.parent_path() / "tokenizer"}, "vocab.json");
  if (tok.empty()) return invalid_argument("no CLIP tokenizer beside " + path + " (pass the tokenizer folder with --tokenizer)");
  ATELIER_ASSIGN_OR_RETURN(auto t, ClipTokenizer::load(tok));
  m.clip_tokenizer.emplace(std::move(t));
  return Status::ok();
}

Status load_t5(FluxModel& m, const std::string& path, const std::string& tokenizer, const FluxLoadOptions& o) {
  ATELIER_ASSIGN_OR_RETURN(auto files, component(path, "model"));
  ATELIER_ASSIGN_OR_RETURN(auto store, WeightStore::open(files));
  const fs::path home = home_of(path);
  std::optional<T5Config> cfg;
  if (fs::exists(home / "config.json")) {
    ATELIER_ASSIGN_OR_RETURN(auto c, T5Config::from_file((home / "config.json").string()));
    cfg = c;
  } else {
    ATELIER_ASSIGN_OR_RETURN(auto c, T5Config::detect(store));
    cfg = c;
  }
  ATELIER_ASSIGN_OR_RETURN(auto enc, T5Encoder::load(store, *cfg, o.device, flux_text_dtype(o)));
  m.t5.emplace(std::move(enc));
  if (m.t5_tokenizer) return Status::ok();  // a reload after an offload: the tokenizer stayed
  const std::string tok = !tokenizer.empty() ? tokenizer : find_beside({home, home.parent_path() / "tokenizer_2"}, "spiece.model");
  if (tok.empty()) return invalid_argument("no T5 tokenizer (spiece.model) beside " + path + " (pass it with --t5-tokenizer)");
  ATELIER_ASSIGN_OR_RETURN(auto t, T5Tokenizer::load(tok));
  m.t5_tokenizer.emplace(std::move(t));
  return Status::ok();
}

// Where the text encoders and their tokenizers are read from.
struct TextEncoderFiles {
  std::string clip, clip_tokenizer, t5, t5_tokenizer;
};

// Loads both text encoders now and keeps how to load them again (FluxModel::load_text_encoders, for offload).
Status set_text_encoders(FluxModel& m, const TextEncoderFiles& f, const FluxLoadOptions& o) {
  m.offload_text_encoders = o.offload;
  m.load_text_encoders = [f, o](FluxModel& model) -> Status {
    ATELIER_RETURN_IF_ERROR(load_clip(model, f.clip, f.clip_tokenizer, o));
    return load_t5(model, f.t5, f.t5_tokenizer, o);
  };
  return m.load_text_encoders(m);
}

Status load_vae(FluxModel& m, const std::string& path, const FluxLoadOptions& o) {
  ATELIER_ASSIGN_OR_RETURN(auto files, component(path, "diffusion_pytorch_model"));
  ATELIER_ASSIGN_OR_RETURN(auto store, WeightStore::open(files));
  const fs::path home = home_of(path);
  if (fs::is_directory(path) && fs::exists(home / "config.json")) {
    ATELIER_ASSIGN_OR_RETURN(auto cfg, VaeConfig::from_file((home / "config.json").string()));
    ATELIER_ASSIGN_OR_RETURN(auto vae, Vae::load(store, VaeLayout::kDiffusers, cfg, o.device, flux_vae_dtype(o)));
    m.vae.emplace(std::move(vae));
    return Status::ok();
  }
  ATELIER_ASSIGN_OR_RETURN(auto layout, detect_vae_layout(store));
  ATELIER_ASSIGN_OR_RETURN(auto cfg, detect_vae_config(store, layout));
  cfg.scaling_factor = kFluxVaeScaling;
  cfg.shift_factor = kFluxVaeShift;
  ATELIER_ASSIGN_OR_RETURN(auto vae, Vae::load(store, layout, cfg, o.device, flux_vae_dtype(o)));
  m.vae.emplace(std::move(vae));
  return Status::ok();
}

Status load_scheduler(FluxModel& m, const nlohmann::json& j) {
  m.scheduler_json = j;
  ATELIER_ASSIGN_OR_RETURN(m.scheduler, sampling::parse_flow_match_config(j));
  return Status::ok();
}

Status load_diffusers(FluxModel& m, const fs::path& root, const FluxLoadOptions& o) {
  m.layout = "diffusers";
  ATELIER_ASSIGN_OR_RETURN(auto files, component_weight_files(root / "transformer", "diffusion_pytorch_model"));
  ATELIER_ASSIGN_OR_RETURN(auto store, WeightStore::open(files));
  ModelHashTask hash(files.front(), o.compute_hash);  // beside the load
  ATELIER_ASSIGN_OR_RETURN(auto cfg, FluxConfig::from_file((root / "transformer" / "config.json").string()));
  ATELIER_ASSIGN_OR_RETURN(auto tr, FluxTransformer::load(store, FluxLayout::kDiffusers, cfg, o.device, flux_model_dtype(o), "", o.fp8));
  if (o.fp8) tr.quantize_fp8();
  m.transformer.emplace(std::move(tr));
  ATELIER_RETURN_IF_ERROR(set_text_encoders(
      m, {o.clip_l.empty() ? (root / "text_encoder").string() : o.clip_l,
          o.clip_tokenizer.empty() && o.clip_l.empty() ? (root / "tokenizer").string() : o.clip_tokenizer,
          o.t5.empty() ? (root / "text_encoder_2").string() : o.t5,
          o.t5_tokenizer.empty() && o.t5.empty() ? (root / "tokenizer_2").string() : o.t5_tokenizer},
      o));
  ATELIER_RETURN_IF_ERROR(load_vae(m, o.vae.empty() ? (root / "vae").string() : o.vae, o));
  ATELIER_ASSIGN_OR_RETURN(auto sched, read_json_file((root / "scheduler" / "scheduler_config.json").string()));
  ATELIER_RETURN_IF_ERROR(load_scheduler(m, sched));
  if (hash.valid()) {
    ATELIER_ASSIGN_OR_RETURN(m.hash, hash.get());
  }
  return Status::ok();
}

Status load_bfl(FluxModel& m, const fs::path& file, const FluxLoadOptions& o) {
  m.layout = "single-file (BFL)";
  ATELIER_ASSIGN_OR_RETURN(auto store, WeightStore::open({file.string()}));
  ModelHashTask hash(file.string(), o.compute_hash);  // beside the load
  const auto prefix = flux_bfl_prefix(store);
  if (!prefix) return unsupported(file.string() + " holds no FLUX transformer in BFL layout (double_blocks.0.img_attn.qkv)");
  std::optional<FluxConfig> cfg;
  if (!o.transformer_config.empty()) {
    ATELIER_ASSIGN_OR_RETURN(auto c, FluxConfig::from_file(o.transformer_config));
    cfg = c;
  } else {
    ATELIER_ASSIGN_OR_RETURN(auto c, FluxConfig::detect(store, FluxLayout::kBfl, *prefix));
    cfg = c;
  }
  ATELIER_ASSIGN_OR_RETURN(auto tr, FluxTransformer::load(store, FluxLayout::kBfl, *cfg, o.device, flux_model_dtype(o), *prefix, o.fp8));
  if (o.fp8) tr.quantize_fp8();
  m.transformer.emplace(std::move(tr));
  if (o.vae.empty() || o.clip_l.empty() || o.t5.empty()) {
    return invalid_argument("a FLUX transformer file needs --vae (ae.safetensors), --clip-l and --t5 (text encoder files or folders)");
  }
  ATELIER_RETURN_IF_ERROR(set_text_encoders(m, {o.clip_l, o.clip_tokenizer, o.t5, o.t5_tokenizer}, o));
  ATELIER_RETURN_IF_ERROR(load_vae(m, o.vae, o));
  ATELIER_RETURN_IF_ERROR(load_scheduler(m, builtin_scheduler(cfg->guidance_embeds)));
  if (hash.valid()) {
    ATELIER_ASSIGN_OR_RETURN(m.hash, hash.get());
  }
  return Status::ok();
}

}  // namespace

DType flux_model_dtype(const FluxLoadOptions& o) { return o.dtype.value_or(default_model_dtype(o.device)); }

DType flux_text_dtype(const FluxLoadOptions& o) { return o.dtype.value_or(DType::F32); }

DType flux_vae_dtype(const FluxLoadOptions& o) {
  const DType dt = flux_model_dtype(o);
  return dt == DType::F16 ? DType::F32 : dt;
}

bool is_flux_model(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    auto j = read_json_file((fs::path(path) / "model_index.json").string());
    if (!j || !j->is_object()) return false;
    const auto cls = j->find("_class_name");  // any type: a folder is probed before its files are checked
    return cls != j->end() && cls->is_string() && *cls == kPipelineClass;
  }
  if (fs::path(path).extension() != ".safetensors" || !fs::is_regular_file(path, ec)) return false;
  auto store = WeightStore::open({path});
  return store && flux_bfl_prefix(*store).has_value();
}

Expected<std::shared_ptr<FluxModel>> load_flux_model(const std::string& path, const FluxLoadOptions& o) {
  auto m = std::make_shared<FluxModel>();
  m->path = path;
  m->name = fs::path(path).filename().replace_extension().string();
  Status st = catch_status([&] {
    return fs::is_directory(path) ? load_diffusers(*m, path, o) : load_bfl(*m, path, o);
  });
  if (!st) return st;
  return m;
}

}  // namespace atelier
