// The native jobs API: asynchronous jobs with polling, server-sent events and cancellation.
//   POST   /v1/jobs               -> 202 {"id", "state", "queue_position", "links"}
//   GET    /v1/jobs/{id}          -> state, queue position, progress, result images (base64) + infotext
//   GET    /v1/jobs/{id}/events   -> text/event-stream: queued, started, step, preview, requeued, done|failed|cancelled
//   DELETE /v1/jobs/{id}          -> cancels a queued or running job
//   GET    /v1/models             -> the models this server can run
#include <httplib.h>

#include "serve/http_util.h"
#include "serve/server_context.h"

namespace atelier::serve {
namespace {

constexpr auto kEventWait = std::chrono::milliseconds(1000);
constexpr int kKeepAliveEvery = 10;  // event waits between SSE keep-alive comments

const std::set<std::string> kNativeFields = {
    "prompt", "negative_prompt", "model", "width", "height", "steps", "cfg_scale", "sampler", "schedule", "seed", "rng",
    "clip_skip", "batch_size", "batch_count", "emphasis", "init_image", "strength", "preview", "timeout_s",
    "output_format", "guidance", "max_sequence_length", "resize_mode", "mask", "mask_blur", "inpaint_fill",
    "inpaint_only_masked", "inpaint_padding", "mask_invert"};

Expected<ServeRequest> parse_native(const nlohmann::json& body, const ServeLimits& limits) {
  ServeRequest r;
  r.api = ApiFamily::kNative;
  GenerateRequest& g = r.gen;
  FieldReader f(body);
  ATELIER_RETURN_IF_ERROR(f.only(kNativeFields));
  ATELIER_RETURN_IF_ERROR(f.string("prompt", g.prompt, limits.max_prompt_bytes));
  ATELIER_RETURN_IF_ERROR(f.string("negative_prompt", g.negative_prompt, limits.max_prompt_bytes));
  ATELIER_RETURN_IF_ERROR(f.string("model", r.model, 256));
  ATELIER_RETURN_IF_ERROR(f.integer("width", kLatentFactor, limits.max_side, g.width));
  ATELIER_RETURN_IF_ERROR(f.integer("height", kLatentFactor, limits.max_side, g.height));
  ATELIER_RETURN_IF_ERROR(f.integer("steps", 1, limits.max_steps, g.steps));
  ATELIER_RETURN_IF_ERROR(f.number("cfg_scale", 0.0, kMaxGuidance, g.cfg_scale));
  r.cfg_given = f.has("cfg_scale");
  ATELIER_RETURN_IF_ERROR(f.number("guidance", 0.0, kMaxGuidance, r.guidance));
  ATELIER_RETURN_IF_ERROR(f.integer("max_sequence_length", 1, kFluxDefaultMaxSequenceLength, r.max_sequence_length));
  ATELIER_RETURN_IF_ERROR(f.string("sampler", g.sampler, 64));
  ATELIER_RETURN_IF_ERROR(f.string("schedule", g.schedule, 64));
  ATELIER_RETURN_IF_ERROR(f.integer("seed", int64_t(-1), int64_t(0xffffffffffffLL), g.seed));
  ATELIER_RETURN_IF_ERROR(f.choice("rng", {"cpu", "cuda"}, g.rng));
  ATELIER_RETURN_IF_ERROR(f.integer("clip_skip", 1, 12, g.clip_skip));
  ATELIER_RETURN_IF_ERROR(f.integer("batch_size", 1, limits.max_images, g.batch_size));
  ATELIER_RETURN_IF_ERROR(f.integer("batch_count", 1, limits.max_images, g.batch_count));
  ATELIER_RETURN_IF_ERROR(f.boolean("emphasis", g.emphasis));
  ATELIER_RETURN_IF_ERROR(f.number("strength", 0.0, 1.0, g.strength));
  ATELIER_RETURN_IF_ERROR(f.boolean("preview", r.preview));
  ATELIER_RETURN_IF_ERROR(f.number("timeout_s", 0.0, limits.max_timeout_s, r.timeout_s));
  ATELIER_RETURN_IF_ERROR(f.choice("output_format", {"png", "jpeg", "webp"}, r.output_format));
  ATELIER_RETURN_IF_ERROR(read_image_field(f, "init_image", limits, r.init_image));
  ATELIER_RETURN_IF_ERROR(f.choice("resize_mode", {"resize", "crop", "fill"}, g.resize_mode));
  ATELIER_RETURN_IF_ERROR(f.integer("mask_blur", 0, kMaxMaskBlur, g.mask_blur_x));
  g.mask_blur_y = g.mask_blur_x;
  ATELIER_RETURN_IF_ERROR(f.choice("inpaint_fill", {"fill", "original", "latent_noise", "latent_nothing"}, g.inpaint_fill));
  ATELIER_RETURN_IF_ERROR(f.boolean("inpaint_only_masked", g.inpaint_only_masked));
  ATELIER_RETURN_IF_ERROR(f.integer("inpaint_padding", 0, kMaxInpaintPadding, g.inpaint_padding));
  ATELIER_RETURN_IF_ERROR(f.boolean("mask_invert", g.mask_invert));
  ATELIER_RETURN_IF_ERROR(read_image_field(f, "mask", limits, r.mask));
  return r;
}

nlohmann::json job_links(const std::string& id) {
  return {{"self", "/v1/jobs/" + id}, {"events", "/v1/jobs/" + id + "/events"}};
}

JobPtr find_job(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  JobPtr job = ctx.store.get(id);
  if (!job) send_error(res, 404, "no job with id '" + id.substr(0, 64) + "' (finished jobs are kept for a while, then forgotten)");
  return job;
}

uint64_t last_event_id(const httplib::Request& req) {
  const std::string v = req.get_header_value("Last-Event-ID");
  if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stoull(v);
}

// `slot`: the held-connection slot the stream keeps until it ends.
void stream_events(ServerContext& ctx, const JobPtr& job, uint64_t after, std::shared_ptr<void> slot, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto cursor = std::make_shared<uint64_t>(after);
  auto idle = std::make_shared<int>(0);
  res.set_chunked_content_provider("text/event-stream", [&ctx, job, cursor, idle, slot](size_t, httplib::DataSink& sink) {
    bool terminal = false;
    const auto events = job->events_after(*cursor, kEventWait, &terminal);
    for (const JobEvent& e : events) {
      const std::string frame = sse_frame(e.seq, e.type, e.data);
      if (!sink.write(frame.data(), frame.size())) return false;  // the client went away
      *cursor = e.seq;
    }
    if (terminal || ctx.stopping.load()) {
      sink.done();
      return true;
    }
    if (events.empty() && ++*idle % kKeepAliveEvery == 0) {
      static const std::string kPing = ": keep-alive\n\n";
      if (!sink.write(kPing.data(), kPing.size())) return false;
    }
    return true;
  });
}

}  // namespace

void add_native_routes(httplib::Server& http, ServerContext& ctx) {
  http.Post("/v1/jobs", [&ctx](const httplib::Request& req, httplib::Response& res) {
    auto body = json_body(req);
    if (!body) return send_error(res, body.status());
    auto r = parse_native(*body, ctx.options.limits);
    if (!r) return send_error(res, r.status());
    auto job = ctx.submit(std::move(*r));
    if (!job) return send_error(res, job.status(), ctx.retry_after_s());
    res.set_header("Location", "/v1/jobs/" + (*job)->id());
    send_json(res, 202, {{"id", (*job)->id()}, {"state", job_state_name((*job)->state())},
                         {"queue_position", ctx.scheduler.queue_position((*job)->id())}, {"links", job_links((*job)->id())}});
  });

  http.Get(R"(/v1/jobs/([^/]+))", [&ctx](const httplib::Request& req, httplib::Response& res) {
    const JobPtr job = find_job(ctx, req, res);
    if (!job) return;
    const bool with_images = req.get_param_value("images") != "0";
    send_json(res, 200, job->to_json(with_images, ctx.scheduler.queue_position(job->id())));
  });

  http.Get(R"(/v1/jobs/([^/]+)/events)", [&ctx](const httplib::Request& req, httplib::Response& res) {
    const JobPtr job = find_job(ctx, req, res);
    if (!job) return;
    std::shared_ptr<void> slot = ctx.hold_connection(res);
    if (!slot) return;
    stream_events(ctx, job, last_event_id(req), std::move(slot), res);
  });

  http.Delete(R"(/v1/jobs/([^/]+))", [&ctx](const httplib::Request& req, httplib::Response& res) {
    const JobPtr job = find_job(ctx, req, res);
    if (!job) return;
    if (!ctx.scheduler.cancel(job, "cancelled by the client"))
      return send_error(res, 409, std::string("job already ") + job_state_name(job->state()));
    send_json(res, 202, {{"id", job->id()}, {"state", job_state_name(job->state())}, {"cancel_requested", true}});
  });

  http.Get("/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
    nlohmann::json data = nlohmann::json::array();
    for (const ModelEntry& e : ctx.registry.entries())
      data.push_back({{"id", e.name}, {"object", "model"}, {"path", e.path}, {"family", model_family_name(e.family)},
                      {"default", &e == ctx.registry.default_model()}});
    send_json(res, 200, {{"object", "list"}, {"data", data}});
  });
}

}  // namespace atelier::serve
