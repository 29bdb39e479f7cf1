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

Status check_mask_size(const Image& mask, const Image& image) {
  if (mask.width == image.width && mask.height == image.height) return Status::ok();
  return invalid_argument("mask: " + std::to_string(mask.width) + "x" + std::to_string(mask.height) +
                          " but the init image is " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                          "; send a mask of the image's size");
}

Tensor masked_blend(const Tensor& a, const Tensor& mask, const Tensor& b, const Tensor& not_mask) {
  return ops::binary(ops::binary(a, mask, BinaryOp::kMul), ops::binary(b, not_mask, BinaryOp::kMul), BinaryOp::kAdd);
}

Expected<const Image*> request_mask(const GenerateRequest& r, const Image* given, bool has_init_image, Image& loaded) {
  if (!given && r.mask.empty()) return static_cast<const Image*>(nullptr);
  if (!has_init_image) return invalid_argument("a mask (inpainting) needs an init image to inpaint");
  if (given) return given;
  ATELIER_ASSIGN_OR_RETURN(loaded, read_image(r.mask));
  return static_cast<const Image*>(&loaded);
}

Expected<InpaintPlan> plan_inpaint(const Image& image, const Image& mask, GenerateRequest& r, int multiple,
                                   int latent_factor) {
  ATELIER_RETURN_IF_ERROR(check_mask_size(mask, image));
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
  Image image, loaded_mask;
  ATELIER_ASSIGN_OR_RETURN(const Image* mask, request_mask(r, given_mask, given_image || !r.init_image.empty(), loaded_mask));
  if (!mask) return std::shared_ptr<const InpaintPlan>();
  ATELIER_RETURN_IF_ERROR(check_img2img_strength(r));
  if (!given_image) {
    ATELIER_ASSIGN_OR_RETURN(image, read_image(r.init_image));
  }
  ATELIER_ASSIGN_OR_RETURN(InpaintPlan plan,
                           plan_inpaint(given_image ? *given_image : image, *mask, r, multiple, latent_factor));
  return std::make_shared<const InpaintPlan>(std::move(plan));
}

Tensor fill_masked_latents(InpaintFill fill, const Tensor& latents, const Tensor& keep, const Tensor& inpainted,
                           RngKind kind, int64_t seed) {
  if (fill == InpaintFill::kLatentNothing) return ops::binary(latents, keep, BinaryOp::kMul);
  if (fill != InpaintFill::kLatentNoise) return latents;
  const std::unique_ptr<NoiseGenerator> gen = make_generator(kind, uint64_t(seed));
  Tensor noise = randn_tensor(*gen, latents.shape()).to(latents.device());
  if (noise.dtype() != latents.dtype()) noise = ops::cast(noise, latents.dtype());
  return masked_blend(latents, keep, noise, inpainted);
}

Tensor binarized_latent_mask(const Image& upload, int width, int height, int64_t h, int64_t w, int64_t channels) {
  constexpr int kBinarizeAt = 128;  // v / 255 >= 0.5
  const Image m = resize_image(mask_from_upload(upload, true), width, height);
  const size_t plane = size_t(h * w);
  std::vector<float> out(plane * size_t(channels));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {  // torch's nearest: source index floor(dst * in / out)
      const int64_t sy = y * height / h, sx = x * width / w;
      out[size_t(y * w + x)] = m.pixels[size_t(sy * width + sx)] >= kBinarizeAt ? 1.0f : 0.0f;
    }
  for (size_t c = 1; c < size_t(channels); ++c) std::copy_n(out.begin(), plane, out.begin() + c * plane);
  return Tensor::from_vector(out, {1, channels, h, w});
}

Tensor blend_flow_inpaint(const Tensor& x, const std::vector<FlowInpaintRow>& rows, const sampling::FlowMatchEuler& s) {
  if (std::none_of(rows.begin(), rows.end(), [](const FlowInpaintRow& r) { return r.defined(); })) return x;
  std::vector<Tensor> out;
  for (size_t b = 0; b < rows.size(); ++b) {
    const FlowInpaintRow& r = rows[b];
    Tensor row = x.narrow(0, int64_t(b), 1);
    if (r.defined()) {
      const Tensor proper = s.done() ? r.image_latents : s.scale_noise(r.image_latents, r.noise);
      row = masked_blend(ops::contiguous(row), r.mask, proper, ops::affine(r.mask, -1.0f, 1.0f));
    }
    out.push_back(row);
  }
  return out.size() == 1 ? out.front() : ops::concat(out, 0);
}

}  // namespace atelier
