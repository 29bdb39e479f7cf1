// SD UNet: config parsing (diffusers' head-count quirk), detection from shapes, the CompVis key map (every
// tensor of the fixture's single file used), goldens through both layouts at three timesteps, per-sample
// timesteps, odd latent sizes, weight errors that name the key, and the random-weight constructor.
#include "models/sd/unet.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/trace.h"
#include "io/safetensors.h"
#include "models/common/weights.h"
#include "models/sd/unet_keymap_compvis.h"
#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

constexpr double kGoldenTol = 1e-5;  // rel L2 vs diffusers (f32 CPU)

struct Fixture {
  fs::path dir;
  fs::path diffusers_weights() const { return dir / "model/unet/diffusion_pytorch_model.safetensors"; }
  fs::path diffusers_config() const { return dir / "model/unet/config.json"; }
  fs::path single_file() const { return dir / "sd15-tiny.safetensors"; }
};

WeightStore open_store(const fs::path& p) {
  auto s = WeightStore::open({p.string()});
  EXPECT_TRUE(s.has_value()) << s.status().message();
  return s ? std::move(s).value() : WeightStore();
}

UNetConfig tiny_config(const Fixture& f) {
  auto c = load_unet_config(f.diffusers_config().string());
  EXPECT_TRUE(c.has_value()) << c.status().message();
  return c ? *c : UNetConfig();
}

// The UNet of the fixture through one layout (config from config.json, or detected for the single file).
UNet load_tiny(const Fixture& f, UNetLayout layout) {
  WeightStore store = open_store(layout == UNetLayout::kDiffusers ? f.diffusers_weights() : f.single_file());
  UNetConfig config = tiny_config(f);
  if (layout == UNetLayout::kCompVis) {
    auto detected = detect_unet_config(store, layout, UNetFamily::kSD1);
    EXPECT_TRUE(detected.has_value()) << detected.status().message();
    config = *detected;
  }
  auto u = UNet::load(store, layout, config);
  if (!u) throw Error(u.status());
  return std::move(u).value();
}

Tensor run(const UNet& u, const Tensor& x, const std::vector<float>& t, const Tensor& ctx) {
  auto out = u.forward(x, Tensor::from_vector(t, {int64_t(t.size())}), ctx);
  if (!out) throw Error(out.status());
  return *out;
}

std::vector<float> row(const Tensor& t, int64_t b) { return t.narrow(0, b, 1).to_vector(); }

// --- config --------------------------------------------------------------------------------------------

TEST(UnetConfig, ParsesTinyConfigAttentionHeadDimAsHeads) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const UNetConfig c = tiny_config({dir});
  EXPECT_EQ(c.block_out_channels, (std::vector<int>{32, 64, 64, 64}));
  EXPECT_EQ(c.num_attention_heads, (std::vector<int>{8, 8, 8, 8}));  // "attention_head_dim": 8 means 8 heads
  EXPECT_EQ(c.head_dim(0), 4);
  EXPECT_EQ(c.layers_per_block, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(c.cross_attention_dim, (std::vector<int>{32, 32, 32, 32}));
  EXPECT_EQ(c.time_embed_dim, 128);
  EXPECT_TRUE(c.down_has_attention(0));
  EXPECT_FALSE(c.down_has_attention(3));
  EXPECT_FALSE(c.up_has_attention(0));
  EXPECT_TRUE(c.up_has_attention(3));
  EXPECT_FALSE(c.use_linear_projection);
}

TEST(UnetConfig, Sd2HeadListMeansHeadsPerLevel) {
  auto c = parse_unet_config(nlohmann::json::parse(R"({
    "_class_name": "UNet2DConditionModel", "attention_head_dim": [5, 10, 20, 20],
    "block_out_channels": [320, 640, 1280, 1280], "cross_attention_dim": 1024,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "use_linear_projection": true, "upcast_attention": true, "layers_per_block": 2})"));
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->num_attention_heads, (std::vector<int>{5, 10, 20, 20}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c->head_dim(i), 64);
  EXPECT_EQ(c->cross_attention_dim, (std::vector<int>{1024, 1024, 1024, 1024}));
  EXPECT_TRUE(c->use_linear_projection);
  EXPECT_TRUE(c->upcast_attention);
  EXPECT_EQ(c->time_embed_dim, 1280);
  EXPECT_EQ(c->mid_block_type, UNetConfig::kMidCrossAttn);  // absent key: diffusers' default
}

