// KL autoencoder: config parsing and detection, the key maps of the three checkpoint layouts, decode and
// encode against the reference goldens (SD 1.x through diffusers and CompVis files, FLUX / Z-Image through
// diffusers and original files), tiled decode, load errors, and a random-weight SD-size timing.
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <random>

#include <unistd.h>

#include "io/safetensors.h"
#include "models/vae/vae.h"
#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

constexpr double kGoldenTol = 1e-5;  // rel L2 against float32 reference outputs

WeightStore open_store(const fs::path& file) { return WeightStore::open({file.string()}).value(); }

VaeConfig folder_config(const fs::path& root) { return VaeConfig::from_file((root / "model/vae/config.json").string()).value(); }

WeightStore folder_store(const fs::path& root) { return open_store(root / "model/vae/diffusion_pytorch_model.safetensors"); }

// Compares and prints the figure the report quotes.
void expect_close(const std::string& what, const Tensor& actual, const Tensor& expected, double tol = kGoldenTol) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const auto a = actual.to_vector(), b = expected.to_vector();
  const double r = test::rel_l2(a, b);
  std::cout << "[vae] " << what << ": rel L2 " << r << ", max abs " << test::max_abs_diff(a, b) << "\n";
  EXPECT_LE(r, tol) << what;
}

void expect_same_architecture(const VaeConfig& a, const VaeConfig& b) {
  EXPECT_EQ(a.in_channels, b.in_channels);
  EXPECT_EQ(a.out_channels, b.out_channels);
  EXPECT_EQ(a.latent_channels, b.latent_channels);
  EXPECT_EQ(a.block_out_channels, b.block_out_channels);
  EXPECT_EQ(a.layers_per_block, b.layers_per_block);
  EXPECT_EQ(a.norm_num_groups, b.norm_num_groups);
  EXPECT_EQ(a.use_quant_conv, b.use_quant_conv);
  EXPECT_EQ(a.use_post_quant_conv, b.use_post_quant_conv);
  EXPECT_EQ(a.mid_block_add_attention, b.mid_block_add_attention);
}

// --- key maps ------------------------------------------------------------------------------------

TEST(VaeKeyMap, OriginalNames) {
  auto m = [](const std::string& k) { return vae_file_key(VaeLayout::kCompVis, k, 4); };
  EXPECT_EQ(m("decoder.up_blocks.0.upsamplers.0.conv.weight"), "first_stage_model.decoder.up.3.upsample.conv.weight");
  EXPECT_EQ(m("decoder.up_blocks.3.resnets.0.conv_shortcut.bias"), "first_stage_model.decoder.up.0.block.0.nin_shortcut.bias");
  EXPECT_EQ(m("encoder.down_blocks.1.downsamplers.0.conv.bias"), "first_stage_model.encoder.down.1.downsample.conv.bias");
  EXPECT_EQ(m("encoder.down_blocks.2.resnets.1.norm2.weight"), "first_stage_model.encoder.down.2.block.1.norm2.weight");
  EXPECT_EQ(m("encoder.mid_block.resnets.1.conv1.weight"), "first_stage_model.encoder.mid.block_2.conv1.weight");
  EXPECT_EQ(m("decoder.mid_block.attentions.0.to_out.0.weight"), "first_stage_model.decoder.mid.attn_1.proj_out.weight");
  EXPECT_EQ(m("decoder.mid_block.attentions.0.group_norm.bias"), "first_stage_model.decoder.mid.attn_1.norm.bias");
  EXPECT_EQ(m("encoder.mid_block.attentions.0.to_k.weight"), "first_stage_model.encoder.mid.attn_1.k.weight");
  EXPECT_EQ(m("decoder.conv_norm_out.weight"), "first_stage_model.decoder.norm_out.weight");
  EXPECT_EQ(m("post_quant_conv.weight"), "first_stage_model.post_quant_conv.weight");
  EXPECT_EQ(vae_file_key(VaeLayout::kOriginal, "decoder.up_blocks.1.resnets.2.conv1.weight", 4), "decoder.up.2.block.2.conv1.weight");
  EXPECT_EQ(vae_file_key(VaeLayout::kDiffusers, "decoder.up_blocks.1.resnets.2.conv1.weight", 4),
            "decoder.up_blocks.1.resnets.2.conv1.weight");
}

