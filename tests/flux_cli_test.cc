// `atelier generate` on FLUX models: the diffusers folder and the BFL single file + --vae/--clip-l/--t5 both give
// the golden run's image (to 8-bit rounding); true CFG only with --cfg-scale; a BFL file alone names what it needs.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "io/image.h"
#include "test_util.h"

namespace atelier {
namespace {
namespace fs = std::filesystem;

const char* const kRunFlags =
    " --prompt 'a photo of an astronaut riding a horse on mars' --width 128 --height 128 --steps 4 --seed 1234"
    " --rng cpu --max-sequence-length 32";

struct CliRun {
  int exit_code = -1;
  std::string output;
};

CliRun run_cli(const std::string& args) {
  CliRun r;
  FILE* p = popen((std::string(ATELIER_BINARY) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

fs::path out_path(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("atelier_flux_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d / (name + ".png");
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Largest difference between the PNG's pixels and round(255 * golden image).
int max_pixel_error(const fs::path& png) {
  auto img = decode_image(read_file(png));
  EXPECT_TRUE(img.has_value());
  if (!img) return 255;
  const auto want = test::golden("flux-tiny", "run.flux_euler.image").to_vector();
  EXPECT_EQ(img->pixels.size(), want.size());
  int worst = 0;
  for (size_t i = 0; i < want.size() && i < img->pixels.size(); ++i) {
    worst = std::max(worst, std::abs(int(img->pixels[i]) - int(std::lround(want[i] * 255.0f))));
  }
  return worst;
}

TEST(FluxCli, DiffusersFolderGivesGoldenImage) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const fs::path out = out_path("folder");
  const auto r = run_cli("generate --model " + q(dir / "model") + kRunFlags + " --output " + q(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LE(max_pixel_error(out), 1);
  auto info = read_infotext(read_file(out));
  ASSERT_TRUE(info.has_value());
  EXPECT_NE(info->find("Steps: 4, Sampler: Euler, Schedule type: Simple, CFG scale: 1, Distilled CFG Scale: 3.5"),
            std::string::npos) << *info;
}

TEST(FluxCli, BflSingleFilesGiveGoldenImage) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const fs::path out = out_path("bfl");
  // (--offload: the text encoders are dropped after encoding; the image is the same)
  const auto r = run_cli("generate --model " + q(dir / "flux-tiny-transformer.bfl.safetensors") + " --vae " +
                         q(dir / "flux-tiny-ae.safetensors") + " --clip-l " + q(dir / "model/text_encoder/model.safetensors") +
                         " --t5 " + q(dir / "model/text_encoder_2") + kRunFlags + " --offload --output " + q(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LE(max_pixel_error(out), 1);
}

// --dtype fp8: the transformer blocks in e4m3 draw the golden image to within a few 8-bit levels (the
// model's output moves by 0.6% rel L2: flux_transformer_test), yet not the f32 run's exact pixels; the same
// flag on an SD model is refused with what it supports.
TEST(FluxCli, Fp8BlocksDrawNearlyTheGoldenImage) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const fs::path out = out_path("fp8"), f32 = out_path("fp8_ref");
  const auto r = run_cli("generate --model " + q(dir / "model") + kRunFlags + " --dtype fp8 --output " + q(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(run_cli("generate --model " + q(dir / "model") + kRunFlags + " --output " + q(f32)).exit_code, 0);
  const int err = max_pixel_error(out);
  std::printf("[flux] --dtype fp8 image vs golden: max |diff| %d / 255\n", err);
  EXPECT_LE(err, 8);
  const auto a = decode_image(read_file(out)), b = decode_image(read_file(f32));
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->pixels, b->pixels);  // it did run in fp8
  ATELIER_REQUIRE_FIXTURE(sd, "sd15-tiny");
  const auto refused = run_cli("generate --model " + q(sd / "model") + " --prompt x --steps 1 --dtype fp8 --output " +
                               q(out_path("sd_fp8")));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("FLUX and Z-Image"), std::string::npos) << refused.output;
}

TEST(FluxCli, TrueCfgOnlyWhenAsked) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const fs::path out = out_path("cfg");
  const auto r = run_cli("generate --model " + q(dir / "model") + kRunFlags +
                         " --cfg-scale 2 --negative-prompt blurry --output " + q(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(max_pixel_error(out), 1);  // a second pass against the negative prompt changes the image
  auto info = read_infotext(read_file(out));
  ASSERT_TRUE(info.has_value());
  EXPECT_NE(info->find("CFG scale: 2"), std::string::npos) << *info;
}

// --init-image on a FLUX model: img2img from the golden run's own image at strength 0.5 (2 of the 4 steps), a new image
// whose infotext names the strength; a strength that leaves no step is refused.
TEST(FluxCli, InitImageRunsImg2Img) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const fs::path golden = out_path("img2img_init"), out = out_path("img2img");
  ASSERT_EQ(run_cli("generate --model " + q(dir / "model") + kRunFlags + " --output " + q(golden)).exit_code, 0);
  const auto r = run_cli("generate --model " + q(dir / "model") + kRunFlags + " --init-image " + q(golden) +
                         " --strength 0.5 --output " + q(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(max_pixel_error(out), 1);  // not the txt2img image
  auto info = read_infotext(read_file(out));
  ASSERT_TRUE(info.has_value());
  EXPECT_NE(info->find("Denoising strength: 0.5"), std::string::npos) << *info;
  const auto none = run_cli("generate --model " + q(dir / "model") + kRunFlags + " --init-image " + q(golden) +
                            " --strength 0.1 --output " + q(out_path("img2img_none")));
  EXPECT_NE(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("strength"), std::string::npos) << none.output;
}

TEST(FluxCli, BflFileAloneNamesMissingParts) {
  ATELIER_REQUIRE_FIXTURE(dir, "flux-tiny");
  const auto r = run_cli("generate --model " + q(dir / "flux-tiny-transformer.bfl.safetensors") + kRunFlags +
                         " --output " + q(out_path("missing")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--vae"), std::string::npos) << r.output;
  const auto bad = run_cli("generate --model " + q(dir / "model") + kRunFlags + " --guidance -1 --output " + q(out_path("bad")));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
}

}  // namespace
}  // namespace atelier
