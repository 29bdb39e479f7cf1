// The sd15-tiny fixture on cuda:0 for the GPU tests that generate through SdPipeline (cuda_graph_test.cc,
// cuda_launch_batch_test.cc): the model loaded without hashing, and a small request for it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>

#include "core/status.h"
#include "cuda_test_util.h"
#include "pipeline/sd_model.h"
#include "pipeline/sd_pipeline.h"

namespace atelier::test {

// dir: the sd15-tiny fixture folder (ATELIER_REQUIRE_FIXTURE's).
inline Expected<std::shared_ptr<SdModel>> load_tiny_sd_on_gpu(const std::filesystem::path& dir) {
  SdLoadOptions lo;
  lo.compute_hash = false;
  lo.device = cuda0();
  return load_sd_model((dir / "model").string(), lo);
}

// "a red circle", 128², `steps` steps, on cuda:0 (seed and sampler as the request's defaults unless set after).
inline GenerateRequest tiny_gpu_request(int steps) {
  GenerateRequest r;
  r.prompt = "a red circle";
  r.width = r.height = 128;
  r.steps = steps;
  r.device = "cuda:0";
  return r;
}

}  // namespace atelier::test
