// Trace: the one registry of timings in the engine. Code marks work with RAII ranges (trace::Scope) that
// carry a name, a category and the FLOPs counted while they were open; attached Recorders collect them as
// events with host steady-clock times and a thread id. The same events feed the pipeline's StageTimes, the
// `atelier bench` figures and the Chrome/Perfetto trace JSON of `--trace FILE`, so no figure is computed twice.
//
// Who receives an event: every Recorder attached to the calling thread (ThreadAttach, e.g. one generation's
// own stage log) whose category mask includes it, plus the one process-wide Recorder (GlobalAttach, e.g. the
// CLI's --trace file). Nobody listening costs one branch per range: Scope's constructor tests a global and a
// thread-local mask and does nothing more, which is what keeps the op front end's one-range-per-op cheap.
//
// Device time: on an asynchronous device (CUDA) host times measure launches, not execution. A backend that
// can time its queue installs a DeviceTimer (CUDA events recorded on its stream, NVTX push/pop for external
// profilers); each recorded range then also carries a device token that Recorder::resolve_device_times() turns
// into device start/duration once the device has synchronized. Kernels themselves (inside replayed graphs too)
// come from a KernelTracer (backend/kernel_tracer.h, CUPTI) as events of category kKernel.
//
// FLOPs: the op front end counts the arithmetic of the compute ops into a per-thread counter (count_flops),
// 2 per multiply-add as torch's FlopCounterMode does: gemm 2*B*M*N*K, conv 2*N*O*Ho*Wo*(C/g)*kh*kw, attention
// 2*B*H*Sq*Sk*(D + Dv). Elementwise, normalisation and softmax work is not counted (torch does not either).
// The counter runs whether or not anything records; ranges report the difference over their lifetime.
// Checked against torch: a full SD 1.5 UNet call at 64x64 latent, batch 2, counts 1,606,546,882,560 here and
// 1.61 T in FlopCounterMode (../shared/notes/performance-anchors.md), the SD VAE decoder at 512 px 2.5145 T vs
// 2.51 T: the same operations by the same rules (docs/performance.md has the breakdown).
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace atelier::trace {

enum class Category : uint8_t {
  kStage = 0,  // pipeline stages: generate, text encode, denoise, VAE decode/encode, image encode, PNG write
  kCall = 1,   // inside the denoise loop: one model call, one UNet forward, one sampler update
  kOp = 2,     // the op front end (backend/ops.cc): one range per ops:: call, nested ops at depth > 0
  kKernel = 3, // device kernels as a KernelTracer reports them (backend/kernel_tracer.h)
};
inline constexpr int kCategoryCount = 4;
const char* category_name(Category c);  // "stage", "call", "op", "kernel"

using CategoryMask = uint32_t;
constexpr CategoryMask bit(Category c) { return CategoryMask(1) << unsigned(c); }
inline constexpr CategoryMask kAllCategories = (CategoryMask(1) << kCategoryCount) - 1;
inline constexpr CategoryMask kPipelineCategories = bit(Category::kStage) | bit(Category::kCall);

struct Event {
  const char* name = "";        // static storage (a string literal): ranges never copy their names
  Category category = Category::kStage;
  uint32_t thread = 0;          // small per-process thread number (thread_number())
  int64_t start_ns = 0;         // host steady clock (now_ns())
  int64_t dur_ns = 0;
  int64_t index = -1;           // which one of a series (model call number); -1 = none
  uint64_t flops = 0;           // counted on this thread while the range was open
  int depth = 0;                // ops: 0 = called by model code, > 0 = called by another op
  std::string detail;           // free text (ops: operand shapes), filled only while recorded
  uint64_t device_token = 0;    // from the DeviceTimer (0 = none)
  double device_start_us = -1;  // from resolve_device_times(): since the recorder's origin; < 0 = unknown
  double device_dur_us = -1;

  double seconds() const { return double(dur_ns) * 1e-9; }
  // Device duration when resolved, else host duration (the CPU executes synchronously: they coincide).
  double busy_seconds() const { return device_dur_us >= 0 ? device_dur_us * 1e-6 : seconds(); }
};

struct DeviceSpan {
  double start_us = 0;  // since the timer's origin (DeviceTimer::origin_host_ns)
  double dur_us = 0;
};

// Implemented by a backend that can time its own queue (see the file comment). Called only for ranges that
// some Recorder records, on the host thread that opens them; begin/end must not synchronize the device.
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  virtual std::string device_name() const = 0;  // "cuda:0": the trace's device track
  // The host steady-clock time (now_ns()) at which the device clock that span starts count from read zero
  // (a marker recorded right after a synchronize when the timer was made, say); aligns the two timelines.
  virtual int64_t origin_host_ns() const = 0;
  // A range opens / closes: record markers in the device's queue; return a token (non-zero) for resolve().
  virtual uint64_t begin(const char* name, Category category) = 0;
  virtual void end(uint64_t token) = 0;
  // After the device has synchronized: the range's device span, or nullopt when it was not timed (inside a
  // graph capture, say) or its markers were recycled. May be asked more than once per token (every recorder
  // that got the event asks), so markers live in a pool the timer recycles on its own terms (a ring sized
  // for a generation's ranges, say).
  virtual std::optional<DeviceSpan> resolve(uint64_t token) = 0;
};
// Installs (or with nullptr removes) the process's device timer; one at a time. The timer must outlive
// every range opened while it is installed.
void set_device_timer(DeviceTimer* timer);
DeviceTimer* device_timer();

