#include "pipeline/init_image.h"

#include "backend/ops.h"
#include "core/trace.h"
#include "pipeline/image_resize.h"
#include "pipeline/stage_names.h"
#include "sampling/sampler.h"

namespace atelier {

Status size_from_image(const Image& image, GenerateRequest& r, int multiple, const std::string& label) {
  if (r.width == 0) r.width = image.width / multiple * multiple;
  if (r.height == 0) r.height = image.height / multiple * multiple;
  if (r.width < multiple || r.height < multiple) {
    return invalid_argument(label + " is smaller than " + std::to_string(multiple) + "x" + std::to_string(multiple));
  }
  return Status::ok();
}

Expected<Tensor> init_image_tensor(const Image& image, GenerateRequest& r, int multiple, const std::string& label) {
  ATELIER_RETURN_IF_ERROR(size_from_image(image, r, multiple, label));
  ATELIER_ASSIGN_OR_RETURN(const ResizeMode mode, parse_resize_mode(r.resize_mode));
  return tensor_from_image(resize_image(image, r.width, r.height, mode));
}

Status check_img2img_strength(const GenerateRequest& r) {
  if (!(r.strength > 0 && r.strength <= 1) || sampling::img2img_steps(r.steps, r.strength) < 1) {
    return invalid_argument("img2img strength " + std::to_string(r.strength) + " with " + std::to_string(r.steps) +
                            " steps: the strength must be in (0, 1] and leave at least one of the steps to run "
                            "(img2img runs the last int(steps x strength))");
  }
  return Status::ok();
}

Expected<Tensor> request_init_image(GenerateRequest& r, const Image* given, int multiple) {
  if (!given && r.init_image.empty()) return Tensor();
  ATELIER_RETURN_IF_ERROR(check_img2img_strength(r));
  Image loaded;
  if (!given) {
    ATELIER_ASSIGN_OR_RETURN(loaded, read_image(r.init_image));
    given = &loaded;
  }
  return init_image_tensor(*given, r, multiple, r.init_image.empty() ? "init image" : "init image " + r.init_image);
}

Tensor vae_encode_sample(const Vae& vae, const Tensor& image01, NoiseGenerator& gen, Device device) {
  trace::Scope range(stage::kVaeEncode, trace::Category::kStage);
  const Tensor x = ops::affine(image01.to(device), 2.0f, -1.0f);  // diffusers' normalize: 2 * x - 1
  const int f = vae.config().downscale_factor();
  const Shape lat = {x.size(0), vae.config().latent_channels, x.size(2) / f, x.size(3) / f};
  const Tensor noise = randn_tensor(gen, lat).to(device);  // latent_dist.sample(generator) draws first
  Tensor latents = vae.image_to_latents(x, noise);
  backend_for(device).synchronize();
  return latents;
}

}  // namespace atelier