// --- config --------------------------------------------------------------------------------------

TEST(VaeConfig, FromDiffusersJson) {
  ATELIER_REQUIRE_FIXTURE(sd, "sd15-tiny");
  const VaeConfig c = folder_config(sd);
  EXPECT_EQ(c.latent_channels, 4);
  EXPECT_EQ(c.block_out_channels, (std::vector<int>{32, 64, 64, 64}));
  EXPECT_EQ(c.layers_per_block, 2);
  EXPECT_FLOAT_EQ(c.scaling_factor, 0.18215f);
  EXPECT_EQ(c.shift_factor, 0.0f);
  EXPECT_TRUE(c.use_quant_conv && c.use_post_quant_conv && c.mid_block_add_attention && c.force_upcast);
  EXPECT_EQ(c.downscale_factor(), 8);
  ATELIER_REQUIRE_FIXTURE(flux, "flux-tiny");
  const VaeConfig f = folder_config(flux);
  EXPECT_EQ(f.latent_channels, 16);
  EXPECT_FLOAT_EQ(f.scaling_factor, 0.3611f);
  EXPECT_FLOAT_EQ(f.shift_factor, 0.1159f);
  EXPECT_FALSE(f.use_quant_conv || f.use_post_quant_conv);
}

TEST(VaeConfig, RejectsWhatItCannotRun) {
  auto bad_block = VaeConfig::from_json({{"down_block_types", {"DownEncoderBlock2D", "AttnDownEncoderBlock2D"}},
                                         {"block_out_channels", {64, 64}}});
  ASSERT_FALSE(bad_block);
  EXPECT_NE(bad_block.status().message().find("AttnDownEncoderBlock2D"), std::string::npos) << bad_block.status().message();
  auto bad_type = VaeConfig::from_json({{"latent_channels", "four"}});
  ASSERT_FALSE(bad_type);
  auto bad_groups = VaeConfig::from_json({{"block_out_channels", {48}}, {"norm_num_groups", 32}});
  ASSERT_FALSE(bad_groups);
  EXPECT_NE(bad_groups.status().message().find("norm_num_groups"), std::string::npos);
  EXPECT_FALSE(VaeConfig::from_file("/nonexistent/config.json"));
}

TEST(VaeConfig, DetectedFromCompVisFileMatchesDiffusers) {
  ATELIER_REQUIRE_FIXTURE(sd, "sd15-tiny");
  const WeightStore store = open_store(sd / "sd15-tiny.safetensors");
  ASSERT_EQ(detect_vae_layout(store).value(), VaeLayout::kCompVis);
  const VaeConfig detected = detect_vae_config(store, VaeLayout::kCompVis).value();
  const VaeConfig reference = folder_config(sd);
  expect_same_architecture(detected, reference);
  EXPECT_FLOAT_EQ(detected.scaling_factor, reference.scaling_factor);
  EXPECT_EQ(detected.shift_factor, reference.shift_factor);
  // The diffusers folder detects the same way.
  expect_same_architecture(detect_vae_config(folder_store(sd), VaeLayout::kDiffusers).value(), reference);
}

TEST(VaeConfig, DetectedFromFluxAeMatchesDiffusers) {
  ATELIER_REQUIRE_FIXTURE(flux, "flux-tiny");
  const WeightStore store = open_store(flux / "flux-tiny-ae.safetensors");
  ASSERT_EQ(detect_vae_layout(store).value(), VaeLayout::kOriginal);
  expect_same_architecture(detect_vae_config(store, VaeLayout::kOriginal).value(), folder_config(flux));
}

TEST(VaeConfig, DetectOnWeightsWithoutVae) {
  ATELIER_REQUIRE_FIXTURE(flux, "flux-tiny");
  const WeightStore store = open_store(flux / "flux-tiny-transformer.bfl.safetensors");
  auto layout = detect_vae_layout(store);
  ASSERT_FALSE(layout);
  EXPECT_EQ(layout.status().code(), ErrorCode::kNotFound);
  auto c = detect_vae_config(store, VaeLayout::kOriginal);
  ASSERT_FALSE(c);
  EXPECT_NE(c.status().message().find("encoder.conv_in.weight"), std::string::npos) << c.status().message();
}

