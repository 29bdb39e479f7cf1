// Z-Image transformer vs the zimage-tiny goldens, through the diffusers folder and the original single file.
#include <gtest/gtest.h>

#include "models/zimage/zimage_transformer.h"
#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;
constexpr double kOutTol = 1e-5;
// fp8 blocks against the f32 goldens: measured 0.038 (2026-11-30; one fp8 linear alone is ~0.03, fp8_test.cc);
// a wrong scale, row or rounding mode moves the output by O(1).
constexpr double kFp8Tol = 0.06;

fs::path layout_file(const fs::path& dir, ZImageLayout layout) {
  return layout == ZImageLayout::kDiffusers ? dir / "model/transformer/diffusion_pytorch_model.safetensors"
                                            : dir / "zimage-tiny-transformer.original.safetensors";
}

// The zimage-tiny transformer from its diffusers folder, and its config.
Expected<std::pair<ZImageTransformer, ZImageConfig>> load_tiny_diffusers(const fs::path& dir) {
  ATELIER_ASSIGN_OR_RETURN(ZImageConfig config, ZImageConfig::from_file((dir / "model/transformer/config.json").string()));
  ATELIER_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open({layout_file(dir, ZImageLayout::kDiffusers).string()}));
  ATELIER_ASSIGN_OR_RETURN(ZImageTransformer model, ZImageTransformer::load(store, config, Device::cpu()));
  return std::pair{std::move(model), std::move(config)};
}

TEST(ZImageTransformer, DetectsLayoutsAndConfig) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto from_json = ZImageConfig::from_file((dir / "model/transformer/config.json").string());
  ASSERT_TRUE(from_json) << from_json.status().message();
  for (ZImageLayout layout : {ZImageLayout::kDiffusers, ZImageLayout::kOriginal}) {
    auto store = WeightStore::open({layout_file(dir, layout).string()});
    ASSERT_TRUE(store) << store.status().message();
    EXPECT_TRUE(is_zimage_transformer(*store));
    EXPECT_EQ(*detect_zimage_layout(*store), layout);
    auto c = ZImageConfig::detect(*store);
    ASSERT_TRUE(c) << c.status().message();
    EXPECT_EQ(c->dim, from_json->dim);
    EXPECT_EQ(c->n_heads, from_json->n_heads);
    EXPECT_EQ(c->n_layers, from_json->n_layers);
    EXPECT_EQ(c->n_refiner_layers, from_json->n_refiner_layers);
    EXPECT_EQ(c->cap_feat_dim, from_json->cap_feat_dim);
    EXPECT_EQ(c->in_channels, from_json->in_channels);
    EXPECT_EQ(c->axes_dims, from_json->axes_dims);
  }
  auto vae = WeightStore::open({(dir / "model/vae/diffusion_pytorch_model.safetensors").string()});
  ASSERT_TRUE(vae);
  EXPECT_FALSE(is_zimage_transformer(*vae));
}

TEST(ZImageTransformer, OutputsMatchGoldensThroughBothLayouts) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto config = ZImageConfig::from_file((dir / "model/transformer/config.json").string());
  ASSERT_TRUE(config) << config.status().message();
  const Tensor x = test::golden("zimage-tiny", "transformer.in.x");
  const Tensor cap = test::golden("zimage-tiny", "transformer.in.cap");
  for (ZImageLayout layout : {ZImageLayout::kDiffusers, ZImageLayout::kOriginal}) {
    auto store = WeightStore::open({layout_file(dir, layout).string()});
    ASSERT_TRUE(store) << store.status().message();
    auto model = ZImageTransformer::load(*store, *config, Device::cpu());
    ASSERT_TRUE(model) << model.status().message();
    for (const auto& [t, key] : {std::pair{1.0f, "transformer.out.t1.0"}, {0.5f, "transformer.out.t0.5"}}) {
      auto out = model->forward(x, t, cap);
      ASSERT_TRUE(out) << out.status().message();
      const Tensor g = test::golden("zimage-tiny", key);
      ASSERT_EQ(out->shape(), g.shape());
      EXPECT_REL_L2_LE(out->to_vector(), g.to_vector(), kOutTol);
      std::printf("[zimage] %s (%s) rel L2 %.3g\n", key, layout == ZImageLayout::kDiffusers ? "diffusers" : "original",
                  test::rel_l2(out->to_vector(), g.to_vector()));
    }
  }
}

