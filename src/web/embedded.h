// The web UI's files (src/web/*.html, *.css, *.js), embedded in the binary at build time by
// src/web/embed.cmake, so that `atelier serve` serves its page with no file on disk and no network.
#pragma once
#include <cstddef>
#include <span>

namespace atelier::web {

struct EmbeddedFile {
  const char* name;          // file name under src/web, e.g. "app.js"
  const char* content_type;  // e.g. "text/javascript; charset=utf-8"
  const char* etag;          // quoted strong validator: a hash of the bytes
  const unsigned char* data;
  size_t size;               // bytes (data holds one more, a terminating 0)
};

// Every embedded file, sorted by name.
std::span<const EmbeddedFile> embedded_files();

}  // namespace atelier::web
