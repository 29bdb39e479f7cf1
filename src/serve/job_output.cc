#include "serve/job_output.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "io/image.h"
#include "pipeline/image_resize.h"
#include "pipeline/latent_preview.h"
#include "serve/base64.h"

namespace atelier::serve {
namespace {

constexpr int kPreviewJpegQuality = 70;

Expected<std::string> encode_as(const std::string& format, const GeneratedImage& g) {
  if (format == "jpeg") return encode_jpeg(g.image, kDefaultJpegQuality, g.infotext);
  if (format == "webp") return encode_webp(g.image, kDefaultWebpQuality, g.infotext);
  return encode_png(g.image, {{kInfotextKey, g.infotext}});
}

Status save(const std::string& dir, const std::string& name, const std::string& bytes, const nlohmann::json& info,
            std::string* path) {
  namespace fs = std::filesystem;
  const fs::path p = fs::path(dir) / name;
  ATELIER_RETURN_IF_ERROR(write_file(p.string(), bytes));
  ATELIER_RETURN_IF_ERROR(write_file(fs::path(p).replace_extension(".json").string(),
                                     info.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
  *path = p.string();
  return Status::ok();
}

}  // namespace

void complete_job(const JobPtr& job, const std::vector<GeneratedImage>& images, const std::string& output_dir,
                  MetricsRegistry& metrics) {
  const auto t0 = Clock::now();
  const std::string& format = job->request().output_format;
  std::vector<JobImage> out;
  const Status st = catch_status([&]() -> Status {
    for (size_t i = 0; i < images.size(); ++i) {
      const GeneratedImage& g = images[i];
      ATELIER_ASSIGN_OR_RETURN(std::string bytes, encode_as(format, g));
      JobImage ji;
      ji.format = format;
      ji.infotext = g.infotext;
      ji.seed = g.seed;
      ji.width = g.image.width;
      ji.height = g.image.height;
      if (!output_dir.empty()) {
        const std::string name = job->id() + "-" + std::to_string(i) + "." + (format == "jpeg" ? "jpg" : format);
        ATELIER_RETURN_IF_ERROR(save(output_dir, name, bytes, g.info, &ji.path));
      }
      ji.data_b64 = base64_encode(bytes);
      out.push_back(std::move(ji));
    }
    return Status::ok();
  });
  metrics.observe(metric::kStage, {{"stage", "image_encode"}}, std::chrono::duration<double>(Clock::now() - t0).count());
  if (!st.is_ok()) {
    job->fail(st);
    return;
  }
  job->finish(std::move(out));
}

void publish_preview(const JobPtr& job, const Tensor& latents, int step) {
  (void)catch_status([&]() -> Status {
    ATELIER_ASSIGN_OR_RETURN(Image img, latent_preview(latents));
    ATELIER_ASSIGN_OR_RETURN(std::string jpeg, encode_jpeg(img, kPreviewJpegQuality));
    job->set_preview(step, base64_encode(jpeg));
    return Status::ok();
  });
}

void publish_preview_image(const JobPtr& job, const Image& image, int step) {
  (void)catch_status([&]() -> Status {
    const int side = std::max(image.width, image.height);
    const Image small = side <= kDecodedPreviewMaxSide
                            ? image
                            : resize_image(image, std::max(1, image.width * kDecodedPreviewMaxSide / side),
                                           std::max(1, image.height * kDecodedPreviewMaxSide / side));
    ATELIER_ASSIGN_OR_RETURN(std::string jpeg, encode_jpeg(small, kPreviewJpegQuality));
    job->set_preview(step, base64_encode(jpeg));
    return Status::ok();
  });
}

}  // namespace atelier::serve
