// The AUTOMATIC1111 web UI API (/sdapi/v1/*), the de-facto standard of image-generation clients.
// txt2img and img2img are synchronous (the HTTP thread waits while the job runs in the shared batches);
// progress reports the oldest running A1111 job; interrupt cancels the running A1111 jobs (A1111 interrupts
// "the current job"; here several run at once). Unknown request fields are ignored, as A1111 does. POST options sets
// the defaults of later A1111 requests (a1111_settings.h).
#include <httplib.h>

#include <algorithm>
#include <cctype>

#include "pipeline/sd_pipeline.h"
#include "sampling/sampler_names.h"
#include "serve/http_util.h"
#include "serve/server_context.h"

namespace atelier::serve {
namespace {

constexpr int kA1111DefaultSteps = 50;
constexpr int kA1111LatentUpscaleMode = 3;  // resize_mode 3: "Just resize (latent upscale)"

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A1111 scheduler labels -> ours ("Automatic" = the model's default).
Status read_scheduler(FieldReader& f, std::string& schedule) {
  std::string s;
  ATELIER_RETURN_IF_ERROR(f.string("scheduler", s, 64));
  if (s.empty()) return Status::ok();
  const std::string l = lower(s);
  if (l == "automatic" || l == "default") schedule = "default";
  else if (l == "karras" || l == "exponential") schedule = l;
  else return invalid_argument("scheduler: '" + s + "' is not supported; supported: Automatic, Karras, Exponential");
  return Status::ok();
}

// A flag A1111 declares as a bool or an int 0/1 (inpaint_full_res, inpainting_mask_invert): either is accepted.
Status read_flag(FieldReader& f, const char* key, bool& out) {
  const nlohmann::json* v = f.get(key);
  if (!v) return Status::ok();
  if (v->is_number_integer() && (*v == 0 || *v == 1)) {
    out = *v == 1;
    return Status::ok();
  }
  return f.boolean(key, out);
}

// img2img's resize_mode and inpainting fields (A1111's StableDiffusionProcessingImg2Img; its API's defaults: the
// masked area "fill"ed, only the masked area generated, no padding) and the mask upload.
Status read_a1111_img2img(FieldReader& f, ServeRequest& r, const ServeLimits& limits) {
  GenerateRequest& g = r.gen;
  static const char* const kResizeModes[] = {"resize", "crop", "fill"};
  int resize_mode = 0;
  if (const nlohmann::json* v = f.get("resize_mode"); v && *v == kA1111LatentUpscaleMode)
    return unsupported("resize_mode: 3 (just resize, latent upscale) is not supported; use 0, 1 or 2");
  ATELIER_RETURN_IF_ERROR(f.integer("resize_mode", 0, 2, resize_mode));
  g.resize_mode = kResizeModes[resize_mode];
  static const char* const kFills[] = {"fill", "original", "latent_noise", "latent_nothing"};
  int fill = 0;
  ATELIER_RETURN_IF_ERROR(f.integer("inpainting_fill", 0, 3, fill));
  g.inpaint_fill = kFills[fill];
  g.inpaint_only_masked = true;
  g.inpaint_padding = 0;
  ATELIER_RETURN_IF_ERROR(read_flag(f, "inpaint_full_res", g.inpaint_only_masked));
  ATELIER_RETURN_IF_ERROR(f.integer("inpaint_full_res_padding", 0, kMaxInpaintPadding, g.inpaint_padding));
  ATELIER_RETURN_IF_ERROR(read_flag(f, "inpainting_mask_invert", g.mask_invert));
  ATELIER_RETURN_IF_ERROR(f.boolean("mask_round", g.mask_round));
  int blur = g.mask_blur_x;
  ATELIER_RETURN_IF_ERROR(f.integer("mask_blur", 0, kMaxMaskBlur, blur));  // both axes, unless given apart
  g.mask_blur_x = g.mask_blur_y = blur;
  ATELIER_RETURN_IF_ERROR(f.integer("mask_blur_x", 0, kMaxMaskBlur, g.mask_blur_x));
  ATELIER_RETURN_IF_ERROR(f.integer("mask_blur_y", 0, kMaxMaskBlur, g.mask_blur_y));
  return read_image_field(f, "mask", limits, r.mask);
}

// `d`: the options set through POST /sdapi/v1/options (model, clip skip, noise source, image format).
Expected<ServeRequest> parse_a1111(const nlohmann::json& body, const ServeLimits& limits, bool img2img, const A1111Defaults& d) {
  ServeRequest r;
  r.api = ApiFamily::kA1111;
  r.model = d.model;
  r.output_format = d.output_format;
  GenerateRequest& g = r.gen;
  g.clip_skip = d.clip_skip;
  g.rng = d.rng;
  g.steps = kA1111DefaultSteps;
  g.width = g.height = kApiDefaultSide;
  g.sampler = "Euler a";
  g.emphasis = true;  // A1111 reads (word:1.2) / [word] by default (its "emphasis" option, "Original")
  FieldReader f(body);
  ATELIER_RETURN_IF_ERROR(f.string("prompt", g.prompt, limits.max_prompt_bytes));
  ATELIER_RETURN_IF_ERROR(f.string("negative_prompt", g.negative_prompt, limits.max_prompt_bytes));
  ATELIER_RETURN_IF_ERROR(f.integer("width", kLatentFactor, limits.max_side, g.width));
  ATELIER_RETURN_IF_ERROR(f.integer("height", kLatentFactor, limits.max_side, g.height));
  ATELIER_RETURN_IF_ERROR(f.integer("steps", 1, limits.max_steps, g.steps));
  ATELIER_RETURN_IF_ERROR(f.number("cfg_scale", 0.0, kMaxGuidance, g.cfg_scale));
  r.cfg_given = f.has("cfg_scale");
  ATELIER_RETURN_IF_ERROR(f.number("distilled_cfg_scale", 0.0, kMaxGuidance, r.guidance));  // FLUX (Forge's name)
  ATELIER_RETURN_IF_ERROR(f.string("sampler_index", g.sampler, 64));  // the old name of sampler_name
  ATELIER_RETURN_IF_ERROR(f.string("sampler_name", g.sampler, 64));
  for (const char* field : {"sampler_name", "sampler_index"})  // the error names the field the client sent
    if (f.has(field))
      if (auto spec = sampling::parse_sampler(g.sampler); !spec) return invalid_argument(std::string(field) + ": " + spec.status().message());
  ATELIER_RETURN_IF_ERROR(read_scheduler(f, g.schedule));
  ATELIER_RETURN_IF_ERROR(f.integer("seed", int64_t(-1), int64_t(0xffffffffffffLL), g.seed));
  ATELIER_RETURN_IF_ERROR(f.integer("batch_size", 1, limits.max_images, g.batch_size));
  ATELIER_RETURN_IF_ERROR(f.integer("n_iter", 1, limits.max_images, g.batch_count));
  ATELIER_RETURN_IF_ERROR(f.number("denoising_strength", 0.0, 1.0, g.strength));
  if (const nlohmann::json* o = f.get("override_settings")) {
    if (!o->is_object()) return invalid_argument("override_settings: expected an object, got " + describe_json_value(*o));
    FieldReader os(*o, "override_settings.");
    A1111Defaults these{r.model, g.clip_skip, g.rng, r.output_format};  // this request's, over the options
    ATELIER_RETURN_IF_ERROR(read_a1111_options(os, these));
    r.model = these.model;
    g.clip_skip = these.clip_skip;
    g.rng = these.rng;
    r.output_format = these.output_format;
    std::string emphasis;  // "No norm" (weights without the mean restored) is A1111's third mode, not implemented
    ATELIER_RETURN_IF_ERROR(os.choice("emphasis", {"Original", "None"}, emphasis));
    if (!emphasis.empty()) g.emphasis = emphasis == "Original";
  }
  if (!img2img) return r;
  ATELIER_RETURN_IF_ERROR(read_a1111_img2img(f, r, limits));
  const nlohmann::json* init = f.get("init_images");
  if (!init) return invalid_argument("init_images: img2img needs one base64 image");
  if (!init->is_array() || init->empty() || !(*init)[0].is_string())
    return invalid_argument("init_images: expected a list of base64 strings, got " + describe_json_value(*init));
  ATELIER_ASSIGN_OR_RETURN(Image img, decode_upload((*init)[0].get_ref<const std::string&>(), "init_images[0]", limits));
  r.init_image = std::move(img);
  return r;
}

// The "info" string of a txt2img/img2img response (A1111's Processed.js()).
nlohmann::json a1111_info(const ServerContext& ctx, const Job& job) {
  const GenerateRequest& g = job.request().gen;
  const auto images = job.images();
  nlohmann::json seeds = nlohmann::json::array(), infotexts = nlohmann::json::array(), prompts = nlohmann::json::array(),
                 negatives = nlohmann::json::array();
  for (const JobImage& i : images) {
    seeds.push_back(i.seed);
    infotexts.push_back(i.infotext);
    prompts.push_back(g.prompt);
    negatives.push_back(g.negative_prompt);
  }
  const ModelEntry* entry = ctx.registry.find(job.request().model);
  return {{"prompt", g.prompt}, {"all_prompts", prompts}, {"negative_prompt", g.negative_prompt},
          {"all_negative_prompts", negatives}, {"seed", images.empty() ? g.seed : images.front().seed},
          {"all_seeds", seeds}, {"subseed", -1}, {"all_subseeds", seeds}, {"subseed_strength", 0},
          {"width", images.empty() ? g.width : images.front().width},
          {"height", images.empty() ? g.height : images.front().height}, {"sampler_name", g.sampler},
          {"cfg_scale", g.cfg_scale}, {"steps", g.steps}, {"batch_size", g.batch_size}, {"restore_faces", false},
          {"sd_model_name", job.request().model}, {"sd_model_hash", entry ? ctx.registry.hash(*entry) : ""},
          {"denoising_strength", job.request().init_image ? g.strength : 0.0f}, {"clip_skip", g.clip_skip},
          {"infotexts", infotexts}, {"styles", nlohmann::json::array()},
          {"job_timestamp", std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                               job.created_wall().time_since_epoch()).count())},
          {"version", std::string("atelier ") + ATELIER_VERSION}};
}

void generate(ServerContext& ctx, const httplib::Request& req, httplib::Response& res, bool img2img) {
  auto body = json_body(req);
  if (!body) return send_error(res, body.status());
  auto r = parse_a1111(*body, ctx.options.limits, img2img, ctx.a1111.get());
  if (!r) return send_error(res, r.status());
  bool send_images = true;
  FieldReader f(*body);
  if (Status st = f.boolean("send_images", send_images); !st.is_ok()) return send_error(res, st);
  const std::shared_ptr<void> slot = ctx.hold_connection(res);  // held while the job runs
  if (!slot) return;
  auto job = ctx.submit(std::move(*r));
  if (!job) return send_error(res, job.status(), ctx.retry_after_s());
  if (!ctx.wait(*job)) return send_error(res, 503, "the server is shutting down");
  ctx.store.erase((*job)->id());  // answered: nobody polls a synchronous job, so its result is not kept
  const Job& j = **job;
  nlohmann::json params = *body;
  for (const char* upload : {"init_images", "mask"})  // not echoed back: they can be large
    if (params.contains(upload)) params[upload] = nullptr;
  const Status err = j.error();
  if (j.state() == JobState::kFailed)
    return send_error(res, failed_job_status(err), err.message());
  nlohmann::json images = nlohmann::json::array();
  if (j.state() == JobState::kDone && send_images)
    for (const JobImage& i : j.images()) images.push_back(i.data_b64);
  nlohmann::json info = a1111_info(ctx, j);
  if (j.state() == JobState::kCancelled) info["interrupted"] = true;  // A1111 answers an interrupted job with 200
  send_json(res, 200, {{"images", images}, {"parameters", params}, {"info", json_text(info)}});
}

JobPtr current_a1111_job(ServerContext& ctx, int* job_count) {
  JobPtr current;
  int count = 0;
  for (const JobPtr& j : ctx.store.unfinished()) {
    if (j->request().api != ApiFamily::kA1111) continue;
    ++count;
    if (!current && j->state() == JobState::kRunning) current = j;
  }
  *job_count = count;
  return current;
}

void progress(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  int job_count = 0;
  const JobPtr j = current_a1111_job(ctx, &job_count);
  nlohmann::json state = {{"skipped", false}, {"interrupted", false}, {"stopping_generation", false},
                          {"job", ""}, {"job_count", job_count}, {"job_timestamp", "0"}, {"job_no", 0},
                          {"sampling_step", 0}, {"sampling_steps", 0}};
  double p = 0, eta = 0;
  nlohmann::json current_image = nullptr;
  if (j) {
    p = j->progress();
    const double elapsed = j->age_s();
    eta = p > 0 ? elapsed / p - elapsed : 0;
    state["job"] = j->id();
    state["interrupted"] = j->cancel_requested();
    state["sampling_step"] = j->step();
    state["sampling_steps"] = j->total_steps();
    state["job_timestamp"] = std::to_string(
        std::chrono::duration_cast<std::chrono::seconds>(j->created_wall().time_since_epoch()).count());
    const std::string preview = j->preview_b64();
    if (!preview.empty() && req.get_param_value("skip_current_image") != "true") current_image = preview;
  }
  send_json(res, 200, {{"progress", p}, {"eta_relative", eta}, {"state", state}, {"current_image", current_image},
                       {"textinfo", j ? nlohmann::json("running") : nlohmann::json(nullptr)}});
}

nlohmann::json samplers_list() {
  nlohmann::json out = nlohmann::json::array();
  for (sampling::SamplerKind k : sampling::kAllSamplers) {
    const std::string ours(sampling::sampler_name(k));
    out.push_back({{"name", a1111_sampler_name(ours)}, {"aliases", {ours}}, {"options", nlohmann::json::object()}});
  }
  return out;
}

nlohmann::json schedulers_list() {
  return nlohmann::json::array({{{"name", "automatic"}, {"label", "Automatic"}, {"aliases", nlohmann::json::array()}},
                                {{"name", "karras"}, {"label", "Karras"}, {"aliases", nlohmann::json::array()}},
                                {{"name", "exponential"}, {"label", "Exponential"}, {"aliases", nlohmann::json::array()}}});
}

}  // namespace

