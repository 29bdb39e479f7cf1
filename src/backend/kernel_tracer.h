// Every kernel the GPU ran, as it ran it: the kernel activity of the vendor's profiling interface (CUPTI on
// CUDA), for `atelier bench --kernels` and the `--trace` files. It sees what a trace::DeviceTimer cannot: a CUDA
// graph replay is one timed range to the event timer, while here each of its kernels has its own device span, so
// the gaps between kernels inside a replayed step (the device idle while the step runs) can be measured.
//
// Tracing is process-wide (CUPTI has one activity subscriber per process): several tracers may be open at once
// (the bench's and the trace file's); each collects the kernels that started after it was opened. It adds a
// little device time per kernel (CUPTI's timestamps), so figures measured with a tracer open say so.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/trace.h"

namespace atelier {

class KernelTracer {
 public:
  virtual ~KernelTracer() = default;
  // The kernels (and copies, below) that started since this tracer was opened, in start order, as trace events of
  // category kKernel:
  // name = the kernel's function name without namespaces, return type or parameters (template arguments kept, so
  // instances stay apart; static storage), start_ns / dur_ns its device span on the host's steady clock (the
  // clock of trace::now_ns(), so kernels line up with the host ranges that launched them), thread = the stream,
  // index = the CUDA graph it ran in (-1 outside graphs), detail = "cuda:D grid x,y,z block x,y,z". Call after the device
  // has synchronized: a kernel still running is not reported yet. Errors when CUPTI dropped records.
  virtual Expected<std::vector<trace::Event>> collect() = 0;
};

// Copies and memsets of the device's queue (a copy engine's work: cudaMemcpyAsync, cudaMemsetAsync) come as events
// of the same category, on their stream's track, named in brackets ("[memcpy HtoD]", "[memcpy DtoD]",
// "[memset]"; kernel names never start with one) with detail "cuda:D N bytes".
inline constexpr const char* kMemsetName = "[memset]";
inline bool is_copy_activity(const trace::Event& e) { return e.name && e.name[0] == '['; }

// Opens a tracer; an error says why none can run (a build without CUDA, no CUPTI library, no GPU or driver,
// another profiler holding CUPTI).
Expected<std::unique_ptr<KernelTracer>> open_kernel_tracer();

// A mangled kernel name as KernelTracer reports it: demangled, without the return type, the parameter list
// and namespace qualifiers ("void atelier::cuda::(anonymous namespace)::f<(atelier::Op)2, 64>(P)" ->
// "f<(Op)2, 64>"). Names that do not demangle (extern "C" kernels) come back as they are.
std::string short_kernel_name(const char* mangled);

}  // namespace atelier
