#include "tokenizers/clip_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "io/file.h"
#include "io/json_util.h"
#include "tokenizers/unicode.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxIdSlack = 4096;  // ids past twice the vocabulary's size plus this are refused (added tokens fit)
constexpr const char* kEndOfWord = "</w>";
constexpr const char* kDefaultBos = "<|startoftext|>";
constexpr const char* kDefaultEos = "<|endoftext|>";
// Configs sometimes hold a "no limit" sentinel (1e30) here; CLIP text encoders always have 77 positions.
constexpr double kMaxSaneMaxLength = 1 << 20;

// Parses `path` when it exists (a null json when absent, an error when malformed). A top-level key named
// `skip_key` is parsed but not stored.
Expected<json> read_json_if_present(const fs::path& path, const char* skip_key = nullptr) {
  if (!fs::exists(path)) return json();
  ATELIER_ASSIGN_OR_RETURN(std::string text, read_file(path.string(), "JSON file"));
  json::parser_callback_t keep = [skip_key](int depth, json::parse_event_t event, json& parsed) {
    return !(skip_key && depth == 1 && event == json::parse_event_t::key && parsed == skip_key);
  };
  bool too_deep = false;
  json j = parse_json_bounded(text, &too_deep, keep);
  if (j.is_discarded()) return corrupt(path.string() + (too_deep ? " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels" : " is not valid JSON"));
  return j;
}

// Streams vocab.json ({"token": id, ...}, ~50k entries) into a hash map without building a JSON tree.
class VocabSax : public nlohmann::json_sax<json> {
 public:
  explicit VocabSax(std::unordered_map<std::string, int32_t>& out) : out_(out) {}
  bool start_object(std::size_t) override { return ++depth_ == 1 || fail("nested objects"); }
  bool end_object() override { return --depth_ == 0; }
  bool key(string_t& k) override { key_ = std::move(k); return true; }
  bool number_unsigned(number_unsigned_t v) override {
    if (v > uint64_t(std::numeric_limits<int32_t>::max())) return fail("an id out of range");
    out_[key_] = int32_t(v);
    return true;
  }
  bool number_integer(number_integer_t v) override { return v >= 0 ? number_unsigned(uint64_t(v)) : fail("a negative id"); }
  bool null() override { return fail("null"); }
  bool boolean(bool) override { return fail("a boolean"); }
  bool number_float(number_float_t, const string_t&) override { return fail("a fractional id"); }
  bool string(string_t&) override { return fail("a string value"); }
  bool binary(binary_t&) override { return fail("binary data"); }
  bool start_array(std::size_t) override { return fail("an array"); }
  bool end_array() override { return false; }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  bool fail(const char* what) {
    error_ = std::string("expected {\"token\": id, ...}, found ") + what;
    return false;
  }
  std::unordered_map<std::string, int32_t>& out_;
  std::string key_, error_;
  int depth_ = 0;
};

Expected<std::unordered_map<std::string, int32_t>> parse_vocab(const std::string& text, const std::string& label) {
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(1 << 16);
  VocabSax sax(vocab);
  if (!json::sax_parse(text, &sax)) return corrupt(label + ": " + (sax.error().empty() ? "not valid JSON" : sax.error()));
  return vocab;
}

// merges.txt: an optional "#version" line, then one "left right" pair per line, best rank first.
Expected<std::vector<std::pair<std::string, std::string>>> parse_merges_txt(const std::string& text, const std::string& label) {
  std::vector<std::pair<std::string, std::string>> merges;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.starts_with("#version")) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      return corrupt(label + ": line '" + std::string(line) + "' is not two space-separated symbols");
    merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
  }
  return merges;
}

// The BPE model of a tokenizer.json (bpe::read_model), with the one end-of-word suffix CLIP's vocabulary uses.
Status read_tokenizer_json_model(const json& model, const std::string& label, std::unordered_map<std::string, int32_t>& vocab,
                                 std::vector<std::pair<std::string, std::string>>& merges) {
  if (model.value("end_of_word_suffix", json()).is_string() && model.at("end_of_word_suffix") != kEndOfWord)
    return unsupported(label + ": only the \"</w>\" end-of-word suffix is supported");
  return bpe::read_model(model, label, vocab, merges);
}

