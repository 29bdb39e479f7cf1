#include "backend/graph_runner.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/ops.h"
#include "core/status.h"
#include "core/trace.h"

namespace atelier {

namespace {

// What a replay (or the first one, at recording) returns: the recording's output buffer, or a copy of it.
Tensor output_of(const Tensor& static_output, GraphRunner::Result result) {
  return result == GraphRunner::Result::kBorrowed ? static_output : ops::clone(static_output);
}

bool graphs_disabled_by_env() {
  const char* v = std::getenv("ATELIER_GRAPHS");
  return v && std::strcmp(v, "0") == 0;
}

// Shapes, dtypes and devices of the inputs: what a recording is valid for.
std::string key_of(const std::vector<Tensor>& inputs, Device device) {
  std::string key = device.str();
  for (const Tensor& t : inputs) {
    key += '|';
    key += dtype_name(t.dtype());
    for (int64_t d : t.shape()) key += ',' + std::to_string(d);
  }
  return key;
}

// dsts[i] (contiguous, on the device) = srcs[i] (any device, same shape and dtype), in one copy_many: a replay's
// input copies are device time at every step's boundary, one launch where the device can.
void copy_into(const std::vector<Tensor>& dsts, const std::vector<Tensor>& srcs, Backend& backend) {
  std::vector<std::pair<Tensor, Tensor>> pairs;
  for (size_t i = 0; i < dsts.size(); ++i) {
    const Tensor& src = srcs[i];
    pairs.emplace_back(dsts[i], src.device() == dsts[i].device() ? src : ops::to_device(src, dsts[i].device()));
  }
  backend.copy_many(pairs);
}

}  // namespace

GraphRunner::GraphRunner() : GraphRunner(Options{}) {}

GraphRunner::GraphRunner(Options options) : options_(options) {
  if (graphs_disabled_by_env()) options_.enabled = false;
}

GraphRunner::Entry& GraphRunner::entry_for(const std::string& key) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key != key) continue;
    entries_.splice(entries_.begin(), entries_, it);  // most recently used first
    return entries_.front();
  }
  while (entries_.size() >= options_.max_entries && !entries_.empty()) entries_.pop_back();
  entries_.emplace_front();
  entries_.front().key = key;
  return entries_.front();
}

Tensor GraphRunner::eager(const std::vector<Tensor>& inputs, Device device, const Fn& fn) {
  ++stats_.eager_calls;
  std::vector<Tensor> moved;  // an eager call sees what a replay sees: every input on the device
  for (const Tensor& t : inputs) moved.push_back(t.device() == device ? t : ops::to_device(t, device));
  return fn(moved);
}

Tensor GraphRunner::record(Entry& e, const std::vector<Tensor>& inputs, Backend& backend, const Fn& fn, Result result) {
  e.static_inputs.clear();
  for (const Tensor& t : inputs) e.static_inputs.push_back(Tensor::empty(t.shape(), t.dtype(), backend.device()));
  copy_into(e.static_inputs, inputs, backend);
  const uint64_t flops_before = trace::thread_flops();
  try {
    e.work = backend.capture([&] { e.static_output = fn(e.static_inputs); });
  } catch (const Error& err) {
    e.work.reset();
    e.static_output = Tensor();
    e.static_inputs.clear();
    e.failed = true;
    ++stats_.capture_failures;
    stats_.last_failure = err.status().message();
    return eager(inputs, backend.device(), fn);  // this shape runs eagerly from now on
  }
  ++stats_.captures;
  e.flops = trace::thread_flops() - flops_before;
  e.work->replay();  // recording does not run the work: the first result comes from the first replay
  return output_of(e.static_output, result);
}

namespace {

// inputs with n rows -> the same inputs with `rows` rows: inputs whose leading dimension is n get their last
// row repeated; others (a shared [1] timestep, say) are left as they are.
std::vector<Tensor> pad_rows(const std::vector<Tensor>& inputs, int64_t n, int64_t rows) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    if (t.dim() == 0 || t.size(0) != n) {
      out.push_back(t);
      continue;
    }
    std::vector<Tensor> parts(size_t(rows - n), t.narrow(0, n - 1, 1));
    parts.insert(parts.begin(), t);
    out.push_back(ops::concat(parts, 0));
  }
  return out;
}

}  // namespace

Tensor GraphRunner::run(const std::vector<Tensor>& inputs, Device device, const Fn& fn, Result result) {
  Backend& backend = backend_for(device);
  std::lock_guard<std::mutex> lock(mu_);
  if (!options_.enabled || !backend.can_capture()) return eager(inputs, device, fn);
  const int64_t n = inputs.empty() || inputs.front().dim() == 0 ? 0 : inputs.front().size(0);
  const auto bucket = std::lower_bound(options_.batch_buckets.begin(), options_.batch_buckets.end(), n);
  if (n == 0 || bucket == options_.batch_buckets.end() || *bucket == n) return run_recorded(inputs, backend, fn, result);
  return run_recorded(pad_rows(inputs, n, *bucket), backend, fn, result).narrow(0, 0, n);
}

Tensor GraphRunner::run_recorded(const std::vector<Tensor>& inputs, Backend& backend, const Fn& fn, Result result) {
  const Device device = backend.device();
  Entry& e = entry_for(key_of(inputs, device));
  if (e.failed || e.calls < options_.warmup) {
    ++e.calls;
    return eager(inputs, device, fn);
  }
  if (!e.work) return record(e, inputs, backend, fn, result);
  // One op range for the whole replay (inputs in, graph, output out): the trace's device track and the
  // bench's GPU busy figure see the recorded kernels through it.
  trace::Scope range("graph_replay", trace::Category::kOp);
  copy_into(e.static_inputs, inputs, backend);
  e.work->replay();
  trace::count_flops(e.flops);
  ++stats_.replays;
  return output_of(e.static_output, result);
}

GraphRunner::Stats GraphRunner::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.pool_bytes = 0;
  for (const Entry& e : entries_)
    if (e.work) s.pool_bytes += e.work->pool_bytes();
  return s;
}

void GraphRunner::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

}  // namespace atelier
