// What the HTTP APIs turn a request body into, whatever the API family: a generation request plus the
// server-side settings (model name, decoded init image, previews, timeout, output format), checked against
// the server's limits before the job is accepted, so every problem is a 400 that names the field.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "io/image.h"
#include "pipeline/flux_pipeline.h"
#include "pipeline/model_family.h"
#include "pipeline/request.h"
#include "serve/json_fields.h"

namespace atelier::serve {

enum class ApiFamily { kNative, kA1111, kOpenAI };
const char* api_family_name(ApiFamily f);

struct ServeLimits {
  int max_side = 2048;                       // pixels, width and height
  int64_t max_pixels = 1024 * 1024;          // width * height of one image
  int max_steps = 150;
  int max_images = 16;                       // images per request (batch_size x batch_count, or n)
  size_t max_prompt_bytes = 16 * 1024;
  size_t max_upload_bytes = 16 << 20;        // one decoded init image file
  int max_upload_side = 4096;                // init image, before resizing
  double max_timeout_s = 3600;
};

constexpr int kApiDefaultSide = 512;  // A1111's default width/height; also the estimate for "model default"
constexpr double kMaxGuidance = 100.0;  // cfg_scale and FLUX's guidance, in every API

struct ServeRequest {
  GenerateRequest gen;                 // gen.init_image (a path) is never used by the server
  std::string model;                   // registry name; empty = the server's default model
  std::optional<Image> init_image;     // img2img when set
  std::optional<Image> mask;           // inpainting (with init_image) when set
  bool preview = false;                // per-step low-cost previews in the events
  int partial_images = 0;              // OpenAI streaming: partial images to send (0..3)
  double timeout_s = 0;                // 0 = the server's default
  ApiFamily api = ApiFamily::kNative;
  std::string output_format = "png";   // png | jpeg | webp
  // FLUX and Z-Image (ModelFamily): whether the client gave cfg_scale (without it, no CFG runs for them:
  // validate_for_model sets cfg_scale to 1 for FLUX, 0 for Z-Image-Turbo), FLUX's distilled guidance (native and
  // OpenAI "guidance", A1111 "distilled_cfg_scale" as Forge names it) and the T5 token count.
  bool cfg_given = false;
  float guidance = kFluxDefaultGuidance;
  int max_sequence_length = kFluxDefaultMaxSequenceLength;
  // A model call's cost per image pixel against SD 1.x/2.x with CFG (the router's unit): set by validate_for_model.
  double cost = 1.0;

  int images() const { return gen.batch_size * gen.batch_count; }
  // Pixels of one image, with "model default" (0) counted as kApiDefaultSide, or as the init image's side for img2img.
  int64_t pixels() const;
  // Estimated work: model calls x images x pixels x cost (the router's unit; Heun counts ~2 calls per step).
  double work() const;
};

// gen.validate() plus the server's limits, sampler/schedule names resolved.
Status validate_request(const ServeRequest& r, const ServeLimits& limits);

// What the model's family takes, checked once the model is known (a 400 before the job exists): FLUX and Z-Image
// run txt2img at sizes of multiples of 16, and take cfg_scale only when the client gave it (else set here to
// what runs no CFG). Their sampler and schedule are set to what runs (flow-matching Euler; the infotext says so),
// and `cost` to the family's (twice that with CFG).
Status validate_for_model(ServeRequest& r, ModelFamily family);

// base64 (or data URL) -> decoded image, refusing oversized data and images before their pixels are
// allocated (the dimensions are read from the header first).
Expected<Image> decode_upload(std::string_view base64, const std::string& field, const ServeLimits& limits);
// The same for an image file's bytes (a multipart upload).
Expected<Image> decode_upload_bytes(std::string_view bytes, const std::string& field, const ServeLimits& limits);
// The JSON field `key` (a base64 string, when present) decoded into `out` by decode_upload.
Status read_image_field(const FieldReader& f, const char* key, const ServeLimits& limits, std::optional<Image>& out);

// Width and height from a PNG, JPEG or WebP header without decoding the pixels.
Expected<std::pair<int, int>> peek_image_size(std::string_view bytes);

}  // namespace atelier::serve
