// Channels-last concatenation on cuda:0 in one pass (CudaBackend::concat_channels_last, a UNet's skip
// concatenations): the same bits as the CPU's part-by-part copies, and the part-by-part path where the kernel
// does not take the case (channel runs that are not whole 16-byte chunks, more than four parts, the switch off).
// Skips with the reason without a GPU.
#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/ops.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::channels_last;
using test::cuda0;
using test::random_tensor;
using test::to_gpu;

struct OnePassScope {
  ~OnePassScope() { cuda::set_concat_one_pass(true); }
};

// Concatenates `shapes` (channels-last, `dt`) on the GPU and checks every value against the CPU's result and
// whether the one-pass kernel ran.
void check(const std::vector<Shape>& shapes, DType dt, bool one_pass) {
  std::vector<Tensor> cpu, gpu;
  uint64_t seed = 40;
  for (const Shape& s : shapes) {
    Tensor x = ops::cast(random_tensor(s, seed++), dt);
    cpu.push_back(x);
    gpu.push_back(channels_last(to_gpu(x)));
    ASSERT_TRUE(gpu.back().is_channels_last());
  }
  const int64_t before = cuda::concat_one_pass_launches();
  const Tensor got = ops::concat(gpu, 1);
  EXPECT_EQ(cuda::concat_one_pass_launches() - before, one_pass ? 1 : 0) << shape_str(shapes[0]) << " x " << shapes.size();
  EXPECT_TRUE(got.is_channels_last());
  const std::vector<float> want = ops::cast(ops::concat(cpu, 1), DType::F32).to_vector();
  const std::vector<float> have = ops::cast(ops::contiguous(got), DType::F32).to_vector();
  ASSERT_EQ(have.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(have[i], want[i]) << "element " << i << " of " << shape_str(got.shape());
}

TEST(CudaConcat, ChannelsLastPartsInOnePassMatchTheCpu) {
  ATELIER_REQUIRE_CUDA();
  OnePassScope restore;
  check({{2, 640, 16, 16}, {2, 320, 16, 16}}, DType::BF16, true);       // SD's up path at 512², CFG
  check({{3, 8, 5, 7}, {3, 16, 5, 7}, {3, 8, 5, 7}}, DType::BF16, true);  // three parts, odd pixel counts
  check({{1, 8, 9, 9}, {1, 24, 9, 9}}, DType::F16, true);                // 16 and 48 bytes per pixel, f16
  check({{1, 3, 5, 7}, {1, 5, 5, 7}}, DType::BF16, false);               // 6 and 10 bytes: part by part
  check({{1, 8, 4, 4}, {1, 8, 4, 4}, {1, 8, 4, 4}, {1, 8, 4, 4}, {1, 8, 4, 4}}, DType::BF16, false);  // five parts
  cuda::set_concat_one_pass(false);
  check({{2, 640, 16, 16}, {2, 320, 16, 16}}, DType::BF16, false);
}

}  // namespace
}  // namespace atelier
