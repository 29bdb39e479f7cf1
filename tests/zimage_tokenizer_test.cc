// Qwen tokenizer and chat template (Z-Image's text side) vs the zimage-tiny goldens and hand-derived cases.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizers/chat_template.h"
#include "tokenizers/qwen_tokenizer.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;
constexpr int kMaxSequenceLength = 64;  // the fixture's max_sequence_length

nlohmann::json read_case(const fs::path& dir) {
  std::ifstream f(dir / "case.json");
  return nlohmann::json::parse(f);
}

std::vector<int32_t> golden_ints(const std::string& key) {
  std::vector<int32_t> out;
  for (float v : test::golden("zimage-tiny", key).to_vector()) out.push_back(int32_t(v));
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST(ZImageTokenizer, PreTokenizerRegex) {
  using V = std::vector<std::string>;
  EXPECT_EQ(QwenTokenizer::pre_tokenize("a photo of"), (V{"a", " photo", " of"}));
  EXPECT_EQ(QwenTokenizer::pre_tokenize("it's 1234 x"), (V{"it", "'s", " ", "1", "2", "3", "4", " x"}));
  EXPECT_EQ(QwenTokenizer::pre_tokenize("IT'S I'LL"), (V{"IT", "'S", " I", "'LL"}));
  EXPECT_EQ(QwenTokenizer::pre_tokenize("hi  there"), (V{"hi", " ", " there"}));
  EXPECT_EQ(QwenTokenizer::pre_tokenize("a\n\nb"), (V{"a", "\n\n", "b"}));
  EXPECT_EQ(QwenTokenizer::pre_tokenize("a  \n  b"), (V{"a", "  \n", " ", " b"}));
  EXPECT_EQ(QwenTokenizer::pre_tokenize("x !!\n\ny"), (V{"x", " !!\n\n", "y"}));
  EXPECT_EQ(QwenTokenizer::pre_tokenize("(word:1.2)"), (V{"(word", ":", "1", ".", "2", ")"}));
  EXPECT_EQ(QwenTokenizer::pre_tokenize("end  "), (V{"end", "  "}));
  EXPECT_EQ(QwenTokenizer::pre_tokenize("\thi"), (V{"\thi"}));
  EXPECT_EQ(QwenTokenizer::pre_tokenize("cafe\xCC\x81"), (V{"caf\xC3\xA9"}));  // NFC first
}

TEST(ZImageTokenizer, ChatTemplateOfTheFixture) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  const std::string tmpl = read_text(dir / "model/tokenizer/chat_template.jinja");
  const nlohmann::json c = read_case(dir);
  auto r = apply_chat_template(tmpl, c.at("prompt").get<std::string>(), /*enable_thinking=*/true);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(*r, c.at("chat_template_example").get<std::string>());
  auto off = apply_chat_template(tmpl, "x", /*enable_thinking=*/false);
  ASSERT_TRUE(off) << off.status().message();
  EXPECT_EQ(*off, "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // The ChatML fallback (for Qwen3's full template) renders the same.
  EXPECT_TRUE(is_chatml_template(tmpl));
  EXPECT_EQ(chatml_user_prompt(c.at("prompt").get<std::string>(), true), *r);
  EXPECT_EQ(chatml_user_prompt("x", false), *off);
}

TEST(ZImageTokenizer, ChatTemplateJinjaSubset) {
  const nlohmann::json ctx = {{"messages", {{{"role", "system"}, {"content", " s "}}, {{"role", "user"}, {"content", "u"}}}},
                              {"flag", false}};
  auto render = [&](const std::string& t) {
    auto r = render_chat_template(t, ctx);
    return r ? *r : "ERROR: " + r.status().message();
  };
  // trim_blocks + lstrip_blocks, loop variables, elif/else, tests, filters, set, '-' whitespace control.
  EXPECT_EQ(render("{% for m in messages %}\n  {% if loop.first %}[{{ m.content | trim }}]{% elif m['role'] == 'user' %}<{{ m.content }}>{% else %}?{% endif %}\n\n{% endfor %}"),
            "[s]\n<u>\n");
  EXPECT_EQ(render("{% if flag is defined and flag is false %}A{% endif %}{% if nothing is not defined %}B{% endif %}"), "AB");
  EXPECT_EQ(render("{% set x = 'a' ~ 'b' %}{{ x + 'c' }} {{ messages | length }} {{ 'ys' in 'xyz' }}"), "abc 2 False");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif %}"), "ab");
  EXPECT_EQ(render("{{ not flag or none }}"), "True");
  // Unsupported constructs fail with a message naming them.
  EXPECT_NE(render("{{ raise_exception('x') }}").find("not supported"), std::string::npos);
  EXPECT_NE(render("{% macro m() %}{% endmacro %}").find("macro"), std::string::npos);
  EXPECT_NE(render("{% if true %}open").find("endif"), std::string::npos);
}

