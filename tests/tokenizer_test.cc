// CLIP BPE tokenizer (vs the fixtures' golden token ids and hand-derived cases), the Unicode helpers it
// uses, and A1111 prompt emphasis parsing and chunked tokenization.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "test_util.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/prompt_weights.h"
#include "tokenizers/unicode.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kBos = 49406;
constexpr int32_t kEos = 49407;
constexpr int kMaxLength = 77;
// Vocabulary ids read off vocab.json (CLIP's real vocabulary).
constexpr int32_t kA = 320, kPhoto = 1125, kOf = 539, kComma = 267, kB = 321, kX = 343;

std::vector<std::string> fixture_prompts(const fs::path& dir) {
  std::ifstream f(dir / "case.json");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // Python's json writes -Infinity/Infinity/NaN (scheduler configs), which strict JSON parsers reject.
  for (const std::string bad : {"-Infinity", "Infinity", "NaN"})
    for (size_t p = text.find(bad); p != std::string::npos; p = text.find(bad, p)) text.replace(p, bad.size(), "null");
  return nlohmann::json::parse(text).at("prompts").get<std::vector<std::string>>();
}

std::vector<int32_t> golden_ids(const std::string& fixture, const std::string& key) {
  std::vector<int32_t> ids;
  for (float v : test::golden(fixture, key).to_vector()) ids.push_back(int32_t(v));
  return ids;
}

// BOS + `tokens` + EOS, padded with `pad` to 77.
std::vector<int32_t> padded(std::vector<int32_t> tokens, int32_t pad = kEos) {
  std::vector<int32_t> ids = {kBos};
  ids.insert(ids.end(), tokens.begin(), tokens.end());
  ids.push_back(kEos);
  ids.resize(kMaxLength, pad);
  return ids;
}

ClipTokenizer load_or_die(const fs::path& dir) {
  auto t = ClipTokenizer::load(dir.string());
  if (!t) ADD_FAILURE() << t.status().message();
  return std::move(t).value();
}

// A scratch folder holding links to the fixture's vocabulary files plus the given config files.
class ScratchTokenizerDir {
 public:
  ScratchTokenizerDir(const fs::path& source, const std::vector<std::string>& link,
                      const std::vector<std::pair<std::string, std::string>>& files) {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("atelier_tokenizer_test_" + std::to_string(rd()));
    fs::create_directories(dir_);
    for (const auto& name : link) fs::create_symlink(source / name, dir_ / name);
    for (const auto& [name, text] : files) std::ofstream(dir_ / name) << text;
  }
  ~ScratchTokenizerDir() { fs::remove_all(dir_); }
  const fs::path& path() const { return dir_; }

