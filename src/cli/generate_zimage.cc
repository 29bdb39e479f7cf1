// `atelier generate` for Z-Image models (is_zimage_model): load, generate, write PNG + JSON sidecar.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "io/image.h"
#include "pipeline/zimage_pipeline.h"

namespace atelier::cli {
namespace fs = std::filesystem;

namespace {

std::string numbered_path(const std::string& base, size_t index, size_t count) {
  if (count == 1) return base;
  fs::path p(base);
  const std::string ext = p.has_extension() ? p.extension().string() : ".png";
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(index) + ext)).string();
}

// A single-file transformer takes its other parts from --components, else from a Z-Image folder beside it.
std::string components_for(const GenerateOptions& o) {
  if (!o.components.empty() || fs::is_directory(o.model)) return o.components;
  const fs::path dir = fs::path(o.model).parent_path();
  return is_zimage_model(dir.string()) ? dir.string() : std::string();
}

}  // namespace

int run_generate_zimage(const GenerateOptions& o, Device device) {
  TraceFile trace_file(o.trace);
  ZImageLoadOptions lo;
  lo.device = device;
  lo.components_dir = components_for(o);
  auto model = load_zimage_model(o.model, lo);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", model.status().message().c_str());
    return 1;
  }
  const bool tty = isatty(fileno(stderr));  // a progress line only where someone watches it
  auto progress = [tty](const StepProgress& p) {
    if (!tty) return true;
    std::fprintf(stderr, "\rimage %d: step %d/%d", p.batch_index + 1, p.call, p.total_calls);
    if (p.call == p.total_calls) std::fputc('\n', stderr);
    return true;
  };
  auto res = ZImagePipeline(*model).generate(o.request, progress);
  if (!res) {
    std::fprintf(stderr, "\nerror: %s\n", res.status().message().c_str());
    return 1;
  }
  for (size_t i = 0; i < res->images.size(); ++i) {
    const GeneratedImage& g = res->images[i];
    const std::string path = numbered_path(o.output, i, res->images.size());
    if (Status st = write_png(path, g.image, {{"parameters", g.infotext}}); !st.is_ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    }
    std::ofstream(fs::path(path).replace_extension(".json")) << g.info.dump(2) << "\n";
    std::printf("%s (seed %lld)\n", path.c_str(), static_cast<long long>(g.seed));
  }
  if (!trace_file.write(device)) return 1;
  const StageTimes& t = res->times;
  std::fprintf(stderr, "text %.3f s, denoise %.3f s, vae %.3f s, total %.3f s\n", t.text_encode_s, t.denoise_s, t.vae_s,
               t.total_s);
  return 0;
}

}  // namespace atelier::cli
