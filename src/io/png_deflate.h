// A PNG's image data (IDAT) made on every core: the rows filtered in parallel, then one zlib stream
// compressed in parallel strips, as pigz does for gzip.
//
// Why: libpng filters and deflates on one thread. A 512² RGB image takes 40-50 ms that way on a GPU host's
// CPU, a third of a lone server request's latency (docs/performance.md, "Session 62"); the image data is
// independent per row for filtering, and deflate can restart at any byte when each strip is primed with the
// 32 KiB before it, so the work splits without changing what a decoder sees.
// Measured there (session 63): 8 ms on 8 threads for what took libpng 40-50.
//
// The output is a function of the input alone (strip boundaries are fixed byte counts, not thread counts), so
// the same image gives the same file on any machine.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace atelier {

// Uncompressed bytes per strip. Each strip costs a sync-flush marker (~5 bytes) and the matches its primed
// window cannot reach; 64 KiB keeps that near 0.03% while a 512² RGB image (768 KiB) spreads over 12 cores.
constexpr size_t kDeflateStripBytes = size_t(64) << 10;
// What libpng and PIL (so A1111) use by default: files of the size users expect.
constexpr int kPngDeflateLevel = 6;

// PNG row filtering. pixels: [height, width * channels] u8 (8 bits per sample, rows packed) ->
// [height, 1 + width * channels]: each row's filter type byte, then its filtered bytes. The filter of each row is
// the one whose output has the smallest sum of absolute (signed) values, the heuristic the PNG specification
// recommends and libpng uses for truecolour images.
std::string png_filter_rows(const uint8_t* pixels, int width, int height, int channels);

// data -> one zlib stream (RFC 1950) that inflates to data, compressed at `level` with `strategy` (zlib's
// Z_DEFAULT_STRATEGY, Z_FILTERED, ...) in strips of kDeflateStripBytes on the OpenMP threads.
Expected<std::string> zlib_compress_parallel(std::string_view data, int level, int strategy);

}  // namespace atelier
