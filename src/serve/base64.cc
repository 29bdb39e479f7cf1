#include "serve/base64.h"

#include <array>

namespace atelier::serve {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr int8_t kInvalid = -1;

std::array<int8_t, 256> make_table() {
  std::array<int8_t, 256> t{};
  t.fill(kInvalid);
  for (int i = 0; i < 64; ++i) t[uint8_t(kAlphabet[i])] = int8_t(i);
  t[uint8_t('-')] = 62;  // the URL-safe alphabet too: some clients send it
  t[uint8_t('_')] = 63;
  return t;
}

}  // namespace

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (const size_t rest = in.size() - i; rest > 0) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Expected<std::string> base64_decode(std::string_view text, const std::string& field, size_t max_decoded_bytes) {
  static const std::array<int8_t, 256> table = make_table();
  if (text.substr(0, 5) == "data:") {  // data URL: keep what follows ";base64,"
    const size_t comma = text.find(',');
    if (comma == std::string_view::npos || text.substr(0, comma).find(";base64") == std::string_view::npos)
      return invalid_argument(field + ": a data URL must be base64 (data:<type>;base64,<data>)");
    text.remove_prefix(comma + 1);
  }
  if (text.size() / 4 * 3 > max_decoded_bytes + 3)
    return invalid_argument(field + ": the data is larger than the limit of " + std::to_string(max_decoded_bytes) + " bytes");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0, pad = 0;
  size_t symbols = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n' || c == '\r' || c == ' ' || c == '\t') continue;
    if (c == '=') {
      ++pad;
      continue;
    }
    const int8_t v = table[uint8_t(c)];
    if (v == kInvalid || pad > 0)
      return invalid_argument(field + ": not valid base64 (unexpected character at offset " + std::to_string(i) + ")");
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    ++symbols;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xff);
    }
  }
  if (symbols % 4 == 1 || pad > 2 || (pad > 0 && (symbols + size_t(pad)) % 4 != 0))
    return invalid_argument(field + ": not valid base64 (truncated data or wrong padding)");
  if (symbols == 0) return invalid_argument(field + ": empty base64 data");
  return out;
}

}  // namespace atelier::serve
