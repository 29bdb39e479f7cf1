// Tiled decode with diffusers' semantics (AutoencoderKL._tiled_decode): tiles of tile_latent latent
// pixels start every int(tile_latent * (1 - overlap)) pixels; each decoded tile is blended with the tile
// above and the tile to its left (both already blended themselves, as diffusers blends in place) over
// int(tile_sample * overlap) image pixels, then cropped to its top-left row_limit x row_limit corner.
// Only the previous row of decoded tiles is kept, so memory grows with the width, not the area.
#include <algorithm>

#include "models/vae/vae.h"

namespace atelier {

namespace {

// Linear ramp weights along `dim` (2 = rows, 3 = columns) of length `extent`, shaped to broadcast over
// [B, C, H, W]: returns {1 - y/extent, y/extent} rounded to f32 the way torch multiplies by a Python float.
std::pair<Tensor, Tensor> ramp(int64_t extent, int dim, Device dev) {
  std::vector<float> keep(static_cast<size_t>(extent)), take(static_cast<size_t>(extent));
  for (int64_t y = 0; y < extent; ++y) {
    keep[size_t(y)] = float(1.0 - double(y) / double(extent));
    take[size_t(y)] = float(double(y) / double(extent));
  }
  const Shape s = dim == 2 ? Shape{1, 1, extent, 1} : Shape{1, 1, 1, extent};
  return {Tensor::from_vector(keep, s).to(dev), Tensor::from_vector(take, s).to(dev)};
}

// diffusers' blend_v (dim 2) / blend_h (dim 3): the first `extent` rows/columns of b fade in from the last
// `extent` of a. a, b [B, C, H, W] -> blended b.
Tensor blend(const Tensor& a, const Tensor& b, int64_t extent, int dim) {
  extent = std::min({a.size(dim), b.size(dim), extent});
  if (extent <= 0) return b;
  const auto [keep, take] = ramp(extent, dim, b.device());
  const Tensor mixed = ops::add(ops::mul(a.narrow(dim, a.size(dim) - extent, extent), keep),
                                ops::mul(b.narrow(dim, 0, extent), take));
  if (extent == b.size(dim)) return mixed;
  return ops::concat({mixed, b.narrow(dim, extent, b.size(dim) - extent)}, dim);
}

}  // namespace

// z [B, latent, h, w] (unscaled) -> image [B, out, f*h, f*w] (f32)
Tensor Vae::decode_tiled(const Tensor& z_in, const VaeTiling& tiling) const {
  const Tensor z = prepare_latents(z_in);
  const int64_t tile_latent = tiling.tile_latent;
  if (tile_latent < 1 || !(tiling.overlap >= 0.0f && tiling.overlap < 1.0f))
    throw Error(invalid_argument("vae: tiling needs tile_latent >= 1 and 0 <= overlap < 1"));
  const int64_t h = z.size(2), w = z.size(3);
  if (h <= tile_latent && w <= tile_latent) return decode(z);  // diffusers tiles only larger latents

  const int64_t f = config_.downscale_factor();
  const int64_t tile_sample = tile_latent * f;
  const int64_t stride = int64_t(double(tile_latent) * (1.0 - double(tiling.overlap)));  // overlap_size
  const int64_t blend_extent = int64_t(double(tile_sample) * double(tiling.overlap));
  const int64_t row_limit = tile_sample - blend_extent;
  // With other values the crops would not add up to the image size (diffusers has the same constraint).
  if (stride < 1 || row_limit != stride * f)
    throw Error(invalid_argument("vae: tiling with tile " + std::to_string(tile_latent) + " and overlap " +
                                 std::to_string(tiling.overlap) + " does not tile evenly; use an overlap that makes "
                                 "tile * overlap a whole number of latent pixels"));

  std::vector<Tensor> prev_row, strips;
  for (int64_t i = 0; i < h; i += stride) {
    std::vector<Tensor> row, crops;
    for (int64_t j = 0; j < w; j += stride) {
      const Tensor piece = z.narrow(2, i, std::min(tile_latent, h - i)).narrow(3, j, std::min(tile_latent, w - j));
      Tensor tile = decode_prepared(ops::contiguous(piece));
      if (tile.dtype() != DType::F32) tile = ops::cast(tile, DType::F32);
      if (!prev_row.empty()) tile = blend(prev_row[row.size()], tile, blend_extent, 2);
      if (!row.empty()) tile = blend(row.back(), tile, blend_extent, 3);
      crops.push_back(tile.narrow(2, 0, std::min(row_limit, tile.size(2))).narrow(3, 0, std::min(row_limit, tile.size(3))));
      row.push_back(tile);
    }
    strips.push_back(ops::concat(crops, 3));
    prev_row = std::move(row);
  }
  return ops::concat(strips, 2);
}

}  // namespace atelier
