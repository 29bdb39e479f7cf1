// The built-in FLUX.1-dev and Z-Image-Turbo configurations and their random-weight models. The transformers
// are built by their normal loaders reading a synthetic WeightStore whose tensors are made on the target
// device: a block of seeded uniform values is uploaded once and every weight is a window of it (wrapping at
// a per-key offset), scaled as PyTorch's default initialisation would (uniform in +-1/sqrt(fan_in)). The
// figures depend only on shapes; the values only have to be finite and not degenerate.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>

#include "backend/ops.h"
#include "pipeline/builtin_models.h"
#include "pipeline/flux_pipeline.h"

namespace atelier {
namespace {

constexpr int kDitSize = 1024;
constexpr int kFluxSteps = 28;
constexpr int kZImageSteps = 8;             // Z-Image-Turbo's 8 transformer evaluations (turbo: no CFG)
constexpr int64_t kFluxT5Tokens = 512;      // FluxPipeline's max_sequence_length
constexpr int64_t kZImageTextTokens = 128;  // a typical chat-templated prompt's length (the features are unpadded)
constexpr int64_t kPoolSize = (int64_t(1) << 22) + 1021;  // values in the shared random block (not a power of two)
constexpr float kSmallBound = 0.02f;        // biases and learned tokens
constexpr uint64_t kVaeSeedOffset = 0x5eed;
constexpr int64_t kTimeFeatures = 256;      // sinusoidal timestep features of both models
constexpr int64_t kZImageTimeMid = 1024;    // Z-Image's timestep MLP width

int64_t linear_params(int64_t in, int64_t out, bool bias = true) { return in * out + (bias ? out : 0); }

// A generator of seeded random tensors directly on `device` (see the file comment).
class RandomWeights {
 public:
  RandomWeights(uint64_t seed, Device device, DType dtype) : seed_(seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(kPoolSize));
    for (float& x : v) x = dist(rng);
    Tensor pool = Tensor::from_vector(v, {kPoolSize});
    if (dtype != DType::F32) pool = ops::cast(pool, dtype);
    pool_ = device.is_cpu() ? pool : pool.to(device);
  }

  // key's tensor of `shape`: RMS/layer norm weights (rank 1, ".weight") ones; [out, in] weights uniform in
  // +-1/sqrt(in); everything else (biases, pad tokens) uniform in +-kSmallBound.
  Tensor make(const std::string& key, const Shape& shape, Device device, DType dtype) {
    params_ += numel_of(shape);
    const bool weight = key.size() >= 7 && key.compare(key.size() - 7, 7, ".weight") == 0;
    if (weight && shape.size() == 1) {
      Tensor ones = Tensor::full(shape, 1.0f, device);
      return dtype == DType::F32 ? ones : ops::cast(ones, dtype);
    }
    const float bound = weight && shape.size() == 2 ? 1.0f / std::sqrt(float(shape[1])) : kSmallBound;
    const int64_t n = numel_of(shape);
    int64_t at = int64_t((std::hash<std::string>{}(key) ^ seed_) % uint64_t(kPoolSize));
    std::vector<Tensor> pieces;
    for (int64_t left = n; left > 0;) {
      const int64_t len = std::min(left, kPoolSize - at);
      pieces.push_back(pool_.narrow(0, at, len));
      left -= len;
      at = 0;
    }
    Tensor flat = pieces.size() == 1 ? pieces[0] : ops::concat(pieces, 0);
    Tensor t = ops::affine(flat, bound);  // a packed copy of its own
    if (t.dtype() != dtype) t = ops::cast(t, dtype);
    return t.reshape(shape);
  }

  int64_t params() const { return params_; }

 private:
  uint64_t seed_;
  Tensor pool_;
  int64_t params_ = 0;
};

// Runs `build` (which allocates the model) turning an allocation failure into a readable error.
template <typename T>
Expected<T> build_or_explain(const std::string& what, Device device, int64_t params, DType dtype,
                             const std::function<Expected<T>()>& build) {
  Expected<T> out = internal_error("not built");
  Status st = catch_status([&]() -> Status {
    out = build();
    return out.status();
  });
  if (st.is_ok()) return out;
  const double gib = double(params) * double(dtype_size(dtype)) / (1024.0 * 1024.0 * 1024.0);
  char need[64];
  std::snprintf(need, sizeof(need), "%.1f GiB", gib);
  return Status(st.code(), what + " (" + std::to_string(params) + " parameters, " + need + " in " +
                               std::string(dtype_name(dtype)) + ") could not be built on " + device.str() + ": " +
                               st.message());
}

// Host memory a process may still take (MemAvailable), 0 when unknown.
uint64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// The CPU backend allocates from the host, where running out kills the process instead of failing an
// allocation: refuse up front when the weights alone do not fit.
Status check_host_memory(const std::string& what, Device device, int64_t params, DType dtype) {
  if (!device.is_cpu()) return Status::ok();  // device allocators report failure as an error
  const uint64_t need = uint64_t(params) * dtype_size(dtype), have = host_available_bytes();
  if (have == 0 || need < have) return Status::ok();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  char buf[160];
  std::snprintf(buf, sizeof(buf), " needs %.1f GiB for its weights in %s; this machine has %.1f GiB available",
                double(need) / kGiB, std::string(dtype_name(dtype)).c_str(), double(have) / kGiB);
  return Status(ErrorCode::kResourceExhausted, what + buf + " (run it on a GPU: --device cuda)");
}

}  // namespace

