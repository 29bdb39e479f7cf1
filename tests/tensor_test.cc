#include <gtest/gtest.h>

#include "backend/cpu/cpu_allocator.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace atelier {

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t v = uint16_t(h);
    if (((v >> 10) & 0x1f) == 0x1f && (v & 0x3ff)) continue;  // NaN payloads
    EXPECT_EQ(float_to_f16(f16_to_float(v)), v) << std::hex << h;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);  // halfway -> even (1.0)
  EXPECT_EQ(float_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);  // halfway -> even (1 + 2/1024)
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);               // overflow to inf
  EXPECT_EQ(float_to_f16(5.96046448e-08f), 0x0001);        // smallest subnormal
}

TEST(DType, BF16RoundTrip) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.5f)), 1.5f);
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80);  // tie -> even
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(t.narrow(1, 1, 2).to_vector(), (std::vector<float>{1, 2, 4, 5}));
  EXPECT_EQ(t.select(0, 1).to_vector(), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(t.reshape({3, -1}).shape(), (Shape{3, 2}));
}

TEST(Tensor, DeviceParse) {
  EXPECT_TRUE(Device::parse("cpu").has_value());
  EXPECT_EQ(Device::parse("cuda:1")->index, 1);
  EXPECT_FALSE(Device::parse("tpu").has_value());
  EXPECT_NE(Device::parse("gpu").status().message().find("supported"), std::string::npos);
}

}  // namespace atelier

namespace atelier {
namespace {

// The CPU pool serves a request from a cached block of its own size class or a larger one up to twice its
// size (a batch smaller than the last reuses its blocks), not from one larger than that, and a freed block
// returns to its own class.
TEST(CpuAllocator, ServesSmallerRequestsFromLargerCachedBlocks) {
  CpuAllocator pool;
  constexpr size_t kMiB = size_t(1) << 20;
  { auto big = pool.allocate(8 * kMiB); }
  EXPECT_EQ(pool.bytes_reserved(), 8 * kMiB);
  {
    auto smaller = pool.allocate(5 * kMiB);  // served by the cached 8 MiB block: nothing new reserved
    EXPECT_EQ(pool.bytes_reserved(), 8 * kMiB);
    EXPECT_EQ(pool.bytes_in_use(), 8 * kMiB);
  }
  EXPECT_EQ(pool.bytes_in_use(), 0u);
  {
    auto small = pool.allocate(3 * kMiB);  // 8 MiB is more than twice 3: a block of its own
    EXPECT_EQ(pool.bytes_reserved(), 11 * kMiB);
    auto again = pool.allocate(8 * kMiB);  // the 8 MiB block went back to its class
    EXPECT_EQ(pool.bytes_reserved(), 11 * kMiB);
  }
  pool.release_cached();
  EXPECT_EQ(pool.bytes_reserved(), 0u);
}

}  // namespace
}  // namespace atelier
