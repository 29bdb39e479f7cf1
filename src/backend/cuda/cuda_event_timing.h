// Timing a few enqueued runs with CUDA events, for the per-shape choices made at a shape's first eager call
// (cuDNN graph-API plans, cuDNN SDPA against the flash kernel, cuBLASLt algorithms).
#pragma once
#include <cuda_runtime.h>

#include <functional>

namespace atelier::cuda {

// CUDA events for timing, destroyed with the timer.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  bool ok = false;
  EventPair() { ok = cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess; }
  ~EventPair() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

// Mean device milliseconds of `runs` back-to-back calls of `enqueue` on `stream`, or -1 when one returns false
// or an event fails. Synchronises: never call it while the stream is being captured.
inline float time_runs(const EventPair& ev, cudaStream_t stream, int runs, const std::function<bool()>& enqueue) {
  if (!ev.ok || cudaEventRecord(ev.start, stream) != cudaSuccess) return -1.0f;
  for (int i = 0; i < runs; ++i)
    if (!enqueue()) return -1.0f;
  float ms = 0.0f;
  if (cudaEventRecord(ev.stop, stream) != cudaSuccess || cudaEventSynchronize(ev.stop) != cudaSuccess ||
      cudaEventElapsedTime(&ms, ev.start, ev.stop) != cudaSuccess)
    return -1.0f;
  return ms / float(runs);
}

// Whether work enqueued on `stream` now would be recorded into a CUDA graph (then nothing may be timed).
inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

}  // namespace atelier::cuda
