// Contiguous copies on cuda:0 as kernels (CudaBackend::copy, CudaBackend::copy_many; cuda_copy.cu): the same bits as
// the CPU's copies for plain runs of bytes of every size (whole 16-byte chunks, a partial last chunk, a few bytes),
// up to eight of them per launch, the pairs the kernel does not take (casts, strided views) between launches, and
// the driver's copies where ATELIER_DRIVER_COPIES is on; uploads a fill writes in pieces (Tensor::from_host). Skips with the reason without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_upload.h"
#include "backend/ops.h"
#include "io/safetensors.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::cuda0;
using test::random_tensor;
using test::to_gpu;

// Kernel copies for the test (whatever ATELIER_DRIVER_COPIES says), the setting it found restored after.
struct DriverCopiesScope {
  bool was = cuda::driver_copies();
  DriverCopiesScope() { cuda::set_driver_copies(false); }
  ~DriverCopiesScope() { cuda::set_driver_copies(was); }
};

// Every value of a GPU tensor as the CPU sees it, in f32.
std::vector<float> values(const Tensor& x) { return ops::cast(ops::contiguous(x).to(Device::cpu()), DType::F32).to_vector(); }

TEST(CudaCopy, ManyPairsMatchTheCpuInFewLaunches) {
  ATELIER_REQUIRE_CUDA();
  DriverCopiesScope restore;
  // A replay's inputs (SD's CFG latents, its timesteps, its context), then sizes around the 16-byte chunk and
  // other dtypes: ten plain runs of bytes, so two launches (eight and two).
  const std::vector<std::pair<Shape, DType>> runs = {
      {{2, 4, 64, 64}, DType::F32}, {{2}, DType::F32},  {{2, 77, 768}, DType::BF16}, {{1}, DType::F16},
      {{3}, DType::F32},            {{4}, DType::F32},  {{37}, DType::BF16},         {{5, 9}, DType::F16},
      {{1000003}, DType::BF16},     {{6}, DType::BF16}};
  std::vector<Tensor> srcs, dsts;
  std::vector<std::pair<Tensor, Tensor>> pairs;
  uint32_t seed = 70;
  for (const auto& [shape, dt] : runs) {
    srcs.push_back(to_gpu(ops::cast(random_tensor(shape, seed++), dt)));
    dsts.push_back(Tensor::empty(shape, dt, cuda0()));
    pairs.emplace_back(dsts.back(), srcs.back());
  }
  int64_t before = cuda::copy_many_launches();
  backend_for(cuda0()).copy_many(pairs);
  EXPECT_EQ(cuda::copy_many_launches() - before, 2);
  for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(values(dsts[i]), values(srcs[i])) << "pair " << i;

  // A cast and a strided destination in the middle: the runs before them go in one launch, those after in another.
  const Tensor x = to_gpu(random_tensor({8, 8}, 90)), y = to_gpu(random_tensor({5, 3}, 91)), z = to_gpu(random_tensor({33}, 92));
  Tensor dx = Tensor::empty({8, 8}, DType::F32, cuda0()), cast = Tensor::empty({8, 8}, DType::BF16, cuda0());
  Tensor wide = Tensor::zeros({5, 7}, DType::F32, cuda0()), dz = Tensor::empty({33}, DType::F32, cuda0());
  before = cuda::copy_many_launches();
  backend_for(cuda0()).copy_many({{dx, x}, {cast, x}, {wide.narrow(1, 2, 3), y}, {dz, z}});
  EXPECT_EQ(cuda::copy_many_launches() - before, 2);
  EXPECT_EQ(values(dx), values(x));
  EXPECT_EQ(values(cast), values(ops::cast(x, DType::BF16)));
  EXPECT_EQ(values(wide.narrow(1, 2, 3)), values(y));
  EXPECT_EQ(values(wide.narrow(1, 0, 2)), std::vector<float>(10, 0.0f));
  EXPECT_EQ(values(dz), values(z));

  // Views that start off a 16-byte boundary go through copy.
  Tensor off = Tensor::empty({9}, DType::F32, cuda0());
  before = cuda::copy_many_launches();
  backend_for(cuda0()).copy_many({{off.narrow(0, 1, 8), x.narrow(0, 0, 1).reshape({8})}});
  EXPECT_EQ(cuda::copy_many_launches() - before, 0);
  EXPECT_EQ(values(off.narrow(0, 1, 8)), values(x.narrow(0, 0, 1).reshape({8})));
}