// A token field is either "text" or an AddedToken object {"content": "text", ...}.
std::optional<std::string> token_string(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return std::nullopt;
  const json& v = j.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return std::nullopt;
}

enum class SplitStyle { kClip, kGpt2 };

// Splits whitespace-free-or-not normalized text by one of the two regexes the CLIP pipeline applies:
//   kClip: <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
//   kGpt2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+  (on pieces without
//          whitespace, which is all it ever sees here: the optional-space and whitespace branches never fire)
// Whitespace is not part of any match and is dropped, like the "Removed" split behaviour.
std::vector<std::u32string_view> split_words(std::u32string_view s, SplitStyle style) {
  static const std::u32string kSpecials[] = {U"<|startoftext|>", U"<|endoftext|>"};
  static const std::u32string kContractions[] = {U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};
  std::vector<std::u32string_view> out;
  size_t i = 0;
  const size_t n = s.size();
  auto other = [](char32_t c) { return !unicode::is_whitespace(c) && !unicode::is_letter(c) && !unicode::is_number(c); };
  while (i < n) {
    const char32_t c = s[i];
    if (unicode::is_whitespace(c)) {
      ++i;
      continue;
    }
    size_t len = 0;
    if (style == SplitStyle::kClip)
      for (const auto& sp : kSpecials)
        if (len == 0 && s.substr(i).starts_with(sp)) len = sp.size();
    if (len == 0 && c == U'\'')
      for (const auto& ct : kContractions)
        if (len == 0 && s.substr(i).starts_with(ct)) len = ct.size();
    if (len == 0) {
      size_t j = i + 1;
      if (unicode::is_letter(c)) {
        while (j < n && unicode::is_letter(s[j])) ++j;
      } else if (unicode::is_number(c)) {
        if (style == SplitStyle::kGpt2)
          while (j < n && unicode::is_number(s[j])) ++j;
      } else {
        while (j < n && other(s[j])) ++j;
      }
      len = j - i;
    }
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

// The fast tokenizer's normalizer: NFC, Replace(\s+ -> " "), Lowercase.
std::u32string normalize(std::string_view text) {
  const std::u32string composed = unicode::nfc(unicode::decode_utf8(text));
  std::u32string out;
  out.reserve(composed.size());
  bool in_space = false;
  for (char32_t c : composed) {
    if (unicode::is_whitespace(c)) {
      if (!in_space) out.push_back(U' ');
      in_space = true;
      continue;
    }
    in_space = false;
    unicode::append_lowercase(c, out);
  }
  return out;
}

}  // namespace

ClipTokenizer::ClipTokenizer() = default;

Expected<ClipTokenizer> ClipTokenizer::load(const std::string& dir) {
  // nlohmann::json accessors and std::stoll throw on wrongly typed fields: report those as corrupt files.
  try {
    return load_impl(dir);
  } catch (const std::exception& e) {
    return corrupt("tokenizer folder " + dir + ": " + e.what());
  }
}

Expected<ClipTokenizer> ClipTokenizer::load_impl(const std::string& dir_str) {
  const fs::path dir(dir_str);
  if (!fs::is_directory(dir)) return not_found("tokenizer folder " + dir_str + " does not exist");
  const bool separate_files = fs::exists(dir / "vocab.json");
  ATELIER_ASSIGN_OR_RETURN(json config, read_json_if_present(dir / "tokenizer_config.json"));
  ATELIER_ASSIGN_OR_RETURN(json special_map, read_json_if_present(dir / "special_tokens_map.json"));
  // tokenizer.json repeats the whole model; skip building it when vocab.json + merges.txt hold it.
  ATELIER_ASSIGN_OR_RETURN(json tok_json, read_json_if_present(dir / "tokenizer.json", separate_files ? "model" : nullptr));

  ClipTokenizer t;  // max_length_ starts at kDefaultMaxLength
  std::vector<std::pair<std::string, std::string>> merges;
  if (separate_files) {
    ATELIER_ASSIGN_OR_RETURN(std::string vocab_text, read_file((dir / "vocab.json").string(), "vocabulary"));
    ATELIER_ASSIGN_OR_RETURN(t.vocab_, parse_vocab(vocab_text, (dir / "vocab.json").string()));
    ATELIER_ASSIGN_OR_RETURN(std::string merges_text, read_file((dir / "merges.txt").string(), "merge list"));
    ATELIER_ASSIGN_OR_RETURN(merges, parse_merges_txt(merges_text, (dir / "merges.txt").string()));
  } else if (tok_json.contains("model")) {
    ATELIER_RETURN_IF_ERROR(read_tokenizer_json_model(tok_json.at("model"), dir_str + "/tokenizer.json", t.vocab_, merges));
  } else {
    return not_found(dir_str + " has neither vocab.json + merges.txt nor a tokenizer.json with a BPE model");
  }
  if (t.vocab_.empty()) return corrupt(dir_str + ": the vocabulary is empty");
  // Ids index a table of the vocabulary's size: one absurd id (100000000) made it take gigabytes.
  for (const auto& [token, id] : t.vocab_)
    if (size_t(id) >= 2 * t.vocab_.size() + kMaxIdSlack)
      return corrupt(dir_str + ": token id " + std::to_string(id) + " is far past the vocabulary's " +
                     std::to_string(t.vocab_.size()) + " entries");
  ATELIER_RETURN_IF_ERROR(t.add_special_tokens(config, special_map, tok_json, dir_str));
  if (config.contains("model_max_length") && config.at("model_max_length").is_number()) {
    const double m = config.at("model_max_length").get<double>();
    if (m >= 2 && m <= kMaxSaneMaxLength) t.max_length_ = int(m);
  }
  ATELIER_RETURN_IF_ERROR(t.merges_.build(merges, t.vocab_, dir_str));
  t.finish_setup();
  return t;
}

Status ClipTokenizer::add_special_tokens(const json& config, const json& special_map, const json& tok_json,
                                         const std::string& dir) {
  // Added tokens (tokenizer.json, tokenizer_config.json's added_tokens_decoder) carry their own ids.
  auto add_token = [&](const std::string& content, int64_t id) -> Status {
    if (id < 0 || size_t(id) >= 2 * vocab_.size() + kMaxIdSlack) return corrupt(dir + ": bad id for added token " + content);
    vocab_.emplace(content, int32_t(id));
    special_tokens_.emplace_back(content, int32_t(id));
    return Status::ok();
  };
  if (tok_json.contains("added_tokens"))
    for (const json& a : tok_json.at("added_tokens"))
      if (a.contains("content") && a.contains("id"))
        ATELIER_RETURN_IF_ERROR(add_token(a.at("content").get<std::string>(), a.at("id").get<int64_t>()));
  if (config.contains("added_tokens_decoder") && config.at("added_tokens_decoder").is_object())
    for (const auto& [id, a] : config.at("added_tokens_decoder").items())
      if (a.contains("content")) ATELIER_RETURN_IF_ERROR(add_token(a.at("content").get<std::string>(), std::stoll(id)));

  // bos/eos/unk/pad: tokenizer_config.json, then special_tokens_map.json, then tokenizer.json, then defaults.
  auto name_of = [&](const char* key, const char* fallback) -> std::string {
    if (auto s = token_string(config, key)) return *s;
    if (auto s = token_string(special_map, key)) return *s;
    if (tok_json.is_object()) {
      if (std::string(key) == "pad_token")
        if (auto s = token_string(tok_json.value("padding", json::object()), "pad_token")) return *s;
      if (std::string(key) == "unk_token")
        if (auto s = token_string(tok_json.value("model", json::object()), "unk_token")) return *s;
    }
    return fallback;
  };
  const std::pair<const char*, const char*> keys[4] = {
      {"bos_token", kDefaultBos}, {"eos_token", kDefaultEos}, {"unk_token", kDefaultEos}, {"pad_token", kDefaultEos}};
  int* slots[4] = {&bos_, &eos_, &unk_, &pad_};
  for (int k = 0; k < 4; ++k) {
    const std::string name = name_of(keys[k].first, keys[k].second);
    auto it = vocab_.find(name);
    if (it == vocab_.end()) return unsupported(dir + ": special token '" + name + "' is not in the vocabulary");
    *slots[k] = it->second;
    // transformers registers every special token as an added token, matched in the raw text.
    special_tokens_.emplace_back(name, it->second);
  }
  return Status::ok();
}

void ClipTokenizer::finish_setup() {
  int32_t max_id = 0;
  for (const auto& [tok, id] : vocab_) max_id = std::max(max_id, id);
  id_to_token_.assign(size_t(max_id) + 1, std::string());
  for (const auto& [tok, id] : vocab_) id_to_token_[id] = tok;
  const auto& byte_symbol = bpe::byte_symbols();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_symbol[size_t(b)]);
    auto it_eow = vocab_.find(byte_symbol[size_t(b)] + kEndOfWord);
    byte_id_[b] = it == vocab_.end() ? unk_ : it->second;
    byte_eow_id_[b] = it_eow == vocab_.end() ? unk_ : it_eow->second;
  }
  // Leftmost-longest matching: try longer special tokens first; drop duplicates.
  std::sort(special_tokens_.begin(), special_tokens_.end(),
            [](const auto& a, const auto& b) { return a.first.size() != b.first.size() ? a.first.size() > b.first.size() : a < b; });
  special_tokens_.erase(std::unique(special_tokens_.begin(), special_tokens_.end(),
                                    [](const auto& a, const auto& b) { return a.first == b.first; }),
                        special_tokens_.end());
  special_tokens_.erase(std::remove_if(special_tokens_.begin(), special_tokens_.end(), [](const auto& s) { return s.first.empty(); }),
                        special_tokens_.end());
}

