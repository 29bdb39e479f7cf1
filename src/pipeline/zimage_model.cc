// Loading a Z-Image model: a diffusers folder, or the original single-file transformer plus a folder with
// the other components.
#include <filesystem>

#include "models/common/component_files.h"
#include "io/json_util.h"
#include "pipeline/sd_model.h"
#include "pipeline/zimage_pipeline.h"

#include "backend/backend.h"
#include "core/trace.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;
constexpr const char* kPipelineClass = "ZImagePipeline";

DType model_dtype(const ZImageLoadOptions& o) { return o.dtype.value_or(default_model_dtype(o.device)); }
DType vae_dtype(const ZImageLoadOptions& o) { return model_dtype(o) == DType::F16 ? DType::F32 : model_dtype(o); }

bool is_zimage_folder(const fs::path& dir) {
  auto j = read_json_file((dir / "model_index.json").string());
  if (!j || !j->is_object()) return false;
  const auto cls = j->find("_class_name");  // any type: a folder is probed before its files are checked
  return cls != j->end() && cls->is_string() && *cls == kPipelineClass;
}

// Tokenizer, text encoder, VAE and scheduler of a Z-Image diffusers folder.
Status load_components(ZImageModel& m, const fs::path& root, const ZImageLoadOptions& o) {
  ATELIER_ASSIGN_OR_RETURN(m.tokenizer, QwenTokenizer::load((root / "tokenizer").string()));
  if (m.tokenizer.chat_template().empty())
    return not_found((root / "tokenizer").string() + " has no chat template (chat_template.jinja or tokenizer_config.json)");
  ATELIER_ASSIGN_OR_RETURN(auto te_files, component_weight_files(root / "text_encoder", "model"));
  ATELIER_ASSIGN_OR_RETURN(auto te_cfg, Qwen3Config::from_file((root / "text_encoder" / "config.json").string()));
  const Device device = o.device;
  m.text_encoder = std::make_shared<ZImageTextEncoder>(
      [te_files, te_cfg, device]() -> Expected<Qwen3Encoder> {
        ATELIER_ASSIGN_OR_RETURN(auto te_store, WeightStore::open(te_files));
        return Qwen3Encoder::load(te_store, te_cfg, device);
      },
      o.offload);
  ATELIER_RETURN_IF_ERROR(m.text_encoder->load());
  ATELIER_ASSIGN_OR_RETURN(auto vae_files, component_weight_files(root / "vae", "diffusion_pytorch_model"));
  ATELIER_ASSIGN_OR_RETURN(auto vae_store, WeightStore::open(vae_files));
  ATELIER_ASSIGN_OR_RETURN(auto vae_cfg, VaeConfig::from_file((root / "vae" / "config.json").string()));
  ATELIER_ASSIGN_OR_RETURN(auto vae, Vae::load(vae_store, VaeLayout::kDiffusers, vae_cfg, o.device, vae_dtype(o)));
  m.vae = std::make_shared<Vae>(std::move(vae));
  ATELIER_ASSIGN_OR_RETURN(auto sched, read_json_file((root / "scheduler" / "scheduler_config.json").string()));
  ATELIER_ASSIGN_OR_RETURN(m.scheduler, sampling::parse_flow_match_config(sched));
  return Status::ok();
}

}  // namespace

Status ZImageTextEncoder::load_locked() {
  if (encoder_) return Status::ok();
  trace::Scope range("load_text_encoder", trace::Category::kStage);
  ATELIER_ASSIGN_OR_RETURN(auto e, load_());
  encoder_.emplace(std::move(e));
  return Status::ok();
}

Status ZImageTextEncoder::load() {
  std::lock_guard<std::mutex> lock(mu_);
  return load_locked();
}

Status ZImageTextEncoder::with_encoder(const std::function<Status(const Qwen3Encoder&)>& fn) {
  std::lock_guard<std::mutex> lock(mu_);
  ATELIER_RETURN_IF_ERROR(load_locked());
  const Status st = fn(*encoder_);
  if (offload_) {
    const Device dev = encoder_->device();
    encoder_.reset();
    backend_for(dev).release_cached();
  }
  return st;
}

bool ZImageTextEncoder::resident() const {
  std::lock_guard<std::mutex> lock(mu_);
  return encoder_.has_value();
}

bool is_zimage_model(const std::string& path) {
  const fs::path p(path);
  if (fs::is_directory(p)) return is_zimage_folder(p);
  if (p.extension() != ".safetensors" || !fs::exists(p)) return false;
  auto store = WeightStore::open({path});
  return store && is_zimage_transformer(*store);
}

Expected<std::shared_ptr<const ZImageModel>> load_zimage_model(const std::string& path, const ZImageLoadOptions& o) {
  auto m = std::make_shared<ZImageModel>();
  Status st = catch_status([&]() -> Status {
    const fs::path p(path);
    m->path = path;
    m->max_sequence_length = o.max_sequence_length;
    fs::path components;
    std::vector<std::string> transformer_files;
    std::optional<ZImageConfig> config;
    if (fs::is_directory(p)) {
      if (!is_zimage_folder(p)) return invalid_argument(path + " is not a Z-Image folder (model_index.json _class_name is not ZImagePipeline)");
      components = p;
      m->name = p.filename().string();
      m->layout = "diffusers";
      ATELIER_ASSIGN_OR_RETURN(transformer_files, component_weight_files(p / "transformer", "diffusion_pytorch_model"));
    } else {
      if (o.components_dir.empty() || !is_zimage_folder(o.components_dir))
        return invalid_argument("a single-file Z-Image transformer needs the other components: give a Z-Image diffusers "
                                "folder (tokenizer, text_encoder, vae, scheduler) as the components folder");
      components = o.components_dir;
      m->name = p.stem().string();
      m->layout = "original";
      transformer_files = {path};
    }
    ATELIER_RETURN_IF_ERROR(load_components(*m, components, o));
    ATELIER_ASSIGN_OR_RETURN(auto store, WeightStore::open(transformer_files));
    const fs::path cfg_path = components / "transformer" / "config.json";
    if (fs::exists(cfg_path)) {
      ATELIER_ASSIGN_OR_RETURN(config, ZImageConfig::from_file(cfg_path.string()));
    } else {
      ATELIER_ASSIGN_OR_RETURN(config, ZImageConfig::detect(store));
    }
    ATELIER_ASSIGN_OR_RETURN(auto transformer, ZImageTransformer::load(store, *config, o.device, model_dtype(o)));
    if (o.fp8) transformer.quantize_fp8();
    m->transformer = std::make_shared<ZImageTransformer>(std::move(transformer));
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return std::shared_ptr<const ZImageModel>(m);
}

}  // namespace atelier