TEST(CudaCopy, ContiguousCopiesAreKernelsUnlessTheDriverIsAsked) {
  ATELIER_REQUIRE_CUDA();
  DriverCopiesScope restore;
  const Tensor x = to_gpu(ops::cast(random_tensor({3, 1001}, 93), DType::BF16));  // 6006 bytes: a partial chunk
  const Tensor even = to_gpu(ops::cast(random_tensor({3, 1000}, 94), DType::BF16));  // 6000 bytes: whole chunks
  for (const bool driver : {false, true}) {
    cuda::set_driver_copies(driver);
    const int64_t before = cuda::copy_many_launches();
    const Tensor c = ops::clone(x);
    EXPECT_EQ(cuda::copy_many_launches() - before, driver ? 0 : 1) << "driver copies " << driver;
    EXPECT_EQ(values(c), values(x)) << "driver copies " << driver;
    // A concatenation along the first dimension: parts of whole 16-byte chunks are plain runs of bytes, one launch
    // for both; a part that starts off a 16-byte boundary (the second 6006-byte part) is a driver copy, so those
    // parts take one launch (the first part) too, and one copy engine transfer.
    for (const Tensor* part : {&even, &x}) {
      const Tensor second = ops::clone(*part);  // cloned before the count: the clone is a launch of its own
      const int64_t before_concat = cuda::copy_many_launches();
      const Tensor cat = ops::concat({*part, second}, 0);
      EXPECT_EQ(cuda::copy_many_launches() - before_concat, driver ? 0 : 1) << "driver copies " << driver << " " << shape_str(part->shape());
      const Tensor host = part->to(Device::cpu());
      EXPECT_EQ(values(cat), values(ops::concat({host, host}, 0))) << "driver copies " << driver << " " << shape_str(part->shape());
    }
  }
}

// Host values of up to 1 KB reach the device in a kernel's parameters (a step's timesteps and CFG scales), larger
// ones through the pinned staging buffers; both give the host's bits.
TEST(CudaCopy, SmallUploadsRideInAKernelsParameters) {
  ATELIER_REQUIRE_CUDA();
  DriverCopiesScope restore;
  for (const int64_t n : {1, 2, 3, 16, 17, 255, 256, 257}) {  // f32 values: 4 bytes to 1028
    const Tensor host = random_tensor({n}, 95);
    const int64_t before = cuda::inline_uploads();
    const Tensor dev = host.to(cuda0());
    EXPECT_EQ(cuda::inline_uploads() - before, n * 4 <= int64_t(cuda::kInlineUploadBytes) ? 1 : 0) << n << " values";
    EXPECT_EQ(values(dev), host.to_vector()) << n << " values";
  }
  const Tensor bytes = ops::cast(random_tensor({7}, 96), DType::BF16);  // 14 bytes, 2 bytes into the buffer
  Tensor dst = Tensor::zeros({9}, DType::BF16, cuda0());
  Tensor part = dst.narrow(0, 1, 7);
  backend_for(cuda0()).copy_between_devices(part, bytes);
  EXPECT_EQ(values(dst.narrow(0, 1, 7)), ops::cast(bytes, DType::F32).to_vector());
  EXPECT_EQ(values(dst.narrow(0, 0, 1)), std::vector<float>{0.0f});  // the bytes on either side untouched
  EXPECT_EQ(values(dst.narrow(0, 8, 1)), std::vector<float>{0.0f});
  cuda::set_driver_copies(true);
  const int64_t before = cuda::inline_uploads();
  EXPECT_EQ(values(random_tensor({5}, 97).to(cuda0())), random_tensor({5}, 97).to_vector());
  EXPECT_EQ(cuda::inline_uploads() - before, 0);
}

