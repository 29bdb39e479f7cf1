// The FLUX / Z-Image bench path end to end on the CPU at the tiny fixtures' dimensions (random weights built
// through the synthetic weight store, the pipelines' own loops, the shared report), and the published
// parameter counts of the full-size configurations (computed, nothing allocated).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "pipeline/dit_bench.h"
#include "test_util.h"

namespace atelier {
namespace {

constexpr int64_t kFluxDevParams = 11901408320;       // FLUX.1-dev transformer (diffusers' parameter count)
constexpr int64_t kZImageTurboParams = 6154908736;    // Z-Image-Turbo transformer ("6.15B")
constexpr int kSteps = 3;
constexpr int kSide = 64;                             // 8x8 latents with the tiny VAE's factor 8

// The flux-tiny / zimage-tiny fixtures' transformer and VAE dimensions (their config.json files).
VaeConfig tiny_vae() {
  VaeConfig v = flux_vae_config();
  v.block_out_channels = {32, 64, 64, 64};
  v.sample_size = 128;
  return v;
}

BuiltinDitConfig tiny_flux() {
  BuiltinDitConfig c = builtin_dit_config("flux").value();
  FluxConfig& f = *c.flux;
  f.num_layers = 2;
  f.num_single_layers = 2;
  f.num_heads = 2;
  f.head_dim = 16;
  f.joint_attention_dim = 32;
  f.pooled_projection_dim = 24;
  f.axes_dims_rope = {4, 6, 6};
  c.vae = tiny_vae();
  c.text_tokens = 8;
  c.text_width = f.joint_attention_dim;
  c.pooled_width = f.pooled_projection_dim;
  return c;
}

BuiltinDitConfig tiny_zimage() {
  BuiltinDitConfig c = builtin_dit_config("zimage").value();
  ZImageConfig& z = *c.zimage;
  z.dim = 64;
  z.n_layers = 2;
  z.n_refiner_layers = 1;
  z.n_heads = 4;
  z.cap_feat_dim = 32;
  z.axes_dims = {4, 6, 6};
  z.axes_lens = {256, 64, 64};
  c.vae = tiny_vae();
  c.text_tokens = 8;
  c.text_width = z.cap_feat_dim;
  Qwen3Config& q = *c.qwen3;  // a text encoder whose width is the transformer's caption width
  q.vocab_size = 64;
  q.hidden_size = z.cap_feat_dim;
  q.intermediate_size = 48;
  q.num_hidden_layers = 3;
  q.num_attention_heads = 4;
  q.num_key_value_heads = 2;
  q.head_dim = 8;
  return c;
}

BenchOptions cpu_options(const std::string& config, float cfg_scale = 1.0f) {
  BenchOptions o;
  o.config = config;
  o.device = "cpu";
  o.width = o.height = kSide;
  o.steps = kSteps;
  o.cfg_scale = cfg_scale;
  o.warmup = 1;
  return o;
}

// What every transformer bench report must hold after a run of kSteps steps.
void expect_report(const BenchReport& r) {
  ASSERT_TRUE(r.ran);
  EXPECT_EQ(r.model_call, "transformer");
  EXPECT_EQ(r.model_calls, kSteps);
  ASSERT_EQ(r.unet_ms.size(), size_t(kSteps));
  ASSERT_EQ(r.call_flops.size(), size_t(kSteps));
  EXPECT_GT(r.unet_flops, 0u);
  for (uint64_t f : r.call_flops) EXPECT_EQ(f, r.call_flops.front()) << "every step does the same work";
  for (double ms : r.unet_ms) EXPECT_GT(ms, 0.0);
  EXPECT_GT(r.vae_decode_flops, 0u) << "the image was decoded";
  EXPECT_GT(r.vae_decode_s, 0.0);
  EXPECT_GE(r.total_s, r.denoise_s + r.vae_decode_s * 0.99);
  EXPECT_GT(r.s_per_image, 0.0);
  EXPECT_GT(r.unet_tflops, 0.0);
  EXPECT_FALSE(r.conditioning.empty());
  EXPECT_EQ(r.width, kSide);
  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j["model_call"], "transformer");
  EXPECT_EQ(j["unet_ms"]["calls"], kSteps);
  EXPECT_NE(r.to_text().find("transformer call"), std::string::npos);
  // The warm-up (one step and a decode) took at least a call's time and is reported apart from the timed run.
  EXPECT_GE(r.warmup_s, *std::min_element(r.unet_ms.begin(), r.unet_ms.end()) / 1e3);
  EXPECT_EQ(j["warmup_s"], r.warmup_s);
  EXPECT_NE(r.to_text().find("warmup 1 ("), std::string::npos) << r.to_text();
  // The backend's counters over the timed run (the CPU backend's: host allocations, reserved bytes).
  EXPECT_TRUE(j["timed_run_counters"].contains("host_allocations")) << j["timed_run_counters"].dump();
}

TEST(DitBench, FluxTinyOnCpu) {
  auto r = run_dit_bench(cpu_options("flux"), tiny_flux());
  ASSERT_TRUE(r.has_value()) << r.status().message();
  expect_report(*r);
  EXPECT_EQ(r->unet_batch, 1);
  EXPECT_NE(r->conditioning.find("[1, 8, 32]"), std::string::npos) << r->conditioning;
  std::printf("%s", r->to_text().c_str());  // the table `atelier bench --config flux` prints
  std::printf("[ figures  ] flux-tiny 64x64: %.3f ms/call, %llu FLOPs/call, %.3f s/image\n", r->unet_ms_mean,
              static_cast<unsigned long long>(r->unet_flops), r->s_per_image);
}

TEST(DitBench, FluxTrueCfgDoublesTheWorkPerCall) {
  auto plain = run_dit_bench(cpu_options("flux"), tiny_flux());
  auto cfg = run_dit_bench(cpu_options("flux", 2.0f), tiny_flux());
  ASSERT_TRUE(plain.has_value() && cfg.has_value());
  EXPECT_EQ(cfg->model_calls, kSteps);
  EXPECT_EQ(cfg->unet_batch, 2);
  // Two transformer evaluations per call, plus the same small CFG combine and Euler update.
  EXPECT_NEAR(double(cfg->unet_flops) / double(plain->unet_flops), 2.0, 0.05);
}

TEST(DitBench, ZImageTinyOnCpu) {
  auto r = run_dit_bench(cpu_options("zimage"), tiny_zimage());
  ASSERT_TRUE(r.has_value()) << r.status().message();
  expect_report(*r);
  EXPECT_NE(r->conditioning.find("[8, 32]"), std::string::npos) << r->conditioning;
  std::printf("[ figures  ] zimage-tiny 64x64: %.3f ms/call, %llu FLOPs/call, %.3f s/image\n", r->unet_ms_mean,
              static_cast<unsigned long long>(r->unet_flops), r->s_per_image);
}

// --text-encoder (Z-Image): the Qwen3 encoder is built and timed inside the run; its stage shows in the report,
// and its FP8 sibling (--fp8) runs the same pipeline with FP8 blocks.
TEST(DitBench, ZImageTextEncoderAndFp8OnCpu) {
  BenchOptions o = cpu_options("zimage");
  o.text_encoder = true;
  auto r = run_dit_bench(o, tiny_zimage());
  ASSERT_TRUE(r.has_value()) << r.status().message();
  ASSERT_TRUE(r->text_encode_s.has_value()) << r->to_json().dump();
  EXPECT_GT(*r->text_encode_s, 0.0);
  EXPECT_NE(r->conditioning.find("Qwen3 text encoder"), std::string::npos) << r->conditioning;
  o.fp8 = true;
  auto f = run_dit_bench(o, tiny_zimage());
  ASSERT_TRUE(f.has_value()) << f.status().message();
  EXPECT_NE(f->model_kind.find("fp8"), std::string::npos) << f->model_kind;
  BenchOptions sd = cpu_options("sd15");
  sd.text_encoder = true;
  EXPECT_FALSE(sd.validate().is_ok());
  sd.text_encoder = false;
  sd.fp8 = true;
  EXPECT_FALSE(sd.validate().is_ok());
}

TEST(DitBench, PublishedParameterCounts) {
  auto flux = builtin_dit_config("flux");
  auto zimage = builtin_dit_config("zimage");
  ASSERT_TRUE(flux.has_value() && zimage.has_value());
  EXPECT_EQ(flux_transformer_params(*flux->flux), kFluxDevParams);
  EXPECT_EQ(zimage_transformer_params(*zimage->zimage), kZImageTurboParams);
  const FluxConfig& f = *flux->flux;
  EXPECT_EQ(f.num_layers, 19);
  EXPECT_EQ(f.num_single_layers, 38);
  EXPECT_EQ(f.inner_dim(), 3072);
  EXPECT_EQ(flux->vae.latent_channels, 16);
  EXPECT_EQ(flux->default_steps, 28);
  EXPECT_EQ(zimage->default_steps, 8);
  EXPECT_EQ(zimage->zimage->dim, 3840);
  EXPECT_FALSE(builtin_dit_config("flux2").has_value());
}

TEST(DitBench, ParameterFormulasMatchWhatTheLoadersAllocate) {
  int64_t flux_params = 0, zimage_params = 0;
  const BuiltinDitConfig f = tiny_flux(), z = tiny_zimage();
  ASSERT_TRUE(make_random_flux_model(f, Device::cpu(), 1, &flux_params).has_value());
  ASSERT_TRUE(make_random_zimage_model(z, Device::cpu(), 1, &zimage_params).has_value());
  EXPECT_EQ(flux_params, flux_transformer_params(*f.flux));
  EXPECT_EQ(zimage_params, zimage_transformer_params(*z.zimage));
  FluxConfig schnell = *f.flux;
  schnell.guidance_embeds = false;
  BuiltinDitConfig fs = f;
  fs.flux = schnell;
  ASSERT_TRUE(make_random_flux_model(fs, Device::cpu(), 1, &flux_params).has_value());
  EXPECT_EQ(flux_params, flux_transformer_params(schnell));
}

TEST(DitBench, TinyDimensionsAreTheFixtures) {
  ATELIER_REQUIRE_FIXTURE(flux_dir, "flux-tiny");
  ATELIER_REQUIRE_FIXTURE(zimage_dir, "zimage-tiny");
  auto fc = FluxConfig::from_file((flux_dir / "model/transformer/config.json").string());
  auto zc = ZImageConfig::from_file((zimage_dir / "model/transformer/config.json").string());
  auto vc = VaeConfig::from_file((flux_dir / "model/vae/config.json").string());
  ASSERT_TRUE(fc.has_value() && zc.has_value() && vc.has_value());
  EXPECT_EQ(flux_transformer_params(*fc), flux_transformer_params(*tiny_flux().flux));
  EXPECT_EQ(zimage_transformer_params(*zc), zimage_transformer_params(*tiny_zimage().zimage));
  EXPECT_EQ(vc->block_out_channels, tiny_vae().block_out_channels);
  EXPECT_EQ(vc->latent_channels, tiny_vae().latent_channels);
}

TEST(DitBench, DefaultsPerConfiguration) {
  BenchOptions o;
  o.config = "flux";
  BenchOptions d = with_dit_defaults(o, false, false);
  EXPECT_EQ(d.steps, 28);
  EXPECT_LE(d.cfg_scale, 1.0f);
  o.config = "zimage";
  o.steps = 5;
  d = with_dit_defaults(o, true, false);
  EXPECT_EQ(d.steps, 5);
  EXPECT_TRUE(is_dit_bench(d));
  o.config = "sd15";
  EXPECT_FALSE(is_dit_bench(o));
}

TEST(DitBench, RefusesWhatItCannotRun) {
  BenchOptions o = cpu_options("flux");
  o.width = 72;  // a multiple of 8, not of 16
  auto r = run_dit_bench(o, tiny_flux());
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("multiples of 16"), std::string::npos);
  BenchOptions z = cpu_options("zimage");
  z.batch = 2;
  EXPECT_FALSE(run_dit_bench(z, tiny_zimage()).has_value());
}

}  // namespace
}  // namespace atelier
