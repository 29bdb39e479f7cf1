#include <array>
#include <mutex>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#ifdef ATELIER_HAVE_CUDA
#include "backend/cuda/cuda_init.h"
#endif

namespace atelier {
namespace {
constexpr int kMaxDevices = 16;
std::mutex g_mu;
std::array<Backend*, kMaxDevices> g_cuda{};

// Starts the CUDA backends on first use (never at program start, so a machine without a GPU or driver pays
// nothing and sees nothing); returns why no CUDA device is usable, or "" when at least one started.
std::string cuda_unavailable_reason() {
#ifdef ATELIER_HAVE_CUDA
  return init_cuda_backends();
#else
  return "this build has no CUDA backend (configure with -DATELIER_CUDA=ON)";
#endif
}
}  // namespace

void register_backend(Device::Kind kind, int index, Backend* backend) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (kind == Device::Kind::kCUDA && index >= 0 && index < kMaxDevices) g_cuda[index] = backend;
}

bool backend_available(Device dev) {
  if (dev.is_cpu()) return true;
  cuda_unavailable_reason();
  std::lock_guard<std::mutex> lock(g_mu);
  return dev.index >= 0 && dev.index < kMaxDevices && g_cuda[dev.index] != nullptr;
}

Backend& backend_for(Device dev) {
  if (dev.is_cpu()) return cpu_backend();
  const std::string why = cuda_unavailable_reason();
  std::lock_guard<std::mutex> lock(g_mu);
  if (dev.index < 0 || dev.index >= kMaxDevices || !g_cuda[dev.index])
    throw Error(Status(ErrorCode::kUnsupported, "device " + dev.str() + " is not available: " +
                                                    (why.empty() ? "no such CUDA device on this machine" : why)));
  return *g_cuda[dev.index];
}

}  // namespace atelier
