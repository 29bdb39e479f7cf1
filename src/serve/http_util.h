// Small HTTP helpers shared by the route files: JSON responses, errors with the right status code, request
// bodies, server-sent-event frames, and the endpoint label used by the request metrics.
#pragma once
#include <httplib.h>

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/json_fields.h"

namespace atelier::serve {

// 400 for bad input (invalid argument, not found, unsupported, corrupt), 429 for a full queue, 409 for a
// cancelled job, 500 otherwise.
int http_status(const Status& st);
// The status a synchronous call answers for its failed job's error: 504 for a timeout (kCancelled on a failed job),
// 500 for an internal error, 400 for the rest (bad input found only when the job ran).
int failed_job_status(const Status& err);

// JSON text that never throws: invalid UTF-8 (e.g. from a truncated message) is replaced.
std::string json_text(const nlohmann::json& j);
void send_json(httplib::Response& res, int status, const nlohmann::json& body);
// {"error": {"message", "type", "code"}, "detail": message}: OpenAI's shape, plus FastAPI's "detail" that
// A1111 clients read. Adds Retry-After (seconds) for 429.
void send_error(httplib::Response& res, int status, const std::string& message, int retry_after_s = 1);
void send_error(httplib::Response& res, const Status& st, int retry_after_s = 1);

// The request's JSON object body (Content-Type is not required: many clients omit it).
Expected<nlohmann::json> json_body(const httplib::Request& req);

// One server-sent event: "id: N\nevent: TYPE\ndata: JSON\n\n" (id left out when 0).
std::string sse_frame(uint64_t id, const std::string& event, const nlohmann::json& data);

// Route label for metrics: the path with ids replaced ("/v1/jobs/{id}"), "other" for unknown paths so that
// scanners cannot create unbounded label sets.
std::string endpoint_label(const std::string& method, const std::string& path);

}  // namespace atelier::serve
