#include "tokenizers/prompt_weights.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizers/unicode.h"

namespace atelier {
namespace {

constexpr double kRoundMultiplier = 1.1;
constexpr double kSquareMultiplier = 1 / 1.1;
constexpr double kBreakWeight = -1.0;
// The largest weight magnitude a chunk may end with (explicit weights and nested brackets multiplied): far past any
// useful emphasis, and small enough that weighted embeddings stay finite in f16 (1.1^1000 from nested brackets, or
// (word:1e39), overflowed to inf and the image came out black).
constexpr double kMaxEmphasisWeight = 100.0;
constexpr std::u32string_view kBreak = U"BREAK";

// Python's re \s for str patterns: str.isspace(), i.e. White_Space plus the separators U+001C..U+001F.
bool py_space(char32_t c) { return unicode::is_whitespace(c) || (c >= 0x1C && c <= 0x1F); }
// Python's re \w: letters, numbers and '_'.
bool py_word(char32_t c) { return c == U'_' || unicode::is_letter(c) || unicode::is_number(c); }

// re.split(r"\s*\bBREAK\b\s*", s): the pieces between BREAK keywords (and their surrounding whitespace).
std::vector<std::u32string> split_on_break(std::u32string_view s) {
  std::vector<std::u32string> parts;
  const size_t n = s.size();
  size_t piece_start = 0;  // where the search resumes: the end of the previous match
  for (size_t p = 0; p + kBreak.size() <= n; ++p) {
    if (s.substr(p, kBreak.size()) != kBreak) continue;
    const size_t after = p + kBreak.size();
    if ((p > 0 && py_word(s[p - 1])) || (after < n && py_word(s[after]))) continue;  // \b on both sides
    size_t start = p;
    while (start > piece_start && py_space(s[start - 1])) --start;
    size_t end = after;
    while (end < n && py_space(s[end])) ++end;
    parts.emplace_back(s.substr(piece_start, start - piece_start));
    piece_start = end;
    p = end - 1;
  }
  parts.emplace_back(s.substr(piece_start));
  return parts;
}

// Length of a match of :\s*([+-]?[.\d]+)\s*\) at s[i] == ':' (0 when none), and the captured number.
size_t match_weight(std::u32string_view s, size_t i, std::u32string_view& number) {
  size_t j = i + 1;
  while (j < s.size() && py_space(s[j])) ++j;
  const size_t num_start = j;
  if (j < s.size() && (s[j] == U'+' || s[j] == U'-')) ++j;
  const size_t digits_start = j;
  while (j < s.size() && (s[j] == U'.' || (s[j] >= U'0' && s[j] <= U'9'))) ++j;
  if (j == digits_start) return 0;
  number = s.substr(num_start, j - num_start);
  while (j < s.size() && py_space(s[j])) ++j;
  if (j >= s.size() || s[j] != U')') return 0;
  return j + 1 - i;
}

// Python's float() on a [+-]?[.\d]+ string: valid when it is [+-]?(\d+\.?\d*|\.\d+).
Expected<double> parse_weight(std::u32string_view number) {
  std::string text = unicode::encode_utf8(number);
  const std::string original = text;
  if (!text.empty() && text[0] == '+') text.erase(0, 1);  // from_chars takes no '+'
  const size_t body = (!text.empty() && text[0] == '-') ? 1 : 0;
  const size_t dot = text.find('.', body);
  const bool one_dot = dot == std::string::npos || text.find('.', dot + 1) == std::string::npos;
  const bool has_digit = text.find_first_of("0123456789", body) != std::string::npos;
  double value = 0;
  if (one_dot && has_digit) {
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, std::chars_format::fixed);
    if (ec == std::errc() && ptr == text.data() + text.size()) return value;
  }
  return invalid_argument("prompt emphasis weight '" + original + "' is not a number (expected e.g. (word:1.2))");
}

void append_text(std::vector<PromptChunk>& res, std::u32string_view text) {
  const std::vector<std::u32string> parts = split_on_break(text);
  for (size_t k = 0; k < parts.size(); ++k) {
    if (k > 0) res.push_back({"BREAK", kBreakWeight});
    res.push_back({unicode::encode_utf8(parts[k]), 1.0});
  }
}

void multiply_range(std::vector<PromptChunk>& res, size_t start, double multiplier) {
  for (size_t p = start; p < res.size(); ++p) res[p].weight *= multiplier;
}

bool is_special(char32_t c) { return c == U'\\' || c == U'(' || c == U')' || c == U'[' || c == U']' || c == U':'; }

void append_token(WeightedTokens& out, int32_t id, float weight) {
  out.ids.push_back(id);
  out.weights.push_back(weight);
}

}  // namespace

