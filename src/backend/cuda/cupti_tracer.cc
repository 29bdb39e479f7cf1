// CUPTI's concurrent-kernel, memcpy and memset activities (backend/kernel_tracer.h): one activity subscription per
// process, shared by every open tracer; records arrive in buffers CUPTI hands back (buffer_completed, on CUPTI's
// thread or inside a flush) and are kept, named and timed, until the last tracer closes.
#include "backend/cuda/cupti_tracer.h"

#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_init.h"

namespace atelier::cuda {
namespace {

constexpr size_t kBufferBytes = size_t(8) << 20;  // CUPTI's guides use 8 MB; a 380-kernel step is ~40 KB of records
constexpr size_t kBufferAlign = 8;                // activity records need 8-byte alignment
constexpr const char* kLibraries[] = {"libcupti.so.13", "libcupti.so"};

// The few CUPTI entry points used here, looked up in the library opened at run time.
struct Api {
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*register_buffers)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*register_timestamp)(CUpti_TimestampCallbackFunc) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*dropped)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
};

// The activities traced: kernels (required), and the queue's copies and memsets (copy engines' work, not kernels;
// where CUPTI refuses them, kernels are still traced). Copies between two GPUs (copy_between_devices' peer copies)
// are CUPTI's MEMCPY2 kind, not traced: no single-GPU step has any, and the two-GPU server's workers each trace
// their own device.
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

struct KernelRecord {
  const char* name;  // interned short name, or a copy's bracketed name (kernel_tracer.h)
  int64_t start_ns, end_ns;
  uint32_t device, stream;
  int64_t graph;  // -1 outside graphs
  int32_t grid[3], block[3];
  uint64_t bytes;  // copies and memsets (kernels: 0)
};

const char* copy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[memcpy HtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[memcpy DtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[memcpy DtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[memcpy PtoP]";
    default: return "[memcpy]";
  }
}

// Process-wide: CUPTI calls the buffer callbacks without a user pointer.
struct State {
  std::mutex toggle;  // held while a tracer opens or closes: enabling and disabling the activity happen in turns
  std::mutex mu;      // guards everything below (buffer_completed takes it; it may run inside a flush)
  Api api;
  std::string load_error;  // why the library could not be used ("" = loaded)
  bool loaded = false, callbacks = false;
  int open = 0;  // tracers open
  std::vector<KernelRecord> records;
  size_t dropped = 0;
  std::unordered_map<std::string, const char*> names;  // mangled -> interned short name
  std::deque<std::string> name_storage;                // never shrinks: a process runs a bounded set of kernels
};

State& state() {
  static State s;
  return s;
}

std::string result_text(const Api& api, CUptiResult r) {
  const char* text = nullptr;
  if (api.result_string && api.result_string(r, &text) == CUPTI_SUCCESS && text) return text;
  return "CUPTI error " + std::to_string(int(r));
}

// CUPTI's timestamps on the host's steady clock (trace::now_ns), so kernels line up with the ranges that launched them.
uint64_t CUPTIAPI steady_timestamp() { return uint64_t(trace::now_ns()); }

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

const char* intern(State& s, const char* mangled) {
  auto it = s.names.find(mangled);
  if (it != s.names.end()) return it->second;
  s.name_storage.push_back(short_kernel_name(mangled));
  return s.names.emplace(mangled, s.name_storage.back().c_str()).first->second;
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    CUpti_Activity* record = nullptr;
    while (s.api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      // The record layouts of the CUPTI these headers describe (libcupti.so.13).
      if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        s.records.push_back({intern(s, k->name ? k->name : "?"), int64_t(k->start), int64_t(k->end), k->deviceId, k->streamId,
                             k->graphId ? int64_t(k->graphId) : -1, {k->gridX, k->gridY, k->gridZ},
                             {k->blockX, k->blockY, k->blockZ}, 0});
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        s.records.push_back({copy_name(c->copyKind), int64_t(c->start), int64_t(c->end), c->deviceId, c->streamId,
                             c->graphId ? int64_t(c->graphId) : -1, {}, {}, c->bytes});
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        s.records.push_back({kMemsetName, int64_t(m->start), int64_t(m->end), m->deviceId, m->streamId,
                             m->graphId ? int64_t(m->graphId) : -1, {}, {}, m->bytes});
      }
    }
    size_t dropped = 0;
    if (s.api.dropped && s.api.dropped(context, stream, &dropped) == CUPTI_SUCCESS) s.dropped += dropped;
  }
  std::free(buffer);
}

