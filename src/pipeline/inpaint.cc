#include "pipeline/inpaint.h"

#include <algorithm>
#include <cmath>

#include "backend/ops.h"
#include "pipeline/image_resize.h"
#include "pipeline/init_image.h"

namespace atelier {
namespace {

constexpr InpaintFill kFills[] = {InpaintFill::kFill, InpaintFill::kOriginal, InpaintFill::kLatentNoise,
                                  InpaintFill::kLatentNothing};

// A1111's mask_for_overlay when the whole picture is generated: the blurred mask doubled, clipped to 255, so the
// generated pixels cover the mask's whole area and the blur fades only outside it.
Image doubled(const Image& mask) {
  Image out = mask;
  for (uint8_t& v : out.pixels) v = uint8_t(std::min(2 * int(v), 255));
  return out;
}

// PIL's convert("RGB"): gray replicated, alpha dropped.
Image rgb_image(const Image& img) {
  if (img.channels == 3) return img;
  Image out;
  out.width = img.width;
  out.height = img.height;
  out.channels = 3;
  const size_t n = size_t(img.width) * img.height;
  out.pixels.resize(n * 3);
  for (size_t i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c)
      out.pixels[i * 3 + c] = img.pixels[i * size_t(img.channels) + (img.channels >= 3 ? size_t(c) : 0)];
  return out;
}

// The mask at the latent size (bicubic, as PIL's default resize), in [0, 1], rounded half to even when `round`
// (np.around): A1111's latmask.
std::vector<float> latent_mask(const Image& mask, int latent_w, int latent_h, bool round) {
  const Image small = resize_image(mask, latent_w, latent_h, ResizeFilter::kBicubic);
  std::vector<float> out(small.pixels.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const float v = float(small.pixels[i]) / 255.0f;
    out[i] = round ? std::nearbyint(v) : v;
  }
  return out;
}

}  // namespace

Expected<InpaintFill> parse_inpaint_fill(const std::string& name) {
  for (InpaintFill f : kFills)
    if (name == inpaint_fill_name(f)) return f;
  return invalid_argument("unknown inpaint fill '" + name +
                          "': supported are fill (the colours around the mask), original (the image as it is), "
                          "latent_noise and latent_nothing");
}

const char* inpaint_fill_name(InpaintFill fill) {
  switch (fill) {
    case InpaintFill::kFill: return "fill";
    case InpaintFill::kLatentNoise: return "latent_noise";
    case InpaintFill::kLatentNothing: return "latent_nothing";
    case InpaintFill::kOriginal: break;
  }
  return "original";
}

const char* a1111_inpaint_fill_name(InpaintFill fill) {
  switch (fill) {
    case InpaintFill::kFill: return "fill";
    case InpaintFill::kLatentNoise: return "latent noise";
    case InpaintFill::kLatentNothing: return "latent nothing";
    case InpaintFill::kOriginal: break;
  }
  return "original";
}

Tensor InpaintPlan::keep_mask(int channels, Device device) const {
  const size_t plane = latent_mask.size();
  std::vector<float> keep(plane * size_t(channels));
  for (size_t c = 0; c < size_t(channels); ++c)
    for (size_t i = 0; i < plane; ++i) keep[c * plane + i] = 1.0f - latent_mask[i];
  return Tensor::from_vector(keep, {1, channels, latent_h, latent_w}).to(device);
}

Image InpaintPlan::composite(const Image& generated) const {
  if (!paste_to) return atelier::composite(base, generated, overlay_mask);
  // The generated image scaled into its box (A1111's uncrop: crop-and-resize); outside the box the mask is 0.
  Image top = base;
  const Image scaled = resize_image(generated, paste_to->width(), paste_to->height(), ResizeMode::kCropAndResize);
  for (int y = 0; y < scaled.height; ++y)
    std::copy_n(&scaled.pixels[size_t(y) * scaled.width * 3], size_t(scaled.width) * 3,
                &top.pixels[(size_t(paste_to->y1 + y) * top.width + paste_to->x1) * 3]);
  return atelier::composite(base, top, overlay_mask);
}

Expected<InpaintPlan> plan_inpaint(const Image& image, const Image& mask, GenerateRequest& r, int multiple,
                                   int latent_factor) {
  if (mask.width != image.width || mask.height != image.height) {
    return invalid_argument("mask: " + std::to_string(mask.width) + "x" + std::to_string(mask.height) +
                            " but the init image is " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                            "; send a mask of the image's size");
  }
  ATELIER_ASSIGN_OR_RETURN(const ResizeMode mode, parse_resize_mode(r.resize_mode));
  InpaintPlan p;
  ATELIER_ASSIGN_OR_RETURN(p.fill, parse_inpaint_fill(r.inpaint_fill));
  Image m = mask_from_upload(mask, r.mask_round);
  if (r.mask_invert) m = invert_mask(m);
  m = blur_mask(m, r.mask_blur_x, r.mask_blur_y);
  const PixelBox bounds = mask_bounds(m, r.inpaint_padding);
  if (bounds.width() == 0) return invalid_argument("mask: no pixel is masked (white marks what to inpaint)");
  ATELIER_RETURN_IF_ERROR(size_from_image(image, r, multiple, "init image"));
  const int w = r.width, h = r.height;
  const Image rgb = rgb_image(image);
  Image model_mask;
  if (r.inpaint_only_masked) {  // the box around the mask, at the request's aspect ratio, generated at full size
    const PixelBox box = expand_to_ratio(bounds, w, h, image.width, image.height);
    model_mask = resize_image(crop_image(m, box), w, h, ResizeMode::kResizeAndFill);
    p.model_image = resize_image(crop_image(rgb, box), w, h, ResizeMode::kResizeAndFill);
    p.base = rgb;
    p.overlay_mask = m;
    p.paste_to = box;
  } else {
    model_mask = resize_image(m, w, h, mode);
    p.model_image = resize_image(rgb, w, h, mode);
    p.base = p.model_image;
    p.overlay_mask = doubled(model_mask);
  }
  if (p.fill != InpaintFill::kOriginal) p.model_image = fill_masked_area(p.model_image, model_mask);
  p.latent_w = w / latent_factor;
  p.latent_h = h / latent_factor;
  p.latent_mask = latent_mask(model_mask, p.latent_w, p.latent_h, r.mask_round);
  return p;
}

Expected<std::shared_ptr<const InpaintPlan>> request_inpaint(GenerateRequest& r, const Image* given_image,
                                                             const Image* given_mask, int multiple, int latent_factor) {
  if (!given_mask && r.mask.empty()) return std::shared_ptr<const InpaintPlan>();
  if (!given_image && r.init_image.empty()) return invalid_argument("a mask (inpainting) needs an init image to inpaint");
  ATELIER_RETURN_IF_ERROR(check_img2img_strength(r));
  Image image, mask;
  if (!given_image) {
    ATELIER_ASSIGN_OR_RETURN(image, read_image(r.init_image));
  }
  if (!given_mask) {
    ATELIER_ASSIGN_OR_RETURN(mask, read_image(r.mask));
  }
  ATELIER_ASSIGN_OR_RETURN(InpaintPlan plan, plan_inpaint(given_image ? *given_image : image,
                                                          given_mask ? *given_mask : mask, r, multiple, latent_factor));
  return std::make_shared<const InpaintPlan>(std::move(plan));
}

Tensor fill_masked_latents(const InpaintPlan& plan, const Tensor& latents, RngKind kind, int64_t seed) {
  if (plan.fill != InpaintFill::kLatentNoise && plan.fill != InpaintFill::kLatentNothing) return latents;
  const Device dev = latents.device();
  Tensor keep = plan.keep_mask(int(latents.size(1)), dev);
  if (latents.dtype() != keep.dtype()) keep = ops::cast(keep, latents.dtype());
  const Tensor kept = ops::binary(latents, keep, BinaryOp::kMul);
  if (plan.fill == InpaintFill::kLatentNothing) return kept;
  const std::unique_ptr<NoiseGenerator> gen = make_generator(kind, uint64_t(seed));
  Tensor noise = randn_tensor(*gen, latents.shape()).to(dev);
  if (noise.dtype() != latents.dtype()) noise = ops::cast(noise, latents.dtype());
  // latents * keep + noise * (1 - keep): exactly the latents where keep is 1, the noise where it is 0
  const Tensor inpainted = ops::affine(keep, -1.0f, 1.0f);
  return ops::binary(kept, ops::binary(noise, inpainted, BinaryOp::kMul), BinaryOp::kAdd);
}

Tensor binarized_latent_mask(const Image& upload, int width, int height, int64_t h, int64_t w) {
  constexpr int kBinarizeAt = 128;  // v / 255 >= 0.5
  const Image m = resize_image(mask_from_upload(upload, true), width, height);
  std::vector<float> out(size_t(h * w));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {  // torch's nearest: source index floor(dst * in / out)
      const int64_t sy = y * height / h, sx = x * width / w;
      out[size_t(y * w + x)] = m.pixels[size_t(sy * width + sx)] >= kBinarizeAt ? 1.0f : 0.0f;
    }
  return Tensor::from_vector(out, {1, 1, h, w});
}

Tensor blend_flow_inpaint(const Tensor& x, const FlowInpaintRow& row, const sampling::FlowMatchEuler& s) {
  if (!row.defined()) return x;
  const Tensor proper = s.done() ? row.image_latents : s.scale_noise(row.image_latents, row.noise);
  const Tensor kept = ops::affine(row.mask, -1.0f, 1.0f);
  // exactly one of the two where the mask is 0 or 1
  return ops::binary(ops::binary(proper, kept, BinaryOp::kMul), ops::binary(ops::contiguous(x), row.mask, BinaryOp::kMul),
                     BinaryOp::kAdd);
}

}  // namespace atelier
