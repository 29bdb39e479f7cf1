#include "models/common/component_files.h"

#include <algorithm>

#include "io/json_util.h"

namespace atelier {

namespace fs = std::filesystem;

Expected<std::vector<std::string>> component_weight_files(const fs::path& dir, const std::string& stem) {
  if (!fs::is_directory(dir)) return not_found("component folder " + dir.string() + " is missing");
  const fs::path plain = dir / (stem + ".safetensors");
  if (fs::exists(plain)) return std::vector<std::string>{plain.string()};
  std::vector<std::string> files;
  const fs::path index = dir / (stem + ".safetensors.index.json");
  if (fs::exists(index)) {
    ATELIER_ASSIGN_OR_RETURN(auto j, read_json_file(index.string()));
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) return corrupt(index.string() + " has no weight_map object");
    for (auto& [key, file] : j["weight_map"].items()) {
      if (!file.is_string()) return corrupt(index.string() + ": weight_map values must be file names");
      const std::string p = (dir / file.get<std::string>()).string();
      if (std::find(files.begin(), files.end(), p) == files.end()) files.push_back(p);
    }
    return files;
  }
  for (const char* variant : {".fp16.safetensors", ".bf16.safetensors"}) {
    const fs::path v = dir / (stem + variant);
    if (fs::exists(v)) return std::vector<std::string>{v.string()};
  }
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  if (files.empty())
    return not_found("no " + stem + ".safetensors in " + dir.string() +
                     " (only safetensors weights are supported; convert .bin/.ckpt files first)");
  return files;
}

}  // namespace atelier
