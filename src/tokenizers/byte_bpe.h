// The byte-level BPE core shared by the CLIP and Qwen tokenizers: GPT-2's byte alphabet, the merge table built
// from a ranked merge list, and the merge loop with HF tokenizers' semantics (repeatedly merge the best-ranked
// adjacent pair, every occurrence left to right).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace atelier::bpe {

// GPT-2's bytes_to_unicode as UTF-8: printable bytes map to themselves, the others to U+0100 + n in byte order.
const std::array<std::string, 256>& byte_symbols();

class MergeTable {
 public:
  // `merges`: (left, right) pairs, best rank first; each side and their concatenation must be in `vocab`
  // (else an error naming `where`). A repeated pair keeps its last rank, as HF's map built in file order does.
  Status build(const std::vector<std::pair<std::string, std::string>>& merges,
               const std::unordered_map<std::string, int32_t>& vocab, const std::string& where);
  // Merges the symbol ids of one word in place until no adjacent pair has a merge.
  void merge(std::vector<int32_t>& symbols) const;

 private:
  struct Merge {
    int32_t rank;  // position in the merge list: lower merges first
    int32_t id;    // id of the merged token
  };
  static uint64_t key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }
  std::unordered_map<uint64_t, Merge> merges_;  // key(left id, right id) -> merge
};

}  // namespace atelier::bpe