// --- goldens -------------------------------------------------------------------------------------

void check_sd15(const Vae& vae, const std::string& label) {
  expect_close("sd15 " + label + " decode", vae.decode(test::golden("sd15-tiny", "vae.decode.in")),
               test::golden("sd15-tiny", "vae.decode.out"));
  const VaeMoments m = vae.encode(test::golden("sd15-tiny", "vae.encode.in"));
  expect_close("sd15 " + label + " encode mean", m.mean, test::golden("sd15-tiny", "vae.encode.mean"));
  expect_close("sd15 " + label + " encode std", m.std, test::golden("sd15-tiny", "vae.encode.std"));
}

TEST(VaeGolden, Sd15Diffusers) {
  ATELIER_REQUIRE_FIXTURE(sd, "sd15-tiny");
  const WeightStore store = folder_store(sd);
  check_sd15(Vae::load(store, VaeLayout::kDiffusers, folder_config(sd), Device::cpu()).value(), "diffusers");
}

TEST(VaeGolden, Sd15CompVisSingleFile) {
  ATELIER_REQUIRE_FIXTURE(sd, "sd15-tiny");
  const WeightStore store = open_store(sd / "sd15-tiny.safetensors");
  const VaeConfig config = detect_vae_config(store, VaeLayout::kCompVis).value();
  check_sd15(Vae::load(store, VaeLayout::kCompVis, config, Device::cpu()).value(), "compvis");
}

TEST(VaeGolden, Sd15ChannelsLastActivations) {
  ATELIER_REQUIRE_FIXTURE(sd, "sd15-tiny");
  const WeightStore store = folder_store(sd);
  const Vae vae = Vae::load(store, VaeLayout::kDiffusers, folder_config(sd), Device::cpu()).value();
  const std::vector<float> nchw = vae.decode(test::golden("sd15-tiny", "vae.decode.in")).to_vector();
  test::ChannelsLastOnCpu on;
  check_sd15(vae, "channels-last");
  const Tensor decoded = vae.decode(test::golden("sd15-tiny", "vae.decode.in"));
  EXPECT_TRUE(decoded.is_contiguous());
  EXPECT_EQ(decoded.to_vector(), nchw);
}

void check_flux(const Vae& vae, const std::string& label) {
  expect_close("flux " + label + " decode", vae.decode(test::golden("flux-tiny", "vae.decode.in")),
               test::golden("flux-tiny", "vae.decode.out"));
  const VaeMoments m = vae.encode(test::golden("flux-tiny", "vae.encode.in"));
  expect_close("flux " + label + " encode mean", m.mean, test::golden("flux-tiny", "vae.encode.mean"));
}

TEST(VaeGolden, FluxDiffusers) {
  ATELIER_REQUIRE_FIXTURE(flux, "flux-tiny");
  const WeightStore store = folder_store(flux);
  check_flux(Vae::load(store, VaeLayout::kDiffusers, folder_config(flux), Device::cpu()).value(), "diffusers");
}

TEST(VaeGolden, FluxOriginalAe) {
  ATELIER_REQUIRE_FIXTURE(flux, "flux-tiny");
  const WeightStore store = open_store(flux / "flux-tiny-ae.safetensors");
  VaeConfig config = detect_vae_config(store, VaeLayout::kOriginal).value();
  config.scaling_factor = 0.3611f;  // what the FLUX loader sets; decode/encode do not use it
  config.shift_factor = 0.1159f;
  check_flux(Vae::load(store, VaeLayout::kOriginal, config, Device::cpu()).value(), "original");
}

TEST(VaeGolden, ZImageDiffusers) {
  ATELIER_REQUIRE_FIXTURE(zi, "zimage-tiny");
  const WeightStore store = folder_store(zi);
  const Vae vae = Vae::load(store, VaeLayout::kDiffusers, folder_config(zi), Device::cpu()).value();
  expect_close("zimage decode", vae.decode(test::golden("zimage-tiny", "vae.decode.in")), test::golden("zimage-tiny", "vae.decode.out"));
}

