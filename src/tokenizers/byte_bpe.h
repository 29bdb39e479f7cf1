// The byte-level BPE core shared by the CLIP and Qwen tokenizers: GPT-2's byte alphabet, the merge table built
// from a ranked merge list, and the merge loop with HF tokenizers' semantics (repeatedly merge the best-ranked
// adjacent pair, every occurrence left to right).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace atelier::bpe {

// GPT-2's bytes_to_unicode as UTF-8: printable bytes map to themselves, the others to U+0100 + n in byte order.
const std::array<std::string, 256>& byte_symbols();

// A tokenizer.json's BPE model ("model": {"type": "BPE", "vocab": {token: id}, "merges": ["a b" | ["a", "b"]]})
// into `vocab` and `merges` (ranked, best first); errors name `label`: another model type, ids that are not
// non-negative int32, malformed merges.
Status read_model(const nlohmann::json& model, const std::string& label, std::unordered_map<std::string, int32_t>& vocab,
                  std::vector<std::pair<std::string, std::string>>& merges);

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

// Word (or pre-tokenized piece) -> BPE ids, bounded, thread-safe; copies of a tokenizer share one (the
// tokenizers stay copyable). Merging is the slow part of encoding and prompts repeat their words.
class WordCache {
 public:
  // Appends the ids of `word` to `ids`: from the cache, or from `compute(word)` (then remembered while the
  // cache holds fewer than kCapacity words).
  template <typename Compute>
  void append(const std::string& word, std::vector<int32_t>& ids, const Compute& compute) const {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      auto it = state_->words.find(word);
      if (it != state_->words.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> sym = compute(word);
    ids.insert(ids.end(), sym.begin(), sym.end());
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->words.size() < kCapacity) state_->words.emplace(word, std::move(sym));
  }

 private:
  static constexpr size_t kCapacity = 10000;
  struct State {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace atelier::bpe