TEST(UnetConfig, RejectsFeaturesOutsideSd1And2) {
  const auto base = nlohmann::json::parse(R"({"block_out_channels": [32, 64],
    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"], "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"]})");
  ASSERT_TRUE(parse_unet_config(base).has_value()) << parse_unet_config(base).status().message();
  auto sdxl = base;
  sdxl["addition_embed_type"] = "text_time";
  auto r = parse_unet_config(sdxl);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(r.status().message().find("addition_embed_type"), std::string::npos) << r.status().message();
  auto bad_block = base;
  bad_block["down_block_types"][0] = "AttnDownBlock2D";
  EXPECT_FALSE(parse_unet_config(bad_block).has_value());
  auto bad_heads = base;
  bad_heads["attention_head_dim"] = 5;  // 32 channels are not divisible into 5 heads
  EXPECT_FALSE(parse_unet_config(bad_heads).has_value());
  auto wrong_type = base;
  wrong_type["layers_per_block"] = "two";
  auto w = parse_unet_config(wrong_type);
  ASSERT_FALSE(w.has_value());
  EXPECT_EQ(w.status().code(), ErrorCode::kInvalidArgument);
}

// --- CompVis key map -------------------------------------------------------------------------------------

TEST(UnetKeymap, CompVisIndexArithmeticForSd15) {
  const UNetConfig c = sd15_unet_config();
  const std::map<std::string, std::string> expected = {
      {"conv_in.weight", "input_blocks.0.0.weight"},
      {"time_embedding.linear_2.bias", "time_embed.2.bias"},
      {"down_blocks.0.resnets.1.conv1.weight", "input_blocks.2.0.in_layers.2.weight"},
      {"down_blocks.0.attentions.1.proj_in.weight", "input_blocks.2.1.proj_in.weight"},
      {"down_blocks.0.downsamplers.0.conv.weight", "input_blocks.3.0.op.weight"},
      {"down_blocks.1.resnets.0.conv_shortcut.bias", "input_blocks.4.0.skip_connection.bias"},
      {"down_blocks.2.downsamplers.0.conv.bias", "input_blocks.9.0.op.bias"},
      {"down_blocks.3.resnets.1.time_emb_proj.weight", "input_blocks.11.0.emb_layers.1.weight"},
      {"mid_block.resnets.0.norm1.weight", "middle_block.0.in_layers.0.weight"},
      {"mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight", "middle_block.1.transformer_blocks.0.attn2.to_k.weight"},
      {"mid_block.resnets.1.conv2.weight", "middle_block.2.out_layers.3.weight"},
      {"up_blocks.0.resnets.2.norm2.bias", "output_blocks.2.0.out_layers.0.bias"},
      {"up_blocks.0.upsamplers.0.conv.weight", "output_blocks.2.1.conv.weight"},
      {"up_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj.weight", "output_blocks.3.1.transformer_blocks.0.ff.net.0.proj.weight"},
      {"up_blocks.1.upsamplers.0.conv.bias", "output_blocks.5.2.conv.bias"},
      {"up_blocks.3.resnets.2.conv_shortcut.weight", "output_blocks.11.0.skip_connection.weight"},
      {"conv_norm_out.bias", "out.0.bias"},
      {"conv_out.weight", "out.2.weight"},
  };
  for (const auto& [canonical, compvis] : expected) {
    auto k = compvis_unet_key(c, canonical);
    ASSERT_TRUE(k.has_value()) << canonical;
    EXPECT_EQ(*k, compvis) << canonical;
  }
  for (const char* bad : {"down_blocks.4.resnets.0.conv1.weight", "down_blocks.0.resnets.2.conv1.weight",
                          "down_blocks.3.downsamplers.1.conv.weight", "up_blocks.0.resnets.3.conv1.weight",
                          "down_blocks.x.resnets.0.conv1.weight", "unknown.weight"})
    EXPECT_FALSE(compvis_unet_key(c, bad).has_value()) << bad;
}

