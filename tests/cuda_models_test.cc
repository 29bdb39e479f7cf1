// End-to-end models on cuda:0 against the sd15-tiny goldens (computed in f32 by diffusers/transformers):
// the CLIP text encoder, the UNet and the VAE, in f32 (rel L2 <= 1e-4) and bf16 (rel L2 <= 2e-2; weights and
// activations in bf16, f32 accumulation). Skips with the reason when there is no GPU or no fixture.
//
// The VAE is asserted in f32 only: that is the precision the pipeline runs it in (diffusers' force_upcast;
// SD's VAE overflows in half precision). Its bf16 figure is printed for reference (3.2e-2 rel L2 on an H200,
// 2026-11-29: ~30 chained convolutions compound bf16 rounding) and is not a supported configuration.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "cuda_test_util.h"
#include "models/clip/clip_text_model.h"
#include "models/common/weights.h"
#include "test_util.h"

#include "models/sd/unet.h"
#include "models/sd/unet_config.h"
#include "models/vae/vae.h"
#include "models/vae/vae_config.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

constexpr double kF32Tol = 1e-4;   // f32 on the GPU: reduction order differs from the CPU, nothing else
constexpr double kBf16Tol = 2e-2;  // bf16 weights and activations

double tolerance(DType dt) { return dt == DType::F32 ? kF32Tol : kBf16Tol; }

void expect_close_to_golden(const Tensor& out, const std::string& key, const std::string& what, DType dt,
                            bool asserted = true) {
  const Tensor want = test::golden("sd15-tiny", key);
  ASSERT_EQ(out.shape(), want.shape()) << what;
  ASSERT_EQ(out.device(), Device::cuda(0)) << what;
  const std::vector<float> got = ops::contiguous(out).to_vector(), ref = want.to_vector();
  const double rel = test::rel_l2(got, ref);
  std::printf("[ figures  ] %s (%s) vs %s: rel L2 %.3g, max abs %.3g\n", what.c_str(), std::string(dtype_name(dt)).c_str(),
              key.c_str(), rel, test::max_abs_diff(got, ref));
  if (asserted) EXPECT_LE(rel, tolerance(dt)) << what << " " << dtype_name(dt);
}

TEST(CudaModels, Sd15TinyClipMatchesGolden) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto store = WeightStore::open({(dir / "model/text_encoder/model.safetensors").string()});
  ASSERT_TRUE(store.has_value()) << store.status().message();
  auto cfg = ClipTextConfig::from_file((dir / "model/text_encoder/config.json").string());
  ASSERT_TRUE(cfg.has_value()) << cfg.status().message();
  const std::vector<float> tok = test::golden("sd15-tiny", "tokens.0").to_vector();
  Tensor ids = Tensor::empty({1, int64_t(tok.size())}, DType::I32);
  for (size_t i = 0; i < tok.size(); ++i) ids.data<int32_t>()[i] = int32_t(tok[i]);
  for (DType dt : {DType::F32, DType::BF16}) {
    auto model = ClipTextModel::load(*store, ClipLayout::kTransformers, *cfg, Device::cuda(0), dt);
    ASSERT_TRUE(model.has_value()) << model.status().message();
    auto out = model->forward(ids.to(Device::cuda(0)));
    ASSERT_TRUE(out.has_value()) << out.status().message();
    const Tensor hidden = out->dtype() == DType::F32 ? *out : ops::cast(*out, DType::F32);
    expect_close_to_golden(hidden, "text.cond", "CLIP", dt);
  }
}

TEST(CudaModels, Sd15TinyUnetMatchesGolden) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto store = WeightStore::open({(dir / "model/unet/diffusion_pytorch_model.safetensors").string()});
  ASSERT_TRUE(store.has_value()) << store.status().message();
  auto config = load_unet_config((dir / "model/unet/config.json").string());
  ASSERT_TRUE(config.has_value()) << config.status().message();
  const Tensor x = test::golden("sd15-tiny", "unet.in").to(Device::cuda(0));
  const Tensor ctx = test::golden("sd15-tiny", "unet.context").to(Device::cuda(0));
  for (DType dt : {DType::F32, DType::BF16}) {
    auto unet = UNet::load(*store, UNetLayout::kDiffusers, *config, Device::cuda(0), dt);
    ASSERT_TRUE(unet.has_value()) << unet.status().message();
    for (int t : {999, 1}) {
      auto out = unet->forward(x, Tensor::from_vector({float(t), float(t)}, {2}), ctx);
      ASSERT_TRUE(out.has_value()) << out.status().message();
      expect_close_to_golden(*out, "unet.out.t" + std::to_string(t), "UNet t=" + std::to_string(t), dt);
    }
  }
}

TEST(CudaModels, Sd15TinyVaeMatchesGolden) {
  ATELIER_REQUIRE_CUDA();
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto store = WeightStore::open({(dir / "model/vae/diffusion_pytorch_model.safetensors").string()});
  ASSERT_TRUE(store.has_value()) << store.status().message();
  auto config = VaeConfig::from_file((dir / "model/vae/config.json").string());
  ASSERT_TRUE(config.has_value()) << config.status().message();
  for (DType dt : {DType::F32, DType::BF16}) {
    const bool asserted = dt == DType::F32;
    auto vae = Vae::load(*store, VaeLayout::kDiffusers, *config, Device::cuda(0), dt);
    ASSERT_TRUE(vae.has_value()) << vae.status().message();
    expect_close_to_golden(vae->decode(test::golden("sd15-tiny", "vae.decode.in")), "vae.decode.out", "VAE decode", dt,
                           asserted);
    const VaeMoments m = vae->encode(test::golden("sd15-tiny", "vae.encode.in"));
    expect_close_to_golden(m.mean, "vae.encode.mean", "VAE encode mean", dt, asserted);
  }
}

}  // namespace
}  // namespace atelier
