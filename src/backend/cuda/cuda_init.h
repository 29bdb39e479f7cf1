// Lazy start-up of the CUDA backends, called by the registry (registry.cc) the first time a CUDA device is
// asked for. Kept free of CUDA headers so that the registry compiles the same with and without CUDA.
#pragma once
#include <string>

namespace atelier {

// Counts the GPUs and registers one backend per device, once per process. Returns "" on success, else why
// no device could be used (e.g. CUDA's error string when there is no driver or no GPU); never aborts and
// prints nothing.
const std::string& init_cuda_backends();

}  // namespace atelier
