// The own GEMM kernel's tensor maps (cuda_gemm_wgmma.cu), built on the host: x's and w's boxes, the staged tiles'
// output and residual, a convolution's input box. Not a standalone header: included by cuda_gemm_wgmma.cu inside its
// namespace, after Params and the tile constants (kBM, kBK, kBoxCols, kBoxHalfRows) it uses; kept apart so that the
// kernel file stays readable.
#pragma once

// A bf16 tensor of `rank` dimensions (dims innermost first, byte strides of the outer ones) as a tensor map of `box`
// boxes in the 128-byte swizzle, coordinates outside the tensor read as zeros; false where the driver lacks the
// encoder, the base is not 16-byte aligned or the encoder refuses.
template <int Rank>
bool encode_map(CUtensorMap& map, const void* base, const cuuint64_t (&dims)[Rank], const cuuint64_t (&strides)[Rank - 1],
                const cuuint32_t (&box)[Rank], CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  const tma::EncodeTiled encode = tma::encode_tiled();
  if (!encode || reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  cuuint32_t unit[Rank];
  for (cuuint32_t& u : unit) u = 1;
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, Rank, const_cast<void*>(base), dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A row-major bf16 matrix [rows][cols] (row stride ld elements) as a tensor map of 64-column x box_rows boxes in
// the 128-byte swizzle; false where it breaks TMA's rules (16-byte aligned base and row stride).
bool make_map(CUtensorMap& map, const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
  if (ld % 8 != 0 || ld < cols) return false;
  return encode_map<2>(map, base, {cuuint64_t(cols), cuuint64_t(rows)}, {cuuint64_t(ld) * 2}, {cuuint32_t(kBK), cuuint32_t(box_rows)});
}
// The linear layer's output (or residual) [rows][cols], row stride ld, in its staged tiles' boxes.
bool make_linear_out_map(CUtensorMap& map, const void* base, int64_t rows, int64_t cols, int64_t ld) {
  if (ld % 8 != 0 || ld < cols) return false;
  return encode_map<2>(map, base, {cuuint64_t(cols), cuuint64_t(rows)}, {cuuint64_t(ld) * 2},
                       {cuuint32_t(kBoxCols), cuuint32_t(kBoxHalfRows)}, CU_TENSOR_MAP_SWIZZLE_64B);
}
// p.out_map and, with a residual, p.res_map for the staged epilogue of a linear layer or convolution ([m][n], row
// stride ldo); false where either breaks TMA's rules (16-byte aligned base and row stride).
bool make_staged_maps(Params& p, const void* out, const void* residual, int64_t m, int64_t n, int64_t ldo) {
  return make_linear_out_map(p.out_map, out, m, n, ldo) && (!residual || make_linear_out_map(p.res_map, residual, m, n, ldo));
}

// The width of the phases' output boxes of kBoxHalfRows product rows over rows of w pixels: whole rows (w divides
// 64) or 64-pixel parts of one (64 divides w); 0 where w splits neither way.
int64_t phase_box_width(int64_t w) {
  const int64_t box_w = std::min<int64_t>(w, kBoxHalfRows);
  return box_w > 0 && kBoxHalfRows % box_w == 0 && w % box_w == 0 ? box_w : 0;
}

// An upsampler's output [n][2h][2w][c] (dense channels-last) for the four phases' staged tiles: dims {c, column
// parity, w, row parity, n h}, so that phase (a, b)'s product row (image row i, column j) is out's pixel (2i + a,
// 2j + b), in kBoxCols-channel x kBoxHalfRows-row boxes (phase_box_width). False where w splits no such way or a
// pixel is not 16-byte aligned.
bool make_phase_out_map(CUtensorMap& map, const void* base, int64_t n, int64_t h, int64_t w, int64_t c) {
  const int64_t box_w = phase_box_width(w);
  if (c % 8 != 0 || box_w == 0) return false;
  const cuuint64_t pixel = cuuint64_t(c) * 2;
  return encode_map<5>(map, base, {cuuint64_t(c), 2, cuuint64_t(w), 2, cuuint64_t(n * h)},
                       {pixel, 2 * pixel, 2 * cuuint64_t(w) * pixel, 4 * cuuint64_t(w) * pixel},
                       {cuuint32_t(kBoxCols), 1, cuuint32_t(box_w), 1, cuuint32_t(kBoxHalfRows / box_w)}, CU_TENSOR_MAP_SWIZZLE_64B);
}

// The input box of a convolution tile's 128 output pixels, {width, height, images}: 128 pixels of one row (an output
// width that is a multiple of 128), whole rows of one image, or whole images; false where 128 consecutive output
// pixels are no such box (then the kernel does not take the shape).
bool conv_box(int64_t ho, int64_t wo, cuuint32_t (&box)[3]) {
  if (wo >= kBM) {
    box[0] = kBM, box[1] = 1, box[2] = 1;
    return wo % kBM == 0;
  }
  if (kBM % wo != 0) return false;
  const int64_t rows = kBM / wo;
  if (rows <= ho) {
    box[0] = cuuint32_t(wo), box[1] = cuuint32_t(rows), box[2] = 1;
    return ho % rows == 0;
  }
  box[0] = cuuint32_t(wo), box[1] = cuuint32_t(ho), box[2] = cuuint32_t(rows / ho);
  return rows % ho == 0;
}

// A dense channels-last bf16 tensor [n][h][w][c] as a 4-D tensor map of 64-channel x `pixels` boxes in the 128-byte
// swizzle (coordinates out of the tensor read as zeros: the convolution's padding).
bool make_map_4d(CUtensorMap& map, const void* base, int64_t n, int64_t h, int64_t w, int64_t c, const cuuint32_t (&pixels)[3]) {
  if (c % kBK != 0) return false;
  return encode_map<4>(map, base, {cuuint64_t(c), cuuint64_t(w), cuuint64_t(h), cuuint64_t(n)},
                       {cuuint64_t(c) * 2, cuuint64_t(w * c) * 2, cuuint64_t(h * w * c) * 2},
                       {cuuint32_t(kBK), pixels[0], pixels[1], pixels[2]});
}