// The pipeline wrappers apply scaling and shift exactly as diffusers' pipelines do.
TEST(VaeGolden, PipelineWrappersScaleAndShift) {
  ATELIER_REQUIRE_FIXTURE(flux, "flux-tiny");
  const WeightStore store = folder_store(flux);
  const Vae vae = Vae::load(store, VaeLayout::kDiffusers, folder_config(flux), Device::cpu()).value();
  const float s = vae.config().scaling_factor, t = vae.config().shift_factor;
  // decode.in = z / s + t, so z = (decode.in - t) * s decodes to decode.out (up to the rounding of the round trip).
  std::vector<float> z = test::golden("flux-tiny", "vae.decode.in").to_vector();
  for (float& v : z) v = (v - t) * s;
  expect_close("flux latents_to_image", vae.latents_to_image(Tensor::from_vector(z, {1, 16, 16, 16})),
               test::golden("flux-tiny", "vae.decode.out"));
  // image_to_latents = (mean + std * noise - t) * s
  const Tensor image = test::golden("flux-tiny", "vae.encode.in");
  const VaeMoments m = vae.encode(image);
  std::vector<float> noise(size_t(m.mean.numel()));
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = std::sin(0.37f * float(i));
  const Tensor noise_t = Tensor::from_vector(noise, m.mean.shape());
  const auto mean = m.mean.to_vector(), stdv = m.std.to_vector();
  std::vector<float> expected(noise.size());
  for (size_t i = 0; i < noise.size(); ++i) expected[i] = (mean[i] + stdv[i] * noise[i] - t) * s;
  expect_close("flux image_to_latents", vae.image_to_latents(image, noise_t), Tensor::from_vector(expected, m.mean.shape()), 1e-6);
  std::vector<float> mode(noise.size());
  for (size_t i = 0; i < noise.size(); ++i) mode[i] = (mean[i] - t) * s;
  expect_close("flux image_to_latents (mode)", vae.image_to_latents(image), Tensor::from_vector(mode, m.mean.shape()), 1e-6);
}

// --- errors --------------------------------------------------------------------------------------

TEST(VaeErrors, MisShapedTensorNamesKey) {
  ATELIER_REQUIRE_FIXTURE(sd, "sd15-tiny");
  const WeightStore store = folder_store(sd);
  VaeConfig config = folder_config(sd);
  config.latent_channels = 16;  // the file has 4
  auto vae = Vae::load(store, VaeLayout::kDiffusers, config, Device::cpu());
  ASSERT_FALSE(vae);
  const std::string& msg = vae.status().message();
  EXPECT_NE(msg.find("'decoder.conv_in.weight' has shape [64, 4, 3, 3], expected [64, 16, 3, 3]"), std::string::npos) << msg;
}

TEST(VaeErrors, MissingTensorNamesFileKey) {
  ATELIER_REQUIRE_FIXTURE(sd, "sd15-tiny");
  const WeightStore store = open_store(sd / "sd15-tiny.safetensors");
  VaeConfig config = detect_vae_config(store, VaeLayout::kCompVis).value();
  config.layers_per_block = 3;  // the file has 2 resnets per encoder level
  auto vae = Vae::load(store, VaeLayout::kCompVis, config, Device::cpu());
  ASSERT_FALSE(vae);
  EXPECT_NE(vae.status().message().find("missing tensor 'first_stage_model.encoder.down.0.block.2.conv1.weight'"), std::string::npos)
      << vae.status().message();
  ATELIER_REQUIRE_FIXTURE(flux, "flux-tiny");
  const WeightStore ae = open_store(flux / "flux-tiny-ae.safetensors");
  VaeConfig fc = detect_vae_config(ae, VaeLayout::kOriginal).value();
  fc.use_quant_conv = true;  // FLUX has none
  auto flux_vae = Vae::load(ae, VaeLayout::kOriginal, fc, Device::cpu());
  ASSERT_FALSE(flux_vae);
  EXPECT_NE(flux_vae.status().message().find("missing tensor 'quant_conv.weight'"), std::string::npos) << flux_vae.status().message();
}

