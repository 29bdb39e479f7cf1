#include "serve/redis/request_codec.h"

#include "io/image.h"
#include "serve/base64.h"

namespace atelier::serve::redis {
namespace {

constexpr size_t kMaxInitImageBytes = 64u << 20;

template <typename T>
Status read(const nlohmann::json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return Status::ok();  // absent: the default
  try {
    out = it->get<T>();
  } catch (const std::exception&) {
    return invalid_argument(std::string("job request: field '") + key + "' has the wrong type");
  }
  return Status::ok();
}

}  // namespace

nlohmann::json encode_request(const ServeRequest& r) {
  const GenerateRequest& g = r.gen;
  nlohmann::json j = {{"prompt", g.prompt}, {"negative_prompt", g.negative_prompt}, {"width", g.width},
                      {"height", g.height}, {"steps", g.steps}, {"cfg_scale", g.cfg_scale}, {"sampler", g.sampler},
                      {"schedule", g.schedule}, {"seed", g.seed}, {"rng", g.rng}, {"clip_skip", g.clip_skip},
                      {"prediction", g.prediction}, {"strength", g.strength}, {"batch_size", g.batch_size},
                      {"batch_count", g.batch_count}, {"emphasis", g.emphasis}, {"model", r.model},
                      {"preview", r.preview}, {"partial_images", r.partial_images}, {"timeout_s", r.timeout_s},
                      {"api", api_family_name(r.api)}, {"output_format", r.output_format},
                      {"guidance", r.guidance}, {"max_sequence_length", r.max_sequence_length}, {"cost", r.cost}};
  for (auto [key, image] : {std::pair{"init_image_png", &r.init_image}, std::pair{"mask_png", &r.mask}})
    if (*image)
      if (auto png = encode_png(**image)) j[key] = base64_encode(*png);
  j["resize_mode"] = g.resize_mode;
  if (r.mask) g.add_inpaint_settings(j);
  return j;
}

Expected<ServeRequest> decode_request(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("job request: not a JSON object");
  ServeRequest r;
  GenerateRequest& g = r.gen;
  ATELIER_RETURN_IF_ERROR(read(j, "prompt", g.prompt));
  ATELIER_RETURN_IF_ERROR(read(j, "negative_prompt", g.negative_prompt));
  ATELIER_RETURN_IF_ERROR(read(j, "width", g.width));
  ATELIER_RETURN_IF_ERROR(read(j, "height", g.height));
  ATELIER_RETURN_IF_ERROR(read(j, "steps", g.steps));
  ATELIER_RETURN_IF_ERROR(read(j, "cfg_scale", g.cfg_scale));
  ATELIER_RETURN_IF_ERROR(read(j, "sampler", g.sampler));
  ATELIER_RETURN_IF_ERROR(read(j, "schedule", g.schedule));
  ATELIER_RETURN_IF_ERROR(read(j, "seed", g.seed));
  ATELIER_RETURN_IF_ERROR(read(j, "rng", g.rng));
  ATELIER_RETURN_IF_ERROR(read(j, "clip_skip", g.clip_skip));
  ATELIER_RETURN_IF_ERROR(read(j, "prediction", g.prediction));
  ATELIER_RETURN_IF_ERROR(read(j, "strength", g.strength));
  ATELIER_RETURN_IF_ERROR(read(j, "batch_size", g.batch_size));
  ATELIER_RETURN_IF_ERROR(read(j, "batch_count", g.batch_count));
  ATELIER_RETURN_IF_ERROR(read(j, "emphasis", g.emphasis));
  ATELIER_RETURN_IF_ERROR(read(j, "model", r.model));
  ATELIER_RETURN_IF_ERROR(read(j, "preview", r.preview));
  ATELIER_RETURN_IF_ERROR(read(j, "partial_images", r.partial_images));
  ATELIER_RETURN_IF_ERROR(read(j, "timeout_s", r.timeout_s));
  ATELIER_RETURN_IF_ERROR(read(j, "output_format", r.output_format));
  ATELIER_RETURN_IF_ERROR(read(j, "guidance", r.guidance));  // cfg_scale is final by now (validate_for_model)
  ATELIER_RETURN_IF_ERROR(read(j, "max_sequence_length", r.max_sequence_length));
  ATELIER_RETURN_IF_ERROR(read(j, "cost", r.cost));
  std::string api = "native";
  ATELIER_RETURN_IF_ERROR(read(j, "api", api));
  r.api = api == "a1111" ? ApiFamily::kA1111 : api == "openai" ? ApiFamily::kOpenAI : ApiFamily::kNative;
  ATELIER_RETURN_IF_ERROR(read(j, "resize_mode", g.resize_mode));
  ATELIER_RETURN_IF_ERROR(read(j, "mask_blur_x", g.mask_blur_x));  // inpainting: GenerateRequest::add_inpaint_settings'
  ATELIER_RETURN_IF_ERROR(read(j, "mask_blur_y", g.mask_blur_y));
  ATELIER_RETURN_IF_ERROR(read(j, "inpaint_fill", g.inpaint_fill));
  ATELIER_RETURN_IF_ERROR(read(j, "inpaint_only_masked", g.inpaint_only_masked));
  ATELIER_RETURN_IF_ERROR(read(j, "inpaint_padding", g.inpaint_padding));
  ATELIER_RETURN_IF_ERROR(read(j, "mask_invert", g.mask_invert));
  ATELIER_RETURN_IF_ERROR(read(j, "mask_round", g.mask_round));
  for (auto [key, image] : {std::pair{"init_image_png", &r.init_image}, std::pair{"mask_png", &r.mask}}) {
    std::string b64;
    ATELIER_RETURN_IF_ERROR(read(j, key, b64));
    if (b64.empty()) continue;
    ATELIER_ASSIGN_OR_RETURN(std::string png, base64_decode(b64, key, kMaxInitImageBytes));
    ATELIER_ASSIGN_OR_RETURN(Image img, decode_image(png, key));
    *image = std::move(img);
  }
  if (r.model.empty()) return invalid_argument("job request: no model");
  return r;
}

}  // namespace atelier::serve::redis