TEST(ZImageTokenizer, TokenIdsAndMasksMatchGoldens) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto t = QwenTokenizer::load((dir / "model/tokenizer").string());
  ASSERT_TRUE(t) << t.status().message();
  EXPECT_EQ(t->pad(), 0);
  EXPECT_EQ(t->token_to_id("<|im_start|>"), 1);
  const auto prompts = read_case(dir).at("prompts").get<std::vector<std::string>>();
  ASSERT_EQ(prompts.size(), 6u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto text = apply_chat_template(t->chat_template(), prompts[i], /*enable_thinking=*/true);
    ASSERT_TRUE(text) << text.status().message();
    const QwenEncoding e = t->encode(*text, kMaxSequenceLength);
    EXPECT_EQ(e.ids, golden_ints("qwen.tokens." + std::to_string(i))) << "prompt " << i << ": " << prompts[i];
    EXPECT_EQ(e.mask, golden_ints("qwen.mask." + std::to_string(i))) << "prompt " << i;
  }
}

// A folder holding only `tokenizer_json` as tokenizer.json, removed with the object.
class ScratchQwenDir {
 public:
  explicit ScratchQwenDir(const std::string& tokenizer_json)
      : path_(fs::temp_directory_path() / ("atelier_qwen_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
    std::ofstream(path_ / "tokenizer.json", std::ios::binary) << tokenizer_json;
  }
  ~ScratchQwenDir() { fs::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// Each malformed tokenizer.json gives its error kind and a message naming what is wrong (not a crash, not an
// exception's text from inside the JSON library).
TEST(ZImageTokenizer, LoadErrors) {
  EXPECT_EQ(QwenTokenizer::load("/nonexistent/tokenizer").status().code(), ErrorCode::kNotFound);
  struct Case {
    const char* tokenizer_json;
    ErrorCode code;
    const char* message_part;
  };
  const Case cases[] = {
      {R"({"model": {"type": "Unigram", "vocab": []}})", ErrorCode::kUnsupported, "only BPE models"},
      {R"({"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}})", ErrorCode::kCorrupt,
       "vocabulary id of 'a' is not a non-negative integer"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [[1, 2]]}})", ErrorCode::kCorrupt,
       "a merge is neither"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}})", ErrorCode::kCorrupt, "bad merge 'ab'"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a"]}})", ErrorCode::kCorrupt,
       "merge 'a a' uses or makes a token that is not in the vocabulary"},
  };
  for (const Case& c : cases) {
    ScratchQwenDir dir(c.tokenizer_json);
    auto t = QwenTokenizer::load(dir.path());
    ASSERT_FALSE(t) << c.tokenizer_json;
    EXPECT_EQ(t.status().code(), c.code) << c.tokenizer_json << ": " << t.status().message();
    EXPECT_NE(t.status().message().find(c.message_part), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(dir.path()), std::string::npos) << t.status().message();
  }
}

}  // namespace
}  // namespace atelier
