// FLUX's text side: the T5 SentencePiece tokenizer (ids against every t5.tokens.N golden, padding and
// truncation), the relative-position buckets, and the T5 v1.1 encoder against text.t5.
#include <algorithm>
#include <fstream>
#include <iostream>

#include "io/safetensors.h"
#include "models/t5/t5_encoder.h"
#include "test_util.h"
#include "tokenizers/t5_tokenizer.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

constexpr double kGoldenTol = 1e-5;
constexpr int kFixtureMaxLength = 32;  // case.json runs.flux_euler.max_sequence_length
constexpr int kPrompts = 6;

std::vector<std::string> fixture_prompts(const fs::path& dir) {
  const auto j = nlohmann::json::parse(std::ifstream(dir / "case.json"));
  return j["prompts"].get<std::vector<std::string>>();
}

std::vector<int32_t> golden_ids(const std::string& key) {
  std::vector<int32_t> out;
  for (float v : test::golden("flux-tiny", key).to_vector()) out.push_back(int32_t(v));
  return out;
}

TEST(FluxT5Tokenizer, MatchesEveryGolden) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const T5Tokenizer tok = T5Tokenizer::load((dir / "model/tokenizer_2").string()).value();
  EXPECT_EQ(tok.vocab_size(), 700);
  const auto prompts = fixture_prompts(dir);
  ASSERT_EQ(int(prompts.size()), kPrompts);
  for (int i = 0; i < kPrompts; ++i) {
    EXPECT_EQ(tok.encode(prompts[size_t(i)], kFixtureMaxLength), golden_ids("t5.tokens." + std::to_string(i)))
        << "prompt " << i << ": " << prompts[size_t(i)];
  }
}

TEST(FluxT5Tokenizer, PaddingTruncationAndSpecialTokens) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const T5Tokenizer tok = T5Tokenizer::load((dir / "model/tokenizer_2/spiece.model").string()).value();
  const auto ids = tok.encode("a photo", 8);
  ASSERT_EQ(ids.size(), 8u);
  const auto raw = tok.encode_unpadded("a photo");
  ASSERT_LT(raw.size(), 7u);
  EXPECT_EQ(ids[raw.size()], tok.eos());
  EXPECT_EQ(ids.back(), tok.pad());
  const auto cut = tok.encode("word0 word1 word2 word3 word4", 3);
  EXPECT_EQ(cut.size(), 3u);
  EXPECT_EQ(cut.back(), tok.eos());
  // Special tokens written in the text are matched as tokens, as transformers does.
  const auto special = tok.encode_unpadded("a</s><extra_id_0>");
  ASSERT_GE(special.size(), 2u);
  EXPECT_EQ(special[special.size() - 2], tok.eos());
  EXPECT_EQ(special.back(), 699);
  EXPECT_FALSE(T5Tokenizer::load((dir / "model/tokenizer").string()).has_value());  // no spiece.model there
}

TEST(FluxT5Encoder, RelativePositionBuckets) {
  // Values computed with transformers' _relative_position_bucket(bidirectional=True, num_buckets=32,
  // max_distance=128) in torch.
  EXPECT_EQ(t5_relative_position_bucket(0, 32, 128), 0);
  EXPECT_EQ(t5_relative_position_bucket(-1, 32, 128), 1);
  EXPECT_EQ(t5_relative_position_bucket(1, 32, 128), 17);
  EXPECT_EQ(t5_relative_position_bucket(-7, 32, 128), 7);
  EXPECT_EQ(t5_relative_position_bucket(-8, 32, 128), 8);
  EXPECT_EQ(t5_relative_position_bucket(-12, 32, 128), 9);
  EXPECT_EQ(t5_relative_position_bucket(-31, 32, 128), 11);
  EXPECT_EQ(t5_relative_position_bucket(100, 32, 128), 31);
  EXPECT_EQ(t5_relative_position_bucket(-64, 32, 128), 14);
  EXPECT_EQ(t5_relative_position_bucket(63, 32, 128), 29);
  EXPECT_EQ(t5_relative_position_bucket(-127, 32, 128), 15);
  EXPECT_EQ(t5_relative_position_bucket(-500, 32, 128), 15);
  EXPECT_EQ(t5_relative_position_bucket(500, 32, 128), 31);
}

TEST(FluxT5Encoder, MatchesGolden) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const std::string folder = (dir / "model/text_encoder_2").string();
  const WeightStore store = WeightStore::open({folder + "/model.safetensors"}).value();
  const T5Config cfg = T5Config::from_file(folder + "/config.json").value();
  const T5Config detected = T5Config::detect(store).value();
  EXPECT_EQ(detected.d_model, cfg.d_model);
  EXPECT_EQ(detected.num_heads, cfg.num_heads);
  EXPECT_EQ(detected.num_layers, cfg.num_layers);
  EXPECT_EQ(detected.d_ff, cfg.d_ff);
  const T5Encoder enc = T5Encoder::load(store, cfg, Device::cpu()).value();
  const auto ids = golden_ids("t5.tokens.0");
  Tensor t = Tensor::empty({1, int64_t(ids.size())}, DType::I32);
  std::copy(ids.begin(), ids.end(), t.data<int32_t>());
  const Tensor out = enc.forward(t).value();
  const Tensor want = test::golden("flux-tiny", "text.t5");
  ASSERT_EQ(out.shape(), want.shape());
  const double r = test::rel_l2(out.to_vector(), want.to_vector());
  std::cout << "[flux] T5 hidden states vs text.t5: rel L2 " << r << "\n";
  EXPECT_LE(r, kGoldenTol);
  Tensor bad = Tensor::empty({1, 1}, DType::I32);
  bad.data<int32_t>()[0] = 700;  // one past the vocabulary
  EXPECT_FALSE(enc.forward(bad).has_value());
}

}  // namespace
}  // namespace atelier