VaeConfig flux_vae_config() {
  VaeConfig v;
  v.latent_channels = 16;
  v.scaling_factor = 0.3611f;
  v.shift_factor = 0.1159f;
  v.use_quant_conv = false;
  v.use_post_quant_conv = false;
  v.sample_size = kDitSize;
  return v;
}

std::vector<std::string> builtin_dit_config_names() { return {"flux", "zimage"}; }

bool is_builtin_dit_config(const std::string& name) { return name == "flux" || name == "zimage"; }

Expected<BuiltinDitConfig> builtin_dit_config(const std::string& name) {
  BuiltinDitConfig c;
  c.name = name;
  c.vae = flux_vae_config();
  c.default_size = kDitSize;
  if (name == "flux") {
    c.description = "FLUX.1-dev (random weights)";
    c.flux = FluxConfig{};  // the defaults are FLUX.1-dev's transformer/config.json
    c.default_steps = kFluxSteps;
    c.guidance = kFluxDefaultGuidance;
    c.text_tokens = kFluxT5Tokens;
    c.text_width = c.flux->joint_attention_dim;
    c.pooled_width = c.flux->pooled_projection_dim;
  } else if (name == "zimage") {
    c.description = "Z-Image-Turbo (random weights)";
    c.zimage = ZImageConfig{};  // the defaults are Tongyi-MAI/Z-Image-Turbo's transformer/config.json
    c.default_steps = kZImageSteps;
    c.guidance = 0.0f;
    c.text_tokens = kZImageTextTokens;
    c.text_width = c.zimage->cap_feat_dim;
    c.pooled_width = 0;
    // Qwen3-4B's config.json (Z-Image-Turbo's text_encoder): 36 layers, width 2560, GQA 32/8 heads of 128.
    Qwen3Config q;
    q.hidden_size = c.zimage->cap_feat_dim;
    q.intermediate_size = 9728;
    q.num_hidden_layers = 36;
    q.num_attention_heads = 32;
    q.num_key_value_heads = 8;
    q.head_dim = 128;
    q.rope_theta = 1000000.0;
    q.max_position_embeddings = 40960;
    c.qwen3 = q;
  } else {
    return invalid_argument("unknown built-in configuration '" + name + "'; known: sd15, sd21, flux, zimage");
  }
  return c;
}

int64_t flux_transformer_params(const FluxConfig& c) {
  const int64_t d = c.inner_dim(), hd = c.head_dim, mlp = c.mlp_dim();
  auto embedder = [&](int64_t in) { return linear_params(in, d) + linear_params(d, d); };
  int64_t n = linear_params(c.in_channels, d) + linear_params(c.joint_attention_dim, d) + embedder(kTimeFeatures) +
              (c.guidance_embeds ? embedder(kTimeFeatures) : 0) + embedder(c.pooled_projection_dim);
  const int64_t dbl = 2 * linear_params(d, 6 * d) + 8 * linear_params(d, d) + 4 * hd +
                      2 * (linear_params(d, mlp) + linear_params(mlp, d));
  const int64_t sgl = linear_params(d, 3 * d) + 3 * linear_params(d, d) + 2 * hd + linear_params(d, mlp) +
                      linear_params(d + mlp, d);
  n += c.num_layers * dbl + c.num_single_layers * sgl;
  return n + linear_params(d, 2 * d) + linear_params(d, c.out_channels);
}

int64_t zimage_transformer_params(const ZImageConfig& c) {
  const int64_t d = c.dim, ff = c.ffn_dim(), ad = c.adaln_dim();
  const int64_t patch_in = int64_t(c.f_patch_size) * c.patch_size * c.patch_size * c.in_channels;
  const int64_t block = 4 * d * d + (c.qk_norm ? 2 * c.head_dim() : 0) + 4 * d + 3 * d * ff;
  const int64_t modulated = block + linear_params(ad, 4 * d);
  int64_t n = linear_params(patch_in, d) + linear_params(kTimeFeatures, kZImageTimeMid) +
              linear_params(kZImageTimeMid, ad) + c.cap_feat_dim + linear_params(c.cap_feat_dim, d) + 2 * d;
  n += c.n_refiner_layers * (modulated + block) + c.n_layers * modulated;
  return n + linear_params(ad, d) + linear_params(d, patch_in);
}

