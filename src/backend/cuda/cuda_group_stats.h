// Per-channel statistics of a channels-last activation, written by the kernel that produces it, so that a group norm
// of it needs no statistics pass of its own (the design: docs/cuda.md, "Session 51").
//
// The producer is the own convolution's staged epilogue (OwnConvArgs::group_stats, cuda_gemm_wgmma.cu): each 64-row
// half of an output tile is one segment of the output's [N * P] rows, and for each segment s and channel ch it
// writes stats[s * C + ch] = {x at the segment's first row, sum of (x - that), sum of (x - that)^2} over the
// segment's rows, read back from the bf16 tile it stores (the values the output holds). A segment lies inside one
// image when P (pixels per image) is a multiple of kStatsSegmentRows. The consumer,
// CudaBackend::group_norm_nhwc_from_stats (cuda_group_norm_nhwc.cu), merges a (sample, group)'s segments and
// channels in double about one reference (each item a chunk of one channel: its shift plus the channel's offset,
// where the norm has one) and applies the norm as the three-kernel path's apply kernel does.
#pragma once
#include <cstdint>

namespace atelier::cuda {

struct ChannelStats {
  float shift;  // the channel's value at the segment's first row
  float dev;    // sum over the segment's rows of (x - shift)
  float sq;     // sum of (x - shift)^2
};

constexpr int kStatsSegmentRows = 64;

// The ChannelStats a producer of m rows and c channels writes (m a multiple of kStatsSegmentRows).
inline int64_t channel_stats_count(int64_t m, int64_t c) { return m / kStatsSegmentRows * c; }

}  // namespace atelier::cuda
