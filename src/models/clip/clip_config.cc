#include "models/clip/clip_config.h"

#include <limits>

#include "io/json_util.h"
#include "models/common/weights.h"

namespace atelier {

namespace {

// CLIP's attention heads are 64 wide in every published text tower (CLIP-L, OpenCLIP-H, OpenCLIP-bigG).
constexpr int64_t kClipHeadDim = 64;
// transformers pools at argmax(ids) for this eos_token_id (see ClipTextConfig::eos_token_id).
constexpr int64_t kLegacyEosTokenId = 2;

template <typename T>
void read_field(const nlohmann::json& j, const char* name, T& field) {
  read_config_field(j, name, field, "CLIP text encoder config");
}

// Names of the tensors `detect` reads, in one of the two naming schemes.
struct TowerNames {
  std::string token_embedding, position_embedding, layers, fc1, projection;
  UnaryOp act;
  bool projection_transposed;  // OpenCLIP stores [D, proj], transformers [proj, D]
};

TowerNames hf_names(const std::string& prefix) {
  // CLIPTextModelWithProjection keeps its projection beside "text_model.", not inside it.
  const std::string tower = "text_model.";
  std::string root = prefix;
  if (root.size() >= tower.size() && root.compare(root.size() - tower.size(), tower.size(), tower) == 0)
    root.resize(root.size() - tower.size());
  return {prefix + "embeddings.token_embedding.weight", prefix + "embeddings.position_embedding.weight",
          prefix + "encoder.layers.", "mlp.fc1.weight", root + "text_projection.weight", UnaryOp::kQuickGelu, false};
}

TowerNames openclip_names(const std::string& prefix) {
  return {prefix + "token_embedding.weight", prefix + "positional_embedding", prefix + "transformer.resblocks.",
          "mlp.c_fc.weight", prefix + "text_projection", UnaryOp::kGelu, true};
}

// Highest N + 1 over keys "<layers>N.*"; 0 when there are none.
int count_layers(const WeightStore& store, const std::string& layers_prefix) {
  int count = 0;
  for (const auto& key : store.keys_with_prefix(layers_prefix)) {
    const std::string rest = key.substr(layers_prefix.size());
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos) continue;
    try {
      size_t used = 0;
      const int n = std::stoi(rest.substr(0, dot), &used);
      if (used == dot && n >= 0 && n < std::numeric_limits<int>::max() && n + 1 > count) count = n + 1;
    } catch (const std::exception&) {  // not a layer index: ignore the key
    }
  }
  return count;
}

Expected<Shape> matrix_shape(const WeightStore& store, const std::string& key) {
  auto s = store.shape(key);
  if (!s) return not_found("CLIP text encoder: tensor '" + key + "' is missing");
  if (s->size() != 2) return corrupt("CLIP text encoder: tensor '" + key + "' has shape " + shape_str(*s) + ", expected 2 dims");
  return *s;
}

Expected<int> infer_heads(int64_t hidden, int fallback_heads) {
  if (hidden % kClipHeadDim == 0) return int(hidden / kClipHeadDim);
  if (fallback_heads > 0 && hidden % fallback_heads == 0) return fallback_heads;
  return invalid_argument("CLIP text encoder: cannot infer the head count for hidden size " + std::to_string(hidden) +
                          " (not a multiple of 64) without a config; supply it (fallback heads " +
                          std::to_string(fallback_heads) + " does not divide it)");
}

}  // namespace

Expected<UnaryOp> clip_activation_from_name(const std::string& name) {
  if (name == "quick_gelu") return UnaryOp::kQuickGelu;
  if (name == "gelu") return UnaryOp::kGelu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return UnaryOp::kGeluTanh;
  return unsupported("CLIP text encoder: hidden_act '" + name +
                     "' is not supported (supported: quick_gelu, gelu, gelu_new, gelu_pytorch_tanh)");
}

