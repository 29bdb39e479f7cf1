// The last stage of a job, on the host pool: infotext, image encoding (PNG with the "parameters" chunk,
// JPEG/WebP with EXIF UserComment), base64 for the JSON APIs, optional saving to --output-dir (image + JSON
// sidecar), then the job's result. Also the per-step preview (latents -> small JPEG).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "pipeline/sd_pipeline.h"
#include "serve/job.h"
#include "serve/metrics.h"

namespace atelier::serve {

// The job's finished images (pixels + infotext, made on the worker; cheap) -> encoded, saved, stored in the
// job. Holds no model reference, so a model can be evicted while images are still being encoded.
// Never throws: errors fail the job.
void complete_job(const JobPtr& job, const std::vector<GeneratedImage>& images, const std::string& output_dir,
                  MetricsRegistry& metrics);

// latents [1, 4, h, w] host -> job->set_preview(step, base64 JPEG). Never throws (a failed preview is skipped).
void publish_preview(const JobPtr& job, const Tensor& latents, int step);
// The largest side of a preview made from decoded pixels (a FLUX / Z-Image VAE decode), scaled down to it.
constexpr int kDecodedPreviewMaxSide = 256;
// A decoded image -> job->set_preview(step, base64 JPEG), scaled down to kDecodedPreviewMaxSide. Never throws.
void publish_preview_image(const JobPtr& job, const Image& image, int step);

}  // namespace atelier::serve
