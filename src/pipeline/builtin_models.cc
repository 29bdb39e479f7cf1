#include "pipeline/builtin_models.h"

#include <string_view>

namespace atelier {
namespace {

constexpr int kSd15Size = 512;
constexpr int kSd21Size = 768;
constexpr int kOpenClipHWidth = 1024;   // SD 2.x context width (OpenCLIP ViT-H/14)
constexpr int kSd2HeadChannels = 64;
constexpr uint64_t kVaeSeedOffset = 0x5eed;  // the VAE's weights are not the UNet's stream
constexpr uint64_t kTextSeedOffset = 0x7e47;

// The scheduler config every SD 1.x/2.x repository ships (PNDM defaults with SD's betas).
nlohmann::json sd_scheduler_config(Prediction p) {
  return {{"_class_name", "PNDMScheduler"}, {"num_train_timesteps", 1000}, {"beta_start", 0.00085},
          {"beta_end", 0.012}, {"beta_schedule", "scaled_linear"}, {"steps_offset", 1},
          {"clip_sample", false}, {"set_alpha_to_one", false}, {"skip_prk_steps", true},
          {"prediction_type", p == Prediction::kV ? "v_prediction" : "epsilon"}};
}

}  // namespace

UNetConfig sd21_unet_config() {
  UNetConfig c = sd15_unet_config();
  c.num_attention_heads.clear();
  for (int ch : c.block_out_channels) c.num_attention_heads.push_back(ch / kSd2HeadChannels);  // 5, 10, 20, 20
  c.cross_attention_dim.assign(c.block_out_channels.size(), kOpenClipHWidth);
  c.use_linear_projection = true;
  c.upcast_attention = true;  // 2.1's config; a precision hint that changes nothing in f32
  c.sample_size = kSd21Size / 8;
  return c;
}

std::vector<std::string> builtin_sd_config_names() { return {"sd15", "sd21"}; }

Expected<BuiltinSdConfig> builtin_sd_config(const std::string& name) {
  BuiltinSdConfig c;
  c.name = name;
  // CLIP ViT-L/14's text tower (SD 1.x); OpenCLIP ViT-H/14's (SD 2.x) is overridden below.
  c.text_encoder.hidden_size = 768;
  c.text_encoder.intermediate_size = 3072;
  c.text_encoder.projection_dim = 768;
  c.text_encoder.num_hidden_layers = 12;
  c.text_encoder.num_attention_heads = 12;
  c.text_encoder.eos_token_id = 2;
  if (name == "sd15") {
    c.description = "Stable Diffusion 1.5 (random weights)";
    c.unet = sd15_unet_config();
    c.default_size = kSd15Size;
  } else if (name == "sd21") {
    c.description = "Stable Diffusion 2.1 768-v (random weights)";
    c.family = SdFamily::kSD2;
    c.prediction = Prediction::kV;
    c.unet = sd21_unet_config();
    c.default_size = kSd21Size;
    // diffusers' converted SD 2.x text encoder: OpenCLIP-H without its last layer (23 of 24), gelu.
    c.text_encoder.hidden_size = kOpenClipHWidth;
    c.text_encoder.intermediate_size = 4096;
    c.text_encoder.projection_dim = 1024;
    c.text_encoder.num_hidden_layers = 23;
    c.text_encoder.num_attention_heads = 16;
    c.text_encoder.hidden_act = UnaryOp::kGelu;
    c.vae.sample_size = kSd21Size;
  } else {
    return invalid_argument("unknown built-in configuration '" + name + "'; known: sd15, sd21");
  }
  return c;
}

std::string builtin_name_of(const std::string& path) {
  constexpr std::string_view kPrefix = "builtin:";
  return path.rfind(kPrefix, 0) == 0 ? path.substr(kPrefix.size()) : std::string();
}

Expected<std::shared_ptr<SdModel>> make_random_sd_model(const BuiltinSdConfig& config, Device device, uint64_t seed,
                                                        const std::string& tokenizer_dir) {
  auto m = std::make_shared<SdModel>();
  m->path = "builtin:" + config.name;
  m->name = config.name + "-random";
  m->layout = "built-in (random weights)";
  m->family = config.family;
  m->prediction = config.prediction;
  m->default_size = config.default_size;
  m->scheduler_config = sd_scheduler_config(config.prediction);
  ATELIER_ASSIGN_OR_RETURN(auto shapes, UNet::parameter_shapes(config.unet));
  for (const auto& [key, shape] : shapes) m->unet_params += numel_of(shape);
  ATELIER_ASSIGN_OR_RETURN(UNet unet, UNet::random(config.unet, seed, device, default_model_dtype(device)));
  m->unet.emplace(std::move(unet));
  ATELIER_ASSIGN_OR_RETURN(Vae vae, Vae::random(config.vae, seed + kVaeSeedOffset, device, default_model_dtype(device)));
  m->vae.emplace(std::move(vae));
  if (!tokenizer_dir.empty()) {
    ATELIER_ASSIGN_OR_RETURN(ClipTokenizer tok, ClipTokenizer::load(tokenizer_dir));
    m->tokenizer.emplace(std::move(tok));
    ATELIER_ASSIGN_OR_RETURN(ClipTextModel te, ClipTextModel::random(config.text_encoder, seed + kTextSeedOffset, device,
                                                                     default_model_dtype(device)));
    m->text_encoder.emplace(std::move(te));
    const ClipTextConfig& t = config.text_encoder;
    m->text_encoder_params = (t.vocab_size + t.max_position_embeddings) * t.hidden_size +
                             t.num_hidden_layers * (4 * (t.hidden_size + 1) * t.hidden_size + 4 * t.hidden_size +
                                                    2 * t.intermediate_size * t.hidden_size + t.intermediate_size + t.hidden_size) +
                             2 * t.hidden_size;
  }
  return m;
}

}  // namespace atelier
