// Batched launches on cuda:0 (Backend::run_batched, backend/cuda/cuda_batch.cc) and a recording's borrowed output
// (GraphRunner::Result::kBorrowed): a batch's work gives the bits the same ops give eagerly, an earlier batch's
// graph is updated in place with the next one's parameters, host copies inside a batch see the work before them,
// a throw drops the work gathered, and SD generations with batches equal those without, bit for bit. Skips with
// the reason without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/graph_runner.h"
#include "cuda_sd_test_util.h"
#include "cuda_test_util.h"
#include "ops_test_util.h"
#include "pipeline/sd_model.h"
#include "pipeline/sd_pipeline.h"
#include "test_util.h"

namespace atelier {
namespace {

using test::cuda0;
using test::random_tensor;
using test::to_gpu;

// Batches on (the default) for a scope, whatever the environment says, then back to the environment's setting.
struct BatchesOn {
  explicit BatchesOn(bool on = true) { cuda::set_launch_batches(on); }
  ~BatchesOn() { cuda::set_launch_batches(!env_set_to_zero()); }
  static bool env_set_to_zero() {
    const char* v = std::getenv("ATELIER_LAUNCH_BATCHES");
    return v && std::string(v) == "0";
  }
};

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  const Tensor ha = ops::contiguous(a.to(Device::cpu())), hb = ops::contiguous(b.to(Device::cpu()));
  ASSERT_EQ(ha.shape(), hb.shape()) << what;
  ASSERT_EQ(ha.nbytes(), hb.nbytes()) << what;
  EXPECT_EQ(std::memcmp(ha.raw(), hb.raw(), ha.nbytes()), 0) << what << ": the batched result differs";
}

// A step boundary's kinds of work: per-row linear combinations, a concatenation, timesteps uploaded from the host.
struct BoundaryWork {
  Tensor combined, doubled, t;
};
BoundaryWork boundary_work(const Tensor& x, const Tensor& eps, float a, float b) {
  BoundaryWork w;
  w.combined = ops::lincomb_per_sample({x, eps}, {1.0f, a, 1.0f, b});
  w.doubled = ops::concat({w.combined, w.combined}, 0);
  w.t = Tensor::from_vector(std::vector<float>{a * 100.0f, b * 100.0f}, {2}).to(x.device());
  return w;
}

TEST(CudaLaunchBatch, GathersKernelsIntoOneLaunchWithTheSameBitsAndUpdatesItsGraph) {
  ATELIER_REQUIRE_CUDA();
  BatchesOn on;
  cuda::CudaBackend& be = test::cuda_be();
  const Tensor x = to_gpu(random_tensor({2, 4, 16, 16}, 1)), eps = to_gpu(random_tensor({2, 4, 16, 16}, 2));
  const float coeffs[][2] = {{-0.25f, 0.5f}, {0.125f, -2.0f}, {3.0f, 0.75f}};
  const cuda::LaunchBatchStats before = cuda::launch_batch_stats();
  for (const auto& c : coeffs) {
    const BoundaryWork eager = boundary_work(x, eps, c[0], c[1]);
    BoundaryWork batched;
    be.run_batched([&] { batched = boundary_work(x, eps, c[0], c[1]); });
    expect_same_bits(batched.combined, eager.combined, "lincomb");
    expect_same_bits(batched.doubled, eager.doubled, "concat");
    expect_same_bits(batched.t, eager.t, "timesteps");
  }
  const cuda::LaunchBatchStats after = cuda::launch_batch_stats();
  EXPECT_EQ(after.launched - before.launched, 3);
  EXPECT_EQ(after.paused - before.paused, 0);
  // The first batch of this shape makes its graph (unless an earlier test left one of the same kernels); the
  // others take their new coefficients and timesteps into it in place.
  EXPECT_LE(after.instantiated - before.instantiated, 1);
  EXPECT_GE(after.updated - before.updated, 2);
}

TEST(CudaLaunchBatch, HostCopiesAndMarksInsideABatchSeeTheWorkBeforeThem) {
  ATELIER_REQUIRE_CUDA();
  BatchesOn on;
  cuda::CudaBackend& be = test::cuda_be();
  const Tensor x = to_gpu(random_tensor({1, 4, 64, 64}, 3));
  const Tensor noise_host = random_tensor({1, 4, 64, 64}, 4);  // 64 KB: through the pinned staging, not inline
  Tensor doubled_host, sum;
  const cuda::LaunchBatchStats before = cuda::launch_batch_stats();
  be.run_batched([&] {
    const Tensor doubled = ops::affine(x, 2.0f);
    doubled_host = doubled.to(Device::cpu());  // reads what the batch computed so far
    be.wait_for_mark(be.mark_queue());
    sum = ops::add(doubled, noise_host.to(cuda0()));
  });
  const cuda::LaunchBatchStats after = cuda::launch_batch_stats();
  expect_same_bits(doubled_host, ops::affine(x, 2.0f), "device-to-host copy inside a batch");
  expect_same_bits(sum, ops::add(ops::affine(x, 2.0f), noise_host.to(cuda0())), "host-to-device copy inside a batch");
  EXPECT_GE(after.paused - before.paused, 3);  // the copy out, the mark, the wait, the copy in (empty pauses count too)
  EXPECT_GE(after.launched - before.launched, 2);
}

TEST(CudaLaunchBatch, AThrowDropsTheWorkGatheredAndLaterBatchesRun) {
  ATELIER_REQUIRE_CUDA();
  BatchesOn on;
  cuda::CudaBackend& be = test::cuda_be();
  Tensor target = to_gpu(Tensor::full({4096}, 1.0f));
  EXPECT_THROW(be.run_batched([&] {
    be.fill(target, 5.0f);
    throw std::runtime_error("a failure inside the batch");
  }),
               std::runtime_error);
  expect_same_bits(target, Tensor::full({4096}, 1.0f), "dropped work");
  EXPECT_TRUE(cuda::launch_batches()) << "a throw from the caller's function does not switch batches off";
  be.run_batched([&] { be.fill(target, 7.0f); });
  expect_same_bits(target, Tensor::full({4096}, 7.0f), "the next batch");
}

TEST(CudaLaunchBatch, NestedOrInsideARecordingTheWorkJoinsTheOuterCapture) {
  ATELIER_REQUIRE_CUDA();
  BatchesOn on;
  cuda::CudaBackend& be = test::cuda_be();
  const Tensor x = to_gpu(random_tensor({3, 257}, 5));
  Tensor y, z;
  const cuda::LaunchBatchStats before = cuda::launch_batch_stats();
  be.run_batched([&] {
    y = ops::affine(x, 3.0f);
    be.run_batched([&] { z = ops::add(y, x); });
  });
  EXPECT_EQ(cuda::launch_batch_stats().launched - before.launched, 1);
  expect_same_bits(z, ops::affine(x, 4.0f), "nested batch");
  // Inside a recording: the recording holds the work and replays it.
  Tensor in = to_gpu(Tensor::full({257}, 2.0f)), out;
  const auto work = be.capture([&] { be.run_batched([&] { out = ops::affine(in, 0.5f); }); });
  ASSERT_TRUE(work);
  EXPECT_EQ(cuda::launch_batch_stats().launched - before.launched, 1);
  work->replay();
  expect_same_bits(out, Tensor::full({257}, 1.0f), "a batch inside a recording");
}

TEST(CudaGraph, BorrowedOutputIsTheRecordingsBufferAndFreshIsACopy) {
  ATELIER_REQUIRE_CUDA();
  GraphRunner runner;
  const auto fn = [](const std::vector<Tensor>& in) { return ops::affine(in[0], 2.0f, 1.0f); };
  std::vector<const void*> borrowed;
  for (int call = 0; call < 4; ++call) {
    const Tensor x = to_gpu(random_tensor({2, 300}, 50 + call));
    const Tensor b = runner.run({x}, cuda0(), fn, GraphRunner::Result::kBorrowed);
    expect_same_bits(b, ops::affine(x, 2.0f, 1.0f), "borrowed, call " + std::to_string(call));
    if (call >= 1) borrowed.push_back(b.raw());  // call 0 is eager: fn's own output
    const Tensor f = runner.run({x}, cuda0(), fn);
    expect_same_bits(f, b, "fresh, call " + std::to_string(call));
    if (call >= 1) EXPECT_NE(f.raw(), b.raw()) << "a fresh result is a copy";
  }
  ASSERT_EQ(borrowed.size(), 3u);
  EXPECT_EQ(borrowed[0], borrowed[1]);
  EXPECT_EQ(borrowed[1], borrowed[2]);
}

// Generations through SdPipeline::denoise (whose steps batch their boundary work and borrow the UNet's output)
// with batches on and off: the same image, byte for byte, for a sampler with history (DPM++ 2M) and an ancestral
// one that uploads noise in the middle of its update (Euler a).
TEST(CudaLaunchBatch, SdGenerationsEqualThoseWithoutBatches) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto model = test::load_tiny_sd_on_gpu(dir);
  ASSERT_TRUE(model.has_value()) << model.status().message();
  SdPipeline pipe(*model);
  GenerateRequest r = test::tiny_gpu_request(6);
  r.seed = 42;
  // First a generation that makes the UNet's recording and the per-shape choices, so that both compared runs
  // replay the same recording (an eager first call may pick its kernels differently).
  ASSERT_TRUE(pipe.generate(r).has_value());
  for (const char* sampler : {"dpmpp_2m", "euler_a"}) {
    r.sampler = sampler;
    std::vector<uint8_t> pixels[2];
    int64_t launched[2] = {0, 0};
    for (int on = 0; on < 2; ++on) {
      BatchesOn batches(on == 1);
      const int64_t before = cuda::launch_batch_stats().launched;
      auto res = pipe.generate(r);
      ASSERT_TRUE(res.has_value()) << res.status().message();
      ASSERT_EQ(res->images.size(), 1u);
      pixels[on] = res->images[0].image.pixels;
      launched[on] = cuda::launch_batch_stats().launched - before;
    }
    EXPECT_EQ(pixels[0], pixels[1]) << sampler << ": the image with batched launches differs";
    EXPECT_EQ(launched[0], 0) << sampler;
    EXPECT_GE(launched[1], 2 * r.steps) << sampler << ": two batches a step (before and after the UNet call)";
  }
}

}  // namespace
}  // namespace atelier
