// The own GEMM kernel's convolution entry points on the host (cuda_gemm_wgmma.h): which cases the implicit GEMM
// takes, its split-K sizing and workspace, and the launch that fills Params. Not a standalone header: included at the
// end of cuda_gemm_wgmma.cu inside its namespace, after Params, the instances (launch_linear_form) and the tensor
// maps (cuda_gemm_maps.cuh) it uses; kept apart so that the kernel file stays about the kernel.
#pragma once

namespace {
// The product's k: the taps' channels, and the shortcut's after them where there is one.
int64_t conv_k(const OwnConvArgs& a) { return a.kh * a.kw * a.c + (a.shortcut ? a.sc_c : 0); }

// An upsampler's phases (OwnConvArgs::upsample_phases): a 2x2 kernel, padding 1, the input's size, whole tiles per
// phase, whole output boxes per 64 rows (phase_box_width), and nothing else read.
bool phases_take(const OwnConvArgs& a) {
  return a.kh == 2 && a.kw == 2 && a.pad_h == 1 && a.pad_w == 1 && a.ho == a.h && a.wo == a.w && a.o % 4 == 0 &&
         a.o / 4 % (tile_160(a.o) ? 160 : 128) == 0 && phase_box_width(a.wo) != 0 && !a.residual && !a.input2 && !a.shortcut;
}

// conv_implicit_takes with the input box of a tile (conv_box) where it holds.
bool conv_takes_with_box(const OwnConvArgs& a, int cc_major, cuuint32_t (&box)[3]) {
  if (a.input2 && (a.c1 <= 0 || a.c1 >= a.c || a.c1 % kBK != 0 || reinterpret_cast<uintptr_t>(a.input2) % 16 != 0)) return false;
  if (a.shortcut &&
      (a.sc_c <= 0 || a.sc_c % kBK != 0 || a.ho != a.h || a.wo != a.w || reinterpret_cast<uintptr_t>(a.shortcut) % 16 != 0 ||
       (a.shortcut2 && (a.sc_c1 <= 0 || a.sc_c1 >= a.sc_c || a.sc_c1 % kBK != 0 || reinterpret_cast<uintptr_t>(a.shortcut2) % 16 != 0))))
    return false;
  if (a.upsample_phases && !phases_take(a)) return false;
  const bool same_size = a.upsample_phases || (a.ho == a.h + 2 * a.pad_h - a.kh + 1 && a.wo == a.w + 2 * a.pad_w - a.kw + 1);
  if (a.c % kBK != 0 || a.kh < 1 || a.kw < 1 || !same_size || a.ho < 1 || a.wo < 1 || reinterpret_cast<uintptr_t>(a.input) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.weight) % 16 != 0 || !conv_box(a.ho, a.wo, box))
    return false;
  return takes(cc_major, a.max_smem, a.n * a.ho * a.wo, conv_k(a), a.o, a.o, {a.out, a.bias, a.residual});
}

// The convolution's output tiles and k-steps.
int64_t conv_tiles(const OwnConvArgs& a) {
  const int64_t m = a.n * a.ho * a.wo;
  return tile_160(a.o) ? tile_count<Epi::kConv, 160>(m, a.o) : tile_count<Epi::kConv, 128>(m, a.o);
}
int64_t conv_k_steps(const OwnConvArgs& a) { return (conv_k(a) + kBK - 1) / kBK; }

// Whether `split` parts per tile fit the workspace, the flags and the k-steps.
bool split_fits(const OwnConvArgs& a, int split) {
  const int64_t tiles = conv_tiles(a);
  return split >= 2 && split <= kMaxSplit && tiles <= kSplitMaxTiles && split * kMinSplitSteps <= conv_k_steps(a) &&
         (split - 1) * tiles <= int64_t(kSplitSlotsPerSm) * a.sm_count;
}
}  // namespace

bool conv_implicit_takes(const OwnConvArgs& a, int cc_major) {
  cuuint32_t box[3];
  return conv_takes_with_box(a, cc_major, box);
}

size_t conv_split_workspace_bytes(int sm_count) {
  return kSplitFlagBytes + size_t(kSplitSlotsPerSm) * size_t(std::max(sm_count, 1)) * kSplitSlotBytes;
}
size_t conv_split_flag_bytes() { return kSplitFlagBytes; }

