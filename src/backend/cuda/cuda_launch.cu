// Launch-configuration helpers shared by the kernels that run in thread-block clusters (the slice group norm, the
// own GEMMs' pairs): the attributes a launch needs and the occupancy calculator's answer, asked once (cuda_common.h).
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/cuda_common.h"

namespace atelier::cuda {
namespace {
constexpr int kPortableCluster = 8;  // larger clusters need the non-portable opt-in (sm_90: 16)
constexpr size_t kDefaultSmem = 48 * 1024;
}  // namespace

void allow_launch(const void* kernel, const cudaLaunchConfig_t& cfg) {
  if (cfg.dynamicSmemBytes > kDefaultSmem)
    ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(cfg.dynamicSmemBytes)));
  if (cfg.numAttrs > 0 && cfg.attrs[0].val.clusterDim.x > unsigned(kPortableCluster))
    ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

int max_active_clusters(const void* kernel, const cudaLaunchConfig_t& cfg) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, unsigned, unsigned, unsigned, size_t>, int> cache;
  int device = 0;
  ATELIER_CUDA_OK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  const unsigned cs = cfg.numAttrs > 0 ? cfg.attrs[0].val.clusterDim.x : 1;
  auto [it, fresh] = cache.try_emplace({device, kernel, cfg.gridDim.x, cfg.blockDim.x, cs, cfg.dynamicSmemBytes}, 0);
  if (fresh) {
    allow_launch(kernel, cfg);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      clusters = 0;
    }
    it->second = clusters;
  }
  return it->second;
}

}  // namespace atelier::cuda