TEST(VaeErrors, WrongLatentShapeIsInvalidArgument) {
  VaeConfig c;
  c.block_out_channels = {32, 32};
  c.layers_per_block = 1;
  const Vae vae = Vae::random(c, 1, Device::cpu()).value();
  Status st = catch_status([&] { vae.decode(Tensor::zeros({1, 16, 4, 4})); return Status::ok(); });
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.message();
}

// --- tiled decode --------------------------------------------------------------------------------

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// A well-conditioned model of the sd15-tiny VAE's shape, written to a temporary file and loaded like any
// checkpoint: near-identity convolutions (centre tap 1 plus small noise) and weak attention, so the
// decoder is nearly local and a tiled decode must come close to the untiled one. (The fixture's random
// weights are not: there a 16x16 window decoded on its own already differs from the same region of the
// full decode by 40-100% rel L2, because zero-padding edges dominate the GroupNorm statistics.)
struct SmoothVae {
  fs::path path;
  WeightStore store;
  std::optional<Vae> vae;
  explicit SmoothVae(const fs::path& fixture) {
    const WeightStore shapes = folder_store(fixture);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& key : shapes.keys()) {
      const Shape s = *shapes.shape(key);
      std::vector<float> v(size_t(numel_of(s)));
      if (s.size() == 4) {  // conv [O, I, k, k]
        const int64_t O = s[0], I = s[1], K = s[2];
        for (float& x : v) x = normal(rng) * 0.05f / std::sqrt(float(I * K * K));
        for (int64_t o = 0; o < O; ++o) v[size_t(((o * I + o % I) * K + K / 2) * K + K / 2)] += 1.0f;
      } else if (s.size() == 2) {  // attention projections
        for (float& x : v) x = normal(rng) * 0.1f / std::sqrt(float(s[1]));
      } else {  // norm scales 1, biases small
        const bool scale = ends_with(key, "norm1.weight") || ends_with(key, "norm2.weight") || ends_with(key, "norm.weight") ||
                           ends_with(key, "norm_out.weight");
        for (float& x : v) x = scale ? 1.0f : 0.01f * normal(rng);
      }
      tensors.push_back({key, Tensor::from_vector(v, s)});
    }
    path = fs::temp_directory_path() / ("atelier_vae_smooth_" + std::to_string(::getpid()) + ".safetensors");
    EXPECT_TRUE(write_safetensors(path.string(), tensors).is_ok());
    store = WeightStore::open({path.string()}).value();
    vae = Vae::load(store, VaeLayout::kDiffusers, folder_config(fixture), Device::cpu()).value();
  }
  ~SmoothVae() { fs::remove(path); }
};

// A statistically homogeneous 32x32 latent: one random 8x8 cell repeated. Every tile of 16 (or the
// 8-wide edge tiles) holds whole cells, so GroupNorm sees the same statistics per tile as on the whole;
// the cell does not divide the tile stride (12), so a misplaced tile would show.
Tensor texture_latent() {
  std::vector<float> z(size_t(4 * 32 * 32));
  for (int c = 0; c < 4; ++c)
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x) z[size_t((c * 32 + y) * 32 + x)] = 1.3f * std::sin(1.7f * float((c * 8 + y % 8) * 8 + x % 8));
  return Tensor::from_vector(z, {1, 4, 32, 32});
}

// Mean |img[.., k+1] - img[.., k]| across image column k (axis 3) or row k (axis 2); img [1, 3, n, n].
double step_across(const std::vector<float>& img, int n, int axis, int k) {
  double s = 0;
  for (int ch = 0; ch < 3; ++ch)
    for (int t = 0; t < n; ++t) {
      auto at = [&](int y, int x) { return img[size_t((ch * n + y) * n + x)]; };
      s += axis == 3 ? std::abs(at(t, k + 1) - at(t, k)) : std::abs(at(k + 1, t) - at(k, t));
    }
  return s / (3.0 * n);
}

