#include "io/image_metadata.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "io/text_encoding.h"

namespace atelier {
namespace {

constexpr uint16_t kTagExifIfd = 0x8769;
constexpr uint16_t kTagUserComment = 0x9286;
constexpr uint16_t kTypeAscii = 2;
constexpr uint16_t kTypeLong = 4;
constexpr uint16_t kTypeUndefined = 7;
constexpr size_t kIfdEntryBytes = 12;
constexpr size_t kMaxIfdEntries = 1024;  // real IFDs hold tens; a larger count is garbage
constexpr std::string_view kExifPrefix("Exif\0\0", 6);
constexpr std::string_view kUnicodePrefix("UNICODE\0", 8);
constexpr std::string_view kAsciiPrefix("ASCII\0\0\0", 8);
constexpr size_t kCharsetPrefixBytes = 8;

// Bounds-checked reads from a TIFF blob in its byte order.
struct TiffReader {
  std::string_view d;
  bool big_endian;
  bool u16(uint64_t off, uint16_t* v) const {
    if (off + 2 > d.size()) return false;
    const auto* p = reinterpret_cast<const unsigned char*>(d.data() + off);
    *v = big_endian ? uint16_t((p[0] << 8) | p[1]) : uint16_t((p[1] << 8) | p[0]);
    return true;
  }
  bool u32(uint64_t off, uint32_t* v) const {
    if (off + 4 > d.size()) return false;
    const auto* p = reinterpret_cast<const unsigned char*>(d.data() + off);
    *v = big_endian ? (uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3])
                    : (uint32_t(p[3]) << 24 | uint32_t(p[2]) << 16 | uint32_t(p[1]) << 8 | p[0]);
    return true;
  }
};

void put_be16(std::string& s, uint16_t v) {
  s.push_back(char(v >> 8));
  s.push_back(char(v & 0xff));
}
void put_be32(std::string& s, uint32_t v) {
  put_be16(s, uint16_t(v >> 16));
  put_be16(s, uint16_t(v & 0xffff));
}
void put_le32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}
uint32_t get_le32(std::string_view s, size_t off) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<unsigned char>(s[off + i])) << (8 * i);
  return v;
}

// One IFD entry (tag, type, count, value-or-offset) in big-endian.
void put_entry(std::string& s, uint16_t tag, uint16_t type, uint32_t count, uint32_t value) {
  put_be16(s, tag);
  put_be16(s, type);
  put_be32(s, count);
  put_be32(s, value);
}

// Finds `tag` in the IFD at `ifd`; returns the entry's offset.
std::optional<uint64_t> find_tag(const TiffReader& r, uint64_t ifd, uint16_t tag) {
  uint16_t n = 0;
  if (!r.u16(ifd, &n) || n > kMaxIfdEntries) return std::nullopt;
  for (uint16_t i = 0; i < n; ++i) {
    const uint64_t e = ifd + 2 + uint64_t(i) * kIfdEntryBytes;
    uint16_t t = 0;
    if (!r.u16(e, &t)) return std::nullopt;
    if (t == tag) return e;
  }
  return std::nullopt;
}

// Decodes UserComment bytes (8-byte charset prefix + text).
std::string decode_comment(std::string_view raw, bool big_endian) {
  std::string_view body = raw.size() >= kCharsetPrefixBytes ? raw.substr(kCharsetPrefixBytes) : std::string_view();
  std::string out;
  if (raw.substr(0, kCharsetPrefixBytes) == kUnicodePrefix) {
    std::u16string units;
    bool be = big_endian;
    size_t start = 0;
    if (body.size() >= 2) {  // an explicit byte-order mark wins over the TIFF byte order
      const auto b0 = static_cast<unsigned char>(body[0]), b1 = static_cast<unsigned char>(body[1]);
      if (b0 == 0xFE && b1 == 0xFF) { be = true; start = 2; }
      if (b0 == 0xFF && b1 == 0xFE) { be = false; start = 2; }
    }
    for (size_t i = start; i + 1 < body.size(); i += 2) {
      const auto a = static_cast<unsigned char>(body[i]), b = static_cast<unsigned char>(body[i + 1]);
      units.push_back(be ? char16_t((a << 8) | b) : char16_t((b << 8) | a));
    }
    out = utf16_to_utf8(units);
  } else {
    // ASCII, undefined (all zero) or anything else: UTF-8 when it is, else Latin-1 (never fail).
    const std::string_view text = raw.size() >= kCharsetPrefixBytes ? body : raw;
    out = decode_utf8(text) ? std::string(text) : latin1_to_utf8(text);
  }
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

}  // namespace

std::optional<std::string> build_exif_user_comment(std::string_view utf8) {
  auto units = utf8_to_utf16(utf8);
  if (!units) return std::nullopt;
  constexpr uint32_t kIfd0 = 8;
  constexpr uint32_t kExifIfd = kIfd0 + 2 + kIfdEntryBytes + 4;
  constexpr uint32_t kCommentData = kExifIfd + 2 + kIfdEntryBytes + 4;
  const uint64_t comment_bytes = kCharsetPrefixBytes + 2 * uint64_t(units->size());
  if (kCommentData + comment_bytes > kMaxExifBytes) return std::nullopt;
  std::string s("MM\0*", 4);  // big-endian TIFF, magic 42, as piexif writes it
  put_be32(s, kIfd0);
  put_be16(s, 1);
  put_entry(s, kTagExifIfd, kTypeLong, 1, kExifIfd);
  put_be32(s, 0);  // no next IFD
  put_be16(s, 1);
  put_entry(s, kTagUserComment, kTypeUndefined, uint32_t(comment_bytes), kCommentData);
  put_be32(s, 0);
  s += kUnicodePrefix;
  for (char16_t u : *units) put_be16(s, uint16_t(u));
  return s;
}

