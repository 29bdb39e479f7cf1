// ClipTextModel::random: a CLIP text encoder of any configuration with seeded random weights, for benchmarks
// and for serving the built-in full-size configurations without a download. The weights are written in
// transformers' layout to a temporary safetensors file and loaded through the normal loader, so a random
// model is built by exactly the code that builds a real one.
#include <atomic>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>

#include "io/safetensors.h"
#include "models/clip/clip_text_model.h"

namespace atelier {

namespace {

constexpr float kInitStd = 0.02f;  // CLIP's initializer_range
constexpr uint64_t kStreamStride = 0x9e3779b97f4a7c15ull;

// Uniform values with standard deviation kInitStd (a uniform of half-width std * sqrt(3)), as f16.
Tensor random_weight(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const float bound = kInitStd * std::sqrt(3.0f);
  std::uniform_real_distribution<float> dist(-bound, bound);
  std::vector<float> v(size_t(numel_of(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape);
}

Tensor constant(const Shape& shape, float value) { return Tensor::full(shape, value); }

// Every tensor of a transformers CLIPTextModel of `c`, with the `text_model.` prefix.
std::vector<std::pair<std::string, Tensor>> random_state(const ClipTextConfig& c, uint64_t seed) {
  std::vector<std::pair<std::string, Tensor>> t;
  uint64_t stream = seed;
  auto weight = [&](const std::string& key, const Shape& shape) { t.emplace_back(key, random_weight(shape, stream += kStreamStride)); };
  const int64_t d = c.hidden_size, ff = c.intermediate_size;
  weight("text_model.embeddings.token_embedding.weight", {c.vocab_size, d});
  weight("text_model.embeddings.position_embedding.weight", {c.max_position_embeddings, d});
  auto norm = [&](const std::string& key) {
    t.emplace_back(key + ".weight", constant({d}, 1.0f));
    t.emplace_back(key + ".bias", constant({d}, 0.0f));
  };
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = "text_model.encoder.layers." + std::to_string(i);
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      weight(l + ".self_attn." + proj + ".weight", {d, d});
      t.emplace_back(l + ".self_attn." + proj + ".bias", constant({d}, 0.0f));
    }
    norm(l + ".layer_norm1");
    norm(l + ".layer_norm2");
    weight(l + ".mlp.fc1.weight", {ff, d});
    t.emplace_back(l + ".mlp.fc1.bias", constant({ff}, 0.0f));
    weight(l + ".mlp.fc2.weight", {d, ff});
    t.emplace_back(l + ".mlp.fc2.bias", constant({d}, 0.0f));
  }
  norm("text_model.final_layer_norm");
  return t;
}

}  // namespace

Expected<ClipTextModel> ClipTextModel::random(const ClipTextConfig& config, uint64_t seed, Device device, DType dtype) {
  ATELIER_RETURN_IF_ERROR(config.validate());
  static std::atomic<int> counter{0};
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
      ("atelier-random-clip-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".safetensors");
  ATELIER_RETURN_IF_ERROR(write_safetensors(path.string(), random_state(config, seed)));
  Expected<ClipTextModel> model = [&]() -> Expected<ClipTextModel> {
    ATELIER_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open({path.string()}));
    return load(store, ClipLayout::kTransformers, config, device, dtype);
  }();
  std::error_code ec;
  std::filesystem::remove(path, ec);  // a mapping that outlives the name stays valid
  return model;
}

}  // namespace atelier
