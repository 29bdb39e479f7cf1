// `atelier generate` on a Z-Image model (is_zimage_model): load, generate, then the shared output writer.
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "pipeline/zimage_pipeline.h"

namespace atelier::cli {
namespace fs = std::filesystem;

namespace {

// A single-file transformer takes its other parts from --components, else from a Z-Image folder beside it.
std::string components_for(const GenerateOptions& o) {
  if (!o.components.empty() || fs::is_directory(o.model)) return o.components;
  const fs::path dir = fs::path(o.model).parent_path();
  return is_zimage_model(dir.string()) ? dir.string() : std::string();
}

}  // namespace

int run_generate_zimage(const GenerateOptions& o, Device device) {
  if (o.max_sequence_length < 1) {
    std::fprintf(stderr, "error: --max-sequence-length must be at least 1\n");
    return 2;
  }
  TraceFile trace_file(o.trace);
  ZImageLoadOptions lo;
  lo.device = device;
  lo.offload = o.offload;
  lo.dtype = o.load_dtype();
  lo.fp8 = o.fp8();
  lo.components_dir = components_for(o);
  lo.max_sequence_length = o.max_sequence_length;
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
  if (int rc = write_generate_outputs(o, *res); rc != 0) return rc;
  return trace_file.write(device) ? 0 : 1;
}

}  // namespace atelier::cli