Expected<std::shared_ptr<FluxModel>> make_random_flux_model(const BuiltinDitConfig& config, Device device, uint64_t seed,
                                                            int64_t* params, bool fp8) {
  if (!config.flux) return invalid_argument("'" + config.name + "' is not a FLUX configuration");
  const DType dt = default_model_dtype(device);
  ATELIER_RETURN_IF_ERROR(check_host_memory("the FLUX transformer", device, flux_transformer_params(*config.flux), dt));
  using Result = std::shared_ptr<FluxModel>;
  return build_or_explain<Result>("the FLUX transformer", device, flux_transformer_params(*config.flux), dt,
                                  [&]() -> Expected<Result> {
    auto m = std::make_shared<FluxModel>();
    m->path = "builtin:" + config.name;
    m->name = config.name + "-random";
    m->layout = "built-in (random weights)";
    m->default_size = config.default_size;
    // FLUX.1-dev's scheduler_config.json (dynamic shifting between 0.5 and 1.15).
    m->scheduler_json = {{"num_train_timesteps", 1000}, {"shift", 3.0}, {"use_dynamic_shifting", true},
                         {"base_shift", 0.5}, {"max_shift", 1.15}, {"base_image_seq_len", 256},
                         {"max_image_seq_len", 4096}};
    ATELIER_ASSIGN_OR_RETURN(m->scheduler, sampling::parse_flow_match_config(m->scheduler_json));
    auto gen = std::make_shared<RandomWeights>(seed, device, dt);
    const WeightStore store = WeightStore::synthetic(
        [gen](const std::string& k, const Shape& s, Device d, DType t) { return gen->make(k, s, d, t); });
    ATELIER_ASSIGN_OR_RETURN(FluxTransformer tr, FluxTransformer::load(store, FluxLayout::kDiffusers, *config.flux, device, dt));
    if (fp8) tr.quantize_fp8();
    m->transformer.emplace(std::move(tr));
    if (params) *params = gen->params();
    ATELIER_ASSIGN_OR_RETURN(Vae vae, Vae::random(config.vae, seed + kVaeSeedOffset, device, dt));
    m->vae.emplace(std::move(vae));
    return m;
  });
}

Expected<Qwen3Encoder> make_random_qwen3_encoder(const Qwen3Config& config, Device device, DType dtype, uint64_t seed,
                                                 int64_t* params) {
  RandomWeights gen(seed, device, dtype);
  const WeightStore store = WeightStore::synthetic(
      [&gen](const std::string& k, const Shape& s, Device d, DType t) { return gen.make(k, s, d, t); });
  auto enc = Qwen3Encoder::load(store, config, device, dtype);
  if (enc && params) *params = gen.params();
  return enc;
}

Expected<std::shared_ptr<ZImageModel>> make_random_zimage_model(const BuiltinDitConfig& config, Device device,
                                                                uint64_t seed, int64_t* params, bool fp8) {
  if (!config.zimage) return invalid_argument("'" + config.name + "' is not a Z-Image configuration");
  const DType dt = default_model_dtype(device);
  ATELIER_RETURN_IF_ERROR(check_host_memory("the Z-Image transformer", device, zimage_transformer_params(*config.zimage), dt));
  using Result = std::shared_ptr<ZImageModel>;
  return build_or_explain<Result>("the Z-Image transformer", device, zimage_transformer_params(*config.zimage), dt,
                                  [&]() -> Expected<Result> {
    auto m = std::make_shared<ZImageModel>();
    m->path = "builtin:" + config.name;
    m->name = config.name + "-random";
    m->layout = "built-in (random weights)";
    m->scheduler.shift = 3.0;  // Z-Image-Turbo's scheduler_config.json: static shift 3, no dynamic shifting
    auto gen = std::make_shared<RandomWeights>(seed, device, dt);
    const WeightStore store = WeightStore::synthetic(
        [gen](const std::string& k, const Shape& s, Device d, DType t) { return gen->make(k, s, d, t); });
    ATELIER_ASSIGN_OR_RETURN(ZImageTransformer tr, ZImageTransformer::load(store, *config.zimage, device, dt));
    if (fp8) tr.quantize_fp8();
    m->transformer = std::make_shared<ZImageTransformer>(std::move(tr));
    if (params) *params = gen->params();
    ATELIER_ASSIGN_OR_RETURN(Vae vae, Vae::random(config.vae, seed + kVaeSeedOffset, device, dt));
    m->vae = std::make_shared<Vae>(std::move(vae));
    return m;
  });
}

}  // namespace atelier
