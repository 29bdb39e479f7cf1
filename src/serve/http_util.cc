#include "serve/http_util.h"

namespace atelier::serve {

int http_status(const Status& st) {
  switch (st.code()) {
    case ErrorCode::kOk: return 200;
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kUnsupported:
    case ErrorCode::kCorrupt: return 400;
    case ErrorCode::kResourceExhausted: return 429;
    case ErrorCode::kCancelled: return 409;
    default: return 500;
  }
}

int failed_job_status(const Status& err) {
  if (err.code() == ErrorCode::kCancelled) return 504;
  return http_status(err) == 500 ? 500 : 400;
}

std::string json_text(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message, int retry_after_s) {
  const char* type = status == 401 ? "authentication_error"
                     : status == 429 ? "rate_limit_error"
                     : status < 500 ? "invalid_request_error"
                                    : "server_error";
  if (status == 429 || status == 503) res.set_header("Retry-After", std::to_string(retry_after_s));
  send_json(res, status, {{"error", {{"message", message}, {"type", type}, {"code", status}}}, {"detail", message}});
}

void send_error(httplib::Response& res, const Status& st, int retry_after_s) {
  send_error(res, http_status(st), st.message(), retry_after_s);
}

Expected<nlohmann::json> json_body(const httplib::Request& req) { return parse_body(req.body); }

std::string sse_frame(uint64_t id, const std::string& event, const nlohmann::json& data) {
  std::string out;
  if (id) out += "id: " + std::to_string(id) + "\n";
  out += "event: " + event + "\ndata: " + json_text(data) + "\n\n";
  return out;
}

std::string endpoint_label(const std::string& method, const std::string& path) {
  static const char* kFixed[] = {"/v1/jobs", "/v1/models", "/v1/stats", "/v1/images/generations", "/healthz", "/readyz",
                                 "/metrics", "/v1/admin/fail-device", "/sdapi/v1/txt2img", "/sdapi/v1/img2img",
                                 "/sdapi/v1/progress", "/sdapi/v1/interrupt", "/sdapi/v1/sd-models",
                                 "/sdapi/v1/samplers", "/sdapi/v1/schedulers", "/sdapi/v1/options", "/sdapi/v1/memory"};
  std::string label = "other";
  for (const char* f : kFixed)
    if (path == f) label = f;
  const std::string jobs = "/v1/jobs/";
  if (path.rfind(jobs, 0) == 0 && path.size() > jobs.size()) {
    const bool events = path.size() > 7 && path.compare(path.size() - 7, 7, "/events") == 0;
    label = events ? "/v1/jobs/{id}/events" : "/v1/jobs/{id}";
  }
  return method + " " + label;
}

}  // namespace atelier::serve
