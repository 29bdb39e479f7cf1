// A1111 ("stable-diffusion-webui") prompt emphasis, off by default in the pipeline:
//   (text)        weight x1.1            [text]     weight /1.1
//   (text:1.3)    weight x1.3            nesting multiplies; unbalanced brackets close at the end
//   \( \) \[ \] \\  literal characters   "BREAK" (a whole word) starts a new 75-token chunk
// parse_prompt_attention() turns a prompt into (text, weight) chunks exactly as A1111's parser does
// (same multiplication order in double precision, same merging of neighbours with equal weights);
// the encode functions tokenize chunk by chunk and give every token its chunk's weight.
//
// Applying the weights is the pipeline's job, as A1111 does it: multiply the text encoder's output
// per token by its weight, then rescale the whole output so its mean equals the unweighted mean.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizers/clip_tokenizer.h"

namespace atelier {

struct PromptChunk {
  std::string text;
  double weight = 1.0;
  // A1111 marks BREAK as the text "BREAK" with weight -1 (a BREAK inside brackets gets its weight
  // multiplied and then reads as literal text, as in A1111).
  bool is_break() const { return weight == -1.0 && text == "BREAK"; }
  bool operator==(const PromptChunk&) const = default;
};

// Parses A1111 emphasis syntax. Never empty: an empty prompt gives {("", 1.0)}. Fails only when a
// "(text:w)" weight is not a number (e.g. "1.2.3"), which A1111 also rejects.
// Character classes: \s is Python's (Unicode White_Space plus U+001C..U+001F); the weight accepts ASCII
// digits only; BREAK needs non-word neighbours (word = letter, number or '_').
Expected<std::vector<PromptChunk>> parse_prompt_attention(std::string_view prompt);
// The emphasis-off equivalent: the whole prompt as one chunk of weight 1.
std::vector<PromptChunk> unweighted_prompt(std::string_view prompt);

// Token ids with one weight per id (weights are float32, as A1111 builds its multiplier tensor).
struct WeightedTokens {
  std::vector<int32_t> ids;
  std::vector<float> weights;  // BOS, EOS and padding have weight 1
};

// The diffusers-compatible path with weights: BOS + the chunks' tokens, truncated to
// max_length() - 2, + EOS, padded with pad(). BREAK markers are dropped (they only mean something in
// the long-prompt mode). For {(prompt, 1)} the ids equal tokenizer.encode(prompt).
WeightedTokens encode_weighted(const ClipTokenizer& tokenizer, const std::vector<PromptChunk>& chunks);

// A1111's long-prompt mode: tokens are packed into windows of max_length() - 2 (75) tokens, each sent
// to the encoder as BOS + 75 tokens + EOS; a BREAK or a full window starts the next one. When a window
// fills within `comma_padding_backtrack` tokens after a comma, the tokens after the comma move to the
// next window (A1111's default is 20; 0 disables). Windows are padded with EOS, and when the pad token
// differs from EOS (SD 2), everything after the first EOS of a window becomes pad().
struct LongPromptTokens {
  std::vector<WeightedTokens> windows;  // each of max_length() ids; never empty
  int token_count = 0;                  // A1111's count: 75 per full window plus the last one's tokens
};
LongPromptTokens encode_long_prompt(const ClipTokenizer& tokenizer, const std::vector<PromptChunk>& chunks,
                                    int comma_padding_backtrack = 20);

}  // namespace atelier
