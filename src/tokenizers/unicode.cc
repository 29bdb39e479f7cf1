#include "tokenizers/unicode.h"

#include <algorithm>
#include <cstddef>
#include <utility>

namespace atelier::unicode {
namespace {

struct CodeRange {
  uint32_t lo, hi;  // inclusive
};
struct CaseMapping {
  uint32_t cp, lower;
};
struct ClassRange {
  uint32_t lo, hi;
  uint8_t ccc;
};
struct Decomposition {
  uint32_t cp, first, second;  // second == 0 for singleton mappings
  uint8_t composes;            // 1 when NFC recomposes (first, second) into cp
};

#include "tokenizers/unicode_tables.inc"

constexpr char32_t kReplacement = 0xFFFD;
constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Hangul syllable arithmetic (Unicode Standard, section 3.12).
constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161, kHangulTBase = 0x11A7;
constexpr int kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr int kHangulNCount = kHangulVCount * kHangulTCount;
constexpr int kHangulSCount = kHangulLCount * kHangulNCount;

template <size_t N>
bool in_ranges(const CodeRange (&table)[N], char32_t cp) {
  const CodeRange* end = table + N;
  const CodeRange* it = std::upper_bound(table, end, uint32_t(cp), [](uint32_t v, const CodeRange& r) { return v < r.lo; });
  return it != table && cp <= (it - 1)->hi;
}

bool is_surrogate(char32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

const Decomposition* find_decomposition(char32_t cp) {
  const Decomposition* end = std::end(kDecomposition);
  const Decomposition* it = std::lower_bound(std::begin(kDecomposition), end, uint32_t(cp),
                                             [](const Decomposition& d, uint32_t v) { return d.cp < v; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

// Primary composites keyed by (first << 21 | second), sorted, built once from kDecomposition.
const std::vector<std::pair<uint64_t, char32_t>>& composition_table() {
  static const std::vector<std::pair<uint64_t, char32_t>> table = [] {
    std::vector<std::pair<uint64_t, char32_t>> t;
    for (const Decomposition& d : kDecomposition)
      if (d.composes) t.emplace_back((uint64_t(d.first) << 21) | d.second, char32_t(d.cp));
    std::sort(t.begin(), t.end());
    return t;
  }();
  return table;
}

// The primary composite of (a, b), or 0 when there is none.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kHangulLBase && a < kHangulLBase + kHangulLCount && b >= kHangulVBase && b < kHangulVBase + kHangulVCount)
    return kHangulSBase + ((a - kHangulLBase) * kHangulVCount + (b - kHangulVBase)) * kHangulTCount;
  if (a >= kHangulSBase && a < kHangulSBase + kHangulSCount && (a - kHangulSBase) % kHangulTCount == 0 &&
      b > kHangulTBase && b < kHangulTBase + kHangulTCount)
    return a + (b - kHangulTBase);
  const auto& t = composition_table();
  const uint64_t key = (uint64_t(a) << 21) | b;
  auto it = std::lower_bound(t.begin(), t.end(), key, [](const auto& e, uint64_t k) { return e.first < k; });
  return (it != t.end() && it->first == key) ? it->second : 0;
}

void decompose_into(char32_t cp, std::u32string& out) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    const int s = int(cp - kHangulSBase);
    out.push_back(kHangulLBase + s / kHangulNCount);
    out.push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out.push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  const Decomposition* d = find_decomposition(cp);
  if (!d) {
    out.push_back(cp);
    return;
  }
  decompose_into(d->first, out);  // mappings are one level deep in the data: recurse for the full form
  if (d->second) decompose_into(d->second, out);
}

// Stable sort of every run of non-starters by combining class (canonical ordering algorithm).
void canonical_order(std::u32string& s) {
  size_t i = 0;
  while (i < s.size()) {
    if (combining_class(s[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && combining_class(s[j]) != 0) ++j;
    std::stable_sort(s.begin() + i, s.begin() + j,
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
}

// Canonical composition of a canonically ordered, fully decomposed string.
std::u32string compose(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  ptrdiff_t starter = -1;  // index in `out` of the last starter, -1 before the first one
  int last_ccc = -1;       // combining class of the last character kept in `out`
  for (char32_t c : s) {
    const int ccc = combining_class(c);
    // c is blocked from the starter when a kept character between them has ccc 0 or >= ccc(c).
    const bool reachable = starter >= 0 && (last_ccc < ccc || (last_ccc == 0 && size_t(starter) + 1 == out.size()));
    if (reachable) {
      if (char32_t composite = compose_pair(out[starter], c)) {
        out[starter] = composite;
        continue;
      }
    }
    if (ccc == 0) starter = ptrdiff_t(out.size());
    last_ccc = ccc;
    out.push_back(c);
  }
  return out;
}

}  // namespace

const char* tables_version() { return kUnicodeVersion; }

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    // Expected length and the valid range of the second byte (excludes overlongs and surrogates).
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    char32_t cp = 0;
    if (b >= 0xC2 && b <= 0xDF) { len = 2; cp = b & 0x1F; }
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; cp = b & 0x0F; lo = b == 0xE0 ? 0xA0 : 0x80; hi = b == 0xED ? 0x9F : 0xBF; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; cp = b & 0x07; lo = b == 0xF0 ? 0x90 : 0x80; hi = b == 0xF4 ? 0x8F : 0xBF; }
    if (len == 0) {  // stray continuation byte or invalid lead byte
      out.push_back(kReplacement);
      ++i;
      continue;
    }
    // Consume the longest valid prefix; an incomplete one becomes a single U+FFFD (maximal subpart).
    size_t k = 1;
    for (; k < size_t(len) && i + k < n; ++k) {
      const unsigned char c = p[i + k];
      const unsigned char min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
      if (c < min || c > max) break;
      cp = (cp << 6) | (c & 0x3F);
    }
    out.push_back(k == size_t(len) ? cp : kReplacement);
    i += k;
  }
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp > kMaxCodePoint || is_surrogate(cp)) cp = kReplacement;
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::string encode_utf8(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) append_utf8(cp, out);
  return out;
}

bool is_letter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(kLetterRanges, cp);
}

bool is_number(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(kNumberRanges, cp);
}

bool is_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

int combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const ClassRange* end = std::end(kCombiningClass);
  const ClassRange* it = std::upper_bound(std::begin(kCombiningClass), end, uint32_t(cp),
                                          [](uint32_t v, const ClassRange& r) { return v < r.lo; });
  if (it == std::begin(kCombiningClass)) return 0;
  --it;
  return cp <= it->hi ? it->ccc : 0;
}

void append_lowercase(char32_t cp, std::u32string& out) {
  if (cp < 0x80) {
    out.push_back(cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp);
    return;
  }
  // U+0130 LATIN CAPITAL LETTER I WITH DOT ABOVE is the one unconditional multi-code-point mapping.
  if (cp == 0x130) {
    out.push_back('i');
    out.push_back(0x307);
    return;
  }
  const CaseMapping* end = std::end(kLowercase);
  const CaseMapping* it = std::lower_bound(std::begin(kLowercase), end, uint32_t(cp),
                                           [](const CaseMapping& m, uint32_t v) { return m.cp < v; });
  out.push_back((it != end && it->cp == cp) ? char32_t(it->lower) : cp);
}

std::u32string to_lower(std::u32string_view cps) {
  std::u32string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) append_lowercase(cp, out);
  return out;
}

std::u32string nfc(std::u32string_view cps) {
  // Fast path: ASCII is always in NFC.
  if (std::all_of(cps.begin(), cps.end(), [](char32_t c) { return c < 0x80; })) return std::u32string(cps);
  std::u32string decomposed;
  decomposed.reserve(cps.size() + 8);
  for (char32_t cp : cps) decompose_into(cp, decomposed);
  canonical_order(decomposed);
  return compose(decomposed);
}

std::string nfc_utf8(std::string_view text) { return encode_utf8(nfc(decode_utf8(text))); }

}  // namespace atelier::unicode
