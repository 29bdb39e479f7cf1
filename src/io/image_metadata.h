// Where generation parameters ("infotext") live inside image files other than PNG: an EXIF UserComment,
// carried by a JPEG APP1 segment or a WebP "EXIF" chunk, the way A1111 stores them (piexif, big-endian TIFF,
// "UNICODE\0" + UTF-16). Every parser here is bounded: malformed input gives nullopt, never a read past the
// end of the buffer.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace atelier {

// A JPEG APP1 segment holds at most 65533 payload bytes, 6 of them "Exif\0\0".
constexpr size_t kMaxExifBytes = 65533 - 6;

// TIFF blob (no "Exif\0\0" prefix) whose Exif IFD holds only UserComment = `utf8`. nullopt when `utf8` is
// not valid UTF-8 or the blob would exceed kMaxExifBytes (about 32k UTF-16 units).
std::optional<std::string> build_exif_user_comment(std::string_view utf8);
// UserComment of a TIFF blob (an "Exif\0\0" prefix is skipped), as UTF-8; nullopt when absent or malformed.
std::optional<std::string> parse_exif_user_comment(std::string_view tiff);

// The TIFF blob of a JPEG's EXIF APP1 segment (after "Exif\0\0"), when there is one before the scan data.
std::optional<std::string_view> find_jpeg_exif(std::string_view jpeg);
// The payload of a WebP file's EXIF chunk (an "Exif\0\0" prefix is skipped).
std::optional<std::string_view> find_webp_exif(std::string_view webp);
// Adds an EXIF chunk to a WebP file written by libwebp's simple encoder, converting it to the extended
// (VP8X) layout when needed. nullopt when `webp` is not a RIFF/WEBP file this function understands.
std::optional<std::string> add_webp_exif(std::string_view webp, std::string_view tiff, int width, int height,
                                         bool has_alpha);

}  // namespace atelier
