#include "models/vae/vae_keymaps.h"

#include <sstream>
#include <vector>

namespace atelier {

namespace {

constexpr const char* kCompVisPrefix = "first_stage_model.";

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  std::string p;
  while (std::getline(ss, p, '.')) parts.push_back(p);
  return parts;
}

std::string join_dots(const std::vector<std::string>& parts, size_t from) {
  std::string out;
  for (size_t i = from; i < parts.size(); ++i) out += (out.empty() ? "" : ".") + parts[i];
  return out;
}

// Resnet parameter names are shared, except the 1x1 shortcut conv.
std::string resnet_tail(const std::vector<std::string>& p, size_t from) {
  std::string tail = join_dots(p, from);
  if (tail.rfind("conv_shortcut.", 0) == 0) tail = "nin_shortcut." + tail.substr(14);
  return tail;
}

// "to_q.weight" -> "q.weight", "to_out.0.bias" -> "proj_out.bias", "group_norm.weight" -> "norm.weight".
std::string attention_tail(const std::vector<std::string>& p, size_t from) {
  if (from >= p.size()) return join_dots(p, from);
  const std::string& name = p[from];
  if (name == "group_norm") return "norm." + join_dots(p, from + 1);
  if (name == "to_q") return "q." + join_dots(p, from + 1);
  if (name == "to_k") return "k." + join_dots(p, from + 1);
  if (name == "to_v") return "v." + join_dots(p, from + 1);
  if (name == "to_out" && from + 1 < p.size() && p[from + 1] == "0") return "proj_out." + join_dots(p, from + 2);
  return join_dots(p, from);
}

// Translates the part after "encoder." / "decoder."; returns "" when the key has no original name.
std::string coder_to_original(bool decoder, const std::vector<std::string>& p, int num_levels) {
  // p[0] is "encoder"/"decoder"; p[1] the sub-module.
  const std::string& m = p[1];
  if (m == "conv_in" || m == "conv_out") return join_dots(p, 1);
  if (m == "conv_norm_out") return "norm_out." + join_dots(p, 2);
  if (m == "mid_block" && p.size() >= 5) {
    if (p[2] == "resnets") return "mid.block_" + std::to_string(std::stoi(p[3]) + 1) + "." + resnet_tail(p, 4);
    if (p[2] == "attentions" && p[3] == "0") return "mid.attn_1." + attention_tail(p, 4);
  }
  const bool level_block = (!decoder && m == "down_blocks") || (decoder && m == "up_blocks");
  if (level_block && p.size() >= 6) {
    const int i = std::stoi(p[2]);
    const int level = decoder ? num_levels - 1 - i : i;
    const std::string head = std::string(decoder ? "up." : "down.") + std::to_string(level) + ".";
    if (p[3] == "resnets") return head + "block." + p[4] + "." + resnet_tail(p, 5);
    if ((p[3] == "downsamplers" || p[3] == "upsamplers") && p[4] == "0")
      return head + (decoder ? "upsample." : "downsample.") + join_dots(p, 5);
  }
  return "";
}

bool is_index(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// Index fields must be numeric for stoi; anything else is left unmapped.
bool indices_numeric(const std::vector<std::string>& p) {
  if (p.size() >= 3 && (p[1] == "down_blocks" || p[1] == "up_blocks") && !is_index(p[2])) return false;
  if (p.size() >= 4 && p[1] == "mid_block" && p[2] == "resnets" && !is_index(p[3])) return false;
  return true;
}

}  // namespace

std::string_view vae_layout_name(VaeLayout layout) {
  switch (layout) {
    case VaeLayout::kDiffusers: return "diffusers";
    case VaeLayout::kCompVis: return "CompVis (first_stage_model.*)";
    case VaeLayout::kOriginal: return "original (ae.safetensors)";
  }
  return "?";
}

std::string vae_key_prefix(VaeLayout layout) { return layout == VaeLayout::kCompVis ? kCompVisPrefix : ""; }

std::string vae_canonical_to_layout(VaeLayout layout, const std::string& canonical, int num_levels) {
  if (layout == VaeLayout::kDiffusers) return canonical;
  const auto p = split_dots(canonical);
  if (p.size() >= 3 && (p[0] == "encoder" || p[0] == "decoder") && indices_numeric(p)) {
    std::string mapped = coder_to_original(p[0] == "decoder", p, num_levels);
    if (!mapped.empty()) return p[0] + "." + mapped;
  }
  return canonical;  // quant_conv / post_quant_conv keep their names; unknown keys are reported as missing
}

KeyMap vae_key_map(VaeLayout layout, int num_levels) {
  if (layout == VaeLayout::kDiffusers) return {};
  return [layout, num_levels](const std::string& key) { return vae_canonical_to_layout(layout, key, num_levels); };
}

std::string vae_file_key(VaeLayout layout, const std::string& canonical, int num_levels) {
  return vae_key_prefix(layout) + vae_canonical_to_layout(layout, canonical, num_levels);
}

}  // namespace atelier