// Every parameter maps to a tensor of the single file with the same shape, and every UNet tensor of the
// file is used by exactly one parameter.
TEST(UnetKeymap, CoversEveryTensorOfTheSingleFile) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const Fixture f{dir};
  const WeightStore store = open_store(f.single_file());
  const UNetConfig config = tiny_config(f);
  auto params = UNet::parameter_shapes(config);
  ASSERT_TRUE(params.has_value()) << params.status().message();
  std::set<std::string> used;
  for (const auto& [canonical, shape] : *params) {
    auto k = compvis_unet_key(config, canonical);
    ASSERT_TRUE(k.has_value()) << "no CompVis name for " << canonical;
    const std::string key = std::string(kCompVisUNetPrefix) + *k;
    auto file_shape = store.shape(key);
    ASSERT_TRUE(file_shape.has_value()) << canonical << " -> " << key << " is not in the file";
    Shape a = *file_shape, b = shape;
    while (a.size() > 2 && a.back() == 1) a.pop_back();  // 1x1 proj convs are held as linears
    while (b.size() > 2 && b.back() == 1) b.pop_back();
    EXPECT_EQ(a, b) << key;
    EXPECT_TRUE(used.insert(key).second) << key << " mapped twice";
  }
  std::vector<std::string> unused;
  for (const auto& key : store.keys_with_prefix(kCompVisUNetPrefix))
    if (!used.count(key)) unused.push_back(key);
  std::string list;
  for (const auto& k : unused) list += "\n  " + k;
  EXPECT_TRUE(unused.empty()) << unused.size() << " UNet tensors of the file are not used:" << list;
  std::printf("[ UNet     ] CompVis map: %zu parameters, %zu file tensors under %s, %zu unused\n", params->size(),
              store.keys_with_prefix(kCompVisUNetPrefix).size(), kCompVisUNetPrefix, unused.size());
  // The diffusers file holds exactly the same parameter set.
  EXPECT_EQ(open_store(f.diffusers_weights()).keys().size(), params->size());
}

// --- detection -----------------------------------------------------------------------------------------

TEST(UnetDetect, SingleFileMatchesDiffusersConfig) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const Fixture f{dir};
  auto detected = detect_unet_config(open_store(f.single_file()), UNetLayout::kCompVis, UNetFamily::kSD1);
  ASSERT_TRUE(detected.has_value()) << detected.status().message();
  const auto diffs = unet_config_differences(*detected, tiny_config(f));
  std::string list;
  for (const auto& d : diffs) list += "\n  " + d;
  EXPECT_TRUE(diffs.empty()) << "detected config differs from config.json:" << list;
}

TEST(UnetDetect, DiffusersFileMatchesDiffusersConfig) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const Fixture f{dir};
  auto detected = detect_unet_config(open_store(f.diffusers_weights()), UNetLayout::kDiffusers, UNetFamily::kSD1);
  ASSERT_TRUE(detected.has_value()) << detected.status().message();
  EXPECT_TRUE(unet_config_differences(*detected, tiny_config(f)).empty());
}

TEST(UnetDetect, Sd2FamilyUsesHeadsOf64AndFallsBackTo8) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto detected = detect_unet_config(open_store(Fixture{dir}.single_file()), UNetLayout::kCompVis, UNetFamily::kSD2);
  ASSERT_TRUE(detected.has_value()) << detected.status().message();
  EXPECT_EQ(detected->num_attention_heads, (std::vector<int>{8, 1, 1, 1}));  // 32 is not a multiple of 64
}

