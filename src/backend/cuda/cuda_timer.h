// A trace::DeviceTimer over CUDA events: the device times of traced ranges (ops, model calls, stages) on one
// GPU's stream, so that `atelier bench` can report kernel time and GPU busy % and `--trace` files show a
// device track. Events come from a fixed ring (recycled in order); a range whose events were recycled before
// resolve() is reported as untimed. Ranges opened while the stream is being recorded into a CUDA graph are
// not timed (an event recorded into a graph is no timer).
#pragma once
#include <memory>

#include "core/trace.h"

namespace atelier::cuda {

// The timer of cuda:`index`'s stream; nullptr without that device. Install it with trace::set_device_timer.
std::unique_ptr<trace::DeviceTimer> make_device_timer(int index);

}  // namespace atelier::cuda
