#include "io/text_encoding.h"

namespace atelier {
namespace {
constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr char32_t kReplacement = 0xFFFD;
bool is_surrogate(char32_t c) { return c >= 0xD800 && c <= 0xDFFF; }
}  // namespace

std::optional<std::u32string> decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    int extra = 0;
    char32_t cp = 0, min = 0;
    if (b < 0x80) { cp = b; }
    else if ((b & 0xE0) == 0xC0) { cp = b & 0x1F; extra = 1; min = 0x80; }
    else if ((b & 0xF0) == 0xE0) { cp = b & 0x0F; extra = 2; min = 0x800; }
    else if ((b & 0xF8) == 0xF0) { cp = b & 0x07; extra = 3; min = 0x10000; }
    else return std::nullopt;  // stray continuation byte or 0xF8..0xFF
    if (extra > 0 && i + size_t(extra) >= s.size()) return std::nullopt;  // sequence cut off at the end
    for (int k = 1; k <= extra; ++k) {
      const unsigned char c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp < min || cp > kMaxCodePoint || is_surrogate(cp)) return std::nullopt;  // overlong / out of range
    out.push_back(cp);
    i += size_t(extra) + 1;
  }
  return out;
}

std::string encode_utf8(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) {
    if (c < 0x80) {
      out.push_back(char(c));
    } else if (c < 0x800) {
      out.push_back(char(0xC0 | (c >> 6)));
      out.push_back(char(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(char(0xE0 | (c >> 12)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(char(0x80 | (c & 0x3F)));
    } else {
      out.push_back(char(0xF0 | (c >> 18)));
      out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(char(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

std::optional<std::string> utf8_to_latin1(std::string_view s) {
  auto cps = decode_utf8(s);
  if (!cps) return std::nullopt;
  std::string out;
  out.reserve(cps->size());
  for (char32_t c : *cps) {
    if (c > 0xFF) return std::nullopt;
    out.push_back(char(c));
  }
  return out;
}

std::string latin1_to_utf8(std::string_view s) {
  std::u32string cps;
  cps.reserve(s.size());
  for (char c : s) cps.push_back(char32_t(static_cast<unsigned char>(c)));
  return encode_utf8(cps);
}

std::optional<std::u16string> utf8_to_utf16(std::string_view s) {
  auto cps = decode_utf8(s);
  if (!cps) return std::nullopt;
  std::u16string out;
  out.reserve(cps->size());
  for (char32_t c : *cps) {
    if (c < 0x10000) {
      out.push_back(char16_t(c));
    } else {
      const char32_t v = c - 0x10000;
      out.push_back(char16_t(0xD800 + (v >> 10)));
      out.push_back(char16_t(0xDC00 + (v & 0x3FF)));
    }
  }
  return out;
}

std::string utf16_to_utf8(std::u16string_view s) {
  std::u32string cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t u = s[i];
    if (u >= 0xD800 && u <= 0xDBFF && i + 1 < s.size() && s[i + 1] >= 0xDC00 && s[i + 1] <= 0xDFFF) {
      cps.push_back(0x10000 + ((u - 0xD800) << 10) + (char32_t(s[i + 1]) - 0xDC00));
      ++i;
    } else {
      cps.push_back(is_surrogate(u) ? kReplacement : u);
    }
  }
  return encode_utf8(cps);
}

}  // namespace atelier
