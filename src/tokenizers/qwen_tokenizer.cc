#include "tokenizers/qwen_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <mutex>

#include <nlohmann/json.hpp>

#include "io/file.h"
#include "io/json_util.h"
#include "tokenizers/unicode.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char32_t kLongS = U'\u017F';  // ſ: case-folds to 's', so (?i:'s) matches "'ſ"

bool is_newline(char32_t c) { return c == U'\r' || c == U'\n'; }
bool is_ws(char32_t c) { return unicode::is_whitespace(c); }
bool is_letter(char32_t c) { return unicode::is_letter(c); }
bool is_number(char32_t c) { return unicode::is_number(c); }
bool is_other(char32_t c) { return !is_ws(c) && !is_letter(c) && !is_number(c); }

char32_t fold_ascii(char32_t c) {
  if (c >= U'A' && c <= U'Z') return c + (U'a' - U'A');
  return c == kLongS ? U's' : c;
}

// Branch 1, (?i:'s|'t|'re|'ve|'m|'ll|'d): the match length at i, or 0.
size_t match_contraction(std::u32string_view s, size_t i) {
  if (s[i] != U'\'' || i + 1 >= s.size()) return 0;
  const char32_t a = fold_ascii(s[i + 1]);
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (i + 2 >= s.size()) return 0;
  const char32_t b = fold_ascii(s[i + 2]);
  if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  return 0;
}

// Length of the run of characters satisfying `pred` starting at i.
template <typename Pred>
size_t run(std::u32string_view s, size_t i, Pred pred) {
  size_t j = i;
  while (j < s.size() && pred(s[j])) ++j;
  return j - i;
}

// The length of the regex's leftmost-first match at i (always >= 1: the branches cover every character).
size_t match_at(std::u32string_view s, size_t i) {
  const size_t n = s.size();
  const char32_t c = s[i];
  if (size_t len = match_contraction(s, i)) return len;
  // [^\r\n\p{L}\p{N}]?\p{L}+ : the optional prefix is taken when a letter follows it.
  if (!is_newline(c) && !is_letter(c) && !is_number(c) && i + 1 < n && is_letter(s[i + 1]))
    return 1 + run(s, i + 1, is_letter);
  if (is_letter(c)) return run(s, i, is_letter);
  if (is_number(c)) return 1;  // \p{N}: one digit at a time
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  const size_t start = (c == U' ' && i + 1 < n && is_other(s[i + 1])) ? i + 1 : i;
  if (is_other(s[start])) {
    size_t j = start + run(s, start, is_other);
    return j + run(s, j, is_newline) - i;
  }
  // What remains starts with whitespace.
  const size_t ws = run(s, i, is_ws);
  // \s*[\r\n]+ : greedy \s* backs off to the last newline of the run.
  for (size_t k = i + ws; k > i; --k)
    if (is_newline(s[k - 1])) return k - i;
  // \s+(?!\S): the run minus its last character when a non-space follows, unless that leaves nothing.
  if (i + ws == n) return ws;
  if (ws > 1) return ws - 1;
  return ws;  // \s+
}

