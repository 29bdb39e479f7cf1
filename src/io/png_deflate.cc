#include "io/png_deflate.h"

#include <omp.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace atelier {
namespace {

constexpr size_t kWindowBytes = size_t(32) << 10;  // deflate's window: what a strip's primer has to cover
constexpr int kRawDeflateWindowBits = -15;          // negative: raw deflate, no zlib header per strip
constexpr int kMemLevel = 8;                        // zlib's default
// deflateBound covers a finished stream; a sync flush adds an empty stored block (4 bytes and 3 bits).
constexpr size_t kFlushSlackBytes = 16;
constexpr uint8_t kZlibDeflate32K = 0x78;           // CMF: method 8 (deflate), a 32 KiB window
constexpr unsigned kZlibCheckModulus = 31;          // (CMF * 256 + FLG) must be a multiple of it (RFC 1950)

enum PngFilter : uint8_t { kNone = 0, kSub = 1, kUp = 2, kAverage = 3, kPaeth = 4 };
constexpr int kFilterCount = 5;

// The Paeth predictor without branches (so the row loops vectorize): a, b, c are the left, above and
// above-left bytes; the one nearest a + b - c wins, ties in the order a, b, c.
inline int paeth_predictor(int a, int b, int c) {
  const int pa = std::abs(b - c), pb = std::abs(a - c), pc = std::abs(a + b - 2 * c);
  return (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
}

// The byte x as filter f writes it, given its left neighbour a, the byte above b and the one above-left c.
template <int F>
inline uint8_t filtered_byte(int x, int a, int b, int c) {
  if constexpr (F == kSub) return uint8_t(x - a);
  if constexpr (F == kUp) return uint8_t(x - b);
  if constexpr (F == kAverage) return uint8_t(x - ((a + b) >> 1));
  if constexpr (F == kPaeth) return uint8_t(x - paeth_predictor(a, b, c));
  return uint8_t(x);
}

// |v| with v read as a signed byte: the specification's measure of how well a filter predicted.
inline uint32_t signed_magnitude(uint8_t v) { return v < 128 ? v : 256u - v; }

// Rows padded on the left with one pixel of zeros, so that the left neighbours of the first pixel need no
// branch: cur and prior are [bpp + n]; the row's byte i is cur[bpp + i], its left neighbour cur[i].
template <int F>
uint32_t filter_cost(const uint8_t* cur, const uint8_t* prior, size_t n, size_t bpp) {
  uint32_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += signed_magnitude(filtered_byte<F>(cur[bpp + i], cur[i], prior[bpp + i], prior[i]));
  return sum;
}
template <int F>
void write_filtered(const uint8_t* cur, const uint8_t* prior, size_t n, size_t bpp, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = filtered_byte<F>(cur[bpp + i], cur[i], prior[bpp + i], prior[i]);
}

// One padded row (see filter_cost) -> out [1 + n]: the chosen filter's type byte, then the filtered row.
void filter_row(const uint8_t* cur, const uint8_t* prior, size_t n, size_t bpp, uint8_t* out) {
  const uint32_t cost[kFilterCount] = {filter_cost<kNone>(cur, prior, n, bpp), filter_cost<kSub>(cur, prior, n, bpp),
                                       filter_cost<kUp>(cur, prior, n, bpp), filter_cost<kAverage>(cur, prior, n, bpp),
                                       filter_cost<kPaeth>(cur, prior, n, bpp)};
  const int best = int(std::min_element(cost, cost + kFilterCount) - cost);  // ties: the lowest type
  out[0] = uint8_t(best);
  switch (best) {
    case kSub: return write_filtered<kSub>(cur, prior, n, bpp, out + 1);
    case kUp: return write_filtered<kUp>(cur, prior, n, bpp, out + 1);
    case kAverage: return write_filtered<kAverage>(cur, prior, n, bpp, out + 1);
    case kPaeth: return write_filtered<kPaeth>(cur, prior, n, bpp, out + 1);
    default: return write_filtered<kNone>(cur, prior, n, bpp, out + 1);
  }
}

// data[begin, end) as raw deflate, primed with the window before `begin`, ended by a sync flush (so the next
// strip's output can follow at a byte boundary) or, for the last strip, by the final block. Returns a zlib code.
int deflate_strip(std::string_view data, size_t begin, size_t end, bool last, int level, int strategy,
                  std::string* out) {
  z_stream zs{};
  int rc = deflateInit2(&zs, level, Z_DEFLATED, kRawDeflateWindowBits, kMemLevel, strategy);
  if (rc != Z_OK) return rc;
  const auto* bytes = reinterpret_cast<const Bytef*>(data.data());
  const size_t primer = std::min(begin, kWindowBytes);
  if (primer > 0) rc = deflateSetDictionary(&zs, bytes + begin - primer, uInt(primer));
  if (rc == Z_OK) {
    out->resize(deflateBound(&zs, uLong(end - begin)) + kFlushSlackBytes);
    zs.next_in = const_cast<Bytef*>(bytes + begin);
    zs.avail_in = uInt(end - begin);
    zs.next_out = reinterpret_cast<Bytef*>(out->data());
    zs.avail_out = uInt(out->size());
    rc = deflate(&zs, last ? Z_FINISH : Z_SYNC_FLUSH);
    // A flush is complete only when input is used up with output room to spare.
    const bool done = last ? rc == Z_STREAM_END : (rc == Z_OK && zs.avail_in == 0 && zs.avail_out > 0);
    if (done) out->resize(out->size() - zs.avail_out);
    rc = done ? Z_OK : (rc == Z_OK || rc == Z_STREAM_END ? Z_BUF_ERROR : rc);
  }
  deflateEnd(&zs);
  return rc;
}

// The zlib header's FLG byte: the level class (informational) and the check bits.
uint8_t zlib_flags(int level) {
  if (level == Z_DEFAULT_COMPRESSION) level = kPngDeflateLevel;
  const unsigned level_class = level < 2 ? 0 : level < 6 ? 1 : level == 6 ? 2 : 3;
  unsigned flg = level_class << 6;
  const unsigned rem = (kZlibDeflate32K * 256u + flg) % kZlibCheckModulus;
  if (rem != 0) flg += kZlibCheckModulus - rem;
  return uint8_t(flg);
}

}  // namespace

std::string png_filter_rows(const uint8_t* pixels, int width, int height, int channels) {
  const size_t n = size_t(width) * size_t(channels), bpp = size_t(channels);
  std::string out(size_t(height) * (1 + n), '\0');
  auto* dst = reinterpret_cast<uint8_t*>(out.data());
  bool out_of_memory = false;
  // A small image (a preview) is filtered faster than a team wakes up.
#pragma omp parallel if (out.size() > kDeflateStripBytes)
  {
    std::vector<uint8_t> padded[2];  // this thread's current and prior rows, padded (see filter_cost)
    try {  // no exception may leave an OpenMP region
      padded[0].assign(bpp + n, 0);
      padded[1].assign(bpp + n, 0);
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      out_of_memory = true;
    }
#pragma omp for schedule(static)
    for (int y = 0; y < height; ++y) {
      if (padded[0].empty()) continue;
      uint8_t* cur = padded[0].data();
      uint8_t* prior = padded[1].data();
      const uint8_t* row = pixels + size_t(y) * n;
      std::memcpy(cur + bpp, row, n);
      if (y > 0) std::memcpy(prior + bpp, row - n, n);  // above the first row: zeros
      else std::memset(prior + bpp, 0, n);
      filter_row(cur, prior, n, bpp, dst + size_t(y) * (1 + n));
    }
  }
  if (out_of_memory) throw std::bad_alloc();
  return out;
}

Expected<std::string> zlib_compress_parallel(std::string_view data, int level, int strategy) {
  if (level != Z_DEFAULT_COMPRESSION && (level < 0 || level > 9))
    return invalid_argument("deflate level " + std::to_string(level) + " is not supported: use 0-9");
  const size_t strips = std::max<size_t>(1, (data.size() + kDeflateStripBytes - 1) / kDeflateStripBytes);
  std::vector<std::string> parts(strips);
  std::vector<int> codes(strips, Z_OK);
  std::vector<uLong> adlers(strips);
  const int threads = int(std::min<size_t>(strips, size_t(std::max(1, omp_get_max_threads()))));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (size_t s = 0; s < strips; ++s) {
    const size_t begin = s * kDeflateStripBytes, end = std::min(data.size(), begin + kDeflateStripBytes);
    try {  // no exception may leave an OpenMP region
      codes[s] = deflate_strip(data, begin, end, s + 1 == strips, level, strategy, &parts[s]);
      const auto* strip = reinterpret_cast<const Bytef*>(data.data()) + begin;
      adlers[s] = adler32(adler32(0L, Z_NULL, 0), strip, uInt(end - begin));
    } catch (const std::bad_alloc&) {
      codes[s] = Z_MEM_ERROR;
    }
  }
  for (int rc : codes) {
    if (rc == Z_MEM_ERROR) return Status(ErrorCode::kResourceExhausted, "out of memory compressing image data");
    if (rc != Z_OK) return internal_error("deflate failed (zlib code " + std::to_string(rc) + ")");
  }
  // The stream's checksum covers all of data: the strips' checksums joined in order.
  uLong adler = adlers[0];
  for (size_t s = 1; s < strips; ++s) {
    const size_t begin = s * kDeflateStripBytes, len = std::min(data.size(), begin + kDeflateStripBytes) - begin;
    adler = adler32_combine(adler, adlers[s], z_off_t(len));
  }
  size_t total = 2 + 4;
  for (const auto& p : parts) total += p.size();
  std::string out;
  out.reserve(total);
  out.push_back(char(kZlibDeflate32K));
  out.push_back(char(zlib_flags(level)));
  for (const auto& p : parts) out += p;
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(char((adler >> shift) & 0xFF));
  return out;
}

}  // namespace atelier