int64_t now_ns();          // host steady clock
uint32_t thread_number();  // 1, 2, ... in the order threads first ask

// --- FLOP counter -----------------------------------------------------------------------------------
namespace detail {
extern constinit thread_local uint64_t t_flops;
extern constinit thread_local CategoryMask t_mask;  // union of the masks attached to this thread
extern std::atomic<CategoryMask> g_mask;            // mask of the global recorder (0 = none)
}  // namespace detail

inline void count_flops(uint64_t n) { detail::t_flops += n; }
// FLOPs of the compute ops issued from the calling thread since it started (differences are what count).
inline uint64_t thread_flops() { return detail::t_flops; }

// Whether any recorder would keep a range of category `c` opened now on this thread.
inline bool enabled(Category c) {
  return ((detail::g_mask.load(std::memory_order_relaxed) | detail::t_mask) & bit(c)) != 0;
}

// --- recorders --------------------------------------------------------------------------------------
class Recorder {
 public:
  explicit Recorder(CategoryMask mask = kAllCategories);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  CategoryMask mask() const { return mask_; }
  int64_t origin_ns() const { return origin_ns_; }  // creation time: trace timestamps count from it
  void add(Event e);                                // thread-safe
  std::vector<Event> events() const;                // a copy, in the order ranges closed
  void clear();

  // Fills device_start_us / device_dur_us of events that carry a device token. Call after the device has
  // synchronized and before the timer is removed; a no-op without a timer.
  void resolve_device_times();

  // Chrome trace-event JSON ({"traceEvents": [...]}: "X" events, microseconds since origin_ns(); host
  // ranges in process 1 by thread, device spans in process 2); loads in Perfetto and chrome://tracing.
  nlohmann::json chrome_json() const;
  Status write_chrome_json(const std::string& path) const;

 private:
  CategoryMask mask_;
  int64_t origin_ns_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

// Attaches `r` as the process-wide recorder (events from every thread) while alive; restores the previous.
class GlobalAttach {
 public:
  explicit GlobalAttach(Recorder& r);
  ~GlobalAttach();
  GlobalAttach(const GlobalAttach&) = delete;
  GlobalAttach& operator=(const GlobalAttach&) = delete;

 private:
  Recorder* previous_;
};

// Attaches `r` to the calling thread while alive (stacked: every attached recorder receives). A scope guard:
// destroy it on the thread that made it.
class ThreadAttach {
 public:
  explicit ThreadAttach(Recorder& r);
  ~ThreadAttach();
  ThreadAttach(const ThreadAttach&) = delete;
  ThreadAttach& operator=(const ThreadAttach&) = delete;

 private:
  Recorder* recorder_;
};

// --- ranges -----------------------------------------------------------------------------------------
// A timed range from construction to finish() or destruction. Inactive when no recorder wants its category
// at construction, and then it costs one pointer store and two branches: the open range's state lives on the
// heap, allocated only for ranges that are recorded.
class Scope {
 public:
  Scope(const char* name, Category category, int64_t index = -1) {
    if (enabled(category)) begin(name, category, index);
  }
  ~Scope() {
    if (open_) end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  bool active() const { return open_ != nullptr; }
  // Adds free text to the event; ignored when inactive (test active() first: building the text is the
  // caller's cost).
  void set_detail(std::string detail);
  // Closes the range now (idempotent); the event goes to the recorders.
  void finish() {
    if (open_) end();
  }

 private:
  struct Open;  // the event being built and the counters at its start
  void begin(const char* name, Category category, int64_t index);
  void end();

  Open* open_ = nullptr;
};

// --- summaries over events (bench, StageTimes) ------------------------------------------------------
// Events named `name` (compared as text), in recorded order.
std::vector<const Event*> named(const std::vector<Event>& events, std::string_view name);
// Sum of host durations of the events named `name`, in seconds.
double total_seconds(const std::vector<Event>& events, std::string_view name);
// Busy time of the op ranges called by model code (depth 0) that lie inside [from_ns, to_ns): device time
// when resolved, else host time; seconds.
double op_busy_seconds(const std::vector<Event>& events, int64_t from_ns, int64_t to_ns);
// Whether every depth-0 op event in the window has a resolved device duration.
bool has_device_times(const std::vector<Event>& events, int64_t from_ns, int64_t to_ns);
// Seconds the device was busy between host times from_ns and to_ns: the union of the device spans of the
// top-level ops (depth 0) in that window; overlaps count once, ranges without device times are ignored. A
// call replayed as a recorded graph is one top-level op range ("graph_replay", backend/graph_runner.h).
double device_busy_seconds(const std::vector<Event>& events, int64_t from_ns, int64_t to_ns);
// Where the device work of those same top-level ops ends (us since the recorder's origin, as device_start_us);
// -1 when none has a device time. It may lie after to_ns: the device runs what the host enqueued last after
// the host's range closed, unless something synchronized.
double device_end_us(const std::vector<Event>& events, int64_t from_ns, int64_t to_ns);

}  // namespace atelier::trace