std::vector<int32_t> ClipTokenizer::merge_symbols(const std::string& word) const {
  // One symbol per byte (each byte maps to one character of the byte alphabet); the last carries "</w>".
  std::vector<int32_t> sym;
  sym.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const auto b = static_cast<unsigned char>(word[i]);
    sym.push_back(i + 1 == word.size() ? byte_eow_id_[b] : byte_id_[b]);
  }
  merges_.merge(sym);
  return sym;
}

void ClipTokenizer::bpe_word(const std::string& word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  cache_.append(word, ids, [this](const std::string& w) { return merge_symbols(w); });
}

void ClipTokenizer::encode_span(std::string_view span, std::vector<int32_t>& ids) const {
  const std::u32string norm = normalize(span);
  for (std::u32string_view piece : split_words(norm, SplitStyle::kClip))
    for (std::u32string_view word : split_words(piece, SplitStyle::kGpt2)) bpe_word(unicode::encode_utf8(word), ids);
}

std::vector<int32_t> ClipTokenizer::encode_unpadded(const std::string& text) const {
  std::vector<int32_t> ids;
  std::string_view rest(text);
  size_t start = 0;  // beginning of the pending span without special tokens
  size_t i = 0;
  while (i < rest.size()) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& sp : special_tokens_)
      if (rest.substr(i).starts_with(sp.first)) {
        hit = &sp;
        break;  // sorted longest first
      }
    if (!hit) {
      ++i;
      continue;
    }
    encode_span(rest.substr(start, i - start), ids);
    ids.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  encode_span(rest.substr(start), ids);
  return ids;
}