// Opens libcupti and looks up the entry points (once); the caller holds s.mu.
bool load(State& s) {
  if (s.loaded || !s.load_error.empty()) return s.loaded;
  void* lib = nullptr;
  for (const char* name : kLibraries)
    if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
  if (!lib) {
    s.load_error = "CUPTI's library (libcupti.so.13, from the CUDA toolkit) is not on the library path";
    return false;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    return fn != nullptr;
  };
  Api& a = s.api;
  s.loaded = sym(a.enable, "cuptiActivityEnable") && sym(a.disable, "cuptiActivityDisable") &&
             sym(a.register_buffers, "cuptiActivityRegisterCallbacks") &&
             sym(a.register_timestamp, "cuptiActivityRegisterTimestampCallback") && sym(a.flush_all, "cuptiActivityFlushAll") &&
             sym(a.next_record, "cuptiActivityGetNextRecord") && sym(a.dropped, "cuptiActivityGetNumDroppedRecords") &&
             sym(a.result_string, "cuptiGetResultString");
  if (!s.loaded) s.load_error = "the CUPTI library found lacks entry points this build needs (CUDA 13's CUPTI)";
  return s.loaded;
}

class CuptiTracer final : public KernelTracer {
 public:
  explicit CuptiTracer(int64_t opened_ns) : opened_ns_(opened_ns) {}
  ~CuptiTracer() override {
    State& s = state();
    std::lock_guard<std::mutex> toggle(s.toggle);
    std::unique_lock<std::mutex> lock(s.mu);
    if (--s.open > 0) return;
    lock.unlock();  // disabling flushes through buffer_completed, which takes the lock
    for (CUpti_ActivityKind kind : kKinds) s.api.disable(kind);
    s.api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    lock.lock();
    s.records.clear();
    s.dropped = 0;
  }

  Expected<std::vector<trace::Event>> collect() override {
    State& s = state();
    if (CUptiResult r = s.api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); r != CUPTI_SUCCESS)
      return internal_error("CUPTI could not flush its kernel records: " + result_text(s.api, r));
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.dropped)
      return internal_error("CUPTI dropped " + std::to_string(s.dropped) + " kernel records (its buffers filled faster than they were read)");
    const auto triple = [](const int32_t (&v)[3]) {
      return std::to_string(v[0]) + "," + std::to_string(v[1]) + "," + std::to_string(v[2]);
    };
    std::vector<trace::Event> out;
    for (const KernelRecord& k : s.records) {
      if (k.start_ns < opened_ns_) continue;
      trace::Event e;
      e.name = k.name;
      e.category = trace::Category::kKernel;
      e.thread = k.stream;
      e.start_ns = k.start_ns;
      e.dur_ns = k.end_ns - k.start_ns;
      e.index = k.graph;
      e.detail = "cuda:" + std::to_string(k.device) + (is_copy_activity(e) ? " " + std::to_string(k.bytes) + " bytes"
                                                                             : " grid " + triple(k.grid) + " block " + triple(k.block));
      out.push_back(std::move(e));
    }
    std::stable_sort(out.begin(), out.end(), [](const trace::Event& a, const trace::Event& b) { return a.start_ns < b.start_ns; });
    return out;
  }

 private:
  int64_t opened_ns_;
};

}  // namespace

Expected<std::unique_ptr<KernelTracer>> open_cupti_tracer() {
  if (const std::string& why = init_cuda_backends(); !why.empty()) return unsupported("kernel tracing needs a CUDA device: " + why);
  State& s = state();
  std::lock_guard<std::mutex> toggle(s.toggle);
  std::lock_guard<std::mutex> lock(s.mu);
  if (!load(s)) return unsupported("kernel tracing is not available: " + s.load_error);
  if (!s.callbacks) {
    // The clock first: CUPTI applies it to records of kinds enabled after it.
    if (CUptiResult r = s.api.register_timestamp(steady_timestamp); r != CUPTI_SUCCESS)
      return unsupported("CUPTI refused the host clock: " + result_text(s.api, r));
    if (CUptiResult r = s.api.register_buffers(buffer_requested, buffer_completed); r != CUPTI_SUCCESS)
      return unsupported("CUPTI refused its buffers (is another profiler attached?): " + result_text(s.api, r));
    s.callbacks = true;
  }
  if (s.open == 0) {
    if (CUptiResult r = s.api.enable(kKinds[0]); r != CUPTI_SUCCESS)
      return unsupported("CUPTI could not trace kernels (is another profiler attached?): " + result_text(s.api, r));
    for (CUpti_ActivityKind kind : kKinds)
      if (kind != kKinds[0]) (void)s.api.enable(kind);  // optional: without them the copies are just not reported
  }
  ++s.open;
  return std::unique_ptr<KernelTracer>(std::make_unique<CuptiTracer>(trace::now_ns()));
}

}  // namespace atelier::cuda
