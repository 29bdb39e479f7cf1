// Whole-file reads with errors as values. Every file the engine reads whole (JSON configs, tokenizer vocabularies,
// images, result files) goes through here, so a missing file, a folder where a file belongs, or a file too large
// to be what it claims gives a Status that names the path, instead of an empty string or a multi-gigabyte read.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace atelier {

// The default bound of read_file: larger than any tokenizer vocabulary, JSON config or image the engine reads.
constexpr uint64_t kMaxReadFileBytes = uint64_t(512) << 20;

// The bytes of the regular file at `path`, at most `max_bytes` of them. `what` names the kind of file in the
// errors ("image", "JSON file"): not found, not a regular file, too large (with the limit), unreadable.
Expected<std::string> read_file(const std::string& path, std::string_view what = "file",
                                uint64_t max_bytes = kMaxReadFileBytes);

// Writes `bytes` to `path` (its folders made as needed) through a temporary file of this write alone, renamed into
// place: a reader sees the old file or the new one, never a torn one, also when two threads or processes write it at
// once. False when it could not be written (nothing is left behind).
bool write_file_atomically(const std::string& path, const std::string& bytes);

// The folder of Atelier's caches (the kept plan choices, backend/choice_store.h; the model hashes, io/hash.h):
// ATELIER_PLAN_CACHE=DIR, else $XDG_CACHE_HOME/atelier, else $HOME/.cache/atelier; "" (no cache) with
// ATELIER_PLAN_CACHE=0 or when no home is known.
std::string default_cache_dir();

}  // namespace atelier
