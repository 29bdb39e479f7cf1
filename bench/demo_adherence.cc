// Prompt adherence of the demo model: runs the held-out prompts (tests/data/demo/heldout_prompts.txt, caption
// combinations never shown in training) through the engine and judges each image with the demo checker.
//   demo_adherence [--model DIR] [--prompts FILE] [--steps N] [--cfg F] [--sampler NAME] [--save DIR]
// Prints one line per prompt and "adherence: P/N = X%"; exits 0 (the figure is the output, not a verdict).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "demo_checker.h"
#include "io/image.h"
#include "pipeline/demo_model.h"
#include "pipeline/sd_pipeline.h"

namespace {

struct Args {
  std::string model, prompts = std::string(ATELIER_SOURCE_DIR) + "/tests/data/demo/heldout_prompts.txt";
  std::string sampler = atelier::kDemoModelSampler, save;  // what `generate` uses for the demo model
  int steps = 20;
  float cfg = 7.0f;
};

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") a.model = v;
    else if (k == "--prompts") a.prompts = v;
    else if (k == "--steps") a.steps = std::atoi(v.c_str());
    else if (k == "--cfg") a.cfg = float(std::atof(v.c_str()));
    else if (k == "--sampler") a.sampler = v;
    else if (k == "--save") a.save = v;
    else return false;
  }
  return argc % 2 == 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace atelier;
  Args a;
  if (!parse(argc, argv, a)) {
    std::fprintf(stderr, "usage: demo_adherence [--model DIR] [--prompts FILE] [--steps N] [--cfg F] [--sampler NAME] [--save DIR]\n");
    return 2;
  }
  if (a.model.empty()) {
    auto found = find_demo_model(executable_dir());
    if (!found) return std::fprintf(stderr, "error: %s\n", found.status().message().c_str()), 1;
    a.model = *found;
  }
  auto model = load_sd_model(a.model, {});
  if (!model) return std::fprintf(stderr, "error: %s\n", model.status().message().c_str()), 1;
  std::vector<std::string> prompts;
  std::ifstream in(a.prompts);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) prompts.push_back(line);
  if (prompts.empty()) return std::fprintf(stderr, "error: no prompts in %s\n", a.prompts.c_str()), 1;
  if (!a.save.empty()) std::filesystem::create_directories(a.save);
  SdPipeline pipe(*model);
  int passed = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateRequest r;
    r.prompt = prompts[i];
    r.seed = int64_t(i + 1);
    r.rng = "cpu";
    r.steps = a.steps;
    r.cfg_scale = a.cfg;
    r.sampler = a.sampler;
    auto res = pipe.generate(r);
    if (!res) return std::fprintf(stderr, "error: %s\n", res.status().message().c_str()), 1;
    const Image& img = res->images[0].image;
    const auto c = demo::check(img, prompts[i]);
    passed += c.passed;
    std::printf("%s  %-60s %s\n", c.passed ? "PASS" : "FAIL", prompts[i].c_str(), c.describe().c_str());
    if (!a.save.empty()) {
      char name[32];
      std::snprintf(name, sizeof name, "/%02zu.png", i);
      (void)write_png(a.save + name, img, {{"parameters", prompts[i]}});
    }
  }
  std::printf("adherence: %d/%zu = %.0f%% (%s, %d steps, CFG %.1f)\n", passed, prompts.size(),
              100.0 * passed / double(prompts.size()), a.sampler.c_str(), a.steps, a.cfg);
  return 0;
}
