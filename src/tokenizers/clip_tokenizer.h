// CLIP's byte-level BPE tokenizer, reproducing transformers' CLIPTokenizerFast (HF `tokenizers`) exactly:
//   1. special tokens (bos/eos/unk/pad and tokenizer.json's added tokens) are split out of the raw text
//      first, by exact match, leftmost-longest (so SD 2's pad token "!" always becomes id 0, as it does
//      in transformers);
//   2. each remaining span is normalized: NFC, every run of White_Space replaced by one ' ', lowercase;
//   3. pre-tokenized by CLIP's regex
//        <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
//      (whitespace between matches is dropped), then by GPT-2's byte-level regex within each piece;
//   4. each piece's UTF-8 bytes are mapped to GPT-2's printable byte alphabet, the last symbol gets the
//      "</w>" end-of-word suffix, and BPE merges are applied by rank;
//   5. BOS + ids + EOS, truncated to model_max_length (keeping EOS last), padded with the pad token.
// ftfy (used by the slow tokenizer only when installed) is not applied, like the fast tokenizer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "tokenizers/byte_bpe.h"

namespace atelier {

// One prompt encoded for the text encoder.
struct ClipEncoding {
  std::vector<int32_t> ids;  // max_length ids: BOS, tokens, EOS, then padding
  int length = 0;            // tokens before padding (BOS and EOS included): the attention-mask length
  int eos_index = 0;         // index of the first EOS id: the position CLIP's pooled output reads
};

class ClipTokenizer {
 public:
  // Loads vocab.json + merges.txt (or, when those are absent, the BPE model inside tokenizer.json) from
  // `dir`, and the special tokens and model_max_length from tokenizer_config.json, special_tokens_map.json
  // and tokenizer.json, in that order of precedence. Defaults when nothing names them: bos
  // "<|startoftext|>", eos and unk and pad "<|endoftext|>", model_max_length 77.
  static Expected<ClipTokenizer> load(const std::string& dir);

  // BOS + tokens + EOS, truncated to max_length() (the last kept id is EOS) and padded with pad().
  std::vector<int32_t> encode(const std::string& text) const;
  // As encode(), plus the unpadded length and the EOS position.
  ClipEncoding encode_full(const std::string& text) const;
  // The token ids of `text` alone: no BOS/EOS, no truncation, no padding.
  std::vector<int32_t> encode_unpadded(const std::string& text) const;

  // BPE pieces (vocabulary strings, e.g. "photo</w>") of `text`, without BOS/EOS; for tests and debugging.
  std::vector<std::string> tokenize(const std::string& text) const;
  // Vocabulary lookup: the id of `token`, or -1.
  int32_t token_to_id(const std::string& token) const;
  // The vocabulary string of `id`, or "" when out of range.
  const std::string& id_to_token(int32_t id) const;

  int bos() const { return bos_; }
  int eos() const { return eos_; }
  int pad() const { return pad_; }
  int unk() const { return unk_; }
  int max_length() const { return max_length_; }
  size_t vocab_size() const { return id_to_token_.size(); }

 private:
  ClipTokenizer();
  static Expected<ClipTokenizer> load_impl(const std::string& dir);
  // Registers added and special tokens (bos/eos/unk/pad) from the parsed config files (null when absent).
  Status add_special_tokens(const nlohmann::json& config, const nlohmann::json& special_map,
                            const nlohmann::json& tok_json, const std::string& dir);
  // Builds the id -> token table, the byte-symbol ids and the special-token match order.
  void finish_setup();
  // Appends the ids of one pre-tokenized word (a piece of normalized UTF-8 text).
  void bpe_word(const std::string& word, std::vector<int32_t>& ids) const;
  // Appends the ids of a span of raw text that contains no special token.
  void encode_span(std::string_view span, std::vector<int32_t>& ids) const;
  // Merges a word's symbols by rank; returns the final symbol ids.
  std::vector<int32_t> merge_symbols(const std::string& word) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  bpe::MergeTable merges_;
  std::vector<std::pair<std::string, int32_t>> special_tokens_;  // matched in raw text, longest first
  int32_t byte_id_[256] = {};          // id of each byte symbol
  int32_t byte_eow_id_[256] = {};      // id of each byte symbol + "</w>"
  int bos_ = 49406, eos_ = 49407, pad_ = 49407, unk_ = 49407;
  static constexpr int kDefaultMaxLength = 77;  // CLIP's position-embedding count
  int max_length_ = kDefaultMaxLength;
  bpe::WordCache cache_;  // word -> ids
};

}  // namespace atelier
