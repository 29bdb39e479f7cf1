// CUDA backend start-up and registration, the device's stream, host<->device and peer copies.
#include "backend/cuda/cuda_backend.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_conv.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_init.h"
#include "backend/cuda/cuda_sdpa.h"
#include "backend/cuda/cuda_sdpa_fp8.h"
#include "backend/cuda/cuda_upload.h"

namespace atelier {
namespace cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  std::string msg = std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ") in " + what +
                    " at " + (base ? base + 1 : file) + ":" + std::to_string(line);
  if (err == cudaErrorMemoryAllocation) throw Error(Status(ErrorCode::kResourceExhausted, msg));
  throw Error(Status(ErrorCode::kInternal, msg));
}

namespace {

cudaStream_t make_stream(int index) {
  DeviceGuard guard(index);
  cudaStream_t s = nullptr;
  // Non-blocking: never implicitly ordered with the legacy default stream that other libraries may use.
  ATELIER_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// The backends' start-up threads, joined at exit: a process that ends while one still loads a library must not tear
// down static state (the CUDA runtime's, the libraries') under it. Made before the first thread starts, so it is
// destroyed after everything made later.
class StartupThreads {
 public:
  void start(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    threads_.emplace_back(std::move(fn));
  }
  ~StartupThreads() {
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

StartupThreads& startup_threads() {
  static StartupThreads threads;
  return threads;
}

}  // namespace

CudaBackend::CudaBackend(int index, const cudaDeviceProp& prop)
    : index_(index),
      name_("cuda:" + std::to_string(index) + " (" + prop.name + ")"),
      sm_count_(prop.multiProcessorCount),
      cc_major_(prop.major),
      max_smem_optin_(prop.sharedMemPerBlockOptin),
      stream_(make_stream(index)),
      alloc_(index, stream_),
      staging_(index),
      allow_tf32_(env_flag("ATELIER_CUDA_TF32")) {
  conv_nhwc_ = !env_is("ATELIER_CONV_NHWC", "0");
  conv_gemm_ = conv_gemm_default();
  gn_apply_merge_ = env_flag("ATELIER_GN_APPLY_MERGE");
  gn_offset_in_kernels_ = !env_is("ATELIER_GN_OFFSET_IN_KERNELS", "0");
  concat_in_place_ = !env_is("ATELIER_CONCAT_IN_PLACE", "0");
  fused_fp8_norm_modulate_ = !env_is("ATELIER_FUSED_FP8_NORM", "0");
  specialized_norm_modulate_ = !env_is("ATELIER_NORM_MODULATE_SPECIALIZED", "0");
  fp8_attention_ = fp8_attention_default();
  // The libraries' start-up runs beside whatever the process does next (a checkpoint's load) instead of at the first
  // product and convolution: ~0.1 s of a process's first image whose choices are kept (docs/performance.md, "Session
  // 65"). ATELIER_PREWARM=0: at first use instead; =libs: the engines and libraries only, no warm-up product or plan.
  if (!env_is("ATELIER_PREWARM", "0")) startup_threads().start([this] { prewarm(!env_is("ATELIER_PREWARM", "libs")); });
}

void CudaBackend::prewarm(bool first_calls) noexcept {
  try {
    DeviceGuard guard(index_);
    GemmEngine& gemm = gemm_engine();  // cuBLASLt's handle; cuDNN's library and handle; the choice store's file
    load_cudnn_engine_libraries();
    if (!first_calls) return;
    // The libraries' first calls, which cost the process's first product and first convolution ~50-70 ms each
    // beyond their handles (docs/performance.md, "Session 65"): cuBLASLt's first heuristics query and kernel, and
    // cuDNN's first plan restored from its serialized form.
    gemm.warm_up();
    conv_engine().warm_up();
  } catch (...) {
    // Whatever failed here fails again, and is reported, at its first real use.
  }
}

bool CudaBackend::fp8_attention_default() { return !env_is("ATELIER_FP8_ATTENTION", "0"); }

CudaBackend::~CudaBackend() {
  for (cudaEvent_t e : marks_)
    if (e) cudaEventDestroy(e);  // at exit the driver may be gone: nothing to report
}

void CudaBackend::synchronize() {
  DeviceGuard guard(index_);
  BatchPause pause(*this);  // the wait covers the batch gathered so far
  ATELIER_CUDA_OK(cudaStreamSynchronize(stream_));
}

uint64_t CudaBackend::mark_queue() {
  DeviceGuard guard(index_);
  BatchPause pause(*this);  // the mark comes after the batch gathered so far (an event recorded while gathering would not)
  std::lock_guard<std::mutex> lock(marks_mu_);
  const uint64_t mark = ++marks_issued_;
  cudaEvent_t& e = marks_[mark % kQueueMarks];
  if (!e) ATELIER_CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  ATELIER_CUDA_OK(cudaEventRecord(e, stream_));
  return mark;
}

void CudaBackend::wait_for_mark(uint64_t mark) {
  DeviceGuard guard(index_);
  BatchPause pause(*this);
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> lock(marks_mu_);
    if (mark >= 1 && mark <= marks_issued_ && marks_issued_ - mark < uint64_t(kQueueMarks)) e = marks_[mark % kQueueMarks];
  }
  // Recorded again after this read, the event stands for a later point in the stream: waiting for it passes the mark too.
  ATELIER_CUDA_OK(e ? cudaEventSynchronize(e) : cudaStreamSynchronize(stream_));
}

void CudaBackend::bind_current_thread() { ATELIER_CUDA_OK(cudaSetDevice(index_)); }

// dst and src contiguous with the same byte size; at least one of them on this device.
void CudaBackend::copy_between_devices(Tensor& dst, const Tensor& src) {
  ATELIER_CHECK(dst.nbytes() == src.nbytes(), "copy_between_devices: size mismatch");
  const size_t bytes = src.nbytes();
  if (bytes == 0) return;
  const bool src_host = src.device().is_cpu(), dst_host = dst.device().is_cpu();
  if (src_host && dst_host) {
    std::memcpy(dst.raw(), src.raw(), bytes);
  } else if (src_host) {  // upload's paths: a kernel's parameters for a few bytes, else the staging ring
    const char* host = static_cast<const char*>(src.raw());
    cuda_backend(dst.device().index).upload(dst, [host](void* slot, size_t off, size_t len) {
      std::memcpy(slot, host + off, len);
    });
  } else if (dst_host) {
    CudaBackend& from = cuda_backend(src.device().index);
    BatchPause pause(from);
    from.staging_.device_to_host(dst.raw(), src.raw(), bytes, from.stream_);
  } else {
    CudaBackend& from = cuda_backend(src.device().index);
    CudaBackend& to = cuda_backend(dst.device().index);
    DeviceGuard guard(to.index_);
    if (&from == &to) {
      ATELIER_CUDA_OK(cudaMemcpyAsync(dst.raw(), src.raw(), bytes, cudaMemcpyDeviceToDevice, to.stream_));
    } else {
      from.synchronize();  // the source is complete before the other device's stream reads it
      BatchPause pause(to);
      ATELIER_CUDA_OK(cudaMemcpyPeerAsync(dst.raw(), to.index_, src.raw(), from.index_, bytes, to.stream_));
    }
  }
}

// dst: contiguous, on this device. The pieces `fill` writes go through the pinned staging ring, so a checkpoint's
// tensor is converted straight into the buffers the copy engine reads (no host copy of the whole tensor first).
void CudaBackend::upload(Tensor& dst, const HostFill& fill) {
  ATELIER_CHECK(dst.device() == device() && dst.is_contiguous(), "upload: a contiguous tensor on " + device().str() +
                                                                      " expected, got one on " + dst.device().str());
  const size_t bytes = dst.nbytes();
  if (bytes == 0) return;
  DeviceGuard guard(index_);
  if (bytes <= kInlineUploadBytes) {  // a step's timesteps, a bias: in a kernel's parameters (batches take it) where it can
    char small[kInlineUploadBytes];
    fill(small, 0, bytes);
    if (upload_inline(dst.raw(), small, bytes, stream_)) return;
    BatchPause pause(*this);  // the staging slots are reused once their event passes: not something a graph can hold
    staging_.host_to_device(dst.raw(), small, bytes, stream_);
    return;
  }
  BatchPause pause(*this);
  staging_.host_to_device(dst.raw(), bytes, fill, stream_);
}

Tensor CudaBackend::as_dtype(const Tensor& like, DType dtype) {
  if (!like.defined() || like.dtype() == dtype) return like;
  Tensor t = Tensor::empty(like.shape(), dtype, device());
  copy(t, like);
  return t;
}

GemmEngine& CudaBackend::gemm_engine() {
  std::lock_guard<std::mutex> lock(engines_mu_);
  if (!gemm_) {
    gemm_ = std::make_unique<GemmEngine>(index_, stream_, alloc_);
    conv_engine_locked();  // makes the choice store, whose fingerprint names cuDNN's version too
    gemm_->keep_choices_in(choices_.get());
    if (cc_major_ == 9)  // the kernel is sm_90's (wgmma, TMA)
      gemm_->set_own_kernel([this](const GemmCall& call, void* out) {
        return run_own_linear_call(call, out, cc_major_, sm_count_, max_smem_optin_, stream_);
      });
  }
  return *gemm_;
}

void CudaBackend::run_gemm(const GemmCall& call) { gemm_engine().run(call, allow_tf32_); }

namespace {
// What a kept choice holds for: the card, the driver, the libraries that supply candidates, this binary.
std::string choice_fingerprint(int device, const ConvEngine& conv) {
  cudaDeviceProp prop{};
  int driver = 0;
  cudaGetDeviceProperties(&prop, device);
  cudaDriverGetVersion(&driver);
  return std::string(prop.name) + " sm_" + std::to_string(prop.major * 10 + prop.minor) + " x" +
         std::to_string(prop.multiProcessorCount) + "; driver " + std::to_string(driver) + "; cudnn " +
         (conv.available() ? conv.version() : std::string("none")) + "; cublasLt " + std::to_string(cublasLtGetVersion()) +
         "; " + ChoiceStore::executable_identity();
}
}  // namespace

ConvEngine& CudaBackend::conv_engine_locked() {
  if (!conv_) {
    conv_ = std::make_unique<ConvEngine>(index_, stream_);
    choices_ = std::make_unique<ChoiceStore>(ChoiceStore::default_dir(), choice_fingerprint(index_, *conv_));
    conv_->keep_choices_in(choices_.get());
    conv_choices_.keep_in(choices_.get(), "conv path");
    upsample_phase_choices_.keep_in(choices_.get(), "upsampler phases");
    conv_concat_choices_.keep_in(choices_.get(), "conv concat");
    conv_shortcut_choices_.keep_in(choices_.get(), "conv shortcut");
  }
  return *conv_;
}

ConvEngine& CudaBackend::conv_engine() {
  std::lock_guard<std::mutex> lock(engines_mu_);
  return conv_engine_locked();
}

std::string CudaBackend::conv_impl_name() {
  std::lock_guard<std::mutex> lock(engines_mu_);
  const ConvEngine& conv = conv_engine_locked();
  return conv.available() ? "cudnn " + conv.version() : "im2col+gemm (cuDNN not loaded: " + conv.why_unavailable() + ")";
}

namespace {

struct Registry {
  std::string why;  // empty when at least one device started
  int count = 0;
  CudaBackend* backends[16] = {};
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

CudaBackend& cuda_backend(int index) {
  // backend_for starts the backends and reports unavailable devices with the reason.
  return static_cast<CudaBackend&>(backend_for(Device::cuda(index)));
}

}  // namespace cuda

const std::string& init_cuda_backends() {
  static std::once_flag once;
  std::call_once(once, [] {
    cuda::Registry& r = cuda::registry();
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      r.why = cudaGetErrorString(err);
      cudaGetLastError();
      return;
    }
    if (count == 0) {
      r.why = "no CUDA device found";
      return;
    }
    std::string errors;
    for (int i = 0; i < count && i < 16; ++i) {
      try {
        cudaDeviceProp prop{};
        ATELIER_CUDA_OK(cudaGetDeviceProperties(&prop, i));
        if (prop.major < 8) {
          errors += "cuda:" + std::to_string(i) + " has compute capability " + std::to_string(prop.major) + "." +
                    std::to_string(prop.minor) + " (8.0 or newer is supported); ";
          continue;
        }
        r.backends[i] = new cuda::CudaBackend(i, prop);  // never destroyed: tensors may outlive static destruction
        register_backend(Device::Kind::kCUDA, i, r.backends[i]);
        ++r.count;
      } catch (const Error& e) {
        errors += "cuda:" + std::to_string(i) + ": " + e.what() + "; ";
      }
    }
    if (r.count == 0) r.why = errors.empty() ? "no usable CUDA device" : errors.substr(0, errors.size() - 2);
  });
  return cuda::registry().why;
}

}  // namespace atelier