 private:
  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------------
// Unicode helpers (expected strings computed with Python's unicodedata, Unicode 14).

TEST(ClipTokenizerUnicode, Utf8RoundTripAndLossyDecoding) {
  const std::string text = "a\xC3\xA9\xE6\x9D\xB1\xF0\x9F\x9A\x80";  // a é 東 🚀
  EXPECT_EQ(unicode::decode_utf8(text), (std::u32string{U'a', 0xE9, 0x6771, 0x1F680}));
  EXPECT_EQ(unicode::encode_utf8(unicode::decode_utf8(text)), text);
  // Stray continuation, truncated 3-byte sequence (one U+FFFD for the maximal subpart), overlong, surrogate.
  EXPECT_EQ(unicode::decode_utf8("\x80" "a"), (std::u32string{0xFFFD, U'a'}));
  EXPECT_EQ(unicode::decode_utf8("\xE6\x9D" "a"), (std::u32string{0xFFFD, U'a'}));
  EXPECT_EQ(unicode::decode_utf8("\xC0\xAF"), (std::u32string{0xFFFD, 0xFFFD}));
  EXPECT_EQ(unicode::decode_utf8("\xED\xA0\x80"), (std::u32string{0xFFFD, 0xFFFD, 0xFFFD}));
}

TEST(ClipTokenizerUnicode, Categories) {
  EXPECT_TRUE(unicode::is_letter(U'q'));
  EXPECT_TRUE(unicode::is_letter(0x6771));    // 東 Lo
  EXPECT_TRUE(unicode::is_letter(0x1C5));     // ǅ Lt
  EXPECT_TRUE(unicode::is_letter(0x2B0));     // ʰ Lm
  EXPECT_FALSE(unicode::is_letter(0x301));    // combining acute, Mn
  EXPECT_FALSE(unicode::is_letter(0x1F680));  // 🚀 So
  EXPECT_FALSE(unicode::is_letter(U'_'));
  EXPECT_TRUE(unicode::is_number(U'7'));
  EXPECT_TRUE(unicode::is_number(0x663));     // Arabic-Indic three, Nd
  EXPECT_TRUE(unicode::is_number(0x2167));    // Roman numeral eight, Nl
  EXPECT_TRUE(unicode::is_number(0xBD));      // ½ No
  EXPECT_FALSE(unicode::is_number(U'x'));
  for (char32_t c : std::u32string(U"\t\n\r \u0085\u00A0\u1680\u2003\u2028\u3000")) EXPECT_TRUE(unicode::is_whitespace(c)) << uint32_t(c);
  for (char32_t c : std::u32string(U"\x1C\u180E\u200B\uFEFFa")) EXPECT_FALSE(unicode::is_whitespace(c)) << uint32_t(c);
  EXPECT_EQ(unicode::combining_class(0x301), 230);
  EXPECT_EQ(unicode::combining_class(0x323), 220);
  EXPECT_EQ(unicode::combining_class(U'a'), 0);
}

TEST(ClipTokenizerUnicode, Lowercase) {
  EXPECT_EQ(unicode::to_lower(U"ABC\u00C0\u03A3\u0130\u1E9E\u2160"), std::u32string(U"abc\u00E0\u03C3i\u0307\u00DF\u2170"));
  EXPECT_EQ(unicode::to_lower(U"\u00DF\u6771"), std::u32string(U"\u00DF\u6771"));  // no mapping
}

TEST(ClipTokenizerUnicode, NfcComposesDecomposesAndReorders) {
  EXPECT_EQ(unicode::nfc(U"cafe\u0301"), std::u32string(U"caf\u00E9"));
  EXPECT_EQ(unicode::nfc(U"\u1100\u1161\u11A8"), std::u32string(U"\uAC01"));                  // Hangul LVT
  EXPECT_EQ(unicode::nfc(U"\uAC00\u11A8"), std::u32string(U"\uAC01"));                        // LV + T
  EXPECT_EQ(unicode::nfc(U"\u212B"), std::u32string(U"\u00C5"));                              // singleton
  EXPECT_EQ(unicode::nfc(U"\u0958"), std::u32string(U"\u0915\u093C"));                        // excluded
  EXPECT_EQ(unicode::nfc(U"\u1E0B\u0323"), std::u32string(U"\u1E0D\u0307"));                  // reorder
  EXPECT_EQ(unicode::nfc(U"a\u0307\u0323"), std::u32string(U"\u1EA1\u0307"));                 // reorder, compose
  EXPECT_EQ(unicode::nfc(U"\u0041\u030A\u0301"), std::u32string(U"\u01FA"));                  // two steps
  EXPECT_EQ(unicode::nfc(U"\u0301e"), std::u32string(U"\u0301e"));                            // leading mark
  EXPECT_EQ(unicode::nfc(U"e\u0360\u0301"), std::u32string(U"\u00E9\u0360"));                 // reorder 234/230
  EXPECT_EQ(unicode::nfc(U"e\u0315\u0300\u0301"), std::u32string(U"\u00E8\u0301\u0315"));     // second blocked
  EXPECT_EQ(unicode::nfc(U"a\u05AE\u0301\u0300"), std::u32string(U"\u00E1\u05AE\u0300"));     // skips ccc 228
  EXPECT_EQ(unicode::nfc(U"\u0FB2\u0F80"), std::u32string(U"\u0FB2\u0F80"));                  // non-starter decomposition stays
  EXPECT_EQ(unicode::nfc(U"\u00C5\u00E9 ok"), std::u32string(U"\u00C5\u00E9 ok"));            // already NFC
}

// ---------------------------------------------------------------------------------------------------
// The tokenizer against the fixtures.

TEST(ClipTokenizer, LoadsFixtureConfig) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const ClipTokenizer t = load_or_die(dir / "model/tokenizer");
  EXPECT_EQ(t.vocab_size(), 49408u);
  EXPECT_EQ(t.bos(), kBos);
  EXPECT_EQ(t.eos(), kEos);
  EXPECT_EQ(t.pad(), kEos);
  EXPECT_EQ(t.unk(), kEos);
  EXPECT_EQ(t.max_length(), kMaxLength);
  EXPECT_EQ(t.token_to_id("photo</w>"), kPhoto);
  EXPECT_EQ(t.id_to_token(kPhoto), "photo</w>");
  EXPECT_EQ(t.token_to_id("no such token"), -1);
}