Expected<ClipTextConfig> ClipTextConfig::from_json(const nlohmann::json& root) {
  if (!root.is_object()) return invalid_argument("CLIP text encoder config: expected a JSON object");
  // A full CLIPConfig nests the text tower's settings.
  const nlohmann::json& j = root.contains("text_config") ? root.at("text_config") : root;
  ClipTextConfig c;
  std::string act = "quick_gelu";
  try {
    read_field(j, "vocab_size", c.vocab_size);
    read_field(j, "hidden_size", c.hidden_size);
    read_field(j, "intermediate_size", c.intermediate_size);
    read_field(j, "projection_dim", c.projection_dim);
    read_field(j, "num_hidden_layers", c.num_hidden_layers);
    read_field(j, "num_attention_heads", c.num_attention_heads);
    read_field(j, "max_position_embeddings", c.max_position_embeddings);
    read_field(j, "layer_norm_eps", c.layer_norm_eps);
    read_field(j, "eos_token_id", c.eos_token_id);
    read_field(j, "hidden_act", act);
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("CLIP text encoder config: a field has the wrong type: ") + e.what());
  } catch (const Error& e) {  // an integer that does not fit (ConfigValue)
    return e.status();
  }
  ATELIER_ASSIGN_OR_RETURN(c.hidden_act, clip_activation_from_name(act));
  ATELIER_RETURN_IF_ERROR(c.validate());
  return c;
}

Expected<ClipTextConfig> ClipTextConfig::from_file(const std::string& path) {
  ATELIER_ASSIGN_OR_RETURN(const nlohmann::json j, read_json_file(path));
  auto c = from_json(j);
  if (!c) return Status(c.status().code(), c.status().message() + " (in '" + path + "')");
  return c;
}

Expected<ClipTextConfig> ClipTextConfig::detect(const WeightStore& store, const std::string& prefix, int fallback_heads) {
  TowerNames n = hf_names(prefix);
  if (!store.contains(n.token_embedding)) n = openclip_names(prefix);
  if (!store.contains(n.token_embedding))
    return not_found("no CLIP text encoder under '" + prefix + "' (looked for '" + prefix +
                     "embeddings.token_embedding.weight' and '" + prefix + "token_embedding.weight')");
  ClipTextConfig c;
  ATELIER_ASSIGN_OR_RETURN(Shape tok, matrix_shape(store, n.token_embedding));
  ATELIER_ASSIGN_OR_RETURN(Shape pos, matrix_shape(store, n.position_embedding));
  c.vocab_size = tok[0];
  c.hidden_size = tok[1];
  c.max_position_embeddings = pos[0];
  c.num_hidden_layers = count_layers(store, n.layers);
  if (c.num_hidden_layers == 0) return not_found("CLIP text encoder: no layers under '" + n.layers + "'");
  ATELIER_ASSIGN_OR_RETURN(Shape fc1, matrix_shape(store, n.layers + "0." + n.fc1));
  c.intermediate_size = fc1[0];
  ATELIER_ASSIGN_OR_RETURN(c.num_attention_heads, infer_heads(c.hidden_size, fallback_heads));
  c.hidden_act = n.act;
  c.layer_norm_eps = 1e-5f;  // every CLIP text tower (torch's LayerNorm default)
  // Both the original CLIP/OpenCLIP code and SD 1.x's config pool at argmax(ids).
  c.eos_token_id = kLegacyEosTokenId;
  c.projection_dim = c.hidden_size;  // SD 1.x has no projection; its published config says hidden size
  if (auto proj = store.shape(n.projection); proj && proj->size() == 2) {
    c.projection_dim = n.projection_transposed ? (*proj)[1] : (*proj)[0];
  }
  ATELIER_RETURN_IF_ERROR(c.validate());
  return c;
}

Status ClipTextConfig::validate() const {
  auto bad = [](const std::string& what) { return invalid_argument("CLIP text encoder config: " + what); };
  if (vocab_size <= 0 || hidden_size <= 0 || intermediate_size <= 0 || max_position_embeddings <= 0)
    return bad("vocab_size, hidden_size, intermediate_size and max_position_embeddings must be positive");
  if (num_hidden_layers <= 0) return bad("num_hidden_layers must be positive");
  if (num_hidden_layers > kMaxLayerCount)
    return bad("num_hidden_layers " + std::to_string(num_hidden_layers) + " is more than " + std::to_string(kMaxLayerCount));
  if (num_attention_heads <= 0 || hidden_size % num_attention_heads != 0)
    return bad("num_attention_heads (" + std::to_string(num_attention_heads) + ") must divide hidden_size (" +
               std::to_string(hidden_size) + ")");
  if (!(layer_norm_eps > 0.0f)) return bad("layer_norm_eps must be positive");
  return Status::ok();
}

}  // namespace atelier
