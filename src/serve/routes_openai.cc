// The OpenAI images API: POST /v1/images/generations, and POST /v1/images/edits (multipart/form-data: `image`, an
// optional `mask` whose fully transparent pixels mark what to repaint (inpainting), and the generations' fields as
// form fields).
//   {prompt, model, n, size "WxH" | "auto", response_format "b64_json" | "url", output_format png|jpeg|webp,
//    stream, partial_images 0..3}  -> {created, data: [{b64_json, revised_prompt}], output_format, size}
// With stream: true the answer is a server-sent-event stream: "image_generation.partial_image" events
// (low-cost previews of the denoised latents, JPEG) while the job runs, then one
// "image_generation.completed" event per image. Beyond OpenAI's fields, negative_prompt, steps, cfg_scale,
// guidance (FLUX), sampler, seed are accepted (Atelier extensions); quality, style, background, moderation and user are ignored.
#include <httplib.h>

#include "serve/base64.h"
#include "serve/http_util.h"
#include "serve/server_context.h"

namespace atelier::serve {
namespace {

constexpr int kMaxPartialImages = 3;  // OpenAI's limit
constexpr auto kEventWait = std::chrono::milliseconds(1000);

Status parse_size(const std::string& size, const ServeLimits& limits, GenerateRequest& g) {
  if (size.empty() || size == "auto") return Status::ok();  // the model's default size
  const size_t x = size.find('x');
  auto number = [](const std::string& s) -> int {
    if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoi(s);
  };
  const int w = x == std::string::npos ? -1 : number(size.substr(0, x));
  const int h = x == std::string::npos ? -1 : number(size.substr(x + 1));
  if (w <= 0 || h <= 0)
    return invalid_argument("size: expected \"WIDTHxHEIGHT\" (e.g. \"512x512\") or \"auto\", got \"" + size.substr(0, 32) + "\"");
  for (const int side : {w, h})
    if (side < kLatentFactor || side > limits.max_side || side % kLatentFactor != 0)
      return invalid_argument("size: \"" + size + "\" is not supported: each side from " + std::to_string(kLatentFactor) + " to " +
                              std::to_string(limits.max_side) + " pixels, a multiple of " + std::to_string(kLatentFactor));
  g.width = w;
  g.height = h;
  return Status::ok();
}

// `stream`: answer with server-sent events; `as_url`: response_format "url" (images by URL, not inline).
Expected<ServeRequest> parse_openai(const nlohmann::json& body, const ServeLimits& limits, bool* stream, bool* as_url) {
  ServeRequest r;
  r.api = ApiFamily::kOpenAI;
  GenerateRequest& g = r.gen;
  FieldReader f(body);
  if (!f.has("prompt")) return invalid_argument("prompt: required");
  ATELIER_RETURN_IF_ERROR(f.string("prompt", g.prompt, limits.max_prompt_bytes));
  ATELIER_RETURN_IF_ERROR(f.string("negative_prompt", g.negative_prompt, limits.max_prompt_bytes));
  ATELIER_RETURN_IF_ERROR(f.string("model", r.model, 256));
  ATELIER_RETURN_IF_ERROR(f.integer("n", 1, limits.max_images, g.batch_size));
  std::string size, response_format = "b64_json";
  ATELIER_RETURN_IF_ERROR(f.string("size", size, 32));
  ATELIER_RETURN_IF_ERROR(parse_size(size, limits, g));
  ATELIER_RETURN_IF_ERROR(f.string("response_format", response_format, 32));
  if (response_format != "b64_json" && response_format != "url")
    return invalid_argument("response_format: \"" + response_format.substr(0, 32) + "\" is not supported; supported: \"url\", \"b64_json\"");
  *as_url = response_format == "url";
  ATELIER_RETURN_IF_ERROR(f.choice("output_format", {"png", "jpeg", "webp"}, r.output_format));
  ATELIER_RETURN_IF_ERROR(f.boolean("stream", *stream));
  ATELIER_RETURN_IF_ERROR(f.integer("partial_images", 0, kMaxPartialImages, r.partial_images));
  ATELIER_RETURN_IF_ERROR(f.integer("steps", 1, limits.max_steps, g.steps));
  ATELIER_RETURN_IF_ERROR(f.number("cfg_scale", 0.0, kMaxGuidance, g.cfg_scale));
  r.cfg_given = f.has("cfg_scale");
  ATELIER_RETURN_IF_ERROR(f.number("guidance", 0.0, kMaxGuidance, r.guidance));
  ATELIER_RETURN_IF_ERROR(f.string("sampler", g.sampler, 64));
  ATELIER_RETURN_IF_ERROR(f.integer("seed", int64_t(-1), int64_t(0xffffffffffffLL), g.seed));
  if (!*stream) r.partial_images = 0;
  return r;
}

// Form fields of an edit whose values are numbers or booleans in JSON (a form sends every value as text).
const std::set<std::string> kFormNumbers = {"n", "steps", "cfg_scale", "guidance", "seed", "partial_images", "strength"};
const std::set<std::string> kFormBooleans = {"stream"};
constexpr float kEditMaskStrength = 1.0f;  // a masked edit repaints its area from noise; without a mask, img2img's 0.75

// The text fields of a multipart form as the JSON body parse_openai reads: numbers and booleans where those fields
// take them (a value that is neither stays text, and the field's reader says what it expected).
nlohmann::json form_fields(const httplib::Request& req) {
  nlohmann::json body = nlohmann::json::object();
  for (const auto& [name, item] : req.files) {
    if (!item.filename.empty()) continue;  // a file
    nlohmann::json v = item.content;
    if (kFormNumbers.count(name)) {
      const auto n = nlohmann::json::parse(item.content, nullptr, false);
      if (!n.is_discarded() && n.is_number()) v = n;
    } else if (kFormBooleans.count(name) && (item.content == "true" || item.content == "false")) {
      v = item.content == "true";
    }
    body[name] = v;
  }
  return body;
}

// OpenAI's edit mask (an RGBA PNG of the image's size; where alpha is 0 the image is edited) -> the engine's: one
// channel, 255 = repaint.
Expected<Image> edit_mask(const Image& upload) {
  if (upload.channels != 2 && upload.channels != 4)
    return invalid_argument("mask: needs an alpha channel (an RGBA PNG, fully transparent where the image is to be edited)");
  Image m{upload.width, upload.height, 1, std::vector<uint8_t>(size_t(upload.width) * upload.height)};
  for (size_t i = 0; i < m.pixels.size(); ++i) m.pixels[i] = upload.pixels[i * size_t(upload.channels) + (upload.channels - 1)] == 0 ? 255 : 0;
  return m;
}

// POST /v1/images/edits -> the request: the generations' fields, the image (img2img) and its mask (inpainting).
Expected<ServeRequest> parse_openai_edit(const httplib::Request& req, const ServeLimits& limits, bool* stream, bool* as_url) {
  if (!req.is_multipart_form_data())
    return invalid_argument("expected multipart/form-data with the fields image, prompt and optionally mask "
                            "(OpenAI's images edit)");
  const nlohmann::json body = form_fields(req);
  FieldReader f(body);
  float strength = 0;
  ATELIER_RETURN_IF_ERROR(f.number("strength", 0.0, 1.0, strength));
  ATELIER_ASSIGN_OR_RETURN(ServeRequest r, parse_openai(body, limits, stream, as_url));
  const char* image_field = req.has_file("image") ? "image" : "image[]";  // the SDK's name for a list of images
  if (!req.has_file(image_field) || req.get_file_value(image_field).filename.empty())
    return invalid_argument("image: required (the picture to edit, a PNG, JPEG or WebP file)");
  ATELIER_ASSIGN_OR_RETURN(Image image, decode_upload_bytes(req.get_file_value(image_field).content, "image", limits));
  r.init_image = std::move(image);
  if (req.has_file("mask")) {
    ATELIER_ASSIGN_OR_RETURN(Image upload, decode_upload_bytes(req.get_file_value("mask").content, "mask", limits));
    ATELIER_ASSIGN_OR_RETURN(Image mask, edit_mask(upload));
    r.mask = std::move(mask);
  }
  r.gen.strength = f.has("strength") ? strength : r.mask ? kEditMaskStrength : r.gen.strength;
  return r;
}

std::string size_text(const JobImage& i) { return std::to_string(i.width) + "x" + std::to_string(i.height); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Where the client reached this server: scheme (a proxy's X-Forwarded-Proto, else http) and Host.
std::string base_url(const httplib::Request& req) {
  const std::string proto = req.get_header_value("X-Forwarded-Proto");
  return (proto == "https" ? "https" : "http") + std::string("://") + req.get_header_value("Host");
}

// `url_base`: non-empty for response_format "url" (each image kept in ctx.image_files and answered by its URL).
void respond(ServerContext& ctx, const Job& job, const std::string& url_base, httplib::Response& res) {
  if (job.state() != JobState::kDone) {
    const Status err = job.error();
    return send_error(res, job.state() == JobState::kCancelled ? 409 : failed_job_status(err), err.message());
  }
  nlohmann::json data = nlohmann::json::array();
  const auto images = job.images();
  for (const JobImage& i : images) {
    nlohmann::json item = {{"revised_prompt", job.request().gen.prompt}};
    if (url_base.empty()) {
      item["b64_json"] = i.data_b64;
    } else {
      auto bytes = base64_decode(i.data_b64, "image", i.data_b64.size());
      if (!bytes) return send_error(res, bytes.status());
      item["url"] = url_base + kImageFilesPath + ctx.image_files->put(std::move(*bytes), i.format);
    }
    data.push_back(std::move(item));
  }
  send_json(res, 200, {{"created", unix_now()}, {"data", data}, {"output_format", job.request().output_format},
                       {"size", images.empty() ? "" : size_text(images.front())}});
}

// SSE: partial images from the job's preview events, then one completed event per image (or an error).
// `slot`: the held-connection slot the stream keeps until it ends.
void stream(ServerContext& ctx, const JobPtr& job, std::shared_ptr<void> slot, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  auto cursor = std::make_shared<uint64_t>(0);
  auto partial = std::make_shared<int>(0);
  res.set_chunked_content_provider("text/event-stream", [&ctx, job, cursor, partial, slot](size_t, httplib::DataSink& sink) {
    bool terminal = false;
    const auto events = job->events_after(*cursor, kEventWait, &terminal);
    const std::string format = job->request().output_format;
    auto send = [&](const std::string& type, const nlohmann::json& data) {
      const std::string frame = sse_frame(0, type, data);
      return sink.write(frame.data(), frame.size());
    };
    for (const JobEvent& e : events) {
      *cursor = e.seq;
      if (e.type == "preview" && e.data.contains("image")) {
        if (!send("image_generation.partial_image",
                  {{"type", "image_generation.partial_image"}, {"b64_json", e.data["image"]}, {"created_at", unix_now()},
                   {"output_format", "jpeg"}, {"partial_image_index", (*partial)++}}))
          return false;
      } else if (e.type == "done") {
        for (const JobImage& i : job->images())
          if (!send("image_generation.completed", {{"type", "image_generation.completed"}, {"b64_json", i.data_b64},
                                                   {"created_at", unix_now()}, {"size", size_text(i)},
                                                   {"output_format", format}}))
            return false;
      } else if (e.type == "failed" || e.type == "cancelled") {
        if (!send("error", {{"type", "error"}, {"error", {{"message", job->error().message()}}}})) return false;
      }
    }
    if (terminal || ctx.stopping.load()) sink.done();
    return true;
  });
}

}  // namespace

void add_openai_routes(httplib::Server& http, ServerContext& ctx) {
  // Generations (a JSON body) and edits (a multipart form) answer alike.
  const auto run = [&ctx](Expected<ServeRequest> r, bool streaming, bool as_url, const httplib::Request& req,
                          httplib::Response& res) {
    if (!r) return send_error(res, r.status());
    std::shared_ptr<void> slot = ctx.hold_connection(res);  // held while the job runs
    if (!slot) return;
    auto job = ctx.submit(std::move(*r));
    if (!job) return send_error(res, job.status(), ctx.retry_after_s());
    if (streaming) return stream(ctx, *job, std::move(slot), res);
    if (!ctx.wait(*job)) return send_error(res, 503, "the server is shutting down");
    ctx.store.erase((*job)->id());  // answered: the result is not kept for polling
    respond(ctx, **job, as_url ? base_url(req) : std::string(), res);
  };
  http.Post("/v1/images/generations", [&ctx, run](const httplib::Request& req, httplib::Response& res) {
    auto body = json_body(req);
    if (!body) return send_error(res, body.status());
    bool streaming = false, as_url = false;
    auto r = parse_openai(*body, ctx.options.limits, &streaming, &as_url);
    run(std::move(r), streaming, as_url, req, res);
  });
  http.Post("/v1/images/edits", [&ctx, run](const httplib::Request& req, httplib::Response& res) {
    bool streaming = false, as_url = false;
    auto r = parse_openai_edit(req, ctx.options.limits, &streaming, &as_url);
    run(std::move(r), streaming, as_url, req, res);
  });
  // The images answered by URL: public (unguessable names), for kImageUrlLifetime.
  http.Get(R"(/v1/images/files/([0-9a-f]{32}\.(png|jpg|webp)))", [&ctx](const httplib::Request& req, httplib::Response& res) {
    const auto file = ctx.image_files->get(req.matches[1]);
    if (!file) return send_error(res, 404, "no such image (image URLs last an hour, and the oldest go first when many are kept)");
    res.set_header("Cache-Control", "private, max-age=3600");
    res.set_content(file->bytes, "image/" + file->format);
  });
}

}  // namespace atelier::serve
