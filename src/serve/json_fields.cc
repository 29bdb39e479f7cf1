#include "serve/json_fields.h"

#include <cmath>

namespace atelier::serve {

Expected<nlohmann::json> parse_body(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return invalid_argument("the request body is empty; send a JSON object");
  // Depth scan outside strings: nlohmann's recursive parser would overflow the stack on "[[[[...".
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        return invalid_argument("the JSON body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_argument("the body is not valid JSON (byte " + std::to_string(e.byte) + ")");
  } catch (const nlohmann::json::exception& e) {  // a number past a double's range (1e999) is out_of_range, not a parse error
    return invalid_argument(std::string("the body holds a value JSON numbers cannot represent: ") + e.what());
  }
  if (!j.is_object()) return invalid_argument("the body must be a JSON object, got " + describe_json_value(j));
  return j;
}

std::string describe_json_value(const nlohmann::json& v) {
  std::string kind;
  switch (v.type()) {
    case nlohmann::json::value_t::string: kind = "a string"; break;
    case nlohmann::json::value_t::boolean: kind = "a boolean"; break;
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: kind = "an integer"; break;
    case nlohmann::json::value_t::number_float: kind = "a number"; break;
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::null: return "null";
    default: return "an unsupported value";
  }
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text + " (" + kind + ")";
}

const nlohmann::json* FieldReader::get(const char* key) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool FieldReader::has(const char* key) const { return get(key) != nullptr; }

Status FieldReader::type_error(const char* key, const std::string& expected, const nlohmann::json& got) const {
  return invalid_argument(name(key) + ": expected " + expected + ", got " + describe_json_value(got));
}

Status FieldReader::string(const char* key, std::string& out, size_t max_bytes) {
  const nlohmann::json* v = get(key);
  if (!v) return Status::ok();
  if (!v->is_string()) return type_error(key, "a string", *v);
  const auto& s = v->get_ref<const std::string&>();
  if (s.size() > max_bytes)
    return invalid_argument(name(key) + ": longer than the limit of " + std::to_string(max_bytes) + " bytes");
  out = s;
  return Status::ok();
}

Status FieldReader::boolean(const char* key, bool& out) {
  const nlohmann::json* v = get(key);
  if (!v) return Status::ok();
  if (!v->is_boolean()) return type_error(key, "true or false", *v);
  out = v->get<bool>();
  return Status::ok();
}

Status FieldReader::integer(const char* key, int64_t lo, int64_t hi, int64_t& out) {
  const nlohmann::json* v = get(key);
  if (!v) return Status::ok();
  const std::string expected = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  int64_t value = 0;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) return type_error(key, expected, *v);
    value = v->get<int64_t>();
  } else if (v->is_number_float()) {  // 20.0 is accepted (some clients write every number as a float)
    const double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15) return type_error(key, expected, *v);
    value = int64_t(d);
  } else {
    return type_error(key, expected, *v);
  }
  if (value < lo || value > hi) return type_error(key, expected, *v);
  out = value;
  return Status::ok();
}

Status FieldReader::integer(const char* key, int lo, int hi, int& out) {
  int64_t v = out;
  ATELIER_RETURN_IF_ERROR(integer(key, int64_t(lo), int64_t(hi), v));
  out = int(v);
  return Status::ok();
}

Status FieldReader::number(const char* key, double lo, double hi, double& out) {
  const nlohmann::json* v = get(key);
  if (!v) return Status::ok();
  char range[96];
  std::snprintf(range, sizeof range, "a number from %g to %g", lo, hi);
  if (!v->is_number()) return type_error(key, range, *v);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) return type_error(key, range, *v);
  out = d;
  return Status::ok();
}

Status FieldReader::number(const char* key, double lo, double hi, float& out) {
  double d = out;
  ATELIER_RETURN_IF_ERROR(number(key, lo, hi, d));
  out = float(d);
  return Status::ok();
}

Status FieldReader::choice(const char* key, const std::vector<std::string>& allowed, std::string& out) {
  const nlohmann::json* v = get(key);
  if (!v) return Status::ok();
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  if (!v->is_string()) return type_error(key, "one of " + list, *v);
  for (const auto& a : allowed) {
    if (v->get_ref<const std::string&>() == a) {
      out = a;
      return Status::ok();
    }
  }
  return type_error(key, "one of " + list, *v);
}

Status FieldReader::only(const std::set<std::string>& known) const {
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    if (!known.count(it.key())) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      std::string key = it.key().size() > 64 ? it.key().substr(0, 64) + "..." : it.key();
      return invalid_argument("unknown field '" + prefix_ + key + "'; supported fields: " + list);
    }
  }
  return Status::ok();
}

}  // namespace atelier::serve
