// The AUTOMATIC1111 API's global options (GET/POST /sdapi/v1/options): what A1111 clients set once and expect every
// later txt2img/img2img to use: the checkpoint (`sd_model_checkpoint`: how clients switch models), the clip skip,
// the noise source and the image format. Held per server process in memory (A1111 writes them to its config.json;
// here a restart starts from the defaults). A request's override_settings still win for that request.
#pragma once
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "serve/model_registry.h"

namespace atelier::serve {

struct A1111Defaults {
  std::string model;            // registry name; empty = the server's default model
  int clip_skip = 1;            // CLIP_stop_at_last_layers
  std::string rng = "cuda";     // randn_source GPU (A1111's default) | CPU
  std::string output_format = "png";  // samples_format: the API's images are encoded in it, as A1111's are
};

class FieldReader;
// Reads the options that POST /sdapi/v1/options and a request's override_settings both take into `d`
// (sd_model_checkpoint as given: a name or an A1111 title; the caller resolves it).
Status read_a1111_options(FieldReader& f, A1111Defaults& d);

class A1111Settings {
 public:
  A1111Defaults get() const;
  // POST /sdapi/v1/options: every known key is checked before any is applied (a bad value is a 400 naming it and
  // changes nothing); keys this server has no use for are accepted and listed as ignored, as A1111 accepts its
  // whole options dictionary back. Returns {"applied": [...], "ignored": [...]}.
  Expected<nlohmann::json> apply(const nlohmann::json& body, const ModelRegistry& registry);
  // GET /sdapi/v1/options: the settings in A1111's names (the checkpoint as its title "name [hash]").
  nlohmann::json to_json(const ModelRegistry& registry, const std::string& output_dir) const;

 private:
  mutable std::mutex mu_;
  A1111Defaults d_;
};

}  // namespace atelier::serve
