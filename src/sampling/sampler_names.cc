#include "sampling/sampler_names.h"

#include <algorithm>
#include <cctype>

namespace atelier::sampling {
namespace {

struct NameEntry {
  std::string_view ours;
  std::string_view a1111;
  SamplerKind kind;
};

// The A1111 names are those of its sampler dropdown (the "Karras"/"Exponential" variants are parsed as a
// suffix), which diffusers' documentation maps to these classes.
constexpr NameEntry kNames[] = {
    {"euler", "Euler", SamplerKind::kEuler},
    {"euler_a", "Euler a", SamplerKind::kEulerAncestral},
    {"heun", "Heun", SamplerKind::kHeun},
    {"ddim", "DDIM", SamplerKind::kDDIM},
    {"dpmpp_2m", "DPM++ 2M", SamplerKind::kDPMpp2M},
    {"dpmpp_2m_sde", "DPM++ 2M SDE", SamplerKind::kDPMpp2MSDE},
    {"lcm", "LCM", SamplerKind::kLCM},
};

struct ScheduleSuffix {
  std::string_view ours;   // "_karras"
  std::string_view a1111;  // " karras" (names are compared lower-cased)
  ScheduleKind kind;
};
constexpr ScheduleSuffix kSuffixes[] = {
    {"_karras", " karras", ScheduleKind::kKarras},
    {"_exponential", " exponential", ScheduleKind::kExponential},
};

std::string lower_trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

const NameEntry* find_base(const std::string& name) {
  for (const auto& e : kNames) {
    if (name == e.ours || name == lower_trimmed(e.a1111)) return &e;
  }
  // "euler_ancestral" and "euler ancestral" are common spellings of the same sampler.
  if (name == "euler_ancestral" || name == "euler ancestral") return &kNames[1];
  return nullptr;
}

std::string join(const std::vector<std::string>& xs) {
  std::string out;
  for (size_t i = 0; i < xs.size(); ++i) out += (i ? ", " : "") + xs[i];
  return out;
}

}  // namespace

std::string_view sampler_name(SamplerKind kind) {
  for (const auto& e : kNames) {
    if (e.kind == kind) return e.ours;
  }
  return "?";
}

std::string_view schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kDefault: return "default";
    case ScheduleKind::kKarras: return "karras";
    case ScheduleKind::kExponential: return "exponential";
  }
  return "?";
}

std::string_view diffusers_class(SamplerKind kind) {
  switch (kind) {
    case SamplerKind::kEuler: return "EulerDiscreteScheduler";
    case SamplerKind::kEulerAncestral: return "EulerAncestralDiscreteScheduler";
    case SamplerKind::kHeun: return "HeunDiscreteScheduler";
    case SamplerKind::kDDIM: return "DDIMScheduler";
    case SamplerKind::kDPMpp2M:
    case SamplerKind::kDPMpp2MSDE: return "DPMSolverMultistepScheduler";
    case SamplerKind::kLCM: return "LCMScheduler";
  }
  return "?";
}

bool supports_schedule(SamplerKind kind, ScheduleKind schedule) {
  if (schedule == ScheduleKind::kDefault) return true;
  // use_karras_sigmas / use_exponential_sigmas exist on these classes only.
  return kind == SamplerKind::kEuler || kind == SamplerKind::kHeun || kind == SamplerKind::kDPMpp2M ||
         kind == SamplerKind::kDPMpp2MSDE;
}

std::string samplers_supporting(ScheduleKind schedule) {
  std::vector<std::string> names;
  for (SamplerKind k : kAllSamplers) {
    if (supports_schedule(k, schedule)) names.emplace_back(sampler_name(k));
  }
  return join(names);
}

std::vector<std::string> supported_sampler_names() {
  std::vector<std::string> out;
  for (const auto& e : kNames) {
    out.emplace_back(e.ours);
    for (const auto& s : kSuffixes) {
      if (supports_schedule(e.kind, s.kind)) out.push_back(std::string(e.ours) + std::string(s.ours));
    }
  }
  for (const auto& e : kNames) {
    out.emplace_back(e.a1111);
    if (supports_schedule(e.kind, ScheduleKind::kKarras)) out.push_back(std::string(e.a1111) + " Karras");
  }
  return out;
}

Expected<ScheduleKind> parse_schedule(std::string_view name) {
  const std::string n = lower_trimmed(name);
  if (n.empty() || n == "default") return ScheduleKind::kDefault;
  if (n == "karras") return ScheduleKind::kKarras;
  if (n == "exponential") return ScheduleKind::kExponential;
  return invalid_argument("unknown schedule '" + std::string(name) +
                          "'; supported: default, karras, exponential");
}

Expected<SamplerSpec> with_schedule(SamplerSpec spec, ScheduleKind schedule) {
  if (schedule != ScheduleKind::kDefault) {
    if (spec.schedule != ScheduleKind::kDefault && spec.schedule != schedule) {
      return invalid_argument("sampler name asks for the " + std::string(schedule_name(spec.schedule)) +
                              " schedule but the " + std::string(schedule_name(schedule)) +
                              " schedule was requested");
    }
    spec.schedule = schedule;
  }
  if (!supports_schedule(spec.kind, spec.schedule)) {
    return unsupported("the " + std::string(schedule_name(spec.schedule)) + " schedule is not available for " +
                       std::string(sampler_name(spec.kind)) + " (diffusers' " +
                       std::string(diffusers_class(spec.kind)) + " has no such option); samplers that offer it: " +
                       samplers_supporting(spec.schedule));
  }
  return spec;
}

Expected<SamplerSpec> parse_sampler(std::string_view name) {
  const std::string n = lower_trimmed(name);
  const NameEntry* base = find_base(n);
  ScheduleKind schedule = ScheduleKind::kDefault;
  for (const auto& s : kSuffixes) {
    if (base) break;
    for (std::string_view suffix : {s.ours, s.a1111}) {
      if (n.size() > suffix.size() && n.ends_with(suffix)) {
        base = find_base(n.substr(0, n.size() - suffix.size()));
        if (base) {
          schedule = s.kind;
          break;
        }
      }
    }
  }
  if (!base) {
    return invalid_argument("unknown sampler '" + std::string(name) +
                            "'; supported: " + join(supported_sampler_names()));
  }
  return with_schedule(SamplerSpec{base->kind, ScheduleKind::kDefault}, schedule);
}

}  // namespace atelier::sampling