void expect_golden_tokens(const std::string& fixture, const std::string& key_prefix) {
  auto dir = *test::fixture(fixture);
  const ClipTokenizer t = load_or_die(dir / "model/tokenizer");
  const auto prompts = fixture_prompts(dir);
  ASSERT_EQ(prompts.size(), 6u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto golden = golden_ids(fixture, key_prefix + std::to_string(i));
    ASSERT_EQ(golden.size(), size_t(kMaxLength));
    EXPECT_EQ(t.encode(prompts[i]), golden) << fixture << " prompt " << i << ": " << prompts[i];
  }
}

TEST(ClipTokenizer, MatchesSd15Goldens) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  expect_golden_tokens("sd15-tiny", "tokens.");
}

TEST(ClipTokenizer, MatchesFluxClipGoldens) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  expect_golden_tokens("flux-tiny", "clip.tokens.");
}

TEST(ClipTokenizer, LengthAndEosIndex) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const ClipTokenizer t = load_or_die(dir / "model/tokenizer");
  const auto prompts = fixture_prompts(dir);
  ClipEncoding e = t.encode_full(prompts[0]);  // 10 words
  EXPECT_EQ(e.length, 12);
  EXPECT_EQ(e.eos_index, 11);
  e = t.encode_full("");
  EXPECT_EQ(e.length, 2);
  EXPECT_EQ(e.eos_index, 1);
  e = t.encode_full(prompts[5]);  // 370 tokens, truncated
  EXPECT_EQ(t.encode_unpadded(prompts[5]).size(), 370u);
  EXPECT_EQ(e.length, kMaxLength);
  EXPECT_EQ(e.eos_index, kMaxLength - 1);
  EXPECT_EQ(e.ids.back(), kEos);
  // A literal end-of-text in the prompt is the special token, and it is the first EOS CLIP pools at.
  e = t.encode_full("a<|endoftext|>b");
  EXPECT_EQ(std::vector<int32_t>(e.ids.begin(), e.ids.begin() + 5), (std::vector<int32_t>{kBos, kA, kEos, kB, kEos}));
  EXPECT_EQ(e.length, 5);
  EXPECT_EQ(e.eos_index, 2);
}

TEST(ClipTokenizer, HandDerivedCases) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const ClipTokenizer t = load_or_die(dir / "model/tokenizer");
  // Whitespace runs (any White_Space, including U+3000 and NBSP) collapse; leading/trailing space vanishes.
  EXPECT_EQ(t.encode("  a \t\n photo\xE3\x80\x80\xC2\xA0of  "), padded({kA, kPhoto, kOf}));
  // Lowercasing.
  EXPECT_EQ(t.encode("A PHOTO Of"), padded({kA, kPhoto, kOf}));
  // Contractions split off: "don" + "'t".
  EXPECT_EQ(t.encode_unpadded("don't"), (std::vector<int32_t>{847, 713}));
  EXPECT_EQ(t.tokenize("Don't"), (std::vector<std::string>{"don</w>", "'t</w>"}));
  // Numbers split into single digits, each its own word.
  EXPECT_EQ(t.tokenize("x10"), (std::vector<std::string>{"x</w>", "1</w>", "0</w>"}));
  // Punctuation runs stay together: "!!" is one word (id 748), "wow" another.
  EXPECT_EQ(t.encode_unpadded("wow!!"), (std::vector<int32_t>{2781, 748}));
  // NFC: a decomposed "é" tokenizes like the precomposed one ("cafÃ©</w>" in the byte alphabet, 15304).
  EXPECT_EQ(t.encode_unpadded("cafe\xCC\x81"), (std::vector<int32_t>{15304}));
  EXPECT_EQ(t.encode_unpadded("caf\xC3\xA9"), (std::vector<int32_t>{15304}));
  // Special tokens are matched in the raw text only: uppercase is lowercased and then split by the
  // byte-level regex into "<|", "endoftext", "|>".
  EXPECT_EQ(t.tokenize("<|ENDOFTEXT|>"),
            (std::vector<std::string>{"<", "|</w>", "endof", "text</w>", "|", "></w>"}));
  EXPECT_EQ(t.encode_unpadded("<|startoftext|>"), (std::vector<int32_t>{kBos}));
  // Results do not depend on the word cache: same answer twice.
  EXPECT_EQ(t.encode("hello world hello"), t.encode("hello world hello"));
  EXPECT_EQ(t.encode_unpadded("hello world hello"), (std::vector<int32_t>{3306, 1002, 3306}));
}

