// T5's SentencePiece tokenizer (FLUX's and SD3's text_encoder_2 tokenizer), reproducing transformers'
// T5TokenizerFast as FluxPipeline calls it (padding="max_length", truncation=True, add_special_tokens=True):
//   1. special tokens ("<pad>", "</s>", "<unk>", "<extra_id_N>") are split out of the raw text by exact match;
//   2. each remaining span is encoded by the SentencePiece unigram model (spiece.model through
//      libsentencepiece: its precompiled normalizer, whitespace split, "▁" prefix, Viterbi segmentation, runs of
//      unknown characters as one <unk>) — what tokenizer.json's Precompiled + WhitespaceSplit + Metaspace +
//      Unigram pipeline computes;
//   3. the ids are truncated to max_length - 1, EOS (</s>) is appended, and the rest is padded with <pad>.
// The extra ids follow the SentencePiece vocabulary: <extra_id_0> is the highest id (vocab + 99).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace atelier {

class T5Tokenizer {
 public:
  // `path`: a tokenizer folder holding spiece.model (diffusers' tokenizer_2/) or the .model file itself.
  static Expected<T5Tokenizer> load(const std::string& path);
  T5Tokenizer(T5Tokenizer&&) noexcept;
  T5Tokenizer& operator=(T5Tokenizer&&) noexcept;
  ~T5Tokenizer();

  // Tokens + EOS, truncated to max_length (EOS kept last) and padded with pad() to exactly max_length.
  // max_length >= 1.
  std::vector<int32_t> encode(const std::string& text, int max_length) const;
  // The ids of `text` alone: no EOS, no truncation, no padding.
  std::vector<int32_t> encode_unpadded(const std::string& text) const;

  int eos() const { return eos_; }
  int pad() const { return pad_; }
  int unk() const { return unk_; }
  // SentencePiece pieces + the extra ids.
  int vocab_size() const { return piece_count_ + kExtraIds; }

  static constexpr int kExtraIds = 100;

 private:
  T5Tokenizer();
  // Appends the ids of a span that contains no special token.
  void encode_span(const std::string& span, std::vector<int32_t>& ids) const;
  // Length of the special token at text[pos], with its id; 0 when none starts there.
  size_t match_special(const std::string& text, size_t pos, int32_t& id) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int piece_count_ = 0;
  int eos_ = 1, pad_ = 0, unk_ = 2;
};

}  // namespace atelier
