// Z-Image transformer: configuration, layout detection and weight loading (forward: zimage_transformer.cc).
#include "io/json_util.h"
#include "models/zimage/zimage_transformer.h"

namespace atelier {
namespace {

constexpr const char* kContext = "transformer/config.json";
constexpr int64_t kAdaLnMaxDim = 256;      // diffusers' ADALN_EMBED_DIM
constexpr int64_t kTimestepMidDim = 1024;  // the timestep MLP's hidden width
constexpr int64_t kTimestepFreqDim = 256;
constexpr const char* kOriginalPrefix = "model.diffusion_model.";

// Canonical (diffusers) key -> key of the original single file. q/k/v are fused there and are read
// separately (see load_block).
std::string original_key(const std::string& key) {
  std::string k = key;
  auto replace = [&k](const std::string& from, const std::string& to) {
    const size_t at = k.find(from);
    if (at != std::string::npos) k.replace(at, from.size(), to);
  };
  if (k.starts_with("all_x_embedder.")) k = "x_embedder" + k.substr(k.find('.', std::string("all_x_embedder.").size()));
  if (k.starts_with("all_final_layer.")) k = "final_layer" + k.substr(k.find('.', std::string("all_final_layer.").size()));
  replace(".attention.to_out.0.", ".attention.out.");
  replace(".attention.norm_q.", ".attention.q_norm.");
  replace(".attention.norm_k.", ".attention.k_norm.");
  return k;
}

void load_block(WeightLoader w, ZImageLayout layout, const ZImageConfig& c, bool modulation, ZImageBlock& b) {
  const int64_t d = c.dim, hd = c.head_dim(), ff = c.ffn_dim();
  if (layout == ZImageLayout::kOriginal) {
    Tensor qkv;  // [3 dim, dim]: q, k, v stacked
    w.tensor(qkv, "attention.qkv.weight", {3 * d, d});
    if (qkv.defined()) {
      b.to_q.weight = qkv.narrow(0, 0, d);
      b.to_k.weight = qkv.narrow(0, d, d);
      b.to_v.weight = qkv.narrow(0, 2 * d, d);
    }
  } else {
    w.linear(b.to_q, "attention.to_q", d, d, false);
    w.linear(b.to_k, "attention.to_k", d, d, false);
    w.linear(b.to_v, "attention.to_v", d, d, false);
  }
  w.linear(b.to_out, "attention.to_out.0", d, d, false);
  if (c.qk_norm) {
    w.rms_norm(b.norm_q, "attention.norm_q", hd, 1e-5f);  // the attention's own eps, fixed in the reference
    w.rms_norm(b.norm_k, "attention.norm_k", hd, 1e-5f);
  }
  for (auto [norm, name] : {std::pair{&b.attention_norm1, "attention_norm1"}, {&b.attention_norm2, "attention_norm2"},
                            {&b.ffn_norm1, "ffn_norm1"}, {&b.ffn_norm2, "ffn_norm2"}})
    w.rms_norm(*norm, name, d, c.norm_eps);
  w.linear(b.w1, "feed_forward.w1", d, ff, false);
  w.linear(b.w2, "feed_forward.w2", ff, d, false);
  w.linear(b.w3, "feed_forward.w3", d, ff, false);
  if (modulation) w.linear(b.adaLN_modulation, "adaLN_modulation.0", c.adaln_dim(), 4 * d);
}

int count_blocks(const WeightStore& store, const std::string& prefix) {
  int n = 0;
  while (store.any_with_prefix(prefix + std::to_string(n) + ".")) ++n;
  return n;
}

}  // namespace

int64_t ZImageConfig::adaln_dim() const { return std::min(dim, kAdaLnMaxDim); }

Expected<ZImageConfig> ZImageConfig::from_json(const nlohmann::json& j) {
  ZImageConfig c;
  ATELIER_ASSIGN_OR_RETURN(c.in_channels, get_int(j, "in_channels", c.in_channels, kContext));
  ATELIER_ASSIGN_OR_RETURN(c.dim, get_int(j, "dim", c.dim, kContext));
  ATELIER_ASSIGN_OR_RETURN(int64_t layers, get_int(j, "n_layers", c.n_layers, kContext));
  ATELIER_ASSIGN_OR_RETURN(int64_t refiners, get_int(j, "n_refiner_layers", c.n_refiner_layers, kContext));
  ATELIER_ASSIGN_OR_RETURN(int64_t heads, get_int(j, "n_heads", c.n_heads, kContext));
  ATELIER_ASSIGN_OR_RETURN(int64_t kv_heads, get_int(j, "n_kv_heads", heads, kContext));
  if (kv_heads != heads) return unsupported(std::string(kContext) + ": n_kv_heads != n_heads is not supported (the reference ignores it)");
  c.n_layers = int(layers), c.n_refiner_layers = int(refiners), c.n_heads = int(heads);
  ATELIER_ASSIGN_OR_RETURN(double eps, get_number(j, "norm_eps", c.norm_eps, kContext));
  c.norm_eps = float(eps);
  ATELIER_ASSIGN_OR_RETURN(c.qk_norm, get_bool(j, "qk_norm", c.qk_norm, kContext));
  ATELIER_ASSIGN_OR_RETURN(c.cap_feat_dim, get_int(j, "cap_feat_dim", c.cap_feat_dim, kContext));
  ATELIER_ASSIGN_OR_RETURN(c.rope_theta, get_number(j, "rope_theta", c.rope_theta, kContext));
  ATELIER_ASSIGN_OR_RETURN(c.t_scale, get_number(j, "t_scale", c.t_scale, kContext));
  ATELIER_ASSIGN_OR_RETURN(c.axes_dims, get_ints(j, "axes_dims", c.axes_dims, kContext));
  ATELIER_ASSIGN_OR_RETURN(c.axes_lens, get_ints(j, "axes_lens", c.axes_lens, kContext));
  ATELIER_ASSIGN_OR_RETURN(auto patches, get_ints(j, "all_patch_size", {2}, kContext));
  ATELIER_ASSIGN_OR_RETURN(auto f_patches, get_ints(j, "all_f_patch_size", {1}, kContext));
  if (patches.size() != 1 || f_patches.size() != 1)
    return unsupported(std::string(kContext) + ": only one patch size is supported (Z-Image uses patch 2, frame patch 1)");
  c.patch_size = int(patches[0]), c.f_patch_size = int(f_patches[0]);
  if (j.contains("siglip_feat_dim") && !j.at("siglip_feat_dim").is_null())
    return unsupported(std::string(kContext) + ": SigLIP image conditioning (Z-Image Omni) is not supported");
  ATELIER_RETURN_IF_ERROR(c.validate());
  return c;
}

Expected<ZImageConfig> ZImageConfig::from_file(const std::string& path) {
  ATELIER_ASSIGN_OR_RETURN(auto j, read_json_file(path));
  return from_json(j);
}

Status ZImageConfig::validate() const {
  if (dim < 1 || n_heads < 1 || dim % n_heads != 0) return invalid_argument("Z-Image config: dim must be a multiple of n_heads");
  if (axes_dims.size() != 3) return invalid_argument("Z-Image config: axes_dims must have 3 entries");
  int64_t sum = 0;
  for (int64_t a : axes_dims) {
    if (a < 2 || a % 2) return invalid_argument("Z-Image config: axes_dims must be positive and even");
    sum += a;
  }
  if (sum != head_dim())
    return invalid_argument("Z-Image config: axes_dims sum to " + std::to_string(sum) + ", the head size is " + std::to_string(head_dim()));
  if (patch_size < 1 || f_patch_size < 1 || in_channels < 1 || cap_feat_dim < 1 || n_layers < 0 || n_refiner_layers < 0)
    return invalid_argument("Z-Image config: sizes must be positive");
  return Status::ok();
}

Expected<ZImageLayout> detect_zimage_layout(const WeightStore& store, std::string* prefix) {
  for (const std::string p : {"", kOriginalPrefix}) {
    if (store.contains(p + "x_embedder.weight") && store.contains(p + "cap_pad_token")) {
      if (prefix) *prefix = p;
      return ZImageLayout::kOriginal;
    }
  }
  if (store.any_with_prefix("all_x_embedder.") && store.contains("cap_pad_token")) {
    if (prefix) *prefix = "";
    return ZImageLayout::kDiffusers;
  }
  return unsupported("not a Z-Image transformer: neither 'all_x_embedder.*' (diffusers) nor 'x_embedder.weight' (original) "
                     "with 'cap_pad_token' found");
}

bool is_zimage_transformer(const WeightStore& store) { return detect_zimage_layout(store).has_value(); }

Expected<ZImageConfig> ZImageConfig::detect(const WeightStore& store) {
  std::string prefix;
  ATELIER_ASSIGN_OR_RETURN(ZImageLayout layout, detect_zimage_layout(store, &prefix));
  ZImageConfig c;
  std::string embed = prefix + "x_embedder.weight";
  if (layout == ZImageLayout::kDiffusers)
    for (const auto& k : store.keys_with_prefix("all_x_embedder."))
      if (k.ends_with(".weight")) embed = k;
  const Shape xe = *store.shape(embed);
  const Shape cap = *store.shape(prefix + "cap_embedder.1.weight");
  const std::string qn = layout == ZImageLayout::kOriginal ? "layers.0.attention.q_norm.weight" : "layers.0.attention.norm_q.weight";
  c.dim = xe[0];
  c.in_channels = xe[1] / int64_t(c.patch_size * c.patch_size * c.f_patch_size);
  c.cap_feat_dim = cap[1];
  c.n_layers = count_blocks(store, prefix + "layers.");
  c.n_refiner_layers = count_blocks(store, prefix + "noise_refiner.");
  c.qk_norm = store.contains(prefix + qn);
  const int64_t hd = c.qk_norm ? (*store.shape(prefix + qn))[0] : 128;
  c.n_heads = int(c.dim / hd);
  if (hd != 128) c.axes_dims = {hd / 4, hd * 3 / 8, hd * 3 / 8};  // Z-Image's split of 128: 32, 48, 48
  ATELIER_RETURN_IF_ERROR(c.validate());
  return c;
}

Expected<ZImageTransformer> ZImageTransformer::load(const WeightStore& store, const ZImageConfig& config, Device device,
                                                    DType dtype) {
  ATELIER_RETURN_IF_ERROR(config.validate());
  if (!backend_available(device)) return unsupported("Z-Image transformer: device " + device.str() + " is not available");
  if (device.is_cpu() && dtype != DType::F32)
    return unsupported("Z-Image transformer: the CPU backend computes in f32, not " + std::string(dtype_name(dtype)));
  std::string prefix;
  ATELIER_ASSIGN_OR_RETURN(ZImageLayout layout, detect_zimage_layout(store, &prefix));
  ZImageTransformer m;
  m.config_ = config;
  m.device_ = device;
  m.dtype_ = dtype;
  const KeyMap map = layout == ZImageLayout::kOriginal ? KeyMap(original_key) : KeyMap();
  WeightLoader w(store, device, dtype, map, prefix);
  const ZImageConfig& c = config;
  const int64_t d = c.dim, patch_in = int64_t(c.f_patch_size) * c.patch_size * c.patch_size * c.in_channels;
  const std::string patch_key = std::to_string(c.patch_size) + "-" + std::to_string(c.f_patch_size);
  w.linear(m.x_embedder_, "all_x_embedder." + patch_key, patch_in, d);
  w.linear(m.t_mlp0_, "t_embedder.mlp.0", kTimestepFreqDim, kTimestepMidDim);
  w.linear(m.t_mlp2_, "t_embedder.mlp.2", kTimestepMidDim, c.adaln_dim());
  w.rms_norm(m.cap_norm_, "cap_embedder.0", c.cap_feat_dim, c.norm_eps);
  w.linear(m.cap_linear_, "cap_embedder.1", c.cap_feat_dim, d);
  w.tensor(m.x_pad_token_, "x_pad_token", {1, d});
  w.tensor(m.cap_pad_token_, "cap_pad_token", {1, d});
  auto blocks = [&](std::vector<ZImageBlock>& out, const std::string& name, int n, bool modulation) {
    out.resize(size_t(n));
    for (int i = 0; i < n; ++i) load_block(w.scope(name + "." + std::to_string(i)), layout, c, modulation, out[size_t(i)]);
  };
  blocks(m.noise_refiner_, "noise_refiner", c.n_refiner_layers, true);
  blocks(m.context_refiner_, "context_refiner", c.n_refiner_layers, false);
  blocks(m.layers_, "layers", c.n_layers, true);
  w.linear(m.final_adaLN_, "all_final_layer." + patch_key + ".adaLN_modulation.1", c.adaln_dim(), d);
  w.linear(m.final_linear_, "all_final_layer." + patch_key + ".linear", d, patch_in);
  ATELIER_RETURN_IF_ERROR(w.finish());
  ATELIER_RETURN_IF_ERROR(catch_status([&] {
    m.stack_projections();
    return Status::ok();
  }));
  return m;
}

}  // namespace atelier
