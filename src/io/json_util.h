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
#include <string>
#include <string_view>
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