TEST(VaeTiled, CloseToUntiledWithoutSeams) {
  ATELIER_REQUIRE_FIXTURE(sd, "sd15-tiny");
  SmoothVae model(sd);
  const Vae& vae = *model.vae;
  const Tensor z = texture_latent();
  const auto full = vae.decode(z).to_vector();
  const auto tiled = vae.decode_tiled(z, VaeTiling{16, 0.25f}).to_vector();  // 3x3 tiles of 16, stride 12
  const auto hard = vae.decode_tiled(z, VaeTiling{16, 0.0f}).to_vector();    // 2x2 abutting tiles, no blending
  ASSERT_EQ(tiled.size(), full.size());
  const double rel = test::rel_l2(tiled, full);
  std::cout << "[vae] tiled (tile 16, overlap 0.25) vs untiled, 256x256: rel L2 " << rel << ", max abs "
            << test::max_abs_diff(tiled, full) << "; unblended (overlap 0): rel L2 " << test::rel_l2(hard, full) << "\n";
  EXPECT_LT(rel, 0.05);
  // Seams: where the output switches source (96|97 starts a blend band, 127|128 ends it; likewise 192 and
  // 224) the tiled image's deviation from the untiled one must not jump more than it does anywhere away
  // from the bands by much (the texture makes every latent-cell boundary a step; blended seams measure
  // about 1x the largest of those, hard seams 7-10x). The unblended control
  // switches tiles abruptly at 127|128 and must stand out.
  auto deviation = [&](const std::vector<float>& img) {
    std::vector<float> d(img.size());
    for (size_t i = 0; i < d.size(); ++i) d[i] = img[i] - full[i];
    return d;
  };
  const auto dev_tiled = deviation(tiled), dev_hard = deviation(hard);
  auto in_band = [](int t) { return (t >= 88 && t <= 136) || (t >= 184 && t <= 232); };
  auto seam_ratio = [&](const std::vector<float>& d, int axis, int k) {
    double elsewhere = 0;
    for (int t = 0; t < 255; ++t)
      if (!in_band(t)) elsewhere = std::max(elsewhere, step_across(d, 256, axis, t));
    return step_across(d, 256, axis, k) / elsewhere;
  };
  for (int axis : {2, 3}) {
    double worst = 0;
    for (int k : {95, 96, 127, 128, 191, 192, 223, 224}) worst = std::max(worst, seam_ratio(dev_tiled, axis, k));
    const double hard_ratio = seam_ratio(dev_hard, axis, 127);
    std::cout << "[vae] " << (axis == 3 ? "column" : "row") << " seams: largest deviation step at a seam / largest "
              << "away from seams " << worst << " (unblended control: " << hard_ratio << ")\n";
    EXPECT_LT(worst, 2.0) << "visible seam";
    EXPECT_GT(hard_ratio, 4.0) << "the seam measure no longer sees an unblended seam";
  }
}

