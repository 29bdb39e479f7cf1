// UTF-8 and the few Unicode algorithms the tokenizers need, with tables generated from the Unicode
// Character Database by tools/gen_unicode_tables.py (see unicode_tables.inc for the version):
// general-category classes (L*, N*, White_Space), per-code-point lowercase, and NFC normalization
// (canonical decomposition, canonical ordering, canonical composition, Hangul included).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace atelier::unicode {

// Unicode version of the generated tables, e.g. "14.0.0".
const char* tables_version();

// Decodes UTF-8. Malformed sequences (bad lead/continuation bytes, overlongs, surrogates, values past
// U+10FFFF, truncation) decode to U+FFFD one byte at a time, as a lossy decoder does.
std::u32string decode_utf8(std::string_view text);
// Encodes code points as UTF-8 (code points past U+10FFFF or surrogates become U+FFFD).
std::string encode_utf8(std::u32string_view cps);
void append_utf8(char32_t cp, std::string& out);

// General category L (Lu, Ll, Lt, Lm, Lo): regex \p{L}.
bool is_letter(char32_t cp);
// General category N (Nd, Nl, No): regex \p{N}.
bool is_number(char32_t cp);
// The White_Space property (Zs, Zl, Zp, and U+0009..U+000D, U+0085): regex \s in Oniguruma and Rust.
bool is_whitespace(char32_t cp);
// Canonical combining class (0 for starters).
int combining_class(char32_t cp);

// Per-code-point full lowercase mapping, without context (Rust's char::to_lowercase): U+0130 gives two
// code points, every other code point gives one.
void append_lowercase(char32_t cp, std::u32string& out);
std::u32string to_lower(std::u32string_view cps);

// Canonical decomposition followed by canonical composition (Unicode Standard Annex #15).
std::u32string nfc(std::u32string_view cps);
std::string nfc_utf8(std::string_view text);

}  // namespace atelier::unicode