TEST(ClipTokenizer, PadTokenFromConfigLikeSd2) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  // SD 2 / SDXL's second tokenizer name "!" (id 0) as the pad token.
  ScratchTokenizerDir scratch(dir / "model/tokenizer", {"vocab.json", "merges.txt"},
                              {{"tokenizer_config.json", R"({"model_max_length": 77, "pad_token": "!",
                                  "bos_token": {"content": "<|startoftext|>", "__type": "AddedToken"},
                                  "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"})"}});
  const ClipTokenizer t = load_or_die(scratch.path());
  EXPECT_EQ(t.pad(), 0);
  EXPECT_EQ(t.encode("a photo"), padded({kA, kPhoto}, 0));
  // transformers splits every special token out of the raw text, so each "!" is id 0 (diffusers issue
  // #4153 shows "! !! !!!" -> 49406, 0 x6, 49407, 0...).
  EXPECT_EQ(t.encode("! !! !!!"), padded({0, 0, 0, 0, 0, 0}, 0));
  const ClipEncoding e = t.encode_full("a photo");
  EXPECT_EQ(e.length, 4);
  EXPECT_EQ(e.eos_index, 3);
}

TEST(ClipTokenizer, LoadsFromTokenizerJsonAlone) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  ScratchTokenizerDir scratch(dir / "model/tokenizer", {"tokenizer.json"}, {});
  const ClipTokenizer t = load_or_die(scratch.path());
  EXPECT_EQ(t.pad(), kEos);  // from tokenizer.json's padding section
  const auto prompts = fixture_prompts(dir);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(t.encode(prompts[i]), golden_ids("sd15-tiny", "tokens." + std::to_string(i)));
}

TEST(ClipTokenizer, ModelMaxLengthFromConfig) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  ScratchTokenizerDir scratch(dir / "model/tokenizer", {"vocab.json", "merges.txt"},
                              {{"tokenizer_config.json", R"({"model_max_length": 5})"}});
  const ClipTokenizer t = load_or_die(scratch.path());
  EXPECT_EQ(t.max_length(), 5);
  EXPECT_EQ(t.encode("a photo of a photo"), (std::vector<int32_t>{kBos, kA, kPhoto, kOf, kEos}));
  EXPECT_EQ(t.encode("a"), (std::vector<int32_t>{kBos, kA, kEos, kEos, kEos}));
}

TEST(ClipTokenizer, LoadErrors) {
  auto missing = ClipTokenizer::load("/nonexistent/tokenizer");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  {
    ScratchTokenizerDir scratch(dir / "model/tokenizer", {}, {{"vocab.json", R"({"a": 0, "<|startoftext|>": 1, "<|endoftext|>": 2})"}, {"merges.txt", "#version: 0.2\na b\n"}});
    auto t = ClipTokenizer::load(scratch.path().string());
    ASSERT_FALSE(t);
    EXPECT_NE(t.status().message().find("merge 'a b'"), std::string::npos) << t.status().message();
  }
  {
    ScratchTokenizerDir scratch(dir / "model/tokenizer", {"vocab.json", "merges.txt"}, {{"tokenizer_config.json", "{not json"}});
    auto t = ClipTokenizer::load(scratch.path().string());
    ASSERT_FALSE(t);
    EXPECT_EQ(t.status().code(), ErrorCode::kCorrupt);
  }
  {
    ScratchTokenizerDir scratch(dir / "model/tokenizer", {"vocab.json", "merges.txt"},
                                {{"tokenizer_config.json", R"({"pad_token": "<pad>"})"}});
    auto t = ClipTokenizer::load(scratch.path().string());
    ASSERT_FALSE(t);
    EXPECT_EQ(t.status().code(), ErrorCode::kUnsupported);
  }
}

