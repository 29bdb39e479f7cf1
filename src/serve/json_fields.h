// Typed reads of a JSON request body with 400-style messages that name the field and say what is accepted:
//   "steps: expected an integer from 1 to 150, got "abc" (a string)".
// An absent or null field keeps the caller's default. Every reader checks the JSON type first, so a
// hostile body (huge numbers, NaN-like strings, arrays where scalars belong) is an error, never a crash.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace atelier::serve {

constexpr int kMaxJsonDepth = 32;  // deeper bodies are refused before parsing (nlohmann's parser recurses)

// Parses a request body: rejects empty bodies, nesting deeper than kMaxJsonDepth and syntax errors
// (with the byte offset); the top level must be an object.
Expected<nlohmann::json> parse_body(std::string_view body);

class FieldReader {
 public:
  // `obj` must outlive the reader; `prefix` is prepended to field names ("override_settings.").
  explicit FieldReader(const nlohmann::json& obj, std::string prefix = {}) : obj_(obj), prefix_(std::move(prefix)) {}

  bool has(const char* key) const;
  Status string(const char* key, std::string& out, size_t max_bytes);
  Status boolean(const char* key, bool& out);
  Status integer(const char* key, int64_t lo, int64_t hi, int64_t& out);
  Status integer(const char* key, int lo, int hi, int& out);
  Status number(const char* key, double lo, double hi, float& out);
  Status number(const char* key, double lo, double hi, double& out);
  // A string from `allowed` (case-sensitive), e.g. response_format.
  Status choice(const char* key, const std::vector<std::string>& allowed, std::string& out);
  // Fails naming the first field that is not in `known` (the native API is strict; A1111 and OpenAI
  // clients send many fields we do not use, so those APIs ignore unknown ones).
  Status only(const std::set<std::string>& known) const;

  std::string name(const char* key) const { return prefix_ + key; }
  const nlohmann::json* get(const char* key) const;  // nullptr when absent or null

 private:
  Status type_error(const char* key, const std::string& expected, const nlohmann::json& got) const;
  const nlohmann::json& obj_;
  std::string prefix_;
};

// "a string", "an array", ... plus a short rendering of the value for messages.
std::string describe_json_value(const nlohmann::json& v);

}  // namespace atelier::serve