std::vector<std::u32string_view> split_pieces(std::u32string_view s) {
  std::vector<std::u32string_view> out;
  for (size_t i = 0; i < s.size();) {
    const size_t len = match_at(s, i);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace

QwenTokenizer::QwenTokenizer() = default;

Expected<QwenTokenizer> QwenTokenizer::load(const std::string& dir) {
  // nlohmann::json accessors throw on wrongly typed fields: report those as corrupt files.
  try {
    return load_impl(dir);
  } catch (const std::exception& e) {
    return corrupt("tokenizer folder " + dir + ": " + e.what());
  }
}

Expected<QwenTokenizer> QwenTokenizer::load_impl(const std::string& dir_str) {
  const fs::path dir(dir_str);
  if (!fs::exists(dir / "tokenizer.json")) return not_found(dir_str + " has no tokenizer.json (Qwen tokenizers need it)");
  ATELIER_ASSIGN_OR_RETURN(json tj, read_json_file((dir / "tokenizer.json").string()));
  const json& model = tj.at("model");
  QwenTokenizer t;
  std::vector<std::pair<std::string, std::string>> merges;
  ATELIER_RETURN_IF_ERROR(bpe::read_model(model, dir_str + "/tokenizer.json", t.vocab_, merges));
  for (const json& a : tj.value("added_tokens", json::array())) {
    const std::string content = a.at("content").get<std::string>();
    t.vocab_[content] = a.at("id").get<int32_t>();
    if (!content.empty()) t.added_tokens_.emplace_back(content, a.at("id").get<int32_t>());
  }
  std::sort(t.added_tokens_.begin(), t.added_tokens_.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  ATELIER_RETURN_IF_ERROR(t.merges_.build(merges, t.vocab_, dir_str + "/tokenizer.json"));
  for (int b = 0; b < 256; ++b) {
    auto it = t.vocab_.find(bpe::byte_symbols()[size_t(b)]);
    if (it == t.vocab_.end()) return unsupported(dir_str + ": the vocabulary lacks byte symbol " + std::to_string(b) + " (not a byte-level BPE)");
    t.byte_id_[b] = it->second;
  }

  json config = fs::exists(dir / "tokenizer_config.json") ? read_json_file((dir / "tokenizer_config.json").string()).value() : json::object();
  std::string pad_name = "<|endoftext|>";
  if (config.contains("pad_token")) {
    const json& p = config.at("pad_token");
    if (p.is_string()) pad_name = p.get<std::string>();
    else if (p.is_object()) pad_name = p.at("content").get<std::string>();
  }
  auto pit = t.vocab_.find(pad_name);
  if (pit == t.vocab_.end()) return unsupported(dir_str + ": pad token '" + pad_name + "' is not in the vocabulary");
  t.pad_ = pit->second;
  if (fs::exists(dir / "chat_template.jinja")) {
    ATELIER_ASSIGN_OR_RETURN(t.chat_template_, read_file((dir / "chat_template.jinja").string(), "chat template"));
  } else if (config.contains("chat_template") && config.at("chat_template").is_string()) {
    t.chat_template_ = config.at("chat_template").get<std::string>();
  }
  return t;
}

std::vector<int32_t> QwenTokenizer::merge_symbols(const std::string& piece) const {
  std::vector<int32_t> sym;
  sym.reserve(piece.size());
  for (char ch : piece) sym.push_back(byte_id_[static_cast<unsigned char>(ch)]);
  merges_.merge(sym);  // what HF's queue of (rank, position) produces
  return sym;
}

void QwenTokenizer::bpe_piece(const std::string& piece, std::vector<int32_t>& ids) const {
  cache_.append(piece, ids, [this](const std::string& p) { return merge_symbols(p); });
}

void QwenTokenizer::encode_span(std::string_view span, std::vector<int32_t>& ids) const {
  if (span.empty()) return;
  const std::u32string norm = unicode::nfc(unicode::decode_utf8(span));
  for (std::u32string_view piece : split_pieces(norm)) bpe_piece(unicode::encode_utf8(piece), ids);
}

std::vector<std::string> QwenTokenizer::pre_tokenize(const std::string& text) {
  const std::u32string norm = unicode::nfc(unicode::decode_utf8(text));
  std::vector<std::string> out;
  for (std::u32string_view piece : split_pieces(norm)) out.push_back(unicode::encode_utf8(piece));
  return out;
}

std::vector<int32_t> QwenTokenizer::encode_unpadded(const std::string& text) const {
  std::vector<int32_t> ids;
  const std::string_view rest(text);
  size_t start = 0;  // beginning of the pending span without added tokens
  for (size_t i = 0; i < rest.size();) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& a : added_tokens_)
      if (rest.substr(i).starts_with(a.first)) {
        hit = &a;
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

QwenEncoding QwenTokenizer::encode(const std::string& text, int max_length) const {
  QwenEncoding e;
  e.ids = encode_unpadded(text);
  if (e.ids.size() > size_t(max_length)) e.ids.resize(size_t(max_length));
  e.length = int(e.ids.size());
  e.mask.assign(e.ids.size(), 1);
  e.ids.resize(size_t(max_length), pad_);
  e.mask.resize(size_t(max_length), 0);
  return e;
}

int32_t QwenTokenizer::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

}  // namespace atelier
