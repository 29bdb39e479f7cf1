// The demo model's own BPE vocabulary (tools/demo_model/tokenizer, built by bpe.py in CLIP's format) loads in
// the CLIP tokenizer and turns every caption word into exactly one "<word></w>" token.
#include <gtest/gtest.h>

#include <filesystem>

#include "tokenizers/clip_tokenizer.h"

namespace atelier {
namespace {

const std::string kVocabDir = (std::filesystem::path(ATELIER_TEST_SOURCE_DIR) / "tools" / "demo_model" / "tokenizer").string();
constexpr int kByteSymbols = 512;  // 256 byte symbols + the same with </w>, first in CLIP's vocab.json

TEST(DemoTokenizer, LoadsWithCaptionWordsAsSingleTokens) {
  auto tok = ClipTokenizer::load(kVocabDir);
  ASSERT_TRUE(tok.has_value()) << tok.status().message();
  EXPECT_EQ(tok->token_to_id("<|startoftext|>"), int32_t(tok->vocab_size()) - 2);
  EXPECT_EQ(tok->bos(), int(tok->vocab_size()) - 2);
  EXPECT_EQ(tok->eos(), int(tok->vocab_size()) - 1);
  EXPECT_EQ(tok->pad(), tok->eos());
  EXPECT_EQ(tok->max_length(), 77);
  const std::vector<std::string> want = {"two</w>", "small</w>", "yellow</w>", "stars</w>", "on</w>", "a</w>",
                                         "purple</w>", "background</w>"};
  EXPECT_EQ(tok->tokenize("two small yellow stars on a purple background"), want);
  EXPECT_EQ(tok->tokenize("An ORANGE triangle at the top"),
            (std::vector<std::string>{"an</w>", "orange</w>", "triangle</w>", "at</w>", "the</w>", "top</w>"}));
  const auto enc = tok->encode_full("a red circle on a blue background");
  ASSERT_EQ(enc.ids.size(), 77u);
  EXPECT_EQ(enc.length, 9);
  EXPECT_EQ(enc.ids[0], tok->bos());
  EXPECT_EQ(enc.ids[1], tok->token_to_id("a</w>"));
  EXPECT_EQ(enc.ids[2], tok->token_to_id("red</w>"));
  EXPECT_GE(enc.ids[2], kByteSymbols);  // a merged token, not a byte
  EXPECT_EQ(enc.ids[8], tok->eos());
  EXPECT_EQ(enc.ids[76], tok->pad());
}

TEST(DemoTokenizer, UnknownWordsFallBackToBytePieces) {
  auto tok = ClipTokenizer::load(kVocabDir);
  ASSERT_TRUE(tok.has_value()) << tok.status().message();
  const auto pieces = tok->tokenize("zebra");
  ASSERT_GE(pieces.size(), 2u);
  EXPECT_EQ(pieces.back().substr(pieces.back().size() - 4), "</w>");
  for (int32_t id : tok->encode_unpadded("zebra")) EXPECT_NE(id, tok->unk());
}

}  // namespace
}  // namespace atelier
