// Sampler and schedule names: ours ("euler_a", "dpmpp_2m_karras") and AUTOMATIC1111's ("Euler a",
// "DPM++ 2M Karras"), each mapped to the diffusers scheduler class whose semantics the sampler reproduces.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace atelier::sampling {

enum class SamplerKind {
  kEuler,           // EulerDiscreteScheduler
  kEulerAncestral,  // EulerAncestralDiscreteScheduler
  kHeun,            // HeunDiscreteScheduler
  kDDIM,            // DDIMScheduler, eta 0
  kDPMpp2M,         // DPMSolverMultistepScheduler, dpmsolver++, order 2
  kDPMpp2MSDE,      // DPMSolverMultistepScheduler, sde-dpmsolver++, order 2
  kLCM,             // LCMScheduler
};

// kDefault keeps whatever the model's scheduler config says (use_karras_sigmas etc. included).
enum class ScheduleKind { kDefault, kKarras, kExponential };

struct SamplerSpec {
  SamplerKind kind = SamplerKind::kEuler;
  ScheduleKind schedule = ScheduleKind::kDefault;
  bool operator==(const SamplerSpec&) const = default;
};

inline constexpr SamplerKind kAllSamplers[] = {SamplerKind::kEuler, SamplerKind::kEulerAncestral,
                                               SamplerKind::kHeun,  SamplerKind::kDDIM,
                                               SamplerKind::kDPMpp2M, SamplerKind::kDPMpp2MSDE,
                                               SamplerKind::kLCM};

std::string_view sampler_name(SamplerKind kind);     // "euler", "euler_a", "heun", "ddim", "dpmpp_2m", ...
std::string_view schedule_name(ScheduleKind kind);   // "default", "karras", "exponential"
std::string_view diffusers_class(SamplerKind kind);  // "EulerDiscreteScheduler", ...

// Whether the diffusers class behind `kind` offers `schedule` (use_karras_sigmas / use_exponential_sigmas).
bool supports_schedule(SamplerKind kind, ScheduleKind schedule);
// "euler, heun, dpmpp_2m, dpmpp_2m_sde": the samplers that offer `schedule`.
std::string samplers_supporting(ScheduleKind schedule);

// Parses a sampler name, case-insensitively: ours ("euler", "euler_a", "heun", "ddim", "dpmpp_2m",
// "dpmpp_2m_sde", "lcm", optionally suffixed "_karras" / "_exponential") or A1111's ("Euler", "Euler a",
// "Heun", "DDIM", "DPM++ 2M", "DPM++ 2M SDE", "LCM", optionally followed by " Karras" / " Exponential").
// Unknown names give an error listing the supported ones; a schedule the sampler's class lacks gives an
// error naming the samplers that have it.
Expected<SamplerSpec> parse_sampler(std::string_view name);
// "default" (or ""), "karras", "exponential" (case-insensitive).
Expected<ScheduleKind> parse_schedule(std::string_view name);
// Combines a parsed name with a separately requested schedule (kDefault = none requested); a conflict
// ("DPM++ 2M Karras" with "exponential") or an unsupported combination is an error.
Expected<SamplerSpec> with_schedule(SamplerSpec spec, ScheduleKind schedule);

// Every accepted sampler name, ours first then A1111's, for help texts and error messages.
std::vector<std::string> supported_sampler_names();

}  // namespace atelier::sampling
