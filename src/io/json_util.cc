#include "io/json_util.h"

#include <cmath>
#include <optional>

#include "io/file.h"

namespace atelier {
namespace {

using json = nlohmann::json;

// tokenizer.json files reach ~20 MB; anything far beyond that is not a config we should parse into memory.
constexpr uint64_t kMaxJsonFileBytes = uint64_t(512) << 20;
constexpr size_t kMaxValueEcho = 60;  // how much of an offending value an error message quotes

std::string prefix(std::string_view context) {
  return context.empty() ? std::string() : std::string(context) + ": ";
}

std::string echo(const json& v) {
  std::string s = v.dump();
  if (s.size() > kMaxValueEcho) s = s.substr(0, kMaxValueEcho) + "...";
  return s;
}

Status wrong_type(std::string_view context, std::string_view key, const char* expected, const json& v) {
  return invalid_argument(prefix(context) + "key '" + std::string(key) + "': expected " + expected + ", got " +
                          json_type_name(v) + " " + echo(v));
}

// The value at `key`, or nullptr when absent or null. Error when `obj` is not an object.
Expected<const json*> lookup(const json& obj, std::string_view key, std::string_view context) {
  if (!obj.is_object())
    return invalid_argument(prefix(context) + "expected a JSON object to read key '" + std::string(key) + "', got " +
                            json_type_name(obj));
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return static_cast<const json*>(nullptr);
  return &*it;
}

}  // namespace

bool json_to(const json& v, double* out) {
  if (!v.is_number()) return false;
  *out = v.get<double>();
  return true;
}

bool json_to(const json& v, int64_t* out) {
  constexpr double kTwo63 = 9223372036854775808.0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return false;
    *out = int64_t(u);
    return true;
  }
  if (v.is_number_integer()) { *out = v.get<int64_t>(); return true; }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || d < -kTwo63 || d >= kTwo63) return false;
    *out = int64_t(d);
    return true;
  }
  return false;
}

bool json_to(const json& v, bool* out) {
  if (!v.is_boolean()) return false;
  *out = v.get<bool>();
  return true;
}

bool json_to(const json& v, std::string* out) {
  if (!v.is_string()) return false;
  *out = v.get<std::string>();
  return true;
}