ClipEncoding ClipTokenizer::encode_full(const std::string& text) const {
  std::vector<int32_t> tokens = encode_unpadded(text);
  const size_t room = size_t(std::max(max_length_ - 2, 0));  // BOS and EOS always fit
  if (tokens.size() > room) tokens.resize(room);
  ClipEncoding e;
  e.ids.reserve(size_t(max_length_));
  e.ids.push_back(bos_);
  e.ids.insert(e.ids.end(), tokens.begin(), tokens.end());
  e.ids.push_back(eos_);
  e.length = int(e.ids.size());
  e.ids.resize(std::max(size_t(max_length_), e.ids.size()), pad_);
  e.eos_index = int(std::find(e.ids.begin(), e.ids.end(), eos_) - e.ids.begin());
  return e;
}

std::vector<int32_t> ClipTokenizer::encode(const std::string& text) const { return encode_full(text).ids; }

std::vector<std::string> ClipTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (int32_t id : encode_unpadded(text)) out.push_back(id_to_token(id));
  return out;
}

int32_t ClipTokenizer::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string& ClipTokenizer::id_to_token(int32_t id) const {
  static const std::string kEmpty;
  return (id >= 0 && size_t(id) < id_to_token_.size()) ? id_to_token_[id] : kEmpty;
}

}  // namespace atelier
