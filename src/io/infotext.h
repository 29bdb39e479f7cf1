// A1111's "parameters" infotext, the text that image viewers and web UIs read back from generated images:
//
//   a photo of a cat, (masterpiece:1.2)
//   Negative prompt: blurry
//   Steps: 20, Sampler: Euler a, CFG scale: 7, Seed: 1234, Size: 512x512, Model hash: 6ce0161689
//
// Line 1..n: the prompt; then "Negative prompt: ..." (left out when empty); then one line of "Key: value"
// pairs joined by ", ". A value containing ',', ':' or a newline is JSON-quoted (as A1111's quote() does,
// UTF-8 kept as is); we also quote values starting with '"' or with leading/trailing whitespace, which
// A1111 would write raw and then misread. The whole text is stripped of surrounding whitespace.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace atelier {

using InfotextParams = std::vector<std::pair<std::string, std::string>>;

struct Infotext {
  std::string prompt;
  std::string negative;
  InfotextParams params;  // in text order, values unquoted
  // The value of `key`, or `def` when absent.
  std::string get(const std::string& key, const std::string& def = {}) const;
};

std::string build_infotext(const std::string& prompt, const std::string& negative, const InfotextParams& params);

// Parses infotext the way A1111's parse_generation_parameters does: the last line is the parameter line
// only when it holds at least 3 "Key: value" pairs (otherwise it belongs to the prompt); prompt and
// negative-prompt lines are stripped of surrounding whitespace. Never fails; unknown text becomes prompt.
Infotext parse_infotext(const std::string& text);

// Value of one parameter as it appears in infotext (quoted when needed); exposed for tests and tools.
std::string quote_infotext_value(const std::string& value);

}  // namespace atelier