// Tensor::from_host on the GPU (CudaBackend::upload): the fill is asked for the tensor's bytes in order, in pieces no
// larger than a staging slot that cover it exactly (one piece for a tensor of a kernel's parameters), and the device
// ends up with what it wrote: under a slot, one slot, and several with a partial last one.
TEST(CudaCopy, UploadsFilledInPiecesHoldWhatTheFillWrote) {
  ATELIER_REQUIRE_CUDA();
  DriverCopiesScope restore;
  auto pattern = [](size_t i) { return uint8_t((i * 131u + (i >> 13)) & 0xff); };
  constexpr size_t kSlot = cuda::PinnedStaging::kSlotBytes;
  for (const size_t bytes : {size_t(600), size_t(5000), kSlot, 2 * kSlot + 4098}) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes");
    std::vector<std::pair<size_t, size_t>> pieces;
    const int64_t inline_before = cuda::inline_uploads();
    const Tensor dev = Tensor::from_host({int64_t(bytes / 2)}, DType::BF16, cuda0(), [&](void* dst, size_t off, size_t len) {
      pieces.emplace_back(off, len);
      for (size_t i = 0; i < len; ++i) static_cast<uint8_t*>(dst)[i] = pattern(off + i);
    });
    EXPECT_EQ(cuda::inline_uploads() - inline_before, bytes <= cuda::kInlineUploadBytes ? 1 : 0);
    size_t next = 0;
    for (const auto& [off, len] : pieces) {
      EXPECT_EQ(off, next);
      EXPECT_LE(len, kSlot);
      next += len;
    }
    EXPECT_EQ(next, bytes);
    EXPECT_EQ(pieces.size(), (bytes + kSlot - 1) / kSlot);
    const Tensor host = dev.to(Device::cpu());
    const auto* got = static_cast<const uint8_t*>(host.raw());
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; ++i) wrong += got[i] != pattern(i);
    EXPECT_EQ(wrong, 0u);
  }
}

// A checkpoint's tensor loaded onto the GPU, converted on its way through the staging slots (f16 -> bf16 over three
// slots) or copied as stored (bf16), has the bits of the same load on the CPU.
TEST(CudaCopy, CheckpointTensorsLoadOntoTheGpuAsOnTheCpu) {
  ATELIER_REQUIRE_CUDA();
  test::TempDir dir;
  std::filesystem::create_directories(dir.path);
  const std::string path = (dir.path / "w.safetensors").string();
  const int64_t n = int64_t(cuda::PinnedStaging::kSlotBytes) + 12345;  // bf16: 2 slots and a part of a third
  const Tensor values32 = random_tensor({n}, 98);
  ASSERT_TRUE(write_safetensors(path, {{"h", ops::cast(values32, DType::F16)}, {"b", ops::cast(values32, DType::BF16)}}).is_ok());
  auto file = SafeTensorsFile::open(path);
  ASSERT_TRUE(file.has_value()) << file.status().message();
  for (const char* name : {"h", "b"}) {
    SCOPED_TRACE(name);
    const TensorInfo* info = (*file)->find(name);
    ASSERT_NE(info, nullptr);
    auto cpu = (*file)->load(*info, DType::BF16);
    auto gpu = (*file)->load(*info, DType::BF16, cuda0());
    ASSERT_TRUE(cpu.has_value() && gpu.has_value());
    EXPECT_EQ(gpu->device(), cuda0());
    const Tensor back = gpu->to(Device::cpu());
    EXPECT_EQ(std::memcmp(back.raw(), cpu->raw(), cpu->nbytes()), 0);
  }
}

}  // namespace
}  // namespace atelier