namespace {

template <typename T>
Expected<T> get_scalar(const json& obj, std::string_view key, std::optional<T> def, std::string_view context) {
  ATELIER_ASSIGN_OR_RETURN(const json* v, lookup(obj, key, context));
  if (v == nullptr) {
    if (def) return *def;
    return not_found(prefix(context) + "required key '" + std::string(key) + "' is missing");
  }
  T out{};
  if (!json_to(*v, &out)) return wrong_type(context, key, config_type_words<T>(), *v);
  return out;
}

template <typename T>
Expected<std::vector<T>> get_array(const json& obj, std::string_view key, const std::vector<T>& def,
                                   std::string_view context) {
  ATELIER_ASSIGN_OR_RETURN(const json* v, lookup(obj, key, context));
  if (v == nullptr) return def;
  if (!v->is_array()) return wrong_type(context, key, "an array", *v);
  std::vector<T> out(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    if (!json_to((*v)[i], &out[i]))
      return invalid_argument(prefix(context) + "key '" + std::string(key) + "' element " + std::to_string(i) +
                              ": expected " + config_type_words<T>() + ", got " + json_type_name((*v)[i]) + " " + echo((*v)[i]));
  }
  return out;
}

// 1-based line and column of byte offset `pos` in `text` (nlohmann reports a byte count).
std::string line_column(std::string_view text, size_t pos) {
  if (pos > text.size()) pos = text.size();
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos; ++i) {
    if (text[i] == '\n') { ++line; col = 1; } else { ++col; }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

}  // namespace

std::string json_type_name(const json& v) {
  if (v.is_number_float()) return "number";
  if (v.is_number()) return "integer";
  return v.type_name();
}

namespace {
struct TooDeep {};  // thrown from the parser callback: nlohmann has no other way to stop a parse

// `keep` (or keep everything), throwing TooDeep past `max_depth`.
json::parser_callback_t bounded(int max_depth, const json::parser_callback_t& keep = nullptr) {
  return [max_depth, keep](int depth, json::parse_event_t event, json& parsed) {
    if (depth > max_depth) throw TooDeep{};
    return keep ? keep(depth, event, parsed) : true;
  };
}
}  // namespace

json parse_json_bounded(std::string_view text, bool* too_deep, const json::parser_callback_t& keep, int max_depth) {
  if (too_deep) *too_deep = false;
  try {
    return json::parse(text.begin(), text.end(), bounded(max_depth, keep), /*allow_exceptions=*/false);
  } catch (const TooDeep&) {
    if (too_deep) *too_deep = true;
    return json(json::value_t::discarded);
  }
}

std::string json_excerpt(const json& v, size_t max_chars) {
  std::string text = v.dump();  // bounded: every value here comes from a depth-limited parse
  if (text.size() > max_chars) text = text.substr(0, max_chars) + "...";
  return text;
}

Expected<json> parse_json(std::string_view text, const std::string& label) {
  try {
    return json::parse(text.begin(), text.end(), bounded(kMaxJsonDepth));
  } catch (const TooDeep&) {
    return corrupt(label + ": JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const json::parse_error& e) {
    // e.byte is 1-based: the position of the character that failed.
    const size_t pos = e.byte > 0 ? size_t(e.byte - 1) : 0;
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] parse error at line L, column C: " preamble; we say it.
    if (auto colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    return corrupt(label + ": JSON syntax error at " + line_column(text, pos) + ": " + what);
  } catch (const json::exception& e) {
    return corrupt(label + ": invalid JSON: " + e.what());
  }
}

Expected<json> read_json_file(const std::string& path) {
  ATELIER_ASSIGN_OR_RETURN(std::string text, read_file(path, "JSON file", kMaxJsonFileBytes));
  return parse_json(text, path);
}

Expected<double> get_number(const json& obj, std::string_view key, double def, std::string_view context) {
  return get_scalar<double>(obj, key, def, context);
}
Expected<double> require_number(const json& obj, std::string_view key, std::string_view context) {
  return get_scalar<double>(obj, key, std::nullopt, context);
}
Expected<int64_t> get_int(const json& obj, std::string_view key, int64_t def, std::string_view context) {
  return get_scalar<int64_t>(obj, key, def, context);
}
Expected<int64_t> require_int(const json& obj, std::string_view key, std::string_view context) {
  return get_scalar<int64_t>(obj, key, std::nullopt, context);
}
Expected<bool> get_bool(const json& obj, std::string_view key, bool def, std::string_view context) {
  return get_scalar<bool>(obj, key, def, context);
}
Expected<bool> require_bool(const json& obj, std::string_view key, std::string_view context) {
  return get_scalar<bool>(obj, key, std::nullopt, context);
}
Expected<std::string> get_string(const json& obj, std::string_view key, const std::string& def, std::string_view context) {
  return get_scalar<std::string>(obj, key, def, context);
}
Expected<std::string> require_string(const json& obj, std::string_view key, std::string_view context) {
  return get_scalar<std::string>(obj, key, std::nullopt, context);
}
Expected<std::vector<double>> get_numbers(const json& obj, std::string_view key, const std::vector<double>& def,
                                          std::string_view context) {
  return get_array<double>(obj, key, def, context);
}
Expected<std::vector<int64_t>> get_ints(const json& obj, std::string_view key, const std::vector<int64_t>& def,
                                        std::string_view context) {
  return get_array<int64_t>(obj, key, def, context);
}
Expected<std::vector<std::string>> get_strings(const json& obj, std::string_view key,
                                               const std::vector<std::string>& def, std::string_view context) {
  return get_array<std::string>(obj, key, def, context);
}

}  // namespace atelier
