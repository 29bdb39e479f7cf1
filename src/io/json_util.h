// JSON files and typed field access with errors as values. Model folders are full of JSON (config.json,
// model_index.json, scheduler_config.json, tokenizer files); every read goes through here so that a missing
// file, a syntax error (reported with line and column) or a field of the wrong type gives a Status that
// names the file and the key instead of an exception from deep inside nlohmann.
//
// Getter conventions: a key that is absent or null takes the default (diffusers writes null for "not set");
// `require_*` variants fail when the key is absent or null. `context` (e.g. "unet/config.json") prefixes
// every error message.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace atelier {

// The deepest nesting a JSON file read here may have (configs, tokenizer files and safetensors headers are a few levels
// deep). nlohmann's parser is iterative, but its dump, copy and comparison recurse: a hostile file nested 100,000
// deep overflowed the stack.
constexpr int kMaxJsonDepth = 64;

// nlohmann::json::parse(text, keep, false) with the nesting limited: a discarded value on a syntax error or past
// `max_depth` (then *too_deep is set). `keep`: nlohmann's optional callback (which values to keep).
nlohmann::json parse_json_bounded(std::string_view text, bool* too_deep = nullptr,
                                  const nlohmann::json::parser_callback_t& keep = nullptr, int max_depth = kMaxJsonDepth);

// A value's JSON text for an error message, cut to `max_chars` ("..." after it).
std::string json_excerpt(const nlohmann::json& v, size_t max_chars = 80);

// How much of a wrong config value an error message quotes.
constexpr size_t kConfigExcerptChars = 40;

// What counts as each type in a config, for every reader here (the get_* functions and ConfigValue): false when `v`
// is not one. Numbers: any JSON number. Integers: JSON integers that fit int64, or floats with an integral value
// (some exporters write 4.0). Booleans and strings: only those JSON types (no "true" or 1 for true).
bool json_to(const nlohmann::json& v, double* out);
bool json_to(const nlohmann::json& v, int64_t* out);
bool json_to(const nlohmann::json& v, bool* out);
bool json_to(const nlohmann::json& v, std::string* out);

// A config integer of type I: an integer by json_to that fits I; anything else throws Error naming `key`. (nlohmann's
// get<int> wraps 2^32 + 64 to 64 and cuts 64.5 to 64 without a word.)
template <typename I>
I config_integer(const nlohmann::json& v, std::string_view key) {
  int64_t wide = 0;
  if (!json_to(v, &wide) || wide < int64_t(std::numeric_limits<I>::min()) || wide > int64_t(std::numeric_limits<I>::max()))
    throw Error(invalid_argument(std::string(key) + ": expected an integer from " + std::to_string(std::numeric_limits<I>::min()) +
                                 " to " + std::to_string(std::numeric_limits<I>::max()) + ", got " + json_excerpt(v, kConfigExcerptChars)));
  return I(wide);
}

// The expected type's words for an error message ("a number", "true or false", ...).
template <typename T>
constexpr const char* config_type_words() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else return "a string";
}
// A config value of type T by json_to's rules (floats read as doubles); anything else throws Error naming `key` and
// quoting the value.
template <typename T>
struct ConfigValue {
  static T read(const nlohmann::json& v, std::string_view key) {
    std::conditional_t<std::is_floating_point_v<T>, double, T> wire{};
    if (!json_to(v, &wire))
      throw Error(invalid_argument(std::string(key) + ": expected " + config_type_words<T>() + ", got " +
                                   json_excerpt(v, kConfigExcerptChars)));
    return T(wire);
  }
};
template <>
struct ConfigValue<int> {
  static int read(const nlohmann::json& v, std::string_view key) { return config_integer<int>(v, key); }
};
template <>
struct ConfigValue<int64_t> {
  static int64_t read(const nlohmann::json& v, std::string_view key) { return config_integer<int64_t>(v, key); }
};
template <typename I>
struct ConfigValue<std::vector<I>> {
  static std::vector<I> read(const nlohmann::json& v, std::string_view key) {
    if (!v.is_array())
      throw Error(invalid_argument(std::string(key) + ": expected a list, got " + json_excerpt(v, kConfigExcerptChars)));
    std::vector<I> out;
    for (const auto& e : v) out.push_back(ConfigValue<I>::read(e, key));
    return out;
  }
};

// Reads `key` of the object j into `out` when present and not null, by ConfigValue<T>::read: a value of the wrong
// type, or an integer that is not whole or does not fit, throws Error naming "context: key" (callers turn it into a
// Status with catch_status).
template <typename T>
void read_config_field(const nlohmann::json& j, const char* key, T& out, std::string_view context) {
  auto it = j.find(key);
  if (it != j.end() && !it->is_null()) out = ConfigValue<T>::read(*it, std::string(context) + ": " + key);
}

// Reads and parses a JSON file. Errors: kNotFound (missing), kInvalidArgument (unreadable, too large),
// kCorrupt (syntax error, with line and column).
Expected<nlohmann::json> read_json_file(const std::string& path);
// Parses JSON text; `label` names the source in error messages.
Expected<nlohmann::json> parse_json(std::string_view text, const std::string& label = "<json>");

// Numbers: integers and floats both accepted.
Expected<double> get_number(const nlohmann::json& obj, std::string_view key, double def, std::string_view context = {});
Expected<double> require_number(const nlohmann::json& obj, std::string_view key, std::string_view context = {});
// Integers: a float is accepted only when it is integral (1.0), since some exporters write ints as floats.
Expected<int64_t> get_int(const nlohmann::json& obj, std::string_view key, int64_t def, std::string_view context = {});
Expected<int64_t> require_int(const nlohmann::json& obj, std::string_view key, std::string_view context = {});
Expected<bool> get_bool(const nlohmann::json& obj, std::string_view key, bool def, std::string_view context = {});
Expected<bool> require_bool(const nlohmann::json& obj, std::string_view key, std::string_view context = {});
Expected<std::string> get_string(const nlohmann::json& obj, std::string_view key, const std::string& def,
                                 std::string_view context = {});
Expected<std::string> require_string(const nlohmann::json& obj, std::string_view key, std::string_view context = {});

// Arrays of one element type. A scalar where an array is expected is an error (no silent broadcasting:
// callers that accept both, like `attention_head_dim`, check is_array() themselves).
Expected<std::vector<double>> get_numbers(const nlohmann::json& obj, std::string_view key,
                                          const std::vector<double>& def, std::string_view context = {});
Expected<std::vector<int64_t>> get_ints(const nlohmann::json& obj, std::string_view key,
                                        const std::vector<int64_t>& def, std::string_view context = {});
Expected<std::vector<std::string>> get_strings(const nlohmann::json& obj, std::string_view key,
                                               const std::vector<std::string>& def, std::string_view context = {});

// The JSON type's name as used in error messages ("number", "string", "array", ...).
std::string json_type_name(const nlohmann::json& v);

}  // namespace atelier