Expected<std::vector<PromptChunk>> parse_prompt_attention(std::string_view prompt) {
  const std::u32string s = unicode::decode_utf8(prompt);
  std::vector<PromptChunk> res;
  std::vector<size_t> round, square;  // indices into res where open brackets started
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = s[i];
    if (c == U'\\') {
      // \( \) \[ \] \\ give the character; a lone backslash gives nothing.
      const bool escaped = i + 1 < s.size() && (s[i + 1] == U'(' || s[i + 1] == U')' || s[i + 1] == U'[' ||
                                                s[i + 1] == U']' || s[i + 1] == U'\\');
      res.push_back({escaped ? unicode::encode_utf8(s.substr(i + 1, 1)) : std::string(), 1.0});
      i += escaped ? 2 : 1;
    } else if (c == U'(') {
      round.push_back(res.size());
      ++i;
    } else if (c == U'[') {
      square.push_back(res.size());
      ++i;
    } else if (c == U':') {
      std::u32string_view number;
      const size_t len = match_weight(s, i, number);
      if (len > 0 && !round.empty()) {
        ATELIER_ASSIGN_OR_RETURN(double w, parse_weight(number));
        multiply_range(res, round.back(), w);
        round.pop_back();
      } else {
        append_text(res, std::u32string_view(s).substr(i, len > 0 ? len : 1));
      }
      i += len > 0 ? len : 1;
    } else if (c == U')' && !round.empty()) {
      multiply_range(res, round.back(), kRoundMultiplier);
      round.pop_back();
      ++i;
    } else if (c == U']' && !square.empty()) {
      multiply_range(res, square.back(), kSquareMultiplier);
      square.pop_back();
      ++i;
    } else if (c == U')' || c == U']') {
      append_text(res, std::u32string_view(s).substr(i, 1));
      ++i;
    } else {
      size_t j = i;
      while (j < s.size() && !is_special(s[j])) ++j;
      append_text(res, std::u32string_view(s).substr(i, j - i));
      i = j;
    }
  }
  // Unclosed brackets apply to the end, in the order they were opened.
  for (size_t pos : round) multiply_range(res, pos, kRoundMultiplier);
  for (size_t pos : square) multiply_range(res, pos, kSquareMultiplier);
  if (res.empty()) res.push_back({"", 1.0});
  for (const PromptChunk& chunk : res)
    if (!chunk.is_break() && !(std::abs(chunk.weight) <= kMaxEmphasisWeight)) {
      char weight[32];
      std::snprintf(weight, sizeof weight, "%g", chunk.weight);
      return invalid_argument("prompt emphasis weight " + std::string(weight) + " is out of range: a chunk's weight (explicit " +
                              "weights and nested brackets multiplied) must be within +-100");
    }
  // Merge neighbours with exactly equal weights.
  std::vector<PromptChunk> merged;
  for (PromptChunk& chunk : res) {
    if (!merged.empty() && merged.back().weight == chunk.weight)
      merged.back().text += chunk.text;
    else
      merged.push_back(std::move(chunk));
  }
  return merged;
}

