#include "core/trace.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>

namespace atelier::trace {
namespace detail {
constinit thread_local uint64_t t_flops = 0;
constinit thread_local CategoryMask t_mask = 0;
std::atomic<CategoryMask> g_mask{0};
}  // namespace detail

namespace {

constexpr int kHostPid = 1;    // Chrome trace process of host ranges
constexpr int kDevicePid = 2;  // and of device spans: traced ranges on thread 1,
constexpr uint32_t kKernelTid0 = 2;  // kernels on thread 2 + their stream
constexpr double kNsPerUs = 1e3;

// The global recorder is read on every recorded range: a plain pointer published with g_mask, guarded by
// g_global_mu for the (rare) attach/detach against a concurrent add.
std::mutex g_global_mu;
Recorder* g_global = nullptr;
std::atomic<DeviceTimer*> g_timer{nullptr};
std::atomic<uint32_t> g_next_thread{1};

// Recorders attached to this thread. Only attach/detach and recorded ranges touch it (through the TLS
// wrapper a thread_local with a destructor needs); the hot test reads the plain detail::t_mask.
thread_local std::vector<Recorder*> t_stack;
constinit thread_local uint32_t t_thread = 0;
constinit thread_local int t_op_depth = 0;

void recompute_thread_mask() {
  CategoryMask m = 0;
  for (Recorder* r : t_stack) m |= r->mask();
  detail::t_mask = m;
}

void dispatch(Event&& e) {
  const CategoryMask b = bit(e.category);
  if (detail::t_mask & b)
    for (Recorder* r : t_stack)
      if (r->mask() & b) r->add(e);
  if (detail::g_mask.load(std::memory_order_relaxed) & b) {
    std::lock_guard<std::mutex> lock(g_global_mu);
    if (g_global && (g_global->mask() & b)) g_global->add(std::move(e));
  }
}

double rel_us(int64_t ns, int64_t origin) { return double(ns - origin) / kNsPerUs; }

nlohmann::json event_json(const Event& e, int64_t origin) {
  nlohmann::json args = nlohmann::json::object();
  if (e.index >= 0) args["index"] = e.index;
  if (e.flops) args["flops"] = e.flops;
  if (e.category == Category::kOp) args["depth"] = e.depth;
  if (!e.detail.empty()) args["detail"] = e.detail;
  if (e.device_dur_us >= 0) args["device_us"] = e.device_dur_us;
  return {{"name", e.name}, {"cat", category_name(e.category)}, {"ph", "X"}, {"ts", rel_us(e.start_ns, origin)},
          {"dur", double(e.dur_ns) / kNsPerUs}, {"pid", kHostPid}, {"tid", e.thread}, {"args", std::move(args)}};
}

nlohmann::json metadata(const char* what, int pid, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", name}}}};
}

}  // namespace

const char* category_name(Category c) {
  switch (c) {
    case Category::kStage: return "stage";
    case Category::kCall: return "call";
    case Category::kOp: return "op";
    case Category::kKernel: return "kernel";
  }
  return "?";
}

void set_device_timer(DeviceTimer* timer) { g_timer.store(timer); }
DeviceTimer* device_timer() { return g_timer.load(); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint32_t thread_number() {
  if (t_thread == 0) t_thread = g_next_thread.fetch_add(1);
  return t_thread;
}

// --- Recorder -----------------------------------------------------------------------------------------

Recorder::Recorder(CategoryMask mask) : mask_(mask), origin_ns_(now_ns()) {}

void Recorder::add(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

std::vector<Event> Recorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

void Recorder::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
}

void Recorder::resolve_device_times() {
  DeviceTimer* timer = device_timer();
  if (!timer) return;
  const double shift_us = rel_us(timer->origin_host_ns(), origin_ns_);
  std::lock_guard<std::mutex> lock(mu_);
  for (Event& e : events_) {
    if (!e.device_token) continue;
    if (auto span = timer->resolve(e.device_token)) {
      e.device_start_us = span->start_us + shift_us;
      e.device_dur_us = span->dur_us;
    }
    e.device_token = 0;
  }
}

nlohmann::json Recorder::chrome_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json list = nlohmann::json::array();
  list.push_back(metadata("process_name", kHostPid, "atelier (host)"));
  bool device_track = false;
  std::set<uint32_t> kernel_streams;
  for (const Event& e : events_) {
    if (e.category == Category::kKernel) {  // device kernels (backend/kernel_tracer.h): a track per stream
      nlohmann::json k = event_json(e, origin_ns_);
      k["pid"] = kDevicePid;
      k["tid"] = kKernelTid0 + e.thread;
      if (e.index >= 0) k["args"].erase("index"), k["args"]["graph"] = e.index;
      list.push_back(std::move(k));
      kernel_streams.insert(e.thread);
      device_track = true;
      continue;
    }
    list.push_back(event_json(e, origin_ns_));
    if (e.device_start_us < 0) continue;
    nlohmann::json d = {{"name", e.name}, {"cat", category_name(e.category)}, {"ph", "X"}, {"ts", e.device_start_us},
                        {"dur", e.device_dur_us}, {"pid", kDevicePid}, {"tid", 1}};
    list.push_back(std::move(d));
    device_track = true;
  }
  if (device_track) {
    DeviceTimer* t = device_timer();
    list.push_back(metadata("process_name", kDevicePid, t ? t->device_name() : std::string("device")));
    for (uint32_t stream : kernel_streams) {
      nlohmann::json m = metadata("thread_name", kDevicePid, "kernels, stream " + std::to_string(stream));
      m["tid"] = kKernelTid0 + stream;
      list.push_back(std::move(m));
    }
  }
  return {{"traceEvents", std::move(list)}, {"displayTimeUnit", "ms"},
          {"otherData", {{"producer", std::string("atelier ") + ATELIER_VERSION}, {"clock", "steady_clock, us since recorder start"}}}};
}

Status Recorder::write_chrome_json(const std::string& path) const {
  std::ofstream f(path);
  if (!f) return invalid_argument("cannot write the trace file " + path + ": " + std::strerror(errno));
  f << chrome_json().dump() << "\n";
  f.close();
  if (!f) return internal_error("writing the trace file " + path + " failed");
  return Status::ok();
}

// --- attachment ---------------------------------------------------------------------------------------

GlobalAttach::GlobalAttach(Recorder& r) {
  std::lock_guard<std::mutex> lock(g_global_mu);
  previous_ = g_global;
  g_global = &r;
  detail::g_mask.store(r.mask());
}

GlobalAttach::~GlobalAttach() {
  std::lock_guard<std::mutex> lock(g_global_mu);
  g_global = previous_;
  detail::g_mask.store(previous_ ? previous_->mask() : 0);
}

ThreadAttach::ThreadAttach(Recorder& r) : recorder_(&r) {
  t_stack.push_back(&r);
  recompute_thread_mask();
}

ThreadAttach::~ThreadAttach() {
  // Normally the top of the stack; a guard destroyed out of order still detaches its own recorder.
  auto it = std::find(t_stack.rbegin(), t_stack.rend(), recorder_);
  if (it != t_stack.rend()) t_stack.erase(std::next(it).base());
  recompute_thread_mask();
}

// --- Scope --------------------------------------------------------------------------------------------

struct Scope::Open {
  Event event;
  uint64_t start_flops = 0;
};

void Scope::begin(const char* name, Category category, int64_t index) {
  open_ = new Open();
  Event& e = open_->event;
  e.name = name;
  e.category = category;
  e.index = index;
  e.thread = thread_number();
  if (category == Category::kOp) e.depth = t_op_depth++;
  if (DeviceTimer* t = device_timer()) e.device_token = t->begin(name, category);
  open_->start_flops = detail::t_flops;
  e.start_ns = now_ns();
}

void Scope::end() {
  const int64_t end_ns = now_ns();
  std::unique_ptr<Open> open(open_);
  open_ = nullptr;
  Event& e = open->event;
  e.dur_ns = end_ns - e.start_ns;
  e.flops = detail::t_flops - open->start_flops;
  if (e.category == Category::kOp) --t_op_depth;
  if (e.device_token) {
    if (DeviceTimer* t = device_timer()) t->end(e.device_token);
  }
  dispatch(std::move(e));
}

void Scope::set_detail(std::string detail) {
  if (open_) open_->event.detail = std::move(detail);
}

// --- summaries ----------------------------------------------------------------------------------------

std::vector<const Event*> named(const std::vector<Event>& events, std::string_view name) {
  std::vector<const Event*> out;
  for (const Event& e : events)
    if (name == e.name) out.push_back(&e);
  return out;
}

double total_seconds(const std::vector<Event>& events, std::string_view name) {
  double s = 0;
  for (const Event& e : events)
    if (name == e.name) s += e.seconds();
  return s;
}

namespace {
bool top_op_in(const Event& e, int64_t from_ns, int64_t to_ns) {
  return e.category == Category::kOp && e.depth == 0 && e.start_ns >= from_ns && e.start_ns + e.dur_ns <= to_ns;
}
}  // namespace

double op_busy_seconds(const std::vector<Event>& events, int64_t from_ns, int64_t to_ns) {
  double s = 0;
  for (const Event& e : events)
    if (top_op_in(e, from_ns, to_ns)) s += e.busy_seconds();
  return s;
}

double device_busy_seconds(const std::vector<Event>& events, int64_t from_ns, int64_t to_ns) {
  std::vector<std::pair<double, double>> spans;  // device [start, end) in us
  for (const Event& e : events)
    if (top_op_in(e, from_ns, to_ns) && e.device_dur_us >= 0)
      spans.emplace_back(e.device_start_us, e.device_start_us + e.device_dur_us);
  std::sort(spans.begin(), spans.end());
  double busy_us = 0, end = -1e300;
  for (const auto& [s, t] : spans) {
    if (t <= end) continue;
    busy_us += t - std::max(s, end);
    end = t;
  }
  return busy_us * 1e-6;
}

double device_end_us(const std::vector<Event>& events, int64_t from_ns, int64_t to_ns) {
  double end = -1;
  for (const Event& e : events)
    if (top_op_in(e, from_ns, to_ns) && e.device_dur_us >= 0) end = std::max(end, e.device_start_us + e.device_dur_us);
  return end;
}

bool has_device_times(const std::vector<Event>& events, int64_t from_ns, int64_t to_ns) {
  bool any = false;
  for (const Event& e : events) {
    if (!top_op_in(e, from_ns, to_ns)) continue;
    if (e.device_dur_us < 0) return false;
    any = true;
  }
  return any;
}

}  // namespace atelier::trace
