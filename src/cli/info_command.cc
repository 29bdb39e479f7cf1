// `atelier info MODEL`: the detected family, layout, configuration and parameter counts.
#include <cstdio>

#include "cli/commands.h"
#include "pipeline/dit_info.h"
#include "pipeline/model_family.h"
#include "pipeline/sd_model.h"

namespace atelier::cli {
namespace {

double millions(int64_t n) { return double(n) / 1e6; }

// FLUX and Z-Image: described from their files (describe_dit_model), a line per component.
int run_dit_info(const InfoOptions& o, ModelFamily family) {
  auto d = describe_dit_model(o.model, family);
  if (!d) {
    std::fprintf(stderr, "error: %s\n", d.status().message().c_str());
    return 1;
  }
  if (o.json) {
    std::printf("%s\n", d->dump(2).c_str());
    return 0;
  }
  std::printf("model       %s\n", (*d)["path"].get<std::string>().c_str());
  std::printf("family      %s (%s)\n", (*d)["family"].get<std::string>().c_str(), (*d)["variant"].get<std::string>().c_str());
  std::printf("layout      %s\n", (*d)["layout"].get<std::string>().c_str());
  std::printf("hash        %s\n", (*d)["hash"].get<std::string>().c_str());
  for (const auto& [name, c] : (*d)["components"].items()) {
    const std::string cls = c["class"].is_string() ? c["class"].get<std::string>() : "?";
    if (c.contains("parameters"))
      std::printf("%-15s %s, %.2f M parameters\n", name.c_str(), cls.c_str(), millions(c["parameters"]));
    else
      std::printf("%-15s %s\n", name.c_str(), cls.c_str());
  }
  if (d->contains("note")) std::printf("note        %s\n", (*d)["note"].get<std::string>().c_str());
  std::printf("total       %.2f M parameters\n", millions((*d)["parameters_total"]));
  return 0;
}

}  // namespace

void add_info_command(CLI::App& app, InfoOptions& o) {
  CLI::App* c = app.add_subcommand("info", "Describe a model (SD 1.x/2.x, FLUX.1, Z-Image): family, layout, configuration, parameter counts");
  c->add_option("model", o.model, "Diffusers folder or single-file .safetensors checkpoint")->required();
  c->add_option("--tokenizer", o.tokenizer, "CLIP tokenizer folder, for single files");
  c->add_flag("--json", o.json, "Print JSON");
}

int run_info(const InfoOptions& o) {
  if (const ModelFamily family = detect_model_family(o.model); family != ModelFamily::kSd) return run_dit_info(o, family);
  SdLoadOptions lo;
  lo.tokenizer_dir = o.tokenizer;
  lo.require_tokenizer = false;
  auto model = load_sd_model(o.model, lo);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", model.status().message().c_str());
    return 1;
  }
  const nlohmann::json d = describe_sd_model(**model);
  if (o.json) {
    std::printf("%s\n", d.dump(2).c_str());
    return 0;
  }
  std::printf("model       %s\n", d["path"].get<std::string>().c_str());
  std::printf("family      %s (%s prediction, %s)\n", d["family"].get<std::string>().c_str(),
              d["prediction"].get<std::string>().c_str(), d["prediction_source"].get<std::string>().c_str());
  std::printf("layout      %s\n", d["layout"].get<std::string>().c_str());
  std::printf("hash        %s\n", d["hash"].get<std::string>().c_str());
  std::printf("size        %d px\n", d["default_size"].get<int>());
  std::printf("text enc.   %s, %.2f M parameters\n", d["text_encoder"].dump().c_str(), millions(d["text_encoder"]["parameters"]));
  std::printf("unet        %s, %.2f M parameters\n", d["unet"].dump().c_str(), millions(d["unet"]["parameters"]));
  std::printf("vae         %s, %.2f M parameters\n", d["vae"].dump().c_str(), millions(d["vae"]["parameters"]));
  std::printf("total       %.2f M parameters\n", millions(d["parameters_total"]));
  return 0;
}

}  // namespace atelier::cli