// ---------------------------------------------------------------------------------------------------
// A1111 emphasis parsing. The first cases are A1111's own documented examples.

std::vector<PromptChunk> parse(const std::string& prompt) {
  auto r = parse_prompt_attention(prompt);
  if (!r) ADD_FAILURE() << r.status().message();
  return r ? *r : std::vector<PromptChunk>{};
}

using Chunks = std::vector<PromptChunk>;

TEST(PromptWeights, A1111DocumentedExamples) {
  EXPECT_EQ(parse("normal text"), (Chunks{{"normal text", 1.0}}));
  EXPECT_EQ(parse("an (important) word"), (Chunks{{"an ", 1.0}, {"important", 1.1}, {" word", 1.0}}));
  EXPECT_EQ(parse("(unbalanced"), (Chunks{{"unbalanced", 1.1}}));
  EXPECT_EQ(parse("\\(literal\\]"), (Chunks{{"(literal]", 1.0}}));
  EXPECT_EQ(parse("(unnecessary)(parens)"), (Chunks{{"unnecessaryparens", 1.1}}));
  // Weights compare exactly: the products are formed in A1111's order (1.3 * 1.1 * 1.1 = 1.5730000000000004).
  EXPECT_EQ(parse("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky)))."),
            (Chunks{{"a ", 1.0},
                    {"house", 1.5730000000000004},
                    {" ", 1.1},
                    {"on", 1.0},
                    {" a ", 1.1},
                    {"hill", 0.55},
                    {", sun, ", 1.1},
                    {"sky", 1.4641000000000006},
                    {".", 1.1}}));
}

TEST(PromptWeights, MoreSyntax) {
  EXPECT_EQ(parse(""), (Chunks{{"", 1.0}}));
  EXPECT_EQ(parse("masterpiece, best quality, 1girl, (silver hair:1.2), looking at viewer"),
            (Chunks{{"masterpiece, best quality, 1girl, ", 1.0}, {"silver hair", 1.2}, {", looking at viewer", 1.0}}));
  EXPECT_EQ(parse("[a]"), (Chunks{{"a", 1 / 1.1}}));
  double twice = 1.0;
  twice *= 1 / 1.1;
  twice *= 1 / 1.1;
  EXPECT_EQ(parse("[[a]] b"), (Chunks{{"a", twice}, {" b", 1.0}}));
  EXPECT_EQ(parse("((a:2)b)"), (Chunks{{"a", 2 * 1.1}, {"b", 1.1}}));
  EXPECT_EQ(parse("( a : 1.5 )"), (Chunks{{" a ", 1.5}}));
  EXPECT_EQ(parse("(a:-.5)"), (Chunks{{"a", -0.5}}));
  // Without an open bracket the weight syntax and stray closers are literal text.
  EXPECT_EQ(parse("a :1.2) b] c)"), (Chunks{{"a :1.2) b] c)", 1.0}}));
  EXPECT_EQ(parse("time: 12:30"), (Chunks{{"time: 12:30", 1.0}}));
  // Escapes: \\ is a backslash, a lone backslash disappears.
  EXPECT_EQ(parse("a\\\\b\\c"), (Chunks{{"a\\bc", 1.0}}));
  EXPECT_EQ(parse("\\((a)\\)"), (Chunks{{"(", 1.0}, {"a", 1.1}, {")", 1.0}}));
  // Unclosed brackets of both kinds apply to the end.
  EXPECT_EQ(parse("x [y (z"), (Chunks{{"x ", 1.0}, {"y ", 1 / 1.1}, {"z", 1.1 * (1 / 1.1)}}));
  // Unicode text passes through.
  EXPECT_EQ(parse("(\xE6\x9D\xB1\xE4\xBA\xAC:1.1)"), (Chunks{{"\xE6\x9D\xB1\xE4\xBA\xAC", 1.1}}));
}