void add_a1111_routes(httplib::Server& http, ServerContext& ctx) {
  http.Post("/sdapi/v1/txt2img", [&ctx](const httplib::Request& req, httplib::Response& res) { generate(ctx, req, res, false); });
  http.Post("/sdapi/v1/img2img", [&ctx](const httplib::Request& req, httplib::Response& res) { generate(ctx, req, res, true); });
  http.Get("/sdapi/v1/progress", [&ctx](const httplib::Request& req, httplib::Response& res) { progress(ctx, req, res); });

  http.Post("/sdapi/v1/interrupt", [&ctx](const httplib::Request&, httplib::Response& res) {
    int n = 0;
    for (const JobPtr& j : ctx.store.unfinished())
      if (j->request().api == ApiFamily::kA1111 && j->state() == JobState::kRunning)
        n += ctx.scheduler.cancel(j, "interrupted");
    send_json(res, 200, {{"interrupted", n}});
  });

  http.Get("/sdapi/v1/sd-models", [&ctx](const httplib::Request&, httplib::Response& res) {
    nlohmann::json out = nlohmann::json::array();
    for (const ModelEntry& e : ctx.registry.entries()) {
      const std::string hash = ctx.registry.hash(e);
      out.push_back({{"title", hash.empty() ? e.name : e.name + " [" + hash + "]"}, {"model_name", e.name},
                     {"hash", hash.empty() ? nlohmann::json(nullptr) : nlohmann::json(hash)}, {"sha256", nullptr},
                     {"filename", e.path}, {"config", nullptr}});
    }
    send_json(res, 200, out);
  });

  http.Get("/sdapi/v1/samplers", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, samplers_list()); });
  http.Get("/sdapi/v1/schedulers", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, schedulers_list()); });

  http.Get("/sdapi/v1/options", [&ctx](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, ctx.a1111.to_json(ctx.registry, ctx.options.output_dir));
  });
  http.Post("/sdapi/v1/options", [&ctx](const httplib::Request& req, httplib::Response& res) {
    auto body = json_body(req);
    if (!body) return send_error(res, body.status());
    auto applied = ctx.a1111.apply(*body, ctx.registry);
    if (!applied) return send_error(res, applied.status());
    send_json(res, 200, *applied);
  });

  http.Get("/sdapi/v1/memory", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"ram", {{"used", resident_bytes()}}}, {"cuda", {{"system", nlohmann::json::object()}}}});
  });
}

}  // namespace atelier::serve
