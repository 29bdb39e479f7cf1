#include <array>
#include <mutex>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

namespace atelier {
namespace {
constexpr int kMaxDevices = 16;
std::mutex g_mu;
std::array<Backend*, kMaxDevices> g_cuda{};
}  // namespace

void register_backend(Device::Kind kind, int index, Backend* backend) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (kind == Device::Kind::kCUDA && index >= 0 && index < kMaxDevices) g_cuda[index] = backend;
}

bool backend_available(Device dev) {
  if (dev.is_cpu()) return true;
  std::lock_guard<std::mutex> lock(g_mu);
  return dev.index >= 0 && dev.index < kMaxDevices && g_cuda[dev.index] != nullptr;
}

Backend& backend_for(Device dev) {
  if (dev.is_cpu()) return cpu_backend();
  std::lock_guard<std::mutex> lock(g_mu);
  if (dev.index < 0 || dev.index >= kMaxDevices || !g_cuda[dev.index])
    throw Error(Status(ErrorCode::kUnsupported, "device " + dev.str() + " is not available in this build or on this machine"));
  return *g_cuda[dev.index];
}

}  // namespace atelier