// A config unlike the fixture's (SD 2 style: linear projections, heads of 64, uneven depths and layer
// counts, no attention at the top of the up path) written as a weight file in `layout` (zeros), then
// detected back: the detection and the key map must agree with the parameters the model asks for.
UNetConfig unusual_config(bool linear_projection) {
  UNetConfig c = sd15_unet_config();
  c.block_out_channels = {64, 128, 128};
  c.down_block_types = {UNetConfig::kCrossAttnDown, UNetConfig::kCrossAttnDown, UNetConfig::kDown};
  c.up_block_types = {UNetConfig::kUp, UNetConfig::kCrossAttnUp, UNetConfig::kUp};
  c.layers_per_block = {1, 2, 1};
  c.transformer_layers_per_block = {2, 3, 1};
  c.reverse_transformer_layers_per_block = {1, 3, 2};
  c.num_attention_heads = {1, 2, 2};
  c.cross_attention_dim.assign(3, 48);
  c.only_cross_attention.assign(3, false);
  c.use_linear_projection = linear_projection;
  c.time_embed_dim = 96;
  c.in_channels = 5;
  c.out_channels = 3;
  return c;
}

fs::path write_zero_weights(const UNetConfig& c, UNetLayout layout, const std::string& name) {
  auto params = UNet::parameter_shapes(c);
  EXPECT_TRUE(params.has_value()) << params.status().message();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto [key, shape] : *params) {
    const bool proj = key.find(".proj_in.") != std::string::npos || key.find(".proj_out.") != std::string::npos;
    if (proj && !c.use_linear_projection && shape.size() == 2) shape = {shape[0], shape[1], 1, 1};
    if (layout == UNetLayout::kCompVis) key = std::string(kCompVisUNetPrefix) + compvis_unet_key(c, key).value();
    tensors.emplace_back(key, Tensor::zeros(shape));
  }
  const fs::path p = fs::temp_directory_path() / ("atelier_unet_" + name + "_" + std::to_string(::getpid()) + ".safetensors");
  EXPECT_TRUE(write_safetensors(p.string(), tensors).is_ok());
  return p;
}

TEST(UnetDetect, RoundTripsUnusualConfigsThroughBothLayouts) {
  for (bool linear : {true, false}) {
    for (UNetLayout layout : {UNetLayout::kDiffusers, UNetLayout::kCompVis}) {
      const UNetConfig c = unusual_config(linear);
      const fs::path p = write_zero_weights(c, layout, "roundtrip");
      const WeightStore store = open_store(p);
      auto detected = detect_unet_config(store, layout, UNetFamily::kSD2);
      ASSERT_TRUE(detected.has_value()) << detected.status().message();
      std::string list;
      for (const auto& d : unet_config_differences(*detected, c)) list += "\n  " + d;
      EXPECT_TRUE(list.empty()) << "linear=" << linear << " layout=" << int(layout) << list;
      auto u = UNet::load(store, layout, *detected);
      ASSERT_TRUE(u.has_value()) << u.status().message();
      auto out = u->forward(Tensor::zeros({1, 5, 7, 5}), Tensor::from_vector({3}, {1}), Tensor::zeros({1, 4, 48}));
      ASSERT_TRUE(out.has_value()) << out.status().message();
      EXPECT_EQ(out->shape(), (Shape{1, 3, 7, 5}));
      fs::remove(p);
    }
  }
}

TEST(UnetDetect, ReportsAStoreWithoutUnet) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto r = detect_unet_config(open_store(Fixture{dir}.single_file()), UNetLayout::kDiffusers, UNetFamily::kSD1);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
}

// --- goldens -------------------------------------------------------------------------------------------

struct GoldenCase {
  UNetLayout layout;
  int timestep;
};

class UnetGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(UnetGolden, MatchesDiffusers) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const GoldenCase g = GetParam();
  const UNet u = load_tiny({dir}, g.layout);
  const Tensor x = test::golden("sd15-tiny", "unet.in");
  const Tensor ctx = test::golden("sd15-tiny", "unet.context");
  const Tensor expected = test::golden("sd15-tiny", "unet.out.t" + std::to_string(g.timestep));
  const float t = float(g.timestep);
  const Tensor out = run(u, x, {t, t}, ctx);
  ASSERT_EQ(out.shape(), expected.shape());
  const double rel = test::rel_l2(out.to_vector(), expected.to_vector());
  std::printf("[ UNet     ] %s t=%d: rel L2 %.3g, max abs %.3g\n",
              g.layout == UNetLayout::kDiffusers ? "diffusers" : "compvis", g.timestep, rel,
              test::max_abs_diff(out.to_vector(), expected.to_vector()));
  EXPECT_LE(rel, kGoldenTol);
}

