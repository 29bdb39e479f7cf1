#include "serve/serve_request.h"

#include <webp/decode.h>

#include "pipeline/inpaint.h"
#include "sampling/sampler.h"
#include "sampling/sampler_names.h"
#include "serve/base64.h"
#include "serve/model_registry.h"
#include "tokenizers/prompt_weights.h"

namespace atelier::serve {
namespace {

// A DiT model call's cost per image pixel against SD 1.x/2.x with CFG, from the H200 figures in
// docs/performance.md: an SD 1.5 CFG step at 512² takes 5.0 ms (19 ns per pixel), a FLUX.1-dev bf16 step at 1024²
// 122 ms (116 ns), a Z-Image bf16 evaluation at 1024² 93 ms (89 ns). Only the ratios matter (the router compares
// workers' sums of work); true CFG doubles a DiT's calls.
constexpr double kFluxCost = 6.0;
constexpr double kZImageCost = 4.5;

uint32_t be32(std::string_view b, size_t at) {
  return uint32_t(uint8_t(b[at])) << 24 | uint32_t(uint8_t(b[at + 1])) << 16 | uint32_t(uint8_t(b[at + 2])) << 8 |
         uint8_t(b[at + 3]);
}

// JPEG: walk the marker segments to the first start-of-frame (SOF0..SOF15 but DHT, JPG, DAC).
Expected<std::pair<int, int>> jpeg_size(std::string_view b) {
  size_t i = 2;
  while (i + 4 <= b.size()) {
    if (uint8_t(b[i]) != 0xFF) return invalid_argument("corrupt JPEG header");
    const uint8_t marker = uint8_t(b[i + 1]);
    if (marker == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    const size_t len = size_t(uint8_t(b[i + 2])) << 8 | uint8_t(b[i + 3]);
    if (len < 2) return invalid_argument("corrupt JPEG header");
    const bool sof = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (sof) {
      if (i + 9 > b.size()) break;
      const int h = int(uint8_t(b[i + 5])) << 8 | uint8_t(b[i + 6]);
      const int w = int(uint8_t(b[i + 7])) << 8 | uint8_t(b[i + 8]);
      return std::pair<int, int>{w, h};
    }
    i += 2 + len;
  }
  return invalid_argument("truncated JPEG: no frame header");
}

}  // namespace

const char* api_family_name(ApiFamily f) {
  switch (f) {
    case ApiFamily::kNative: return "native";
    case ApiFamily::kA1111: return "a1111";
    case ApiFamily::kOpenAI: return "openai";
  }
  return "?";
}

int64_t ServeRequest::pixels() const {
  // An img2img side left open is the init image's for SD and Z-Image (FLUX takes its model's): count the image's, at
  // most what the run makes, so that a large upload cannot pass the server's pixel limit unseen.
  const auto side = [&](int asked, int image_side) -> int64_t {
    return asked ? asked : init_image ? image_side : kApiDefaultSide;
  };
  return side(gen.width, init_image ? init_image->width : 0) * side(gen.height, init_image ? init_image->height : 0);
}

double ServeRequest::work() const {
  const auto spec = sampling::parse_sampler(gen.sampler);
  const bool two_calls = spec && spec->kind == sampling::SamplerKind::kHeun;  // Heun evaluates the model twice per step
  const double calls = two_calls ? 2.0 * gen.steps : gen.steps;
  const double strength = init_image ? double(gen.strength) : 1.0;
  return calls * strength * double(images()) * double(pixels()) * cost;
}

Status validate_request(const ServeRequest& r, const ServeLimits& limits) {
  const GenerateRequest& g = r.gen;
  if (g.prompt.size() > limits.max_prompt_bytes || g.negative_prompt.size() > limits.max_prompt_bytes)
    return invalid_argument("prompt: longer than the limit of " + std::to_string(limits.max_prompt_bytes) + " bytes");
  ATELIER_RETURN_IF_ERROR(g.validate());
  for (auto [name, v] : {std::pair{"width", g.width}, std::pair{"height", g.height}}) {
    if (v > limits.max_side)
      return invalid_argument(std::string(name) + ": " + std::to_string(v) + " is larger than this server allows (" +
                              std::to_string(limits.max_side) + ")");
  }
  if (r.pixels() > limits.max_pixels)
    return invalid_argument("width x height: " + std::to_string(r.pixels()) + " pixels is more than this server allows (" +
                            std::to_string(limits.max_pixels) + ")");
  if (g.steps > limits.max_steps)
    return invalid_argument("steps: " + std::to_string(g.steps) + " is more than this server allows (" +
                            std::to_string(limits.max_steps) + ")");
  if (r.images() > limits.max_images)
    return invalid_argument("images per request: " + std::to_string(r.images()) + " is more than this server allows (" +
                            std::to_string(limits.max_images) + ")");
  if (r.timeout_s < 0 || r.timeout_s > limits.max_timeout_s)
    return invalid_argument("timeout: must be from 0 to " + std::to_string(int(limits.max_timeout_s)) + " seconds");
  if (r.init_image && !(g.strength > 0 && g.strength <= 1))
    return invalid_argument("denoising_strength: must be in (0, 1] for img2img");
  if (r.init_image && sampling::img2img_steps(g.steps, g.strength) < 1)
    return invalid_argument("denoising_strength: " + std::to_string(g.strength) + " with " + std::to_string(g.steps) +
                            " steps leaves no step to run (img2img runs the last int(steps x strength)); raise either");
  if (r.mask && !r.init_image) return invalid_argument("mask: inpainting needs the image to inpaint (init_images)");
  if (r.mask) ATELIER_RETURN_IF_ERROR(check_mask_size(*r.mask, *r.init_image));
  if (g.emphasis) {  // A1111 (word:1.2) syntax: a malformed prompt is a 400 now, not a failed job later
    for (auto [name, text] : {std::pair{"prompt", &g.prompt}, std::pair{"negative_prompt", &g.negative_prompt}}) {
      if (auto chunks = parse_prompt_attention(*text); !chunks)
        return invalid_argument(std::string(name) + ": " + chunks.status().message());
    }
  }
  auto spec = sampling::parse_sampler(g.sampler);
  if (!spec) return invalid_argument("sampler: " + spec.status().message());
  auto sched = sampling::parse_schedule(g.schedule);
  if (!sched) return invalid_argument("schedule: " + sched.status().message());
  if (auto both = sampling::with_schedule(*spec, *sched); !both) return invalid_argument("sampler: " + both.status().message());
  return Status::ok();
}

Status validate_for_model(ServeRequest& r, ModelFamily family) {
  if (family == ModelFamily::kSd) return Status::ok();
  const char* what = family == ModelFamily::kFlux ? "FLUX" : "Z-Image";
  for (auto [name, v] : {std::pair{"width", r.gen.width}, std::pair{"height", r.gen.height}})
    if (v % kFluxSizeMultiple != 0)  // 0 = the model's default size
      return invalid_argument(std::string(name) + ": " + what + " models take multiples of " +
                              std::to_string(kFluxSizeMultiple) + " (got " + std::to_string(v) + ")");
  if (!(r.guidance >= 0 && r.guidance <= kMaxGuidance))
    return invalid_argument("guidance: must be from 0 to " + std::to_string(int(kMaxGuidance)));
  if (r.max_sequence_length < 1 || r.max_sequence_length > kFluxDefaultMaxSequenceLength)
    return invalid_argument("max_sequence_length: must be from 1 to " + std::to_string(kFluxDefaultMaxSequenceLength));
  // Without the client's cfg_scale, the value that runs one model call per step: FLUX.1-dev is guidance-distilled,
  // Z-Image-Turbo is run with 0. A client that sends a cfg_scale above 1 (an A1111 client's usual 7) gets true CFG,
  // as Forge gives it: docs/serve.md says to send 1 (FLUX) or 0 (Z-Image-Turbo).
  if (!r.cfg_given) r.gen.cfg_scale = family == ModelFamily::kFlux ? 1.0f : 0.0f;
  r.gen.sampler = "euler";  // what runs; a "Heun" sent by an A1111 client would count twice the calls
  r.gen.schedule = "default";
  r.cost = (family == ModelFamily::kFlux ? kFluxCost : kZImageCost) * (r.gen.cfg_scale > 1.0f ? 2.0 : 1.0);
  return Status::ok();
}

Expected<std::pair<int, int>> peek_image_size(std::string_view b) {
  switch (detect_image_format(b)) {
    case ImageFormat::kPNG:
      if (b.size() < 24 || b.substr(12, 4) != "IHDR") return invalid_argument("truncated PNG header");
      return std::pair<int, int>{int(std::min<uint32_t>(be32(b, 16), INT32_MAX)), int(std::min<uint32_t>(be32(b, 20), INT32_MAX))};
    case ImageFormat::kJPEG: return jpeg_size(b);
    case ImageFormat::kWebP: {
      int w = 0, h = 0;
      if (!WebPGetInfo(reinterpret_cast<const uint8_t*>(b.data()), b.size(), &w, &h))
        return invalid_argument("corrupt WebP header");
      return std::pair<int, int>{w, h};
    }
    default: return invalid_argument("not a PNG, JPEG or WebP image");
  }
}

Expected<Image> decode_upload(std::string_view text, const std::string& field, const ServeLimits& limits) {
  ATELIER_ASSIGN_OR_RETURN(std::string bytes, base64_decode(text, field, limits.max_upload_bytes));
  return decode_upload_bytes(bytes, field, limits);
}

Status read_image_field(const FieldReader& f, const char* key, const ServeLimits& limits, std::optional<Image>& out) {
  const nlohmann::json* v = f.get(key);
  if (!v) return Status::ok();
  if (!v->is_string()) return invalid_argument(std::string(key) + ": expected a base64 image, got " + describe_json_value(*v));
  ATELIER_ASSIGN_OR_RETURN(Image img, decode_upload(v->get_ref<const std::string&>(), key, limits));
  out = std::move(img);
  return Status::ok();
}

Expected<Image> decode_upload_bytes(std::string_view bytes, const std::string& field, const ServeLimits& limits) {
  if (bytes.size() > limits.max_upload_bytes)
    return invalid_argument(field + ": " + std::to_string(bytes.size()) + " bytes is more than this server accepts (" +
                            std::to_string(limits.max_upload_bytes) + ")");
  auto size = peek_image_size(bytes);
  if (!size) return invalid_argument(field + ": " + size.status().message());
  const auto [w, h] = *size;
  if (w < 1 || h < 1 || w > limits.max_upload_side || h > limits.max_upload_side)
    return invalid_argument(field + ": a " + std::to_string(w) + "x" + std::to_string(h) +
                            " image is not accepted (each side must be from 1 to " + std::to_string(limits.max_upload_side) + ")");
  auto img = decode_image(bytes, field);
  if (!img) return invalid_argument(field + ": " + img.status().message());
  return img;
}

}  // namespace atelier::serve
