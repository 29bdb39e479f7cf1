#include "pipeline/model_family.h"

#include "pipeline/builtin_models.h"
#include "pipeline/flux_model.h"
#include "pipeline/zimage_pipeline.h"

namespace atelier {

const char* model_family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::kFlux: return "flux";
    case ModelFamily::kZImage: return "zimage";
    case ModelFamily::kSd: break;
  }
  return "sd";
}

ModelFamily detect_model_family(const std::string& path) {
  if (!builtin_name_of(path).empty()) return ModelFamily::kSd;  // the built-in configurations are SD's
  if (is_flux_model(path)) return ModelFamily::kFlux;
  if (is_zimage_model(path)) return ModelFamily::kZImage;
  return ModelFamily::kSd;
}

}  // namespace atelier