INSTANTIATE_TEST_SUITE_P(Unet, UnetGolden,
                         ::testing::Values(GoldenCase{UNetLayout::kDiffusers, 999}, GoldenCase{UNetLayout::kDiffusers, 500},
                                           GoldenCase{UNetLayout::kDiffusers, 1}, GoldenCase{UNetLayout::kCompVis, 999},
                                           GoldenCase{UNetLayout::kCompVis, 500}, GoldenCase{UNetLayout::kCompVis, 1}),
                         [](const auto& info) {
                           return std::string(info.param.layout == UNetLayout::kDiffusers ? "Diffusers" : "CompVis") +
                                  "T" + std::to_string(info.param.timestep);
                         });

TEST(UnetForward, OneTimestepPerSample) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const UNet u = load_tiny({dir}, UNetLayout::kDiffusers);
  const Tensor x = test::golden("sd15-tiny", "unet.in");
  const Tensor ctx = test::golden("sd15-tiny", "unet.context");
  const Tensor out = run(u, x, {999.0f, 1.0f}, ctx);
  const double r0 = test::rel_l2(row(out, 0), row(test::golden("sd15-tiny", "unet.out.t999"), 0));
  const double r1 = test::rel_l2(row(out, 1), row(test::golden("sd15-tiny", "unet.out.t1"), 1));
  std::printf("[ UNet     ] per-sample t=[999, 1]: rel L2 row0 %.3g, row1 %.3g\n", r0, r1);
  EXPECT_LE(r0, kGoldenTol);
  EXPECT_LE(r1, kGoldenTol);
  // A single shared timestep broadcasts to the batch.
  const Tensor shared = *u.forward(x, Tensor::from_vector({500.0f}, {1}), ctx);
  EXPECT_LE(test::rel_l2(shared.to_vector(), test::golden("sd15-tiny", "unet.out.t500").to_vector()), kGoldenTol);
}

// The GPU keeps activations channels-last (Backend::prefers_channels_last); the CPU backend's test switch runs
// the same op-layer paths on the CPU, whose arithmetic is the NCHW one: the output must be the same bits.
TEST(UnetForward, ChannelsLastActivationsGiveTheSameOutput) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const UNet u = load_tiny({dir}, UNetLayout::kDiffusers);
  const Tensor x = test::golden("sd15-tiny", "unet.in");
  const Tensor ctx = test::golden("sd15-tiny", "unet.context");
  const std::vector<float> nchw = run(u, x, {500.0f, 500.0f}, ctx).to_vector();
  std::vector<float> channels_last;
  {
    test::ChannelsLastOnCpu on;
    const Tensor out = run(u, x, {500.0f, 500.0f}, ctx);
    EXPECT_TRUE(out.is_contiguous()) << "the UNet's output must be contiguous whatever the activations' layout";
    channels_last = out.to_vector();
  }
  EXPECT_EQ(channels_last, nchw);
  EXPECT_LE(test::rel_l2(channels_last, test::golden("sd15-tiny", "unet.out.t500").to_vector()), kGoldenTol);
}

// Every resnet's time projection reads the same [B, temb] input and every cross-attention's keys and values
// the same context: the UNet makes each of the two one GEMM (one linear op per call) instead of one per block
// (54 small GEMMs per SD 1.5 call), and the result still matches diffusers (the goldens above).
TEST(UnetForward, SharedInputProjectionsAreOneGemmEach) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const UNet u = load_tiny({dir}, UNetLayout::kDiffusers);
  const Tensor x = test::golden("sd15-tiny", "unet.in");
  const Tensor ctx = test::golden("sd15-tiny", "unet.context");
  const std::vector<trace::Event> ops = test::top_level_ops([&] {
    const Tensor out = run(u, x, {500.0f, 500.0f}, ctx);
    EXPECT_LE(test::rel_l2(out.to_vector(), test::golden("sd15-tiny", "unet.out.t500").to_vector()), kGoldenTol);
  });
  const std::string temb_in = shape_str({x.size(0), int64_t(u.config().time_embed_dim)}) + " x ";
  const std::string context_in = shape_str(ctx.shape()) + " x ";
  int from_temb = 0, from_context = 0;
  for (const trace::Event& e : ops) {
    if (std::string(e.name) != "linear") continue;
    from_temb += e.detail.rfind(temb_in, 0) == 0;
    from_context += e.detail.rfind(context_in, 0) == 0;
  }
  EXPECT_EQ(from_temb, 2) << "time_embedding.linear_2 and one projection for every resnet";
  EXPECT_EQ(from_context, 1) << "one projection of the context for every cross-attention's keys and values";
}

