// The web UI: a page with a generation form, live progress, a gallery and a dashboard, written in plain
// HTML/CSS/JS (src/web/) and embedded in the binary at build time (src/web/embed.cmake), so it works offline.
//   GET /            -> index.html
//   GET /ui/<file>   -> app.css, *.js
// Both are public even with --api-key (the page holds no data; it asks the user for the key and sends it as
// a Bearer token on its API calls). Files carry an ETag: a browser revalidates and gets 304 when unchanged.
#include <httplib.h>

#include <string_view>

#include "serve/http_util.h"
#include "serve/server_context.h"
#include "web/embedded.h"

namespace atelier::serve {
namespace {

constexpr const char* kIndexFile = "index.html";
// Only this server's own files, inline data (previews, results) and its own API: no CDN, no third party.
constexpr const char* kContentSecurityPolicy =
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; connect-src 'self'; "
    "frame-ancestors 'none'";

const web::EmbeddedFile* find_file(std::string_view name) {
  for (const web::EmbeddedFile& f : web::embedded_files())
    if (name == f.name) return &f;
  return nullptr;
}

void send_file(const httplib::Request& req, httplib::Response& res, const web::EmbeddedFile& f) {
  res.set_header("ETag", f.etag);
  // no-cache = revalidate every time: a new binary's UI is picked up at once, an unchanged one costs a 304.
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Content-Security-Policy", kContentSecurityPolicy);
  if (req.get_header_value("If-None-Match") == f.etag) {
    res.status = 304;
    return;
  }
  res.set_content(reinterpret_cast<const char*>(f.data), f.size, f.content_type);
}

}  // namespace

bool is_web_ui_path(const std::string& path) { return path == "/" || path.rfind("/ui/", 0) == 0; }

void add_web_routes(httplib::Server& http, ServerContext&) {
  http.Get("/", [](const httplib::Request& req, httplib::Response& res) {
    const web::EmbeddedFile* f = find_file(kIndexFile);
    if (!f) return send_error(res, 500, "this build has no web UI (src/web/index.html was not embedded)");
    send_file(req, res, *f);
  });
  http.Get(R"(/ui/([A-Za-z0-9_.-]+))", [](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    const web::EmbeddedFile* f = find_file(name);
    if (!f) return send_error(res, 404, "no web UI file '" + name.substr(0, 64) + "'");
    send_file(req, res, *f);
  });
}

}  // namespace atelier::serve
