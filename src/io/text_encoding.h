// Small, strict text-encoding helpers for image metadata: PNG tEXt is Latin-1, iTXt and our strings are
// UTF-8, EXIF UserComment is UTF-16. Invalid UTF-8 (overlong forms, surrogates, > U+10FFFF) is rejected.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace atelier {

// Code points of a UTF-8 string; nullopt when it is not valid UTF-8.
std::optional<std::u32string> decode_utf8(std::string_view s);
// UTF-8 of code points (assumed valid: <= U+10FFFF, no surrogates).
std::string encode_utf8(std::u32string_view cps);
// Latin-1 bytes of a UTF-8 string when every code point is <= U+00FF; nullopt otherwise (or when invalid).
std::optional<std::string> utf8_to_latin1(std::string_view s);
std::string latin1_to_utf8(std::string_view s);
// UTF-16 code units (surrogate pairs above U+FFFF) of valid UTF-8; nullopt when invalid.
std::optional<std::u16string> utf8_to_utf16(std::string_view s);
// UTF-8 of UTF-16 code units; unpaired surrogates become U+FFFD (readers should not fail on sloppy writers).
std::string utf16_to_utf8(std::u16string_view s);

}  // namespace atelier