std::vector<int> conv_implicit_splits(const OwnConvArgs& a) {
  std::vector<int> splits;
  const int64_t tiles = conv_tiles(a);
  // Half the SMs or more busy without it: at 67-131 tiles (a block each, one consumer of two busy) two parts per tile
  // timed slower than one in every SD shape (1024²'s 32x32 level: 50 against 48 us, 90.5 against 87.7; session 34).
  if (tiles <= 0 || 2 * tiles > a.sm_count) return splits;
  // One unit per SM (one consumer of two busy), or two (both).
  for (int64_t per_sm : {int64_t(1), int64_t(kConsumers)}) {
    const int split = int(std::min<int64_t>(kMaxSplit, per_sm * a.sm_count / tiles));
    if (split_fits(a, split) && (splits.empty() || splits.back() != split)) splits.push_back(split);
  }
  return splits;
}

bool launch_conv_implicit(const OwnConvArgs& a, int cc_major, cudaStream_t stream) {
  cuuint32_t box[3];
  if (!conv_takes_with_box(a, cc_major, box)) return false;
  if (a.split > 1 && (!split_fits(a, a.split) || !a.split_workspace || reinterpret_cast<uintptr_t>(a.split_workspace) % 256 != 0))
    return false;
  const int64_t m = a.n * a.ho * a.wo, k = conv_k(a);
  Params p{};
  p.split = std::max(1, a.split);
  if (p.split > 1) {
    p.flags = static_cast<int*>(a.split_workspace);
    p.partial = reinterpret_cast<float*>(static_cast<char*>(a.split_workspace) + kSplitFlagBytes);
  }
  const bool wide = tile_160(a.o);
  const int64_t c1 = a.input2 ? a.c1 : a.c;  // x's channels
  if (!make_map_4d(p.x, a.input, a.n, a.h, a.w, c1, box) || !make_map(p.w, a.weight, a.o, k, k, wide ? 160 : 128) ||
      (a.input2 && !make_map_4d(p.x2, a.input2, a.n, a.h, a.w, a.c - c1, box)))
    return false;
  const int64_t sc1 = a.shortcut2 ? a.sc_c1 : a.sc_c;  // the shortcut's first part's channels
  if (a.shortcut && (!make_map_4d(p.x3, a.shortcut, a.n, a.h, a.w, sc1, box) ||
                     (a.shortcut2 && !make_map_4d(p.x4, a.shortcut2, a.n, a.h, a.w, a.sc_c - sc1, box))))
    return false;
  // The staged epilogue's output (and residual) maps need 16-byte aligned rows; else the 4-byte stores (not for the
  // phases, whose pixels only the 5-D map places).
  const bool staged = a.upsample_phases ? make_phase_out_map(p.out_map, a.out, a.n, a.h, a.w, a.o / 4)
                                        : make_staged_maps(p, a.out, a.residual, m, a.o, a.o);
  if (a.upsample_phases && !staged) return false;
  p.conv_phase_cols = a.upsample_phases ? int(a.o / 4) : 0;
  p.bias = static_cast<const __nv_bfloat16*>(a.bias);
  p.residual = static_cast<const __nv_bfloat16*>(a.residual);
  p.out = static_cast<__nv_bfloat16*>(a.out);
  p.ldo = a.o;
  p.m = int(m), p.n = int(a.o);
  p.conv_c_steps = int(a.c / kBK), p.conv_c1_steps = int(c1 / kBK), p.conv_kw = int(a.kw), p.conv_ph = a.pad_h, p.conv_pw = a.pad_w;
  p.conv_ho = int(a.ho), p.conv_wo = int(a.wo);
  p.conv_kh = int(a.kh), p.conv_tap_steps = int(a.kh * a.kw * a.c / kBK), p.conv_sc1_steps = int(sc1 / kBK);
  return staged ? launch_linear_form<Epi::kConv>(p, m, k, wide, a.sm_count, stream)
                : launch_linear_form<Epi::kConvDirect>(p, m, k, wide, a.sm_count, stream);
}

