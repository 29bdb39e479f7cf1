#include "models/sd/unet_keymap_compvis.h"

#include <charconv>
#include <utility>
#include <vector>

namespace atelier {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// "12" -> 12; nullopt for anything that is not a plain non-negative integer.
std::optional<int> parse_index(const std::string& s) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// A key "<block>.<i>.<kind>.<j>.<rest>" split at its first four dots (block names have no dots).
struct BlockKey {
  std::string block;  // down_blocks / up_blocks (with i) or mid_block (without)
  int i = 0;
  std::string kind;   // resnets / attentions / downsamplers / upsamplers
  int j = 0;
  std::string rest;   // e.g. "conv1.weight"
};

std::optional<BlockKey> split_block_key(const std::string& key) {
  std::vector<std::string> parts;
  size_t pos = 0;
  const bool has_index = !starts_with(key, "mid_block.");
  const int head_parts = has_index ? 4 : 3;
  while (int(parts.size()) < head_parts) {
    const size_t dot = key.find('.', pos);
    if (dot == std::string::npos) return std::nullopt;
    parts.push_back(key.substr(pos, dot - pos));
    pos = dot + 1;
  }
  BlockKey b;
  b.block = parts[0];
  b.rest = key.substr(pos);
  auto i = has_index ? parse_index(parts[1]) : std::optional<int>(0);
  auto j = parse_index(parts[head_parts - 1]);
  if (!i || !j) return std::nullopt;
  b.i = *i;
  b.kind = parts[head_parts - 2];
  b.j = *j;
  return b;
}

// Resnet parameter names: diffusers -> CompVis (ResBlock's Sequential indices).
std::optional<std::string> resnet_name(const std::string& rest) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"norm1.", "in_layers.0."},      {"conv1.", "in_layers.2."},  {"time_emb_proj.", "emb_layers.1."},
      {"norm2.", "out_layers.0."},     {"conv2.", "out_layers.3."}, {"conv_shortcut.", "skip_connection."},
  };
  for (const auto& [from, to] : kNames)
    if (starts_with(rest, from)) return to + rest.substr(std::string(from).size());
  return std::nullopt;
}

std::optional<std::string> block_member(const std::string& base, const BlockKey& b) {
  if (b.kind == "resnets") {
    auto r = resnet_name(b.rest);
    if (!r) return std::nullopt;
    return base + ".0." + *r;
  }
  if (b.kind == "attentions") return base + ".1." + b.rest;
  return std::nullopt;
}

std::optional<std::string> down_key(const UNetConfig& c, const BlockKey& b) {
  if (b.i >= c.levels()) return std::nullopt;
  int first = 1;  // input_blocks.0 is conv_in
  for (int k = 0; k < b.i; ++k) first += c.layers_per_block[k] + 1;
  if (b.kind == "downsamplers") {
    if (b.j != 0 || !starts_with(b.rest, "conv.")) return std::nullopt;
    return "input_blocks." + std::to_string(first + c.layers_per_block[b.i]) + ".0.op." + b.rest.substr(5);
  }
  if (b.j >= c.layers_per_block[b.i]) return std::nullopt;
  return block_member("input_blocks." + std::to_string(first + b.j), b);
}

std::optional<std::string> up_key(const UNetConfig& c, const BlockKey& b) {
  if (b.i >= c.levels()) return std::nullopt;
  const auto resnets_of = [&](int up) { return c.layers_per_block[c.up_level(up)] + 1; };
  int first = 0;
  for (int k = 0; k < b.i; ++k) first += resnets_of(k);
  const int n = resnets_of(b.i);
  if (b.kind == "upsamplers") {
    if (b.j != 0) return std::nullopt;
    const int slot = c.up_has_attention(b.i) ? 2 : 1;  // after the attention, if the block has one
    return "output_blocks." + std::to_string(first + n - 1) + "." + std::to_string(slot) + "." + b.rest;
  }
  if (b.j >= n) return std::nullopt;
  return block_member("output_blocks." + std::to_string(first + b.j), b);
}

std::optional<std::string> mid_key(const BlockKey& b) {
  // middle_block alternates resnet, attention, resnet.
  if (b.kind == "resnets") {
    auto r = resnet_name(b.rest);
    if (!r) return std::nullopt;
    return "middle_block." + std::to_string(2 * b.j) + "." + *r;
  }
  if (b.kind == "attentions") return "middle_block." + std::to_string(2 * b.j + 1) + "." + b.rest;
  return std::nullopt;
}

}  // namespace

std::optional<std::string> compvis_unet_key(const UNetConfig& c, const std::string& key) {
  static const std::pair<const char*, const char*> kTopLevel[] = {
      {"time_embedding.linear_1.", "time_embed.0."}, {"time_embedding.linear_2.", "time_embed.2."},
      {"conv_in.", "input_blocks.0.0."},             {"conv_norm_out.", "out.0."},
      {"conv_out.", "out.2."},
  };
  for (const auto& [from, to] : kTopLevel)
    if (starts_with(key, from)) return to + key.substr(std::string(from).size());
  auto b = split_block_key(key);
  if (!b) return std::nullopt;
  if (b->block == "down_blocks") return down_key(c, *b);
  if (b->block == "up_blocks") return up_key(c, *b);
  if (b->block == "mid_block") return mid_key(*b);
  return std::nullopt;
}

KeyMap compvis_unet_key_map(const UNetConfig& config) {
  return [config](const std::string& canonical) {
    auto k = compvis_unet_key(config, canonical);
    return k ? *k : "<no CompVis name for UNet key '" + canonical + "'>";
  };
}

}  // namespace atelier