TEST(PromptWeights, Break) {
  EXPECT_EQ(parse("a BREAK b"), (Chunks{{"a", 1.0}, {"BREAK", -1.0}, {"b", 1.0}}));
  EXPECT_TRUE(parse("a BREAK b")[1].is_break());
  EXPECT_EQ(parse("aBREAK b, BREAKs"), (Chunks{{"aBREAK b, BREAKs", 1.0}}));  // not whole words
  EXPECT_EQ(parse("a break b"), (Chunks{{"a break b", 1.0}}));                 // case-sensitive
  EXPECT_EQ(parse("BREAK\nBREAK"), (Chunks{{"", 1.0}, {"BREAK", -1.0}, {"", 1.0}, {"BREAK", -1.0}, {"", 1.0}}));
  EXPECT_EQ(parse("a,BREAK,b"), (Chunks{{"a,", 1.0}, {"BREAK", -1.0}, {",b", 1.0}}));
  // Inside brackets the marker's weight is multiplied too, and it then reads as text (as in A1111).
  const Chunks in_brackets = parse("(a BREAK b)");
  EXPECT_EQ(in_brackets, (Chunks{{"a", 1.1}, {"BREAK", -1.1}, {"b", 1.1}}));
  EXPECT_FALSE(in_brackets[1].is_break());
}

TEST(PromptWeights, BadWeightIsAnError) {
  auto r = parse_prompt_attention("(a:1.2.3)");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("1.2.3"), std::string::npos);
  EXPECT_FALSE(parse_prompt_attention("(a:.)"));
}

// Weights past +-100 (explicit, or nested brackets multiplied) are refused: 1.1^1000 or (a:1e39) overflowed the
// weighted embeddings to inf, and the image came out black.
TEST(PromptWeights, WeightsPastAHundredAreAnError) {
  for (const std::string& p : {"(a:1" + std::string(39, '0') + ")", std::string(60, '(') + "a" + std::string(60, ')'),
                               std::string("((a:100))"), std::string("(a:-100.5)"), std::string(1000, '(') + "a"}) {
    auto r = parse_prompt_attention(p);
    ASSERT_FALSE(r) << p.substr(0, 80);
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("out of range"), std::string::npos) << r.status().message();
  }
  EXPECT_TRUE(parse_prompt_attention("(a:100) (b:-100)"));
  EXPECT_TRUE(parse_prompt_attention(std::string(48, '(') + "a" + std::string(48, ')')));  // 1.1^48 = 97.0
  EXPECT_TRUE(parse_prompt_attention(std::string(1000, '[') + "a"));  // tiny weights are harmless
}

TEST(PromptWeights, EncodeWeightedTruncates) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const ClipTokenizer t = load_or_die(dir / "model/tokenizer");
  const WeightedTokens w = encode_weighted(t, parse("a (photo:1.5) [of]"));
  EXPECT_EQ(w.ids, t.encode("a photo of"));
  ASSERT_EQ(w.weights.size(), size_t(kMaxLength));
  EXPECT_EQ(std::vector<float>(w.weights.begin(), w.weights.begin() + 5),
            (std::vector<float>{1.0f, 1.0f, 1.5f, float(1 / 1.1), 1.0f}));
  EXPECT_TRUE(std::all_of(w.weights.begin() + 4, w.weights.end(), [](float x) { return x == 1.0f; }));
  // Emphasis off: identical to encode() for every fixture prompt (the long one truncated at 77).
  for (const auto& p : fixture_prompts(dir)) {
    const WeightedTokens u = encode_weighted(t, unweighted_prompt(p));
    EXPECT_EQ(u.ids, t.encode(p)) << p;
    EXPECT_TRUE(std::all_of(u.weights.begin(), u.weights.end(), [](float x) { return x == 1.0f; }));
  }
  // BREAK is dropped in this mode.
  EXPECT_EQ(encode_weighted(t, parse("a BREAK photo")).ids, t.encode("a photo"));
}