// Op counts (depth-0 op ranges by name) of one traced forward at t = 0.5, its output checked against the golden.
std::map<std::string, int> traced_forward_ops(const ZImageTransformer& model) {
  return test::count_by_name(test::top_level_ops([&] {
    auto out = model.forward(test::golden("zimage-tiny", "transformer.in.x"), 0.5f, test::golden("zimage-tiny", "transformer.in.cap"));
    ASSERT_TRUE(out) << out.status().message();
    EXPECT_LE(test::rel_l2(out->to_vector(), test::golden("zimage-tiny", "transformer.out.t0.5").to_vector()), kOutTol);
  }));
}

// The SwiGLU feed-forward of every block (noise and context refiners, layers) is one GEMM over the stacked
// [w3; w1] and one glu pass (not two GEMMs, a SiLU pass and a product), with the goldens' output.
TEST(ZImageTransformer, FeedForwardIsOneStackedGemmAndOneGlu) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto loaded = load_tiny_diffusers(dir);
  ASSERT_TRUE(loaded) << loaded.status().message();
  auto& [model, config] = *loaded;
  EXPECT_EQ(traced_forward_ops(model)["glu"], 2 * config.n_refiner_layers + config.n_layers);
}

// Each block's q/k/v is one GEMM over the stacked [to_q; to_k; to_v] and the q/k RMS norms run inside the
// rope pass: per modulated block five GEMMs (adaLN, q/k/v, out, [w3; w1], w2), per context-refiner block
// four; two ropes per block; the only rms_norm ops are the caption embedder's and the context refiner's
// unmodulated attention_norm1 / ffn_norm1.
TEST(ZImageTransformer, QkvIsOneGemmAndTheQkNormsRunInTheRope) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto loaded = load_tiny_diffusers(dir);
  ASSERT_TRUE(loaded) << loaded.status().message();
  auto& [model, config] = *loaded;
  auto n = traced_forward_ops(model);
  const int modulated = config.n_refiner_layers + config.n_layers, refiner = config.n_refiner_layers;
  constexpr int kOtherGemms = 6;  // x embedder, timestep MLP (2), caption linear, final adaLN and linear
  EXPECT_EQ(n["linear"], 5 * modulated + 4 * refiner + kOtherGemms);
  EXPECT_EQ(n["rope"], 2 * (modulated + refiner));
  EXPECT_EQ(n["rms_norm"], 1 + 2 * refiner);
}

// --dtype fp8 (block projections in e4m3): within a few percent of the f32 goldens.
TEST(ZImageTransformer, Fp8BlocksStayCloseToTheGoldens) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto loaded = load_tiny_diffusers(dir);
  ASSERT_TRUE(loaded) << loaded.status().message();
  auto& [model, config] = *loaded;
  model.quantize_fp8();
  auto out = model.forward(test::golden("zimage-tiny", "transformer.in.x"), 0.5f, test::golden("zimage-tiny", "transformer.in.cap"));
  ASSERT_TRUE(out) << out.status().message();
  const double r = test::rel_l2(out->to_vector(), test::golden("zimage-tiny", "transformer.out.t0.5").to_vector());
  std::printf("[zimage] fp8 blocks transformer.out.t0.5 rel L2 %.3g against the f32 reference\n", r);
  EXPECT_LE(r, kFp8Tol);
}

TEST(ZImageTransformer, RejectsBadShapes) {
  ATELIER_REQUIRE_FIXTURE(dir, "zimage-tiny");
  auto config = ZImageConfig::from_file((dir / "model/transformer/config.json").string());
  auto store = WeightStore::open({layout_file(dir, ZImageLayout::kDiffusers).string()});
  auto model = ZImageTransformer::load(*store, *config, Device::cpu());
  ASSERT_TRUE(model) << model.status().message();
  EXPECT_FALSE(model->forward(Tensor::zeros({16, 1, 15, 16}), 0.5f, Tensor::zeros({4, 32})));
  EXPECT_FALSE(model->forward(Tensor::zeros({16, 1, 16, 16}), 0.5f, Tensor::zeros({4, 31})));
}

}  // namespace
}  // namespace atelier