std::optional<std::string> parse_exif_user_comment(std::string_view tiff) {
  if (tiff.substr(0, kExifPrefix.size()) == kExifPrefix) tiff.remove_prefix(kExifPrefix.size());
  if (tiff.size() < 8) return std::nullopt;
  TiffReader r{tiff, false};
  if (tiff.substr(0, 2) == "MM") r.big_endian = true;
  else if (tiff.substr(0, 2) != "II") return std::nullopt;
  uint16_t magic = 0;
  uint32_t ifd0 = 0;
  if (!r.u16(2, &magic) || magic != 42 || !r.u32(4, &ifd0)) return std::nullopt;
  // UserComment belongs in the Exif IFD; some writers put it in IFD0, so look there too.
  std::optional<uint64_t> entry;
  if (auto p = find_tag(r, ifd0, kTagExifIfd)) {
    uint32_t exif_ifd = 0;
    if (r.u32(*p + 8, &exif_ifd)) entry = find_tag(r, exif_ifd, kTagUserComment);
  }
  if (!entry) entry = find_tag(r, ifd0, kTagUserComment);
  if (!entry) return std::nullopt;
  uint16_t type = 0;
  uint32_t count = 0;
  if (!r.u16(*entry + 2, &type) || !r.u32(*entry + 4, &count)) return std::nullopt;
  if (type != kTypeUndefined && type != kTypeAscii) return std::nullopt;
  uint64_t data = *entry + 8;  // values of 4 bytes or less sit in the entry itself
  if (count > 4) {
    uint32_t off = 0;
    if (!r.u32(*entry + 8, &off)) return std::nullopt;
    data = off;
  }
  if (data + uint64_t(count) > tiff.size()) return std::nullopt;
  return decode_comment(tiff.substr(size_t(data), count), r.big_endian);
}

std::optional<std::string_view> find_jpeg_exif(std::string_view jpeg) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(jpeg[i]); };
  if (jpeg.size() < 4 || byte(0) != 0xFF || byte(1) != 0xD8) return std::nullopt;
  size_t pos = 2;
  while (pos + 4 <= jpeg.size()) {
    if (byte(pos) != 0xFF) return std::nullopt;
    const unsigned char marker = byte(pos + 1);
    if (marker == 0xFF) { ++pos; continue; }                   // fill byte
    if (marker == 0xDA || marker == 0xD9) return std::nullopt;  // scan data / end: no EXIF before it
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) { pos += 2; continue; }  // no length field
    const size_t len = (size_t(byte(pos + 2)) << 8) | byte(pos + 3);
    if (len < 2 || pos + 2 + len > jpeg.size()) return std::nullopt;
    const std::string_view payload = jpeg.substr(pos + 4, len - 2);
    if (marker == 0xE1 && payload.substr(0, kExifPrefix.size()) == kExifPrefix)
      return payload.substr(kExifPrefix.size());
    pos += 2 + len;
  }
  return std::nullopt;
}

std::optional<std::string_view> find_webp_exif(std::string_view webp) {
  if (webp.size() < 12 || webp.substr(0, 4) != "RIFF" || webp.substr(8, 4) != "WEBP") return std::nullopt;
  const size_t end = std::min<uint64_t>(webp.size(), uint64_t(get_le32(webp, 4)) + 8);
  size_t pos = 12;
  while (pos + 8 <= end) {
    const std::string_view fourcc = webp.substr(pos, 4);
    const uint64_t size = get_le32(webp, pos + 4);
    if (pos + 8 + size > end) return std::nullopt;
    if (fourcc == "EXIF") {
      std::string_view payload = webp.substr(pos + 8, size_t(size));
      if (payload.substr(0, kExifPrefix.size()) == kExifPrefix) payload.remove_prefix(kExifPrefix.size());
      return payload;
    }
    pos += 8 + size_t(size) + (size & 1);  // chunks are padded to an even size
  }
  return std::nullopt;
}

std::optional<std::string> add_webp_exif(std::string_view webp, std::string_view tiff, int width, int height,
                                         bool has_alpha) {
  constexpr uint8_t kFlagExif = 0x08;
  constexpr uint8_t kFlagAlpha = 0x10;
  constexpr size_t kRiffHeader = 12;
  if (webp.size() < kRiffHeader + 8 || webp.substr(0, 4) != "RIFF" || webp.substr(8, 4) != "WEBP")
    return std::nullopt;
  if (width < 1 || height < 1 || width > (1 << 24) || height > (1 << 24)) return std::nullopt;
  std::string body(webp.substr(kRiffHeader));  // chunks after "RIFF size WEBP"
  const std::string_view first = std::string_view(body).substr(0, 4);
  if (first == "VP8X") {
    body[8] = char(static_cast<unsigned char>(body[8]) | kFlagExif);  // flags byte of the VP8X payload
  } else if (first == "VP8 " || first == "VP8L") {
    std::string vp8x = "VP8X";
    put_le32(vp8x, 10);
    vp8x.push_back(char(kFlagExif | (has_alpha ? kFlagAlpha : 0)));
    vp8x.append(3, '\0');
    for (int v : {width - 1, height - 1})
      for (int i = 0; i < 3; ++i) vp8x.push_back(char((v >> (8 * i)) & 0xff));  // 24-bit little-endian
    body = vp8x + body;
  } else {
    return std::nullopt;
  }
  body += "EXIF";
  put_le32(body, uint32_t(tiff.size()));
  body += tiff;
  if (tiff.size() & 1) body.push_back('\0');
  std::string out = "RIFF";
  put_le32(out, uint32_t(body.size() + 4));
  out += "WEBP";
  return out + body;
}

}  // namespace atelier