TEST(UnetForward, OddLatentSizesKeepTheirShape) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const UNet u = load_tiny({dir}, UNetLayout::kCompVis);
  const Tensor ctx = test::golden("sd15-tiny", "unet.context");
  for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{10, 14}, {9, 13}, {72, 40}, {1, 3}}) {
    std::vector<float> v(size_t(2 * 4 * h * w));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * float(i));
    const Tensor out = run(u, Tensor::from_vector(v, {2, 4, h, w}), {999.0f, 20.0f}, ctx);
    EXPECT_EQ(out.shape(), (Shape{2, 4, h, w})) << h << "x" << w;
    for (float o : out.to_vector()) ASSERT_TRUE(std::isfinite(o)) << h << "x" << w;
  }
}

// torch's nearest interpolation to an explicit size picks source index floor(i * in / out).
TEST(UnetForward, UpsampleToSizeMatchesTorchNearest) {
  for (const auto& [h, w, oh, ow] : std::vector<std::array<int64_t, 4>>{{3, 4, 5, 8}, {5, 7, 9, 13}, {2, 2, 3, 4}, {1, 1, 1, 2}}) {
    std::vector<float> v(size_t(2 * h * w));
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
    const Tensor out = upsample_nearest_to(Tensor::from_vector(v, {1, 2, h, w}), oh, ow);
    ASSERT_EQ(out.shape(), (Shape{1, 2, oh, ow}));
    const std::vector<float> o = out.to_vector();
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x) {
          const int64_t sy = std::min(int64_t(std::floor(float(y) * (float(h) / float(oh)))), h - 1);
          const int64_t sx = std::min(int64_t(std::floor(float(x) * (float(w) / float(ow)))), w - 1);
          ASSERT_EQ(o[size_t((c * oh + y) * ow + x)], v[size_t((c * h + sy) * w + sx)]) << h << "x" << w << " -> " << oh << "x" << ow;
        }
  }
}

TEST(UnetForward, RejectsMisShapedInputs) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const UNet u = load_tiny({dir}, UNetLayout::kDiffusers);
  const Tensor ctx = test::golden("sd15-tiny", "unet.context");
  const Tensor ts = Tensor::from_vector({1.0f, 2.0f}, {2});
  EXPECT_FALSE(u.forward(Tensor::zeros({2, 3, 8, 8}), ts, ctx).has_value());
  EXPECT_FALSE(u.forward(Tensor::zeros({2, 4, 8, 8}), Tensor::from_vector({1, 2, 3}, {3}), ctx).has_value());
  auto wide = u.forward(Tensor::zeros({2, 4, 8, 8}), ts, Tensor::zeros({2, 77, 48}));
  ASSERT_FALSE(wide.has_value());
  EXPECT_NE(wide.status().message().find("cross_attention_dim"), std::string::npos) << wide.status().message();
}

