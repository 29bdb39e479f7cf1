// Operations endpoints: liveness, readiness, Prometheus metrics, live figures as JSON, and (only with
// --test-hooks) the device-failure switch the fault-tolerance tests use.
//   GET  /healthz               -> 200 {"status": "ok"} while the process serves HTTP
//   GET  /readyz                -> 200 when at least one device worker is healthy, else 503
//   GET  /metrics               -> Prometheus text format (prefix atelier_)
//   GET  /v1/stats              -> {"metrics": {...}, "workers": [...], "queue": {...}, ...}: the same registry
//   POST /v1/admin/fail-device  -> {"worker": N, "failing_probes": K}: worker N's next model call fails
#include <httplib.h>

#include "serve/http_util.h"
#include "serve/server_context.h"

namespace atelier::serve {

void add_ops_routes(httplib::Server& http, ServerContext& ctx) {
  http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });

  http.Get("/readyz", [&ctx](const httplib::Request&, httplib::Response& res) {
    const int healthy = ctx.cluster_workers ? ctx.cluster_workers() : ctx.pool.healthy_count();
    const bool ready = healthy > 0 && !ctx.stopping.load();
    send_json(res, ready ? 200 : 503, {{"ready", ready}, {"healthy_workers", healthy}, {"workers", ctx.pool.size()}});
  });

  http.Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(ctx.metrics.prometheus_text(), "text/plain; version=0.0.4; charset=utf-8");
  });

  http.Get("/v1/stats", [&ctx](const httplib::Request&, httplib::Response& res) {
    nlohmann::json workers = nlohmann::json::array();
    for (const auto& w : ctx.pool.workers()) workers.push_back(w->status());
    nlohmann::json models = nlohmann::json::array();
    for (const ModelEntry& e : ctx.registry.entries()) models.push_back(e.name);
    const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx.started).count();
    send_json(res, 200, {{"metrics", ctx.metrics.to_json()},
                         {"workers", workers},
                         {"queue", {{"depth", ctx.scheduler.queue_depth()}, {"capacity", ctx.scheduler.queue_capacity()}}},
                         {"jobs_stored", ctx.store.size()},
                         {"held_connections", {{"open", ctx.held.held()}, {"capacity", ctx.held.capacity()}}},
                         {"models", models},
                         {"uptime_s", uptime},
                         {"clock_s", steady_seconds()},  // the time base of each worker's "timeline"
                         {"version", ATELIER_VERSION}});
  });

  if (!ctx.options.test_hooks) return;
  http.Post("/v1/admin/fail-device", [&ctx](const httplib::Request& req, httplib::Response& res) {
    auto body = json_body(req);
    if (!body) return send_error(res, body.status());
    FieldReader f(*body);
    int worker = 0, probes = 0;
    std::string at = "call";  // where the failure surfaces: the next model call, or the next decode of finished jobs
    if (Status st = f.integer("worker", 0, int(ctx.pool.size()) - 1, worker); !st.is_ok()) return send_error(res, st);
    if (Status st = f.integer("failing_probes", 0, 1000, probes); !st.is_ok()) return send_error(res, st);
    if (Status st = f.choice("at", {"call", "decode"}, at); !st.is_ok()) return send_error(res, st);
    if (Status st = f.only({"worker", "failing_probes", "at"}); !st.is_ok()) return send_error(res, st);
    ctx.pool.at(worker)->inject_failure(probes, at == "decode");
    send_json(res, 200, {{"worker", worker}, {"failing_probes", probes}, {"at", at}, {"armed", true}});
  });
}

}  // namespace atelier::serve