TEST(PromptWeights, LongPromptWindows) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const ClipTokenizer t = load_or_die(dir / "model/tokenizer");
  const auto prompts = fixture_prompts(dir);
  const std::vector<int32_t> all = t.encode_unpadded(prompts[5]);  // 370 tokens, no commas
  const LongPromptTokens lp = encode_long_prompt(t, parse(prompts[5]));
  ASSERT_EQ(lp.windows.size(), 5u);
  EXPECT_EQ(lp.token_count, 370);
  EXPECT_EQ(lp.windows[0].ids, golden_ids("sd15-tiny", "tokens.5"));  // first window == plain truncation
  for (size_t w = 0; w < 5; ++w) {
    const auto& ids = lp.windows[w].ids;
    ASSERT_EQ(ids.size(), size_t(kMaxLength));
    EXPECT_EQ(ids.front(), kBos);
    const size_t n = std::min<size_t>(75, all.size() - w * 75);
    EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.begin() + 1 + n),
              std::vector<int32_t>(all.begin() + w * 75, all.begin() + w * 75 + n));
    EXPECT_TRUE(std::all_of(ids.begin() + 1 + n, ids.end(), [](int32_t id) { return id == kEos; }));
  }
  // An empty prompt still gives one window.
  const LongPromptTokens empty = encode_long_prompt(t, parse(""));
  ASSERT_EQ(empty.windows.size(), 1u);
  EXPECT_EQ(empty.windows[0].ids, padded({}));
  EXPECT_EQ(empty.token_count, 0);
}

TEST(PromptWeights, LongPromptBreakAndWeights) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const ClipTokenizer t = load_or_die(dir / "model/tokenizer");
  const LongPromptTokens lp = encode_long_prompt(t, parse("a BREAK (photo:1.3)"));
  ASSERT_EQ(lp.windows.size(), 2u);
  EXPECT_EQ(lp.token_count, 76);  // 75 for the window closed by BREAK, 1 for the last
  EXPECT_EQ(lp.windows[0].ids, padded({kA}));
  EXPECT_EQ(lp.windows[1].ids, padded({kPhoto}));
  EXPECT_EQ(lp.windows[1].weights[1], 1.3f);
  EXPECT_EQ(lp.windows[1].weights[0], 1.0f);
  EXPECT_EQ(lp.windows[1].weights[2], 1.0f);
}

TEST(PromptWeights, LongPromptCommaBacktrack) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const ClipTokenizer t = load_or_die(dir / "model/tokenizer");
  // 70 x "a", a comma at token 70, then 10 x "b": the window fills after 4 "b"s, 5 tokens past the comma.
  std::string prompt;
  for (int i = 0; i < 70; ++i) prompt += "a ";
  prompt += ",";
  for (int i = 0; i < 10; ++i) prompt += " b";
  const std::vector<PromptChunk> chunks = unweighted_prompt(prompt);
  ASSERT_EQ(t.encode_unpadded(prompt).size(), 81u);

  const LongPromptTokens moved = encode_long_prompt(t, chunks);  // A1111 default backtrack 20
  ASSERT_EQ(moved.windows.size(), 2u);
  std::vector<int32_t> first(70, kA);
  first.push_back(kComma);
  EXPECT_EQ(moved.windows[0].ids, padded(first));
  EXPECT_EQ(moved.windows[1].ids, padded(std::vector<int32_t>(10, kB)));
  EXPECT_EQ(moved.token_count, 85);

  const LongPromptTokens kept = encode_long_prompt(t, chunks, /*comma_padding_backtrack=*/0);
  ASSERT_EQ(kept.windows.size(), 2u);
  first.insert(first.end(), 4, kB);
  EXPECT_EQ(kept.windows[0].ids, padded(first));
  EXPECT_EQ(kept.windows[1].ids, padded(std::vector<int32_t>(6, kB)));
  EXPECT_EQ(kept.token_count, 81);

  // The tail after the comma is 5 tokens long: backtrack 5 moves it, 4 does not.
  EXPECT_EQ(encode_long_prompt(t, chunks, 5).windows[0].ids, moved.windows[0].ids);
  EXPECT_EQ(encode_long_prompt(t, chunks, 4).windows[0].ids, kept.windows[0].ids);
}

TEST(PromptWeights, LongPromptPadsAfterFirstEosWhenPadDiffers) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  ScratchTokenizerDir scratch(dir / "model/tokenizer", {"vocab.json", "merges.txt"},
                              {{"tokenizer_config.json", R"({"pad_token": "!"})"}});
  const ClipTokenizer t = load_or_die(scratch.path());
  const LongPromptTokens lp = encode_long_prompt(t, parse("x x"));
  ASSERT_EQ(lp.windows.size(), 1u);
  EXPECT_EQ(lp.windows[0].ids, padded({kX, kX}, 0));
}

}  // namespace
}  // namespace atelier
