// TraceFile: the --trace FILE option of generate and bench.
#include <cstdio>

#include "backend/backend.h"
#include "cli/commands.h"

namespace atelier::cli {

TraceFile::TraceFile(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  recorder_ = std::make_unique<trace::Recorder>(trace::kAllCategories);
  attach_ = std::make_unique<trace::GlobalAttach>(*recorder_);
}

void TraceFile::time_device(Device dev) {
  if (!recorder_ || timer_ || trace::device_timer() || !backend_available(dev)) return;
  timer_ = backend_for(dev).make_device_timer();
  if (timer_) trace::set_device_timer(timer_.get());
  if (dev.is_cpu()) return;  // the CPU's ranges are its kernels
  auto tracer = open_kernel_tracer();
  if (tracer)
    kernels_ = std::move(*tracer);
  else
    std::fprintf(stderr, "trace: no kernel spans in the file: %s\n", tracer.status().message().c_str());
}

TraceFile::~TraceFile() {
  if (timer_) trace::set_device_timer(nullptr);
}

bool TraceFile::write(Device dev) {
  if (!recorder_) return true;
  attach_.reset();
  const Status st = catch_status([&] {
    backend_for(dev).synchronize();
    recorder_->resolve_device_times();
    if (kernels_) {
      ATELIER_ASSIGN_OR_RETURN(std::vector<trace::Event> kernels, kernels_->collect());
      for (trace::Event& k : kernels) recorder_->add(std::move(k));
    }
    return recorder_->write_chrome_json(path_);
  });
  if (!st.is_ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return false;
  }
  std::fprintf(stderr, "trace: %zu events written to %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
               recorder_->events().size(), path_.c_str());
  return true;
}

}  // namespace atelier::cli