TEST(UnetForward, TimestepEmbeddingLayout) {
  // t = 0: sin parts are 0 and cos parts 1; flip_sin_to_cos puts cos first.
  const std::vector<float> flipped = timestep_embedding({0.0f}, 8, true, 0).to_vector();
  EXPECT_EQ(flipped, (std::vector<float>{1, 1, 1, 1, 0, 0, 0, 0}));
  const std::vector<float> plain = timestep_embedding({0.0f}, 8, false, 0).to_vector();
  EXPECT_EQ(plain, (std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1}));
  // Frequencies exp(-ln(1e4) i / (half - shift)): with shift 1 the last one is exactly 1e-4.
  const std::vector<float> e = timestep_embedding({1000.0f}, 6, false, 1).to_vector();
  EXPECT_NEAR(e[2], std::sin(1000.0 * 1e-4), 1e-6);
  EXPECT_NEAR(e[0], std::sin(1000.0), 1e-6);
  EXPECT_EQ(timestep_embedding({3.0f}, 7, true, 0).to_vector().back(), 0.0f);  // odd dim: zero pad
}

// --- weight errors -------------------------------------------------------------------------------------

TEST(UnetLoad, MisShapedTensorErrorNamesTheKey) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const Fixture f{dir};
  auto file = SafeTensorsFile::open(f.diffusers_weights().string());
  ASSERT_TRUE(file.has_value()) << file.status().message();
  const std::string bad_key = "up_blocks.2.attentions.1.transformer_blocks.0.attn2.to_k.weight";
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& info : (*file)->tensors()) {
    if (info.name == bad_key) {
      tensors.emplace_back(info.name, Tensor::zeros({64, 48}));  // cross dim 48 instead of 32
    } else if (info.name != "conv_out.bias") {                   // and one tensor missing
      tensors.emplace_back(info.name, *(*file)->load(info, DType::F32));
    }
  }
  const fs::path tmp = fs::temp_directory_path() / ("atelier_unet_bad_" + std::to_string(::getpid()) + ".safetensors");
  ASSERT_TRUE(write_safetensors(tmp.string(), tensors).is_ok());
  auto u = UNet::load(open_store(tmp), UNetLayout::kDiffusers, tiny_config(f));
  fs::remove(tmp);
  ASSERT_FALSE(u.has_value());
  const std::string& msg = u.status().message();
  EXPECT_NE(msg.find("'" + bad_key + "' has shape [64, 48], expected [64, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing tensor 'conv_out.bias'"), std::string::npos) << msg;
}

TEST(UnetLoad, CompVisErrorsUseTheFileNames) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const Fixture f{dir};
  UNetConfig wrong = tiny_config(f);
  wrong.cross_attention_dim.assign(4, 48);
  auto u = UNet::load(open_store(f.single_file()), UNetLayout::kCompVis, wrong);
  ASSERT_FALSE(u.has_value());
  EXPECT_NE(u.status().message().find("'model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight' has shape [32, 32], expected [32, 48]"),
            std::string::npos)
      << u.status().message();
}

// --- random weights ------------------------------------------------------------------------------------

TEST(UnetRandom, DeterministicPerSeedAndRuns) {
  UNetConfig c = sd15_unet_config();
  c.block_out_channels = {32, 64, 64, 64};
  c.cross_attention_dim.assign(4, 32);
  c.time_embed_dim = 128;
  auto a = UNet::random(c, 7, Device::cpu());
  auto b = UNet::random(c, 7, Device::cpu());
  auto other = UNet::random(c, 8, Device::cpu());
  ASSERT_TRUE(a.has_value() && b.has_value() && other.has_value()) << a.status().message();
  std::vector<float> x(2 * 4 * 8 * 8), ctx(2 * 5 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.1f * float(i));
  for (size_t i = 0; i < ctx.size(); ++i) ctx[i] = std::sin(0.3f * float(i));
  const Tensor xt = Tensor::from_vector(x, {2, 4, 8, 8}), ct = Tensor::from_vector(ctx, {2, 5, 32});
  const auto oa = run(*a, xt, {10, 900}, ct).to_vector();
  const auto ob = run(*b, xt, {10, 900}, ct).to_vector();
  const auto oo = run(*other, xt, {10, 900}, ct).to_vector();
  EXPECT_EQ(oa, ob);
  EXPECT_GT(test::rel_l2(oo, oa), 0.01);
  double norm = 0;
  for (float v : oa) norm += double(v) * v;
  EXPECT_TRUE(std::isfinite(norm) && norm > 0);
}

}  // namespace
}  // namespace atelier
