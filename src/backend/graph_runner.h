// Recorded execution for a repeated device computation (the execution layer above the backends).
//
// A GraphRunner runs one function of tensors — a UNet call, say — many times with inputs of the same shapes.
// On a device that can record its work (CUDA: Backend::capture) it runs the function eagerly for the first
// `warmup` calls of a shape (so that GEMM/convolution plans and allocator size classes exist), then records
// it once into a graph over fixed input buffers, and from then on copies each call's inputs into those
// buffers and replays the graph: one launch instead of a thousand. On other devices (the CPU) it simply calls
// the function. Model code stays the same either way.
//
// What the function may do: enqueue ops on the device that read its `inputs` and tensors that outlive the
// runner (weights). It must not read host values that change between calls (they would be frozen into the
// recording) nor synchronise; a function that does fails to record, and the runner then runs that shape
// eagerly from then on, saying why in stats().
//
// The ops of a replayed call are not called again, so the FLOPs the op front end counted while recording are
// added to the thread's counter on each replay (trace::count_flops): FLOP figures stay the same.
//
// Results are returned as fresh tensors (a device copy of the recording's output), so a caller may keep them
// across calls. Thread-safe (calls are serialised).
//
// Batch buckets: a server's step-level batcher calls with whatever number of samples is active, and every
// new batch size would be a new recording (an eager call, a capture, the memory of one more set of
// activations). With `batch_buckets` set, a call whose inputs have N rows (the first input's leading
// dimension) runs as the smallest bucket >= N: every input with N rows gets copies of its last row appended,
// and the output's first N rows are returned. Rows do not mix in the function (a batch of independent
// samples), so the N results are those of an N-row call up to the kernels' batch-size-dependent rounding.
// Only recorded calls are padded; a device that runs eagerly (the CPU) computes exactly the N rows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace atelier {

class GraphRunner {
 public:
  using Fn = std::function<Tensor(const std::vector<Tensor>& inputs)>;
  struct Options {
    int warmup = 1;          // eager calls per shape before recording
    size_t max_entries = 4;  // recordings kept (least recently used dropped): each holds its activations
    bool enabled = true;     // false: always eager (also ATELIER_GRAPHS=0 in the environment)
    std::vector<int64_t> batch_buckets;  // ascending; empty: every batch size is its own recording
  };
  struct Stats {
    int64_t eager_calls = 0, captures = 0, replays = 0, capture_failures = 0;
    size_t pool_bytes = 0;      // device memory held by the live recordings
    std::string last_failure;   // why the last recording failed
  };

  GraphRunner();
  explicit GraphRunner(Options options);

  // For a diffusion transformer's forward (FLUX, Z-Image): one call per step (two with CFG, whose captions
  // may differ in length), each recording holding GBs of activations at 1024²: two are kept.
  static Options dit_options() {
    Options o;
    o.max_entries = 2;
    return o;
  }

  // What run() returns on a replay. kFresh: a device copy of the recording's output, the caller's to keep.
  // kBorrowed: the recording's output buffer itself (or its first rows), without the copy: one kernel less at
  // every step boundary. It is valid until the next run() of this runner: every op that reads it must be
  // enqueued before then (the device's queue then runs them ahead of the next replay's writes), and a value
  // kept across calls must be copied. Eager calls return fn's output either way.
  enum class Result { kFresh, kBorrowed };

  // inputs: defined tensors on any device (copied to `device` as needed) -> fn's output on `device` (see
  // Result). Shapes, dtypes and devices of the inputs select the recording.
  Tensor run(const std::vector<Tensor>& inputs, Device device, const Fn& fn, Result result = Result::kFresh);

  Stats stats() const;
  const Options& options() const { return options_; }
  // Drops every recording (their memory returns to the device's cache).
  void clear();

 private:
  struct Entry {
    std::string key;
    int calls = 0;
    bool failed = false;
    uint64_t flops = 0;  // counted by the op front end while recording; added again on each replay
    std::vector<Tensor> static_inputs;
    Tensor static_output;
    std::unique_ptr<CapturedWork> work;
  };
  Entry& entry_for(const std::string& key);
  Tensor eager(const std::vector<Tensor>& inputs, Device device, const Fn& fn);  // under mu_
  Tensor record(Entry& e, const std::vector<Tensor>& inputs, Backend& backend, const Fn& fn, Result result);
  Tensor run_recorded(const std::vector<Tensor>& inputs, Backend& backend, const Fn& fn, Result result);  // under mu_

  Options options_;
  mutable std::mutex mu_;
  std::list<Entry> entries_;  // most recently used first
  Stats stats_;
};

}  // namespace atelier
