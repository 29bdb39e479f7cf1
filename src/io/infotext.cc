#include "io/infotext.h"

#include <nlohmann/json.hpp>

namespace atelier {
namespace {

constexpr const char* kNegativePrefix = "Negative prompt:";
constexpr size_t kMinParamsOnParamLine = 3;  // A1111's rule for telling the parameter line from a prompt line

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// Python's \w on str is Unicode-aware; any non-ASCII byte counts as a word character here.
bool is_word(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
bool is_key_char(char c) { return is_word(c) || c == ' ' || c == '-' || c == '/'; }

// A1111's unquote(): JSON-decode a "..." value; on failure keep it as written.
std::string unquote(const std::string& v) {
  if (v.size() < 2 || v.front() != '"' || v.back() != '"') return v;
  try {
    const auto j = nlohmann::json::parse(v);
    if (j.is_string()) return j.get<std::string>();
  } catch (const nlohmann::json::exception&) {
  }
  return v;
}

// One match of A1111's re_param, \s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$), tried at `pos`.
// On success fills key/value (raw) and returns the end of the match.
bool match_param(const std::string& s, size_t pos, std::string* key, std::string* value, size_t* end) {
  size_t i = pos;
  while (i < s.size() && is_space(s[i])) ++i;
  if (i >= s.size() || !is_word(s[i])) return false;
  const size_t key_begin = i++;
  while (i < s.size() && is_key_char(s[i])) ++i;
  if (i - key_begin < 2 || i >= s.size() || s[i] != ':') return false;
  *key = s.substr(key_begin, i - key_begin);
  ++i;
  while (i < s.size() && is_space(s[i])) ++i;
  // `$` matches at the end or before a final newline.
  auto at_end = [&](size_t p) { return p == s.size() || (p + 1 == s.size() && s[p] == '\n'); };
  if (i < s.size() && s[i] == '"') {  // quoted alternative, when followed by ',' or the end
    size_t j = i + 1;
    while (j < s.size() && s[j] != '"') j += (s[j] == '\\' && j + 1 < s.size()) ? 2 : 1;
    if (j < s.size() && j > i + 1 && j - i >= 2) {
      const size_t after = j + 1;
      if (after < s.size() && s[after] == ',') { *value = s.substr(i, after - i); *end = after + 1; return true; }
      if (at_end(after)) { *value = s.substr(i, after - i); *end = after; return true; }
    }
  }
  size_t j = i;  // unquoted alternative: everything up to the next ','
  while (j < s.size() && s[j] != ',') ++j;
  *value = s.substr(i, j - i);
  *end = j < s.size() ? j + 1 : j;
  return true;
}

// re_param.findall(line): scan, advancing one character past each position where no match starts.
InfotextParams find_params(const std::string& line) {
  InfotextParams out;
  size_t pos = 0;
  while (pos < line.size()) {
    std::string k, v;
    size_t end = 0;
    if (match_param(line, pos, &k, &v, &end)) {
      out.emplace_back(std::move(k), std::move(v));
      pos = end;
    } else {
      ++pos;
    }
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '\n') {
      lines.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return lines;
}

}  // namespace

std::string Infotext::get(const std::string& key, const std::string& def) const {
  for (const auto& [k, v] : params)
    if (k == key) return v;
  return def;
}

std::string quote_infotext_value(const std::string& value) {
  const bool a1111_quotes = value.find_first_of(",:\n") != std::string::npos;
  const bool ambiguous = !value.empty() && (value.front() == '"' || is_space(value.front()) || is_space(value.back()));
  if (!a1111_quotes && !ambiguous) return value;
  // ensure_ascii=False like Python's json.dumps(..., ensure_ascii=False); invalid UTF-8 becomes U+FFFD.
  return nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string build_infotext(const std::string& prompt, const std::string& negative, const InfotextParams& params) {
  std::string text = prompt;
  if (!negative.empty()) {
    text.append("\n").append(kNegativePrefix).append(" ").append(negative);
  }
  text += "\n";
  for (size_t i = 0; i < params.size(); ++i) {
    if (i > 0) text += ", ";
    text += params[i].first + ": " + quote_infotext_value(params[i].second);
  }
  return strip(text);
}

Infotext parse_infotext(const std::string& text) {
  Infotext out;
  std::vector<std::string> lines = split_lines(strip(text));
  std::string last = lines.back();
  lines.pop_back();
  InfotextParams params = find_params(last);
  if (params.size() < kMinParamsOnParamLine) {
    lines.push_back(last);
    params.clear();
  }
  bool in_negative = false;
  for (std::string line : lines) {
    line = strip(line);
    if (line.rfind(kNegativePrefix, 0) == 0) {
      in_negative = true;
      line = strip(line.substr(std::string(kNegativePrefix).size()));
    }
    std::string& target = in_negative ? out.negative : out.prompt;
    target += (target.empty() ? "" : "\n") + line;
  }
  for (auto& [k, v] : params) out.params.emplace_back(k, unquote(v));
  return out;
}

}  // namespace atelier
