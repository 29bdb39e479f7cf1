// 8-bit image operations of inpainting, after A1111's (modules/masking.py, processing.py): the mask taken from an
// upload, its Gaussian blur, the crop around it, the "fill" of the masked area and the final composite. Same
// algorithms as the PIL / OpenCV calls A1111 makes, computed in floating point: values may differ by a unit in the
// last place of 8 bits from theirs (PIL and OpenCV round intermediate 8-bit results in their own ways).
#pragma once
#include "io/image.h"

namespace atelier {

// A rectangle of pixels: columns [x1, x2), rows [y1, y2).
struct PixelBox {
  int x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  int width() const { return x2 - x1; }
  int height() const { return y2 - y1; }
  bool operator==(const PixelBox&) const = default;
};

// An uploaded mask -> one channel, 255 = inpaint (A1111's create_binary_mask): an RGBA image whose alpha is not all
// opaque gives its alpha (thresholded at > 128 when `round_alpha`); any other image its luma (PIL's convert("L"),
// ITU-R 601-2: (19595 R + 38470 G + 7471 B + 2^15) >> 16).
Image mask_from_upload(const Image& upload, bool round_alpha);
// 255 - v for every value of a one-channel image.
Image invert_mask(const Image& mask);
// cv2.GaussianBlur of a one-channel image with a (k, 1) then a (1, k) kernel, k = 2 * int(2.5 * sigma + 0.5) + 1,
// reflected borders (BORDER_REFLECT_101), each pass rounded to 8 bits; a sigma of 0 skips its pass.
Image blur_mask(const Image& mask, int sigma_x, int sigma_y);
// The box around the mask's non-zero pixels, widened by `padding` on each side within the image (A1111's
// get_crop_region); an empty box when the mask is all zero.
PixelBox mask_bounds(const Image& mask, int padding);
// `box` grown along one axis to the aspect ratio of width x height, kept inside image_w x image_h
// (A1111's expand_crop_region).
PixelBox expand_to_ratio(PixelBox box, int width, int height, int image_w, int image_h);
Image crop_image(const Image& img, const PixelBox& box);
// A1111's "fill" masked content: the masked area (mask 255) of an RGB image painted with the colours around it,
// by compositing ever less blurred copies of the unmasked pixels (Gaussian blurs of radius 256, 64, 16, 4, 2, 0).
Image fill_masked_area(const Image& rgb, const Image& mask);
// `top` over `bottom` (both RGB, same size) where top's opacity is `alpha` (one channel; 255 = top):
// PIL's alpha_composite of an RGBA overlay onto an opaque image, per channel round((t a + b (255 - a)) / 255).
Image composite(const Image& bottom, const Image& top, const Image& alpha);

}  // namespace atelier
