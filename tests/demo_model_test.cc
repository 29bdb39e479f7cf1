// End to end: the bundled demo model (models/demo) draws what a handful of prompts ask for, judged by the demo
// checker; and `generate` finds the model without --model. Skipped, with the reason printed, until the
// trained weights are committed (models/demo/model_index.json).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "demo_checker.h"
#include "pipeline/demo_model.h"
#include "pipeline/sd_pipeline.h"
#include "serve/model_registry.h"

namespace atelier {
namespace {
namespace fs = std::filesystem;

const fs::path kDemoDir = fs::path(ATELIER_TEST_SOURCE_DIR) / "models" / "demo";
constexpr int kRequiredPasses = 4;  // of the 5 prompts below

// Scoped environment variable (restored on destruction).
class EnvVar {
 public:
  EnvVar(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~EnvVar() { old_ ? (void)setenv(name_, old_->c_str(), 1) : (void)unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DemoModelLookup, EnvironmentFirstThenInstallThenSource) {
  const fs::path tmp = fs::temp_directory_path() / "atelier_demo_lookup_test";
  fs::create_directories(tmp / "model");
  std::ofstream(tmp / "model" / "model_index.json") << "{}";
  EnvVar env("ATELIER_DEMO_MODEL", (tmp / "model").string());
  const auto c = demo_model_candidates("/opt/x/bin");
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0], (tmp / "model").string());
  EXPECT_EQ(c[1], "/opt/x/share/atelier/models/demo");
  EXPECT_EQ(c[2], kDemoDir.string());
  auto found = find_demo_model("/opt/x/bin");
  ASSERT_TRUE(found.has_value()) << found.status().message();
  EXPECT_EQ(*found, (tmp / "model").string());
  fs::remove_all(tmp);
}

// `atelier serve` with neither --model nor --model-dir serves the demo model as "demo"; anything named wins.
TEST(DemoModelLookup, ServeDefaultsToTheDemoModel) {
  const fs::path tmp = fs::temp_directory_path() / "atelier_demo_serve_test";
  fs::create_directories(tmp / "model");
  std::ofstream(tmp / "model" / "model_index.json") << "{}";
  EnvVar env("ATELIER_DEMO_MODEL", (tmp / "model").string());
  EXPECT_EQ(serve::specs_with_default_model({}, "", "/opt/x/bin"), std::vector<std::string>{"demo=" + (tmp / "model").string()});
  EXPECT_EQ(serve::specs_with_default_model({"sd=/m"}, "", "/opt/x/bin"), std::vector<std::string>{"sd=/m"});
  EXPECT_TRUE(serve::specs_with_default_model({}, "/models", "/opt/x/bin").empty());
  auto registry = serve::ModelRegistry::create(serve::specs_with_default_model({}, "", ""), "");
  ASSERT_TRUE(registry.has_value()) << registry.status().message();
  ASSERT_NE(registry->find("demo"), nullptr);
  EXPECT_EQ(registry->find("demo")->path, (tmp / "model").string());
  fs::remove_all(tmp);
}

TEST(DemoModelLookup, ClearErrorWhenAbsent) {
  EnvVar env("ATELIER_DEMO_MODEL", "/nonexistent/demo");
  if (fs::exists(kDemoDir / "model_index.json")) {
    EXPECT_EQ(*find_demo_model(""), kDemoDir.string());  // the source tree's copy is the fallback
    return;
  }
  auto found = find_demo_model("/nonexistent/bin");
  ASSERT_FALSE(found.has_value());
  EXPECT_NE(found.status().message().find("/nonexistent/demo"), std::string::npos) << found.status().message();
  EXPECT_NE(found.status().message().find("--model"), std::string::npos) << found.status().message();
}

// Runs the CLI; returns its exit code and puts stdout + stderr in `output`.
int run_cli(const std::string& args, std::string& output) {
  FILE* p = popen((std::string(ATELIER_BINARY) + " " + args + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) output.append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The README's first command: `generate` with no --model uses the demo model from the source tree, or says
// where it looked when the model is not there.
TEST(DemoModelCli, GenerateWithoutModel) {
  const fs::path out = fs::temp_directory_path() / "atelier_demo_cli_test.png";
  fs::remove(out);
  std::string output;
  const int rc = run_cli("generate --prompt \"a red circle on a blue background\" --seed 1 --rng cpu --output " +
                             out.string(), output);
  if (fs::exists(kDemoDir / "model_index.json")) {
    EXPECT_EQ(rc, 0) << output;
    EXPECT_TRUE(fs::exists(out)) << output;
    // No --sampler: the demo model's own sampler, recorded in the JSON sidecar.
    std::ifstream sidecar(fs::path(out).replace_extension(".json"));
    const std::string info((std::istreambuf_iterator<char>(sidecar)), std::istreambuf_iterator<char>());
    EXPECT_NE(info.find(std::string("\"sampler\": \"") + kDemoModelSampler + "\""), std::string::npos) << info;
    fs::remove(fs::path(out).replace_extension(".json"));
  } else {
    EXPECT_EQ(rc, 1) << output;
    EXPECT_NE(output.find("demo model was not found"), std::string::npos) << output;
    EXPECT_NE(output.find(kDemoDir.string()), std::string::npos) << output;
  }
  fs::remove(out);
}

TEST(DemoModel, DrawsWhatThePromptsSay) {
  if (!fs::exists(kDemoDir / "model_index.json"))
    GTEST_SKIP() << "models/demo has no trained model yet (model_index.json absent): see models/demo/README.md";
  auto model = load_sd_model(kDemoDir.string(), {});
  ASSERT_TRUE(model.has_value()) << model.status().message();
  SdPipeline pipe(*model);
  const std::vector<std::string> prompts = {
      "a red circle on a blue background", "two small yellow stars on a purple background",
      "a large green square on a white background", "three small white triangles on a black background",
      "a small orange circle on the left on a blue background"};
  int passed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r;  // what `generate` uses for the demo model: 20 steps, CFG 7, its sampler, its size
    r.sampler = kDemoModelSampler;
    r.prompt = prompts[i];
    r.seed = int64_t(i + 1);
    r.rng = "cpu";
    auto res = pipe.generate(r);
    ASSERT_TRUE(res.has_value()) << res.status().message();
    const auto c = demo::check(res->images[0].image, prompts[i]);
    passed += c.passed;
    std::printf("%s '%s': %s\n", c.passed ? "PASS" : "FAIL", prompts[i].c_str(), c.describe().c_str());
  }
  EXPECT_GE(passed, kRequiredPasses);
}

}  // namespace
}  // namespace atelier
