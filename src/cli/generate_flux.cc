// `atelier generate` on a FLUX model: the FLUX flags into FluxLoadOptions / FluxOptions, then the shared output writer.

#include <cstdio>

#include "cli/commands.h"
#include "pipeline/flux_pipeline.h"

namespace atelier::cli {

int run_generate_flux(const GenerateOptions& o, Device device) {
  FluxOptions fo;
  fo.guidance = o.guidance;
  fo.max_sequence_length = o.max_sequence_length;
  fo.cfg_explicit = o.cfg_given;
  if (Status st = fo.validate(); !st.is_ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return 2;
  }
  TraceFile trace_file(o.trace);
  FluxLoadOptions lo;
  lo.vae = o.vae;
  lo.clip_l = o.clip_l;
  lo.t5 = o.t5;
  lo.clip_tokenizer = o.tokenizer;
  lo.t5_tokenizer = o.t5_tokenizer;
  lo.device = device;
  lo.dtype = o.load_dtype();
  lo.fp8 = o.fp8();
  lo.offload = o.offload;
  auto model = load_flux_model(o.model, lo);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", model.status().message().c_str());
    return 1;
  }
  const FluxPipeline pipe(*model);
  return finish_generate(o, pipe.generate(o.request, fo, terminal_progress("batch")), trace_file, device);
}

}  // namespace atelier::cli
