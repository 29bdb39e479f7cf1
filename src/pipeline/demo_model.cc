#include "pipeline/demo_model.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace atelier {
namespace fs = std::filesystem;

#ifndef ATELIER_SOURCE_DIR
#define ATELIER_SOURCE_DIR ""
#endif

namespace {
constexpr const char* kEnvVar = "ATELIER_DEMO_MODEL";
constexpr const char* kInstalledRel = "../share/atelier/models/demo";
constexpr const char* kSourceRel = "models/demo";
}  // namespace

std::vector<std::string> demo_model_candidates(const std::string& exe_dir) {
  std::vector<std::string> out;
  if (const char* env = std::getenv(kEnvVar); env && *env) out.emplace_back(env);
  if (!exe_dir.empty()) out.push_back((fs::path(exe_dir) / kInstalledRel).lexically_normal().string());
  if (*ATELIER_SOURCE_DIR) out.push_back((fs::path(ATELIER_SOURCE_DIR) / kSourceRel).string());
  return out;
}

Expected<std::string> find_demo_model(const std::string& exe_dir) {
  const auto candidates = demo_model_candidates(exe_dir);
  std::string looked;
  for (const auto& dir : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(fs::path(dir) / "model_index.json", ec)) return dir;
    looked += (looked.empty() ? "" : ", ") + dir;
  }
  return not_found("no --model given and the bundled demo model was not found (looked in: " +
                   (looked.empty() ? std::string("nowhere") : looked) +
                   "); pass --model PATH (any SD 1.x/2.x diffusers folder or .safetensors file) or set $" + kEnvVar);
}

std::string executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

}  // namespace atelier
