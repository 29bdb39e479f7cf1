// Qwen's byte-level BPE tokenizer (Qwen2/Qwen3, as used by Z-Image), reproducing HF `tokenizers` on the
// model's tokenizer.json:
//   1. added tokens (<|im_start|>, <|im_end|>, <|endoftext|>, ...) are split out of the raw text first, by
//      exact match, leftmost-longest;
//   2. each remaining span is normalized with NFC;
//   3. pre-tokenized by Qwen's regex ("Isolated" split: every match is a piece)
//        (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//      implemented by hand with the Unicode category tables of tokenizers/unicode.h;
//   4. each piece's UTF-8 bytes are mapped to GPT-2's printable byte alphabet and merged by BPE rank
//      (no end-of-word suffix, no unknown token: every byte has a vocabulary entry).
// No BOS/EOS is added (the post-processor of Qwen's tokenizer.json adds none); padding is on the right with
// the pad token of tokenizer_config.json, truncation on the right.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "tokenizers/byte_bpe.h"

namespace atelier {

// One prompt encoded for the text encoder.
struct QwenEncoding {
  std::vector<int32_t> ids;   // max_length ids: tokens, then padding
  std::vector<int32_t> mask;  // 1 for tokens, 0 for padding
  int length = 0;             // tokens before padding
};

class QwenTokenizer {
 public:
  QwenTokenizer();  // empty: encodes nothing; use load()
  // Loads tokenizer.json (BPE model, added tokens), tokenizer_config.json (pad token, chat template) and
  // chat_template.jinja (preferred over tokenizer_config.json's "chat_template") from `dir`.
  static Expected<QwenTokenizer> load(const std::string& dir);

  // Token ids of `text`: no special tokens added, no truncation, no padding.
  std::vector<int32_t> encode_unpadded(const std::string& text) const;
  // Truncated on the right to max_length and padded with pad() to max_length.
  QwenEncoding encode(const std::string& text, int max_length) const;

  // The pre-tokenizer's pieces of `text` (after NFC), as UTF-8; for tests.
  static std::vector<std::string> pre_tokenize(const std::string& text);

  int32_t token_to_id(const std::string& token) const;  // -1 when absent
  int32_t pad() const { return pad_; }
  size_t vocab_size() const { return vocab_.size(); }
  // The Jinja chat template ("" when the folder has none).
  const std::string& chat_template() const { return chat_template_; }

 private:
  static Expected<QwenTokenizer> load_impl(const std::string& dir);
  // Appends the ids of a span of raw text that holds no added token.
  void encode_span(std::string_view span, std::vector<int32_t>& ids) const;
  // Appends the BPE ids of one pre-tokenized piece (UTF-8).
  void bpe_piece(const std::string& piece, std::vector<int32_t>& ids) const;
  std::vector<int32_t> merge_symbols(const std::string& piece) const;

  std::unordered_map<std::string, int32_t> vocab_;
  bpe::MergeTable merges_;
  std::vector<std::pair<std::string, int32_t>> added_tokens_;    // matched in raw text, longest first
  int32_t byte_id_[256] = {};                                    // id of each byte's symbol
  int32_t pad_ = 0;
  std::string chat_template_;
  bpe::WordCache cache_;  // piece -> ids
};

}  // namespace atelier
