// Inpainting on cuda:0 (pipeline/inpaint.h; the hold on the x0 estimate inside the batch step's recorded update):
// with the tiny model in f32, the run follows the CPU's (the same noise, the reduction order apart), the x0 estimate
// is held to the init latents where the image is kept at every call, and the unmasked pixels come back unchanged.
// Skips with the reason without a GPU or the fixture.
#include <gtest/gtest.h>

#include "backend/ops.h"
#include "cuda_sd_test_util.h"
#include "test_util.h"

namespace atelier {
namespace {

constexpr int kSide = 128;
constexpr double kF32RunTol = 1e-3;  // rel L2 of the final latents after 6 f32 steps: reduction order only
constexpr double kHeldTol = 1e-4;    // max abs of the x0 estimate against the init latents where kept

std::vector<float> vec(const Tensor& t) { return ops::contiguous(t.to(Device::cpu())).to_vector(); }

struct InpaintRun {
  Tensor latents;        // [1, 4, 16, 16] on the host: what denoise returned
  double worst_held = 0;  // over every call
};

// The top half of the init picture inpainted (mask blur 0: latent rows 0-7), Euler a, 6 steps, on `model`'s device.
InpaintRun inpaint(const std::shared_ptr<SdModel>& model, const Image& init) {
  Image mask{kSide, kSide, 1, std::vector<uint8_t>(size_t(kSide) * kSide, 0)};
  std::fill(mask.pixels.begin(), mask.pixels.begin() + kSide * kSide / 2, 255);
  GenerateRequest r = test::tiny_gpu_request(6);
  r.seed = 42;
  r.rng = "cpu";
  r.mask_blur_x = r.mask_blur_y = 0;
  SdPipeline pipe(model);
  auto plan = pipe.plan(r, &init, &mask);
  EXPECT_TRUE(plan.has_value()) << plan.status().message();
  auto s = pipe.prepare_sample(*plan, 0);
  EXPECT_TRUE(s.has_value()) << s.status().message();
  auto cond = pipe.encode_prompt(r.prompt, 1, false), uncond = pipe.encode_prompt("", 1, false);
  EXPECT_TRUE(cond && uncond);
  InpaintRun run;
  const Tensor z = s->kept.latents;
  const int64_t h = z.size(2);
  const ProgressCallback held = [&](const StepProgress& p) {
    run.worst_held = std::max(run.worst_held, test::max_abs_diff(vec(p.denoised->narrow(2, h / 2, h / 2)),
                                                                 vec(z.narrow(2, h / 2, h / 2))));
    return true;
  };
  auto out = pipe.denoise({s->sampler.get()}, s->latents, *cond, *uncond, r.cfg_scale, 0, held, nullptr, {s->kept});
  EXPECT_TRUE(out.has_value()) << out.status().message();
  if (out) run.latents = out->to(Device::cpu());
  EXPECT_EQ(vec(run.latents.narrow(2, h / 2, h / 2)), vec(z.narrow(2, h / 2, h / 2)));
  return run;
}

TEST(CudaInpaint, FollowsTheCpuAndHoldsTheKeptLatents) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const Image init = image_from_tensor(test::golden("sd15-tiny", "img2img.init"), 0);
  SdLoadOptions lo;
  lo.compute_hash = false;
  lo.dtype = DType::F32;
  auto cpu = load_sd_model((dir / "model").string(), lo);
  lo.device = test::cuda0();
  auto gpu = load_sd_model((dir / "model").string(), lo);
  ASSERT_TRUE(cpu && gpu);
  const InpaintRun want = inpaint(*cpu, init), got = inpaint(*gpu, init);
  ASSERT_TRUE(want.latents.defined() && got.latents.defined());
  EXPECT_LE(got.worst_held, kHeldTol);
  const double rel = test::rel_l2(vec(got.latents), vec(want.latents));
  EXPECT_LE(rel, kF32RunTol);
  std::printf("[ figures ] inpainting on cuda:0 (f32) against the CPU: final latents rel L2 %.2e, x0 held to %.2e\n", rel,
              got.worst_held);
}

// The whole request on the GPU (bf16, the default): the pixels outside the blurred mask are the start image's.
TEST(CudaInpaint, GenerateKeepsTheUnmaskedPixels) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto model = test::load_tiny_sd_on_gpu(dir);
  ASSERT_TRUE(model) << model.status().message();
  const Image init = image_from_tensor(test::golden("sd15-tiny", "img2img.init"), 0);
  Image mask{kSide, kSide, 1, std::vector<uint8_t>(size_t(kSide) * kSide, 0)};
  std::fill(mask.pixels.begin(), mask.pixels.begin() + kSide * kSide / 2, 255);  // the top half
  const std::string dir_out = ::testing::TempDir();
  ASSERT_TRUE(write_png(dir_out + "/cuda_inpaint_init.png", init).is_ok());
  ASSERT_TRUE(write_png(dir_out + "/cuda_inpaint_mask.png", mask).is_ok());
  GenerateRequest r = test::tiny_gpu_request(6);
  r.init_image = dir_out + "/cuda_inpaint_init.png";
  r.mask = dir_out + "/cuda_inpaint_mask.png";
  r.seed = 7;
  auto res = SdPipeline(*model).generate(r);
  ASSERT_TRUE(res.has_value()) << res.status().message();
  const Image& out = res->images.front().image;
  ASSERT_EQ(out.pixels.size(), init.pixels.size());
  const size_t first_kept = size_t(kSide / 2 + 10) * kSide * 3;  // blur 4: 10 rows below the mask's edge on
  for (size_t i = first_kept; i < out.pixels.size(); ++i) ASSERT_EQ(out.pixels[i], init.pixels[i]) << i;
  size_t changed = 0;
  for (size_t i = 0; i < size_t(kSide / 2 - 10) * kSide * 3; ++i) changed += out.pixels[i] != init.pixels[i];
  EXPECT_GT(changed, size_t(kSide) * (kSide / 2 - 10));
}

}  // namespace
}  // namespace atelier
