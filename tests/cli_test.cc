// The `atelier` binary end to end: generate writes a PNG with infotext and a JSON sidecar; bad input gets a
// clear message and a nonzero exit, never a crash.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/image.h"
#include "pipeline/flux_model.h"
#include "test_util.h"

namespace atelier {
namespace {
namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  bool crashed = false;
  std::string output;  // stdout + stderr
};

RunResult run_cli(const std::string& args) {
  const std::string cmd = std::string(ATELIER_BINARY) + " " + args + " 2>&1";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.crashed = WIFSIGNALED(status);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("atelier_cli_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

TEST(Cli, GenerateWritesPngWithInfotextAndSidecar) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const fs::path out = temp_dir("gen") / "img.png";
  const auto r = run_cli("generate --model " + q(dir / "model") +
                         " --prompt 'a red circle' --negative-prompt blurry --width 64 --height 64 --steps 2"
                         " --seed 7 --sampler 'DPM++ 2M Karras' --output " + q(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(out, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  auto img = decode_image(ss.str());
  ASSERT_TRUE(img) << img.status().message();
  EXPECT_EQ(img->width, 64);
  auto info = read_infotext(ss.str());
  ASSERT_TRUE(info) << info.status().message();
  EXPECT_NE(info->find("a red circle\nNegative prompt: blurry\nSteps: 2, Sampler: DPM++ 2M, Schedule type: Karras"),
            std::string::npos) << *info;
  EXPECT_NE(info->find("Seed: 7"), std::string::npos);
  std::ifstream side(fs::path(out).replace_extension(".json"));
  const auto j = nlohmann::json::parse(side);
  EXPECT_EQ(j["settings"]["seed"], 7);
  EXPECT_TRUE(j.contains("timings"));
}

TEST(Cli, BatchWritesOneFilePerImageWithConsecutiveSeeds) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const fs::path d = temp_dir("batch");
  const auto r = run_cli("generate --model " + q(dir / "model") + " --width 32 --height 32 --steps 1 --seed 100"
                         " --batch-size 2 --batch-count 2 --output " + q(d / "b.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(fs::exists(d / ("b-" + std::to_string(i) + ".png"))) << i;
  std::ifstream side(d / "b-3.json");
  EXPECT_EQ(nlohmann::json::parse(side)["settings"]["seed"], 103);
}

// --mask: the first image, inpainted where a mask is white (its left half); the right half comes back unchanged.
TEST(Cli, MaskInpaintsTheInitImage) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const fs::path d = temp_dir("inpaint");
  const std::string base = "generate --model " + q(dir / "model") + " --width 64 --height 64 --steps 4 --seed 3 ";
  ASSERT_EQ(run_cli(base + "--output " + q(d / "start.png")).exit_code, 0);
  Image mask{64, 64, 1, std::vector<uint8_t>(64 * 64, 0)};
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 32; ++x) mask.pixels[size_t(y) * 64 + x] = 255;
  ASSERT_TRUE(write_png((d / "mask.png").string(), mask).is_ok());
  const auto r = run_cli(base + "--init-image " + q(d / "start.png") + " --mask " + q(d / "mask.png") +
                         " --mask-blur 0 --inpaint-fill latent_noise --output " + q(d / "out.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto start = read_image((d / "start.png").string()), out = read_image((d / "out.png").string());
  ASSERT_TRUE(start && out);
  int changed_left = 0;
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 64; ++x)
      for (int c = 0; c < 3; ++c) {
        const size_t i = (size_t(y) * 64 + x) * 3 + c;
        if (x >= 32) ASSERT_EQ(out->pixels[i], start->pixels[i]) << x << "," << y;
        else changed_left += out->pixels[i] != start->pixels[i];
      }
  EXPECT_GT(changed_left, 32 * 64);
  std::ifstream side(d / "out.json");
  const auto j = nlohmann::json::parse(side);
  EXPECT_EQ(j["settings"]["inpaint_fill"], "latent_noise");
  EXPECT_EQ(j["settings"]["mask_blur_x"], 0);
  const auto bad = run_cli(base + "--init-image " + q(d / "start.png") + " --mask " + q(d / "mask.png") +
                           " --inpaint-fill smear --output " + q(d / "bad.png"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("unknown inpaint fill 'smear'"), std::string::npos) << bad.output;
}

TEST(Cli, InfoDescribesBothLayouts) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  auto r = run_cli("info " + q(dir / "model"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("SD 1.x"), std::string::npos) << r.output;
  r = run_cli("info --json " + q(dir / "sd15-tiny.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["family"], "SD 1.x");
  EXPECT_EQ(j["layout"], "single-file (CompVis)");
  EXPECT_GT(j["unet"]["parameters"].get<int64_t>(), 0);
}

// FLUX and Z-Image from their files alone: the two layouts of one transformer count the same parameters, the total
// is the components', and the hash is the one the loader gives the infotext.
TEST(Cli, InfoDescribesFluxAndZImageFromTheirFiles) {
  ATELIER_REQUIRE_FIXTURE(flux, "flux-tiny");
  ATELIER_REQUIRE_FIXTURE(zimage, "zimage-tiny");
  auto info = [](const fs::path& p) {
    const auto r = run_cli("info --json " + q(p));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output, nullptr, false);
  };
  const auto folder = info(flux / "model");
  ASSERT_FALSE(folder.is_discarded());
  EXPECT_EQ(folder["family"], "flux");
  EXPECT_EQ(folder["layout"], "diffusers");
  EXPECT_EQ(folder["components"]["transformer"]["class"], "FluxTransformer2DModel");
  EXPECT_FALSE(folder["components"]["scheduler"].contains("parameters"));
  int64_t sum = 0;
  for (const auto& [name, c] : folder["components"].items()) sum += c.value("parameters", int64_t(0));
  EXPECT_EQ(folder["parameters_total"], sum);
  EXPECT_GT(folder["components"]["vae"]["parameters"].get<int64_t>(), 0);
  FluxLoadOptions lo;
  EXPECT_EQ(folder["hash"], load_flux_model((flux / "model").string(), lo).value()->hash);
  const auto bfl = info(flux / "flux-tiny-transformer.bfl.safetensors");
  EXPECT_EQ(bfl["layout"], "single-file (BFL)");
  EXPECT_EQ(bfl["components"]["transformer"]["parameters"], folder["components"]["transformer"]["parameters"]);

  const auto zfolder = info(zimage / "model");
  const auto zfile = info(zimage / "zimage-tiny-transformer.original.safetensors");
  EXPECT_EQ(zfolder["family"], "zimage");
  EXPECT_EQ(zfile["layout"], "single-file (original)");
  EXPECT_GT(zfolder["components"]["text_encoder"]["parameters"].get<int64_t>(), 0);
  EXPECT_EQ(zfile["components"]["transformer"]["parameters"], zfolder["components"]["transformer"]["parameters"]);
  const auto text = run_cli("info " + q(zimage / "model"));
  EXPECT_NE(text.output.find("ZImageTransformer2DModel"), std::string::npos) << text.output;
}

struct BadCase {
  const char* name;
  std::string args;      // after "generate --model MODEL"
  std::string expected;  // part of the message
};

TEST(Cli, BadInputGetsAClearMessageAndNonzeroExit) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  const fs::path d = temp_dir("bad");
  // A truncated copy of a real checkpoint and a file that is not safetensors at all.
  {
    std::ifstream in(dir / "sd15-tiny.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(d / "truncated.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 3);
    std::ofstream(d / "garbage.safetensors", std::ios::binary) << "this is not a checkpoint";
  }
  const std::string model = " --model " + q(dir / "model");
  const std::vector<BadCase> cases = {
      {"missing model", " --model " + q(d / "nope.safetensors"), "does not exist"},
      {"truncated file", " --model " + q(d / "truncated.safetensors"), "truncated.safetensors"},
      {"garbage file", " --model " + q(d / "garbage.safetensors"), "garbage.safetensors"},
      {"unknown sampler", model + " --sampler warp", "euler"},
      {"size not multiple of 8", model + " --width 100", "multiple of 8"},
      {"negative steps", model + " --steps -5", "steps"},
      {"unknown schedule", model + " --schedule lunar", "karras"},
      {"unknown device", model + " --device tpu", "cuda:N"},
      {"unknown rng", model + " --rng quantum", "cpu"},
  };
  for (const auto& c : cases) {
    const auto r = run_cli("generate" + c.args + " --output " + q(d / "x.png"));
    EXPECT_FALSE(r.crashed) << c.name << ": " << r.output;
    EXPECT_NE(r.exit_code, 0) << c.name << ": " << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.name << ": " << r.output;
  }
}

}  // namespace
}  // namespace atelier
