// Qwen3 text encoder (Z-Image's hidden_states[-2] features, padding removed) vs the zimage-tiny goldens,
// through both key layouts ("model." prefix or none).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "models/qwen3/qwen3_encoder.h"
#include "test_util.h"
#include "tokenizers/chat_template.h"
#include "tokenizers/qwen_tokenizer.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;
constexpr int kMaxSequenceLength = 64;
constexpr double kFeatureTol = 1e-5;

Tensor features(const fs::path& dir, const WeightStore& store, const std::string& prompt) {
  auto config = Qwen3Config::from_file((dir / "model/text_encoder/config.json").string());
  EXPECT_TRUE(config) << config.status().message();
  auto enc = Qwen3Encoder::load(store, *config, Device::cpu());
  EXPECT_TRUE(enc) << enc.status().message();
  auto tok = QwenTokenizer::load((dir / "model/tokenizer").string());
  EXPECT_TRUE(tok) << tok.status().message();
  auto text = apply_chat_template(tok->chat_template(), prompt, true);
  EXPECT_TRUE(text) << text.status().message();
  const QwenEncoding e = tok->encode(*text, kMaxSequenceLength);
  auto f = enc->encode_features(e.ids, e.mask);
  EXPECT_TRUE(f) << f.status().message();
  return *f;
}

std::string case_string(const fs::path& dir, const char* key) {
  std::ifstream f(dir / "case.json");
  return nlohmann::json::parse(f).at(key).get<std::string>();
}

TEST(ZImageTextEncoder, ConfigFromFixture) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto c = Qwen3Config::from_file((dir / "model/text_encoder/config.json").string());
  ASSERT_TRUE(c) << c.status().message();
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->rope_theta, 1e6);  // from rope_parameters
  EXPECT_EQ(c->num_hidden_layers, 3);
}

TEST(ZImageTextEncoder, FeaturesMatchGoldens) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto store = WeightStore::open({(dir / "model/text_encoder/model.safetensors").string()});
  ASSERT_TRUE(store) << store.status().message();
  const std::pair<const char*, const char*> cases[] = {{"prompt", "text.cond"}, {"negative_prompt", "text.uncond"}};
  for (const auto& [prompt_key, golden_key] : cases) {
    const Tensor f = features(dir, *store, case_string(dir, prompt_key));
    const Tensor g = test::golden("zimage-tiny", golden_key);
    ASSERT_EQ(f.shape(), g.shape()) << golden_key;
    EXPECT_REL_L2_LE(f.to_vector(), g.to_vector(), kFeatureTol);
    std::printf("[zimage] %s rel L2 %.3g\n", golden_key, test::rel_l2(f.to_vector(), g.to_vector()));
  }
}

TEST(ZImageTextEncoder, AcceptsModelPrefix) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  const std::string src = (dir / "model/text_encoder/model.safetensors").string();
  auto store = WeightStore::open({src});
  ASSERT_TRUE(store) << store.status().message();
  std::vector<std::pair<std::string, Tensor>> renamed;
  for (const auto& k : store->keys()) renamed.emplace_back("model." + k, store->read(k, DType::F16).value());
  const fs::path tmp = fs::temp_directory_path() / ("atelier_qwen3_prefix_" + std::to_string(std::random_device()()) + ".safetensors");
  ASSERT_TRUE(write_safetensors(tmp.string(), renamed).is_ok());
  auto prefixed = WeightStore::open({tmp.string()});
  ASSERT_TRUE(prefixed) << prefixed.status().message();
  const Tensor f = features(dir, *prefixed, case_string(dir, "prompt"));
  EXPECT_REL_L2_LE(f.to_vector(), test::golden("zimage-tiny", "text.cond").to_vector(), kFeatureTol);
  fs::remove(tmp);
}

}  // namespace
}  // namespace atelier