TEST(VaeTiled, MatchesDiffusersBlendingRule) {
  VaeConfig c;
  c.block_out_channels = {32, 32};  // f = 2
  c.layers_per_block = 1;
  c.latent_channels = 4;
  const Vae vae = Vae::random(c, 7, Device::cpu()).value();
  const int H = 10, W = 7, tile = 4, f = 2;
  std::vector<float> zv(size_t(4 * H * W));
  for (size_t i = 0; i < zv.size(); ++i) zv[i] = std::cos(0.11f * float(i));
  const Tensor z = Tensor::from_vector(zv, {1, 4, H, W});
  const Tensor got = vae.decode_tiled(z, VaeTiling{tile, 0.25f});
  // Reference: stride 3, tile_sample 8, blend 2, row_limit 6.
  const int stride = 3, ts = tile * f, blend_n = 2, limit = ts - blend_n;
  struct T { int h, w; std::vector<float> v; float& at(int ch, int y, int x) { return v[size_t((ch * h + y) * w + x)]; } };
  std::vector<std::vector<T>> rows;
  for (int i = 0; i < H; i += stride) {
    rows.emplace_back();
    for (int j = 0; j < W; j += stride) {
      const Tensor piece = ops::contiguous(z.narrow(2, i, std::min(tile, H - i)).narrow(3, j, std::min(tile, W - j)));
      const Tensor d = vae.decode(piece);
      rows.back().push_back(T{int(d.size(2)), int(d.size(3)), d.to_vector()});
    }
  }
  std::vector<float> ref(size_t(3 * H * f * W * f));
  int oy = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    int ox = 0, row_h = 0;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      T& b = rows[i][j];
      if (i > 0) {
        T& a = rows[i - 1][j];
        const int e = std::min({a.h, b.h, blend_n});
        for (int ch = 0; ch < 3; ++ch)
          for (int y = 0; y < e; ++y)
            for (int x = 0; x < b.w; ++x)
              b.at(ch, y, x) = a.at(ch, a.h - e + y, x) * float(1.0 - double(y) / e) + b.at(ch, y, x) * float(double(y) / e);
      }
      if (j > 0) {
        T& a = rows[i][j - 1];
        const int e = std::min({a.w, b.w, blend_n});
        for (int ch = 0; ch < 3; ++ch)
          for (int y = 0; y < b.h; ++y)
            for (int x = 0; x < e; ++x)
              b.at(ch, y, x) = a.at(ch, y, a.w - e + x) * float(1.0 - double(x) / e) + b.at(ch, y, x) * float(double(x) / e);
      }
      const int ch_h = std::min(limit, b.h), ch_w = std::min(limit, b.w);
      for (int ch = 0; ch < 3; ++ch)
        for (int y = 0; y < ch_h; ++y)
          for (int x = 0; x < ch_w; ++x) ref[size_t((ch * H * f + oy + y) * W * f + ox + x)] = b.at(ch, y, x);
      ox += ch_w;
      row_h = ch_h;
    }
    oy += row_h;
  }
  ASSERT_EQ(oy, H * f);
  const auto g = got.to_vector();
  EXPECT_EQ(test::max_abs_diff(g, ref), 0.0);
}

TEST(VaeTiled, SmallLatentIsNotTiled) {
  VaeConfig c;
  c.block_out_channels = {32, 32};
  c.layers_per_block = 1;
  const Vae vae = Vae::random(c, 3, Device::cpu()).value();
  const Tensor z = Tensor::full({1, 4, 6, 6}, 0.5f);
  EXPECT_EQ(test::max_abs_diff(vae.decode_tiled(z, VaeTiling{8, 0.25f}).to_vector(), vae.decode(z).to_vector()), 0.0);
  Status st = catch_status([&] { vae.decode_tiled(z, VaeTiling{4, 0.1f}); return Status::ok(); });
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
}

// --- random weights and timing -------------------------------------------------------------------

// SD's real VAE shape (128, 256, 512, 512) with random weights: a 64x64 image by default (seconds);
// ATELIER_VAE_TIMING=256 or 512 decodes that size instead and reports the time.
TEST(VaeRandom, SdSizeDecode) {
  const VaeConfig c;  // the defaults are SD 1.x's
  const auto t0 = std::chrono::steady_clock::now();
  const Vae vae = Vae::random(c, 42, Device::cpu()).value();
  const char* env = std::getenv("ATELIER_VAE_TIMING");
  const int image = env && *env ? std::atoi(env) : 64;
  ASSERT_TRUE(image >= 8 && image % 8 == 0) << "ATELIER_VAE_TIMING must be an image size, a multiple of 8";
  const int h = image / 8;
  std::vector<float> zv(size_t(4 * h * h));
  for (size_t i = 0; i < zv.size(); ++i) zv[i] = std::sin(0.013f * float(i)) * 2.0f;
  const Tensor z = Tensor::from_vector(zv, {1, 4, h, h});
  const auto t1 = std::chrono::steady_clock::now();
  const std::clock_t c1 = std::clock();
  const Tensor img = vae.decode(z);
  const std::clock_t c2 = std::clock();
  const auto t2 = std::chrono::steady_clock::now();
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::cout << "[vae] random SD VAE: build " << secs(t0, t1) << " s; decode " << image << "x" << image << ": " << secs(t1, t2)
            << " s wall, " << double(c2 - c1) / CLOCKS_PER_SEC << " s CPU (all threads)\n";
  ASSERT_EQ(img.shape(), (Shape{1, 3, image, image}));
  for (float v : img.to_vector()) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace atelier
