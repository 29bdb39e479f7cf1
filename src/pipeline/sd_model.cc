#include "pipeline/sd_model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "models/common/component_files.h"
#include "pipeline/builtin_models.h"
#include "io/hash.h"
#include "io/json_util.h"
#include "models/sd/unet_config.h"
#include "sampling/scheduler_config.h"

namespace atelier {
namespace fs = std::filesystem;

namespace {

constexpr int kSd1DefaultSize = 512;
constexpr int kSd2DefaultSize = 768;
constexpr int kTinyClipHeadWidth = 8;  // heads of tiny test models whose width is not a multiple of 64

// SD 1.x/2.x scheduler settings for single files, which carry none (the values every SD repo ships).
nlohmann::json default_sd_scheduler_config(Prediction p) {
  return {{"_class_name", "PNDMScheduler"}, {"num_train_timesteps", 1000}, {"beta_start", 0.00085},
          {"beta_end", 0.012}, {"beta_schedule", "scaled_linear"}, {"steps_offset", 1},
          {"clip_sample", false}, {"set_alpha_to_one", false}, {"skip_prk_steps", true},
          {"prediction_type", p == Prediction::kV ? "v_prediction" : "epsilon"}};
}

// A1111's test for SD 2 v-prediction checkpoints: a v model's output at t=999 on a constant input is far
// below the input (it predicts roughly -x), an epsilon model's is not.
Expected<Prediction> detect_prediction(const UNet& unet) {
  constexpr int kProbeSide = 8;
  constexpr float kProbeValue = 0.5f;
  constexpr float kProbeTimestep = 999.0f;
  constexpr double kVThreshold = -1.0;
  const auto& c = unet.config();
  Tensor x = Tensor::full({1, c.in_channels, kProbeSide, kProbeSide}, kProbeValue);
  Tensor t = Tensor::from_vector({kProbeTimestep}, {1});
  Tensor ctx = Tensor::full({1, 77, c.cross_attention_dim[0]}, kProbeValue);
  ATELIER_ASSIGN_OR_RETURN(Tensor out, unet.forward(x.to(unet.device()), t.to(unet.device()), ctx.to(unet.device())));
  double mean = 0;
  for (float v : out.to_vector()) mean += double(v) - kProbeValue;
  mean /= double(out.numel());
  return mean < kVThreshold ? Prediction::kV : Prediction::kEpsilon;
}

Expected<ClipTokenizer> load_tokenizer(const std::vector<std::string>& candidates) {
  for (const auto& dir : candidates) {
    if (dir.empty()) continue;
    if (fs::exists(fs::path(dir) / "vocab.json") || fs::exists(fs::path(dir) / "tokenizer.json"))
      return ClipTokenizer::load(dir);
  }
  return invalid_argument(
      "no CLIP tokenizer found: single-file checkpoints carry none; pass --tokenizer DIR (a folder with "
      "vocab.json and merges.txt, e.g. the tokenizer/ folder of any SD 1.x or 2.x diffusers repo)");
}

DType vae_dtype(const SdLoadOptions& o) {
  const DType dt = o.dtype.value_or(default_model_dtype(o.device));
  return dt == DType::F16 ? DType::F32 : dt;
}

Status load_diffusers(SdModel& m, const fs::path& root, const SdLoadOptions& o) {
  ATELIER_ASSIGN_OR_RETURN(auto index, read_json_file((root / "model_index.json").string()));
  (void)index;
  m.layout = "diffusers";
  ModelHashTask hash(root.string(), o.compute_hash);  // beside the load
  // Text encoder.
  ATELIER_ASSIGN_OR_RETURN(auto te_files, component_weight_files(root / "text_encoder", "model"));
  ATELIER_ASSIGN_OR_RETURN(auto te_store, WeightStore::open(te_files));
  ATELIER_ASSIGN_OR_RETURN(auto te_cfg, ClipTextConfig::from_file((root / "text_encoder" / "config.json").string()));
  ATELIER_ASSIGN_OR_RETURN(auto te, ClipTextModel::load(te_store, ClipLayout::kTransformers, te_cfg, o.device, o.dtype.value_or(default_model_dtype(o.device))));
  m.text_encoder_params = te_store.count_params();
  m.text_encoder.emplace(std::move(te));
  // UNet.
  ATELIER_ASSIGN_OR_RETURN(auto unet_files, component_weight_files(root / "unet", "diffusion_pytorch_model"));
  ATELIER_ASSIGN_OR_RETURN(auto unet_store, WeightStore::open(unet_files));
  ATELIER_ASSIGN_OR_RETURN(auto unet_cfg, load_unet_config((root / "unet" / "config.json").string()));
  ATELIER_ASSIGN_OR_RETURN(auto unet, UNet::load(unet_store, UNetLayout::kDiffusers, unet_cfg, o.device, o.dtype.value_or(default_model_dtype(o.device))));
  m.unet_params = unet_store.count_params();
  m.unet.emplace(std::move(unet));
  // VAE.
  ATELIER_ASSIGN_OR_RETURN(auto vae_files, component_weight_files(root / "vae", "diffusion_pytorch_model"));
  ATELIER_ASSIGN_OR_RETURN(auto vae_store, WeightStore::open(vae_files));
  ATELIER_ASSIGN_OR_RETURN(auto vae_cfg, VaeConfig::from_file((root / "vae" / "config.json").string()));
  ATELIER_ASSIGN_OR_RETURN(auto vae, Vae::load(vae_store, VaeLayout::kDiffusers, vae_cfg, o.device, vae_dtype(o)));
  m.vae_params = vae_store.count_params();
  m.vae.emplace(std::move(vae));
  // Scheduler, tokenizer, family.
  const fs::path sched = root / "scheduler" / "scheduler_config.json";
  if (fs::exists(sched)) {
    // diffusers writes Python's -Infinity / NaN into scheduler configs; parse_config_json accepts them.
    std::ifstream f(sched);
    if (!f) return not_found("cannot read " + sched.string());
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ATELIER_ASSIGN_OR_RETURN(m.scheduler_config, sampling::parse_config_json(text));
  } else {
    m.scheduler_config = default_sd_scheduler_config(Prediction::kEpsilon);
  }
  ATELIER_ASSIGN_OR_RETURN(auto tok, load_tokenizer({(root / "tokenizer").string(), o.tokenizer_dir}));
  m.tokenizer.emplace(std::move(tok));
  m.family = te_cfg.hidden_act == UnaryOp::kGelu ? SdFamily::kSD2 : SdFamily::kSD1;
  const std::string pt = m.scheduler_config.value("prediction_type", std::string("epsilon"));
  m.prediction = pt == "v_prediction" ? Prediction::kV : Prediction::kEpsilon;
  m.default_size = unet_cfg.sample_size * vae_cfg.downscale_factor();
  if (hash.valid()) {
    ATELIER_ASSIGN_OR_RETURN(m.hash, hash.get());
  }
  return Status::ok();
}

Status load_single_file(SdModel& m, const fs::path& file, const SdLoadOptions& o) {
  ATELIER_ASSIGN_OR_RETURN(auto store, WeightStore::open({file.string()}));
  m.layout = "single-file (CompVis)";
  ModelHashTask hash(file.string(), o.compute_hash);  // beside the load
  auto clip_layout = detect_clip_layout(store);
  if (!clip_layout || *clip_layout == ClipLayout::kTransformers)
    return unsupported(file.string() + " is not an SD 1.x/2.x single-file checkpoint: no text encoder under "
                       "cond_stage_model.* (supported: SD 1.x with CLIP, SD 2.x with OpenCLIP)");
  m.family = *clip_layout == ClipLayout::kOpenClip ? SdFamily::kSD2 : SdFamily::kSD1;
  // Text encoder: the head count is not in the shapes; 64-wide heads (CLIP-L, OpenCLIP-H), else 8-wide.
  const std::string te_prefix = clip_tower_prefix(store, *clip_layout);
  int fallback_heads = 0;
  for (const char* emb : {"embeddings.token_embedding.weight", "token_embedding.weight"})
    if (auto s = store.shape(te_prefix + emb); s && s->size() == 2) fallback_heads = int(std::max<int64_t>(1, (*s)[1] / kTinyClipHeadWidth));
  ATELIER_ASSIGN_OR_RETURN(auto te_cfg, ClipTextConfig::detect(store, te_prefix, fallback_heads));
  ATELIER_ASSIGN_OR_RETURN(auto te, ClipTextModel::load(store, *clip_layout, te_cfg, o.device, o.dtype.value_or(default_model_dtype(o.device))));
  m.text_encoder_params = store.count_params(te_prefix);
  m.text_encoder.emplace(std::move(te));
  // UNet.
  const UNetFamily ufam = m.family == SdFamily::kSD2 ? UNetFamily::kSD2 : UNetFamily::kSD1;
  ATELIER_ASSIGN_OR_RETURN(auto unet_cfg, detect_unet_config(store, UNetLayout::kCompVis, ufam));
  ATELIER_ASSIGN_OR_RETURN(auto unet, UNet::load(store, UNetLayout::kCompVis, unet_cfg, o.device, o.dtype.value_or(default_model_dtype(o.device))));
  m.unet_params = store.count_params("model.diffusion_model.");
  m.unet.emplace(std::move(unet));
  // VAE.
  ATELIER_ASSIGN_OR_RETURN(auto vae_cfg, detect_vae_config(store, VaeLayout::kCompVis));
  ATELIER_ASSIGN_OR_RETURN(auto vae, Vae::load(store, VaeLayout::kCompVis, vae_cfg, o.device, vae_dtype(o)));
  m.vae_params = store.count_params("first_stage_model.");
  m.vae.emplace(std::move(vae));
  // Prediction: SD 1.x is epsilon; SD 2.x ships both kinds, told apart by probing the UNet.
  if (m.family == SdFamily::kSD2) {
    ATELIER_ASSIGN_OR_RETURN(m.prediction, detect_prediction(*m.unet));
  } else {
    m.prediction = Prediction::kEpsilon;
  }
  m.default_size = m.family == SdFamily::kSD2 && m.prediction == Prediction::kV ? kSd2DefaultSize : kSd1DefaultSize;
  m.scheduler_config = default_sd_scheduler_config(m.prediction);
  const fs::path sibling = file.parent_path() / "tokenizer";
  auto tok = load_tokenizer({o.tokenizer_dir, sibling.string()});
  if (tok) m.tokenizer.emplace(std::move(*tok));
  else if (o.require_tokenizer) return tok.status();
  if (hash.valid()) {
    ATELIER_ASSIGN_OR_RETURN(m.hash, hash.get());
  }
  return Status::ok();
}

}  // namespace

const char* sd_family_name(SdFamily f) { return f == SdFamily::kSD2 ? "SD 2.x" : "SD 1.x"; }
const char* prediction_name(Prediction p) { return p == Prediction::kV ? "v" : "epsilon"; }

Expected<Prediction> parse_prediction(const std::string& s) {
  if (s == "epsilon" || s == "eps") return Prediction::kEpsilon;
  if (s == "v" || s == "v_prediction") return Prediction::kV;
  return invalid_argument("unknown prediction '" + s + "': supported are epsilon and v");
}

}  // namespace atelier

