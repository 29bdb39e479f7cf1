// CUPTI's kernel activity behind backend/kernel_tracer.h. libcupti is opened at run time (dlopen), so the binary
// runs where the toolkit's profiling library is not installed; tracing then reports why it cannot run.
#pragma once
#include <memory>

#include "backend/kernel_tracer.h"

namespace atelier::cuda {

Expected<std::unique_ptr<KernelTracer>> open_cupti_tracer();

}  // namespace atelier::cuda