std::vector<PromptChunk> unweighted_prompt(std::string_view prompt) { return {{std::string(prompt), 1.0}}; }

WeightedTokens encode_weighted(const ClipTokenizer& tokenizer, const std::vector<PromptChunk>& chunks) {
  const size_t room = size_t(std::max(tokenizer.max_length() - 2, 0));
  WeightedTokens out;
  append_token(out, tokenizer.bos(), 1.0f);
  for (const PromptChunk& chunk : chunks) {
    if (chunk.is_break()) continue;
    for (int32_t id : tokenizer.encode_unpadded(chunk.text)) {
      if (out.ids.size() - 1 >= room) break;
      append_token(out, id, float(chunk.weight));
    }
  }
  append_token(out, tokenizer.eos(), 1.0f);
  while (out.ids.size() < size_t(tokenizer.max_length())) append_token(out, tokenizer.pad(), 1.0f);
  return out;
}

namespace {

// A1111's tokenize_line state: the window being filled and the windows done.
struct WindowPacker {
  const ClipTokenizer& tok;
  size_t window_tokens;  // 75 for CLIP
  LongPromptTokens result;
  WeightedTokens current;
  ptrdiff_t last_comma = -1;

  void next_window(bool is_last) {
    result.token_count += is_last ? int(current.ids.size()) : int(window_tokens);
    while (current.ids.size() < window_tokens) append_token(current, tok.eos(), 1.0f);
    WeightedTokens w;
    append_token(w, tok.bos(), 1.0f);
    w.ids.insert(w.ids.end(), current.ids.begin(), current.ids.end());
    w.weights.insert(w.weights.end(), current.weights.begin(), current.weights.end());
    append_token(w, tok.eos(), 1.0f);
    if (tok.pad() != tok.eos()) {  // A1111 replaces everything after the first EOS with the pad id
      auto first_eos = std::find(w.ids.begin(), w.ids.end(), tok.eos());
      if (first_eos != w.ids.end()) std::fill(first_eos + 1, w.ids.end(), tok.pad());
    }
    result.windows.push_back(std::move(w));
    current = WeightedTokens();
    last_comma = -1;
  }
};

}  // namespace

LongPromptTokens encode_long_prompt(const ClipTokenizer& tokenizer, const std::vector<PromptChunk>& chunks,
                                    int comma_padding_backtrack) {
  WindowPacker pk{tokenizer, size_t(std::max(tokenizer.max_length() - 2, 1)), {}, {}, -1};
  const int32_t comma = tokenizer.token_to_id(",</w>");
  for (const PromptChunk& chunk : chunks) {
    if (chunk.is_break()) {
      pk.next_window(false);
      continue;
    }
    for (int32_t id : tokenizer.encode_unpadded(chunk.text)) {
      const ptrdiff_t filled = ptrdiff_t(pk.current.ids.size());
      if (id == comma) {
        pk.last_comma = filled;
      } else if (comma_padding_backtrack != 0 && size_t(filled) == pk.window_tokens && pk.last_comma != -1 &&
                 filled - pk.last_comma <= comma_padding_backtrack) {
        // Move the words after the last comma to the next window.
        const size_t cut = size_t(pk.last_comma + 1);
        WeightedTokens moved;
        moved.ids.assign(pk.current.ids.begin() + cut, pk.current.ids.end());
        moved.weights.assign(pk.current.weights.begin() + cut, pk.current.weights.end());
        pk.current.ids.resize(cut);
        pk.current.weights.resize(cut);
        pk.next_window(false);
        pk.current = std::move(moved);
      }
      if (pk.current.ids.size() == pk.window_tokens) pk.next_window(false);
      append_token(pk.current, id, float(chunk.weight));
    }
  }
  if (!pk.current.ids.empty() || pk.result.windows.empty()) pk.next_window(true);
  return std::move(pk.result);
}

}  // namespace atelier