namespace atelier {

DType default_model_dtype(Device device) { return device.is_cpu() ? DType::F32 : DType::BF16; }

Expected<ModelDtype> parse_model_dtype(const std::string& name) {
  if (name == "auto") return ModelDtype{};
  if (name == "fp8") return ModelDtype{std::nullopt, true};
  if (name == "f32") return ModelDtype{DType::F32, false};
  if (name == "bf16") return ModelDtype{DType::BF16, false};
  if (name == "f16") return ModelDtype{DType::F16, false};
  std::string supported;
  for (const char* n : kModelDtypeNames) supported += (supported.empty() ? "" : ", ") + std::string(n);
  return invalid_argument("--dtype: '" + name + "' is not supported; supported: " + supported);
}

Expected<std::shared_ptr<SdModel>> load_sd_model(const std::string& path, const SdLoadOptions& options) {
  auto m = std::make_shared<SdModel>();
  const fs::path p(path);
  m->path = path;
  m->name = (fs::is_directory(p) ? p.filename() : p.stem()).string();
  if (m->name.empty()) m->name = p.parent_path().filename().string();
  if (const std::string builtin = builtin_name_of(path); !builtin.empty()) {
    // A built-in full-size configuration with random weights (benchmarks, server load tests).
    ATELIER_ASSIGN_OR_RETURN(BuiltinSdConfig c, builtin_sd_config(builtin));
    if (options.tokenizer_dir.empty())
      return invalid_argument(path + " needs a CLIP tokenizer folder (--tokenizer DIR) to encode prompts");
    return make_random_sd_model(c, options.device, 0, options.tokenizer_dir);
  }
  Status st = catch_status([&]() -> Status {
    if (fs::is_directory(p)) {
      if (!fs::exists(p / "model_index.json"))
        return invalid_argument(path + " is a folder without model_index.json: supported are diffusers folders and .safetensors files");
      return load_diffusers(*m, p, options);
    }
    if (!fs::exists(p)) return not_found("model " + path + " does not exist");
    if (p.extension() != ".safetensors")
      return unsupported(path + ": only .safetensors checkpoints are supported (pickled .ckpt/.bin files can run code; convert them first)");
    return load_single_file(*m, p, options);
  });
  if (!st.is_ok()) return st;
  if (!options.prediction.empty()) {
    ATELIER_ASSIGN_OR_RETURN(m->prediction, parse_prediction(options.prediction));
    m->prediction_detected = false;
    m->scheduler_config["prediction_type"] = m->prediction == Prediction::kV ? "v_prediction" : "epsilon";
  }
  return m;
}

nlohmann::json describe_sd_model(const SdModel& m) {
  const auto& u = m.unet->config();
  const auto& v = m.vae->config();
  const auto& t = m.text_encoder->config();
  return {
      {"path", m.path}, {"name", m.name}, {"family", sd_family_name(m.family)}, {"layout", m.layout},
      {"hash", m.hash}, {"prediction", prediction_name(m.prediction)},
      {"prediction_source", m.prediction_detected ? "detected" : "override"}, {"default_size", m.default_size},
      {"text_encoder", {{"hidden_size", t.hidden_size}, {"layers", t.num_hidden_layers}, {"heads", t.num_attention_heads},
                        {"activation", t.hidden_act == UnaryOp::kGelu ? "gelu" : "quick_gelu"},
                        {"default_clip_skip", m.text_encoder->default_skip()}, {"parameters", m.text_encoder_params}}},
      {"unet", {{"block_out_channels", u.block_out_channels}, {"layers_per_block", u.layers_per_block},
                {"attention_heads", u.num_attention_heads}, {"cross_attention_dim", u.cross_attention_dim},
                {"use_linear_projection", u.use_linear_projection}, {"parameters", m.unet_params}}},
      {"vae", {{"block_out_channels", v.block_out_channels}, {"latent_channels", v.latent_channels},
               {"scaling_factor", v.scaling_factor}, {"parameters", m.vae_params}}},
      {"scheduler", m.scheduler_config},
      {"parameters_total", m.text_encoder_params + m.unet_params + m.vae_params}};
}

}  // namespace atelier
