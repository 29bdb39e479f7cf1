// `atelier generate` on a Z-Image model (is_zimage_model): load, generate, then the shared output writer.

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
  return finish_generate(o, ZImagePipeline(*model).generate(o.request, terminal_progress("image")), trace_file, device);
}

}  // namespace atelier::cli
