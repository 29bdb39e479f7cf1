// Per-shape choices kept across processes: which candidate (a library's plan, one of our kernels) a backend
// measured fastest for a shape, so that a later process takes it without building and timing the others.
//
// Why: every process pays each shape's planning at its first eager call: ~2.9 s before a 512² SD 1.5 image
// whose 20 steps then take 0.1 s (H100, docs/performance.md "Session 63", call 2). A CLI `generate` is one
// process per image.
//
// A store is one JSON file per fingerprint: what the choices are valid for (the card, the driver, the libraries'
// versions, the binary itself: a rebuilt binary starts afresh, so a changed kernel is always measured). A file of
// another fingerprint, or one that does not parse, is ignored and replaced; a choice is only ever a speed
// decision between candidates that compute the same thing, so a stale or lost file costs time, never a result.
// Writers merge what other processes wrote since (read, merge, write a temporary file, rename); two writing at the
// same instant can still drop the other's newest entries, which are then timed again by a later process.
// Texts (put_text: a library's serialized plan) sit beside the file, in a folder of the same name ending ".texts",
// one file per key. Opening a store marks its file as in use; a new store's first write removes the stores of the
// folder left unused for 30 days (old binaries' and drivers').
//
// Environment: ATELIER_PLAN_CACHE=0 turns stores off; ATELIER_PLAN_CACHE=DIR keeps them in DIR; otherwise
// $XDG_CACHE_HOME/atelier, else $HOME/.cache/atelier (io/file.h's default_cache_dir, the model hashes' folder too).
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace atelier {

namespace choice_key_detail {
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, const char* v) { s += v; }
template <typename T>
  requires std::is_arithmetic_v<T>
void append(std::string& s, T v) {
  s += std::to_string(v);
}
// A sequence in brackets, so that ([1, 2], [3]) and ([1], [2, 3]) read differently.
template <typename Seq>
void append_sequence(std::string& s, const Seq& seq) {
  s += '[';
  bool first = true;
  for (const auto& v : seq) {
    if (!first) s += ',';
    first = false;
    append(s, v);
  }
  s += ']';
}
template <typename T>
void append(std::string& s, const std::vector<T>& v) {
  append_sequence(s, v);
}
template <typename T, size_t N>
void append(std::string& s, const std::array<T, N>& v) {
  append_sequence(s, v);
}
// A tuple's parts, separated by spaces.
template <typename... T>
void append(std::string& s, const std::tuple<T...>& t) {
  bool first = true;
  std::apply([&](const auto&... part) { ((s += first ? "" : " ", first = false, append(s, part)), ...); }, t);
}
}  // namespace choice_key_detail

// A ChoiceStore key from the parts that name a choice (strings, numbers, and vectors, arrays and tuples of them),
// separated by spaces: choice_key("sdpa", shape) -> "sdpa [2,8,4096,40]".
template <typename... Parts>
std::string choice_key(const Parts&... parts) {
  std::string s;
  choice_key_detail::append(s, std::tie(parts...));
  return s;
}

class ChoiceStore {
 public:
  // The store of `fingerprint` in `dir` (made when the first choice is written); dir empty: a store that keeps
  // nothing.
  ChoiceStore(std::string dir, std::string fingerprint);

  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::optional<int64_t> get(const std::string& key) const;
  // The kept choices whose keys start with `prefix`, in key order (a start-up warm-up looks for one of a kind).
  std::vector<std::pair<std::string, int64_t>> with_prefix(const std::string& prefix) const;
  // Records the choice and writes the file; false when it could not be written (the choice still holds here).
  bool put(const std::string& key, int64_t value);

  // Texts kept beside the choices (a library's serialized plan, which spares a later process its compilation): one
  // file per key in a folder named like the store's file, written once and read when asked for. A key should name
  // the choice it belongs to, so that a text outlives no answer it was written for.
  std::optional<std::string> get_text(const std::string& key) const;
  bool put_text(const std::string& key, const std::string& text);

  // The folder the environment asks for ("" when stores are off or no home is known).
  static std::string default_dir();
  // An identity of the running executable (its path, size and modification time): part of every fingerprint.
  static std::string executable_identity();

 private:
  std::map<std::string, int64_t> read_file() const;
  std::string text_path(const std::string& key) const;

  std::string fingerprint_, path_;
  mutable std::mutex mu_;
  std::map<std::string, int64_t> choices_;
};

}  // namespace atelier
