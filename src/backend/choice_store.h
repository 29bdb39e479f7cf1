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
//
// Environment: ATELIER_PLAN_CACHE=0 turns stores off; ATELIER_PLAN_CACHE=DIR keeps them in DIR; otherwise
// $XDG_CACHE_HOME/atelier, else $HOME/.cache/atelier.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace atelier {

class ChoiceStore {
 public:
  // The store of `fingerprint` in `dir` (made when the first choice is written); dir empty: a store that keeps
  // nothing.
  ChoiceStore(std::string dir, std::string fingerprint);

  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::optional<int64_t> get(const std::string& key) const;
  // Records the choice and writes the file; false when it could not be written (the choice still holds here).
  bool put(const std::string& key, int64_t value);

  // The folder the environment asks for ("" when stores are off or no home is known).
  static std::string default_dir();
  // An identity of the running executable (its path, size and modification time): part of every fingerprint.
  static std::string executable_identity();

 private:
  std::map<std::string, int64_t> read_file() const;

  std::string fingerprint_, path_;
  mutable std::mutex mu_;
  std::map<std::string, int64_t> choices_;
};

}  // namespace atelier
