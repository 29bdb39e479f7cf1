// 2-D convolution on the GPU: cuDNN (loaded at run time, see cuda_conv.h), or im2col + cuBLASLt GEMM when
// cuDNN is missing or rejects a case. Bias (and an optional addend: a time embedding, a residual) is added by one
// output pass after either: in place on channels-last outputs, in the NCHW transpose otherwise.
#include "backend/cuda/cuda_conv.h"
#include "backend/cuda/cuda_conv_graph.h"

#include <cudnn.h>
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_device.cuh"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_gemm_wgmma.h"
#include "backend/cuda/cuda_nvtx.h"
#include "backend/cuda/cudnn_graph_api.h"
#include "backend/packed_operands.h"

namespace atelier::cuda {

// --- cuDNN entry points -------------------------------------------------------------------------------------

#define ATELIER_CUDNN_FUNCTIONS(X)                                                                     \
  X(cudnnGetVersion) X(cudnnGetErrorString) X(cudnnCreate) X(cudnnSetStream) X(cudnnCreateTensorDescriptor) \
  X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor) X(cudnnCreateFilterDescriptor)               \
  X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor) X(cudnnCreateConvolutionDescriptor)           \
  X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionGroupCount) X(cudnnSetConvolutionMathType)        \
  X(cudnnDestroyConvolutionDescriptor) X(cudnnGetConvolutionForwardAlgorithm_v7)                             \
  X(cudnnGetConvolutionForwardAlgorithmMaxCount) X(cudnnFindConvolutionForwardAlgorithmEx)                   \
  X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnConvolutionForward)

struct CudnnApi {
#define ATELIER_CUDNN_MEMBER(name) decltype(&::name) name = nullptr;
  ATELIER_CUDNN_FUNCTIONS(ATELIER_CUDNN_MEMBER)
#undef ATELIER_CUDNN_MEMBER
  void* library = nullptr;  // the dlopen handle (ConvGraph looks the backend API up in it)
};

namespace {

constexpr size_t kMaxConvWorkspace = size_t(1) << 30;   // algorithms needing more are skipped
constexpr int64_t kIm2colBudgetBytes = int64_t(256) << 20;

// Loads cuDNN once per process; null (with the reason) when it cannot be used.
const CudnnApi* load_cudnn(std::string* why) {
  static std::string reason;
  static const CudnnApi* api = [&]() -> const CudnnApi* {
    if (env_is("ATELIER_CUDNN", "0")) {
      reason = "disabled by ATELIER_CUDNN=0";
      return nullptr;
    }
    void* lib = nullptr;
    if (const char* path = std::getenv("ATELIER_CUDNN_LIBRARY"); path && *path) lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    for (const char* name : {"libcudnn.so.9", "libcudnn.so"})
      if (!lib) lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      reason = "libcudnn.so.9 not found on the library path (set LD_LIBRARY_PATH or ATELIER_CUDNN_LIBRARY)";
      return nullptr;
    }
    auto* a = new CudnnApi();
    a->library = lib;
#define ATELIER_CUDNN_LOAD(name)                                            \
  a->name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name));         \
  if (!a->name) {                                                           \
    reason = std::string("cuDNN lacks ") + #name;                           \
    return nullptr;                                                         \
  }
    ATELIER_CUDNN_FUNCTIONS(ATELIER_CUDNN_LOAD)
#undef ATELIER_CUDNN_LOAD
    const size_t v = a->cudnnGetVersion();
    if (v / 10000 != CUDNN_MAJOR) {
      reason = "cuDNN " + std::to_string(v) + " found; major version " + std::to_string(CUDNN_MAJOR) + " is needed";
      return nullptr;
    }
    return a;
  }();
  if (!api && why) *why = reason;
  return api;
}

}  // namespace

void load_cudnn_engine_libraries() {
  const CudnnApi* api = load_cudnn(nullptr);
  Dl_info info{};
  if (!api || !dladdr(reinterpret_cast<void*>(api->cudnnGetVersion), &info) || !info.dli_fname) return;
  const std::string path = info.dli_fname;
  if (path.find('/') == std::string::npos) return;  // no folder known: cuDNN finds its libraries itself
  const std::string folder = path.substr(0, path.find_last_of('/') + 1);
  // cuDNN 9's sub-libraries that planning opens; the handles are kept (cuDNN finds the libraries loaded).
  for (const char* name : {"libcudnn_graph.so.9", "libcudnn_heuristic.so.9", "libcudnn_engines_precompiled.so.9",
                           "libcudnn_engines_runtime_compiled.so.9", "libcudnn_cnn.so.9"})
    dlopen((folder + name).c_str(), RTLD_NOW | RTLD_LOCAL);
}

namespace {

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    case DType::F16: return CUDNN_DATA_HALF;
    default: return CUDNN_DATA_FLOAT;
  }
}

bool is_gemm_family(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}

// --- kernels --------------------------------------------------------------------------------------------------

// y[n, o, p] += bias[o] over y [N, O, P] (grid.y walks the N*O planes).
template <typename T>
__global__ void channel_bias_kernel(T* y, const void* bias, DType bias_dtype, int64_t planes, int64_t o_count, int64_t p_count) {
  for (int64_t plane = blockIdx.y; plane < planes; plane += gridDim.y) {
    const float b = load_any(bias, bias_dtype, plane % o_count);
    T* row = y + plane * p_count;
    for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < p_count; p += int64_t(gridDim.x) * blockDim.x)
      row[p] = from_f32<T>(to_f32(row[p]) + b);
  }
}

constexpr int kTile = 32;       // transpose tile side
constexpr int kTileRows = 8;   // rows a block walks per step (blockDim = kTile x kTileRows)

// out [N, B, A] = in [N, A, B] (+ bias[b] when given), through a shared-memory tile so that both the reads
// and the writes are coalesced: NCHW <-> NHWC around the channels-last convolutions.
template <typename T>
__global__ void transpose_kernel(T* out, const T* in, int64_t a_count, int64_t b_count, const void* bias, DType bias_dtype) {
  __shared__ float tile[kTile][kTile + 1];  // +1: no bank conflicts on the transposed read
  const int64_t n = blockIdx.z, a0 = int64_t(blockIdx.y) * kTile, b0 = int64_t(blockIdx.x) * kTile;
  const T* src = in + n * a_count * b_count;
  T* dst = out + n * a_count * b_count;
  for (int r = threadIdx.y; r < kTile; r += kTileRows) {
    const int64_t a = a0 + r, b = b0 + threadIdx.x;
    if (a < a_count && b < b_count) tile[r][threadIdx.x] = to_f32(src[a * b_count + b]);
  }
  __syncthreads();
  for (int r = threadIdx.y; r < kTile; r += kTileRows) {
    const int64_t b = b0 + r, a = a0 + threadIdx.x;
    if (a < a_count && b < b_count) {
      const float v = tile[threadIdx.x][r] + (bias ? load_any(bias, bias_dtype, b) : 0.0f);
      dst[b * a_count + a] = from_f32<T>(v);
    }
  }
}

struct Im2colGeometry {
  int64_t c, h, w;          // input planes of one sample
  int64_t kh, kw, wo;       // kernel, output width
  int64_t cg, groups, kc;   // channels per group, groups, rows per group's column matrix (cg * kh * kw)
  int sh, sw, ph, pw, dh, dw;
};

// col [groups, kc, width] for output pixels [p0, p0 + width) of one sample x [C, H, W] (zero padding).
template <typename T>
__global__ void im2col_kernel(T* col, const T* x, Im2colGeometry g, int64_t p0, int64_t width) {
  const int64_t total = g.groups * g.kc * width;
  for (int64_t i = global_thread(); i < total; i += grid_threads()) {
    const int64_t j = i % width;
    const int64_t row = i / width;  // group * kc + kc-index
    const int64_t gi = row / g.kc, r = row % g.kc;
    const int64_t ci = r / (g.kh * g.kw), kk = r % (g.kh * g.kw);
    const int64_t ki = kk / g.kw, kj = kk % g.kw;
    const int64_t p = p0 + j, oy = p / g.wo, ox = p % g.wo;
    const int64_t iy = oy * g.sh - g.ph + ki * g.dh, ix = ox * g.sw - g.pw + kj * g.dw;
    const bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
    col[i] = inside ? x[((gi * g.cg + ci) * g.h + iy) * g.w + ix] : from_f32<T>(0.0f);
  }
}

void launch_channel_bias(void* y, DType dt, const Tensor& bias, int64_t n, int64_t o, int64_t p, cudaStream_t s) {
  const int64_t planes = n * o;
  const dim3 grid(unsigned(std::min<int64_t>((p + kThreads - 1) / kThreads, 1024)), unsigned(std::min<int64_t>(planes, 65535)));
  dispatch_float(dt, "conv2d", [&](auto tag) {
    using T = decltype(tag);
    channel_bias_kernel<T><<<grid, kThreads, 0, s>>>(static_cast<T*>(y), bias.raw(), bias.dtype(), planes, o, p);
  });
  ATELIER_CUDA_LAUNCHED();
}

// out [n, b, a] = in [n, a, b] (+ bias[b]); out and in contiguous, of dtype dt.
void launch_transpose(void* out, const void* in, DType dt, int64_t n, int64_t a, int64_t b, const Tensor& bias, cudaStream_t s) {
  ATELIER_CHECK(n <= 65535 && (a + kTile - 1) / kTile <= 65535, "transpose: too many planes or rows for one grid");
  const dim3 grid(unsigned((b + kTile - 1) / kTile), unsigned((a + kTile - 1) / kTile), unsigned(n));
  const dim3 block(kTile, kTileRows);
  const void* bias_ptr = bias.defined() ? bias.raw() : nullptr;
  const DType bias_dt = bias.defined() ? bias.dtype() : DType::F32;
  dispatch_float(dt, "conv2d", [&](auto tag) {
    using T = decltype(tag);
    transpose_kernel<T><<<grid, block, 0, s>>>(static_cast<T*>(out), static_cast<const T*>(in), a, b, bias_ptr, bias_dt);
  });
  ATELIER_CUDA_LAUNCHED();
}

// y [N, P, O] (channels-last) += bias[o] + addend(n, o, p), in f32, rounded once. V channels per thread (V = 1
// when O is not a multiple of the vector width). The addend's common forms need no pixel arithmetic: laid out
// as y (a channels-last residual: the same flat index) or one vector per sample (the resnets' time embedding:
// strides [so, 1, 0, 0]); any other view is read through its four strides. I is the index type (32-bit when
// the tensor allows: 64-bit divisions would make this memory-bound pass arithmetic-bound).
enum class AddendForm { kNone, kSameLayout, kPerSample, kStrided };

struct EpilogueAddend {
  const void* data = nullptr;
  AddendForm form = AddendForm::kNone;
  int64_t sn = 0, so = 0, sh = 0, sw = 0;
};

template <typename T, int V, typename I>
__global__ void nhwc_epilogue_kernel(T* y, const void* bias, DType bias_dtype, EpilogueAddend add, I vectors, I p_count, I vo,
                                     I wo) {
  struct alignas(sizeof(T) * V) Pack {
    T v[V];
  };
  for (I i = I(global_thread()); i < vectors; i += I(grid_threads())) {
    const I o0 = (i % vo) * V;
    Pack out = reinterpret_cast<Pack*>(y)[i];
    float acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = to_f32(out.v[e]) + (bias ? load_any(bias, bias_dtype, o0 + e) : 0.0f);
    const T* a = static_cast<const T*>(add.data);
    if (add.form == AddendForm::kSameLayout) {
      const Pack av = reinterpret_cast<const Pack*>(a)[i];
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += to_f32(av.v[e]);
    } else if (add.form == AddendForm::kPerSample) {
      const I n = i / (vo * p_count);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += to_f32(a[int64_t(n) * add.sn + (o0 + e) * add.so]);
    } else if (add.form == AddendForm::kStrided) {
      const I row = i / vo, n = row / p_count, px = row % p_count;
      const T* at = a + int64_t(n) * add.sn + int64_t(o0) * add.so + int64_t(px / wo) * add.sh + int64_t(px % wo) * add.sw;
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += to_f32(at[e * add.so]);
    }
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_f32<T>(acc[e]);
    reinterpret_cast<Pack*>(y)[i] = out;
  }
}

// out channels-last [N, O, Ho, Wo] += bias + addend (either optional) in one pass.
void launch_nhwc_epilogue(Tensor& out, const Tensor& bias, const Tensor& addend, cudaStream_t s) {
  if (!bias.defined() && !addend.defined()) return;
  const int64_t n = out.size(0), o = out.size(1), p = out.size(2) * out.size(3), wo = out.size(3);
  EpilogueAddend add;
  if (addend.defined()) {
    ATELIER_CHECK(addend.dtype() == out.dtype() && addend.shape() == out.shape(), "conv2d: addend must be a view of the output's shape and dtype");
    const Shape& st = addend.strides();
    add = {addend.raw(), AddendForm::kStrided, st[0], st[1], st[2], st[3]};
    if (st == out.strides()) add.form = AddendForm::kSameLayout;
    else if ((st[2] == 0 || out.size(2) == 1) && (st[3] == 0 || wo == 1)) add.form = AddendForm::kPerSample;
  }
  const void* bias_ptr = bias.defined() ? bias.raw() : nullptr;
  const DType bias_dt = bias.defined() ? bias.dtype() : DType::F32;
  dispatch_float(out.dtype(), "conv2d", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kV = 16 / int(sizeof(T));
    // Vectors need whole 16-byte channel runs in both buffers (the same-layout addend is read as vectors too).
    const bool vec = o % kV == 0 && reinterpret_cast<uintptr_t>(out.raw()) % 16 == 0 &&
                     (add.form != AddendForm::kSameLayout || reinterpret_cast<uintptr_t>(add.data) % 16 == 0);
    const int64_t width = vec ? kV : 1, vectors = n * p * o / width;
    auto launch = [&](auto v_tag, auto i_tag) {
      constexpr int W = decltype(v_tag)::value;
      using I = decltype(i_tag);
      nhwc_epilogue_kernel<T, W, I><<<grid_for(vectors), kThreads, 0, s>>>(static_cast<T*>(out.raw()), bias_ptr, bias_dt, add,
                                                                          I(vectors), I(p), I(o / W), I(wo));
    };
    const bool small = n * p * o < (int64_t(1) << 31);
    if (vec && small) launch(std::integral_constant<int, kV>{}, uint32_t{});
    else if (vec) launch(std::integral_constant<int, kV>{}, int64_t{});
    else if (small) launch(std::integral_constant<int, 1>{}, uint32_t{});
    else launch(std::integral_constant<int, 1>{}, int64_t{});
  });
  ATELIER_CUDA_LAUNCHED();
}

// sums[0] += sum (a - b)^2, sums[1] += sum b^2 over n elements (the fused-epilogue check below).
template <typename T>
__global__ void squared_difference_kernel(const T* a, const T* b, int64_t n, double* sums) {
  double diff = 0.0, ref = 0.0;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    const double av = to_f32(a[i]), bv = to_f32(b[i]);
    diff += (av - bv) * (av - bv);
    ref += bv * bv;
  }
  atomicAdd(&sums[0], diff);
  atomicAdd(&sums[1], ref);
}

// A fused convolution epilogue's result against the separate pass's: relative L2 within this. The two differ by
// rounding only (the fused plan rounds conv + bias + addend once, the separate pass the convolution first, about
// 2^-9 relative in bf16); an operand read wrongly gives ~0.5.
constexpr double kFusedEpilogueTolerance = 0.02;

// Whether `got` (out's shape and dtype, contiguous bytes as out's buffer) equals out within
// kFusedEpilogueTolerance. Synchronises the stream (called at planning only).
bool same_to_rounding(const void* got, const Tensor& out, DeviceAllocator& alloc, cudaStream_t s) {
  const std::shared_ptr<Buffer> sums = alloc.allocate(2 * sizeof(double));
  double host[2] = {0.0, 0.0};
  ATELIER_CUDA_OK(cudaMemsetAsync(sums->data(), 0, sizeof host, s));
  const int64_t n = out.numel();
  dispatch_float(out.dtype(), "conv2d", [&](auto tag) {
    using T = decltype(tag);
    squared_difference_kernel<T><<<std::min<unsigned>(grid_for(n), 1024), kThreads, 0, s>>>(
        static_cast<const T*>(got), static_cast<const T*>(out.raw()), n, static_cast<double*>(sums->data()));
  });
  ATELIER_CUDA_LAUNCHED();
  ATELIER_CUDA_OK(cudaMemcpyAsync(host, sums->data(), sizeof host, cudaMemcpyDeviceToHost, s));
  ATELIER_CUDA_OK(cudaStreamSynchronize(s));
  return std::isfinite(host[0]) && host[0] <= kFusedEpilogueTolerance * kFusedEpilogueTolerance * host[1];
}

// Whether out (channels-last) = conv + bias + addend can be one cuDNN plan, and its description in *e: a bias of
// a float dtype, an addend laid out as out (a residual) that does not overlap out. Other addends (the
// per-sample time embedding: see ConvEpilogue; NCHW views) keep the separate pass, which reads any strides.
bool fusable_epilogue(const Tensor& out, const Tensor& bias, const Tensor& addend, ConvEpilogue* e) {
  if (bias.defined()) {
    if (bias.dtype() != DType::F32 && bias.dtype() != DType::BF16 && bias.dtype() != DType::F16) return false;
    if (!bias.is_contiguous() || bias.numel() != out.size(1)) return false;
    e->bias = bias.raw();
    e->bias_dtype = bias.dtype();
  }
  if (addend.defined()) {
    if (addend.dtype() != out.dtype() || addend.shape() != out.shape()) return false;
    if (addend.strides() != out.strides()) return false;
    const auto* a = static_cast<const char*>(addend.raw());
    const auto* y = static_cast<const char*>(out.raw());
    const size_t y_bytes = size_t(out.numel()) * dtype_size(out.dtype());
    if (a < y + y_bytes && y < a + y_bytes) return false;  // cuDNN reads it while storing out
    e->addend = addend.raw();
  }
  return true;
}

}  // namespace

const char* split_candidate_name(int split) {
  static std::mutex mu;
  static std::map<int, std::string> names;
  std::lock_guard<std::mutex> lock(mu);
  return names.try_emplace(split, "own kernel, split-K " + std::to_string(split)).first->second.c_str();
}

std::vector<int> add_split_candidates(const OwnConvArgs& a, const std::function<bool(int)>& own,
                                      std::vector<std::function<bool()>>& candidates, std::vector<const char*>& names) {
  if (own_conv_split() == 1) return {};
  std::vector<int> splits = conv_implicit_splits(a);
  for (int split : splits) candidates.push_back([own, split] { return own(split); }), names.push_back(split_candidate_name(split));
  return splits;
}

std::string candidate_times(const std::vector<float>& ms, const std::vector<const char*>& names) {
  std::string times;
  for (size_t i = 0; i < ms.size(); ++i) times += std::string(i ? ", " : "") + names[i] + " " + std::to_string(ms[i]) + " ms";
  return times;
}

std::string candidate_names_key(const std::vector<const char*>& names) {
  std::string listed;
  for (const char* name : names) listed += std::string(name) + ";";
  return listed;
}

// --- ConvEngine ------------------------------------------------------------------------------------------------

struct ConvEngine::Plan {
  const CudnnApi* api = nullptr;
  bool valid = false;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t algo{};
  size_t workspace = 0;
  ~Plan() {
    if (!api) return;
    if (x) api->cudnnDestroyTensorDescriptor(x);
    if (y) api->cudnnDestroyTensorDescriptor(y);
    if (w) api->cudnnDestroyFilterDescriptor(w);
    if (conv) api->cudnnDestroyConvolutionDescriptor(conv);
  }
};

ConvEngine::ConvEngine(int device, cudaStream_t stream) : device_(device), stream_(stream) {
  const CudnnApi* api = load_cudnn(&why_);
  if (!api) return;
  DeviceGuard guard(device_);
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = api->cudnnCreate(&h);
  if (st != CUDNN_STATUS_SUCCESS) {
    why_ = std::string("cudnnCreate failed: ") + api->cudnnGetErrorString(st);
    return;
  }
  api->cudnnSetStream(h, stream_);
  handle_ = h;
  api_ = api;
  const size_t v = api->cudnnGetVersion();
  version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  graph_ = std::make_unique<ConvGraph>(api->library, handle_, stream_);
}

ConvEngine::~ConvEngine() { plans_.clear(); }  // the handle lives as long as the process

void ConvEngine::keep_choices_in(ChoiceStore* store) {
  if (graph_) graph_->keep_choices_in(store);
}

bool ConvEngine::warm_up() {
  if (!graph_ || !graph_->available() || !conv_graph_enabled()) return false;
  DeviceGuard guard(device_);
  if (!warm_handle_) {
    cudnnHandle_t h = nullptr;
    if (api_->cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) return false;
    warm_handle_ = h;
  }
  return graph_->warm_up(warm_handle_);
}

void* ConvEngine::library() const { return api_ ? api_->library : nullptr; }

std::string ConvEngine::version() const {
  if (!graph_ || !graph_->available()) {
    const std::string why = graph_ ? graph_->why_unavailable() : std::string("not loaded");
    return version_ + " (legacy API; graph API unavailable: " + why + ")";
  }
  if (!conv_graph_enabled()) return version_ + " (legacy API; graph API off by ATELIER_CUDNN_GRAPH=0)";
  return version_ + (conv_graph_autotune() ? " (graph API, autotuned" : " (graph API, heuristics' first plan") +
         "; legacy API for f32 and groups)";
}

ConvEngine::Plan* ConvEngine::plan_for(const ConvShape& s, const Conv2dParams& p, DType dtype, bool strict_f32, void* y,
                                       const void* x, const void* w, DeviceAllocator& alloc, bool nhwc) {
  const Key key{int64_t(dtype), strict_f32, s.n, s.c, s.h, s.w, s.o, s.kh, s.kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w,
                p.dilation_h, p.dilation_w, p.groups, nhwc, 0, 0, 0};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second->valid ? it->second.get() : nullptr;
  auto owned = std::make_unique<Plan>();
  Plan* plan = owned.get();
  plans_.emplace(key, std::move(owned));
  plan->api = api_;
  const CudnnApi& a = *api_;
  const auto handle = static_cast<cudnnHandle_t>(handle_);
  // The legacy API takes int dims and tensors below 2^31 elements.
  for (int64_t v : {s.n * s.c * s.h * s.w, s.n * s.o * s.ho * s.wo, s.o * (s.c / p.groups) * s.kh * s.kw})
    if (v >= INT_MAX) return nullptr;
  const cudnnDataType_t dt = cudnn_type(dtype);
  if (a.cudnnCreateTensorDescriptor(&plan->x) || a.cudnnCreateTensorDescriptor(&plan->y) ||
      a.cudnnCreateFilterDescriptor(&plan->w) || a.cudnnCreateConvolutionDescriptor(&plan->conv))
    return nullptr;
  const cudnnTensorFormat_t format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;  // dims are given as NCHW either way
  if (a.cudnnSetTensor4dDescriptor(plan->x, format, dt, int(s.n), int(s.c), int(s.h), int(s.w)) ||
      a.cudnnSetTensor4dDescriptor(plan->y, format, dt, int(s.n), int(s.o), int(s.ho), int(s.wo)) ||
      a.cudnnSetFilter4dDescriptor(plan->w, dt, format, int(s.o), int(s.c / p.groups), int(s.kh), int(s.kw)) ||
      a.cudnnSetConvolution2dDescriptor(plan->conv, p.pad_h, p.pad_w, p.stride_h, p.stride_w, p.dilation_h, p.dilation_w,
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) ||
      a.cudnnSetConvolutionGroupCount(plan->conv, p.groups))
    return nullptr;
  // f32 without TF32: FMA-only kernels. f32 with TF32 allowed: cuDNN's default. 16-bit: tensor cores.
  const cudnnMathType_t math = dtype != DType::F32 ? CUDNN_TENSOR_OP_MATH : strict_f32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
  if (a.cudnnSetConvolutionMathType(plan->conv, math)) return nullptr;

  int max_algos = 0;
  a.cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_algos);
  max_algos = std::max(max_algos, 1);
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(max_algos));
  int found = 0;
  cudnnStatus_t st;
  if (env_is("ATELIER_CUDNN_FIND", "1")) {
    // Times every algorithm once on the real buffers (the output is overwritten by the real call after).
    std::shared_ptr<Buffer> ws = alloc.allocate(kMaxConvWorkspace / 4);
    st = a.cudnnFindConvolutionForwardAlgorithmEx(handle, plan->x, x, plan->w, w, plan->conv, plan->y, y, max_algos, &found,
                                                  perf.data(), ws->data(), ws->bytes());
  } else {
    st = a.cudnnGetConvolutionForwardAlgorithm_v7(handle, plan->x, plan->w, plan->conv, plan->y, max_algos, &found, perf.data());
  }
  if (st != CUDNN_STATUS_SUCCESS) return nullptr;
  for (int i = 0; i < found; ++i) {
    const cudnnConvolutionFwdAlgoPerf_t& r = perf[size_t(i)];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > kMaxConvWorkspace) continue;
    const bool tensor_ops = r.mathType == CUDNN_TENSOR_OP_MATH || r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    if (strict_f32 && (tensor_ops || !is_gemm_family(r.algo))) continue;
    // The descriptor runs with the math type the algorithm was rated with (strict f32 keeps FMA only).
    if (!strict_f32 && a.cudnnSetConvolutionMathType(plan->conv, r.mathType) != CUDNN_STATUS_SUCCESS) continue;
    size_t ws = 0;
    if (a.cudnnGetConvolutionForwardWorkspaceSize(handle, plan->x, plan->w, plan->conv, plan->y, r.algo, &ws) != CUDNN_STATUS_SUCCESS)
      continue;
    plan->algo = r.algo;
    plan->workspace = ws;
    plan->valid = true;
    return plan;
  }
  return nullptr;
}

bool ConvEngine::forward(void* y, const void* x, const void* w, DType dtype, const ConvShape& s, const Conv2dParams& p,
                         bool strict_f32, DeviceAllocator& alloc, bool nhwc) {
  if (!api_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(device_);
  if (nhwc && graph_ && graph_->forward(y, x, w, dtype, s, p, alloc)) return true;
  Plan* plan = plan_for(s, p, dtype, strict_f32, y, x, w, alloc, nhwc);
  if (!plan) return false;
  std::shared_ptr<Buffer> ws = plan->workspace ? alloc.allocate(plan->workspace) : nullptr;
  const float alpha = 1.0f, beta = 0.0f;
  const cudnnStatus_t st =
      api_->cudnnConvolutionForward(static_cast<cudnnHandle_t>(handle_), &alpha, plan->x, x, plan->w, w, plan->conv, plan->algo,
                                    ws ? ws->data() : nullptr, plan->workspace, &beta, plan->y, y);
  if (st != CUDNN_STATUS_SUCCESS) {
    plan->valid = false;  // never again for this shape
    return false;
  }
  return true;
}

bool ConvEngine::forward_fused(void* y, const void* x, const void* w, DType dtype, const ConvShape& s, const Conv2dParams& p,
                               DeviceAllocator& alloc, const ConvEpilogue& epilogue) {
  if (!api_ || !graph_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(device_);
  return graph_->forward(y, x, w, dtype, s, p, alloc, &epilogue);
}

// --- the backend op ---------------------------------------------------------------------------------------------

bool CudaBackend::prefers_channels_last(DType dtype) const {
  return conv_nhwc_ && (conv_impl_ == ConvImpl::kAuto || conv_impl_ == ConvImpl::kCudnn) && dtype != DType::F32 &&
         load_cudnn(nullptr) != nullptr;
}

// x [N, C, H, W] contiguous or channels-last, w [O, C/groups, kh, kw] contiguous, bias [O] optional, addend
// optional (a view with out's shape) -> out [N, O, Ho, Wo] (contiguous or channels-last) = conv + bias + addend.
// x and w in out's dtype (cast otherwise).
void CudaBackend::conv2d(Tensor& out, const Tensor& x_in, const Tensor& w_in, const Tensor& bias, const Conv2dParams& p,
                         const Tensor& addend) {
  if (out.numel() == 0) return;
  NvtxRange range("conv2d");
  DeviceGuard guard(index_);
  const DType dt = out.dtype();
  const Tensor x = as_dtype(x_in, dt), w = as_dtype(w_in, dt);
  if (conv_impl_ != ConvImpl::kIm2col) {
    const ConvEngine& conv = conv_engine();  // conv_ from here on
    // The channels-last path where this device keeps activations so (ungrouped 16-bit convolutions on cuDNN).
    const bool nhwc = prefers_channels_last(dt) && p.groups == 1 && conv.available();
    if (nhwc && conv2d_nhwc(out, x, w, bias, p, w_in.dtype() == dt, addend)) return;
  }
  // The NCHW paths (legacy cuDNN, im2col) on contiguous buffers; channels-last operands go through copies.
  through_packed(*this, out, x, [&](Tensor& oc, const Tensor& xc) {
    const ConvShape s{xc.size(0), xc.size(1), xc.size(2), xc.size(3), w.size(0), w.size(2), w.size(3), oc.size(2), oc.size(3)};
    bool done = false;
    if (conv_impl_ != ConvImpl::kIm2col) {
      done = conv_->forward(oc.raw(), xc.raw(), w.raw(), dt, s, p, !allow_tf32_, alloc_);
      if (!done && (conv_impl_ == ConvImpl::kCudnn || conv_impl_ == ConvImpl::kCudnnNchw))
        throw Error(unsupported("conv2d: cuDNN was asked for but " +
                                (conv_->available() ? std::string("has no algorithm for this case") : conv_->why_unavailable())));
    }
    if (!done) conv2d_im2col(oc, xc, w, Tensor(), p);
    if (bias.defined()) launch_channel_bias(oc.raw(), dt, bias, s.n, s.o, s.ho * s.wo, stream_);
    if (addend.defined()) binary(oc, oc, addend, BinaryOp::kAdd);
  });
}

Tensor CudaBackend::nhwc_weight(const Tensor& w, bool persistent) {
  const int64_t o = w.size(0), c = w.size(1), k = w.size(2) * w.size(3);
  auto pack = [&] {
    Tensor packed = Tensor::empty({o, w.size(2), w.size(3), c}, w.dtype(), device());
    launch_transpose(packed.raw(), w.raw(), w.dtype(), o, c, k, Tensor(), stream_);  // [O, C, k] -> [O, k, C]
    return packed;
  };
  if (!persistent) return pack();
  std::lock_guard<std::mutex> lock(nhwc_mu_);
  return weight_entry(
             nhwc_weights_, w, [&](const NhwcWeight& e) { return e.packed.shape() == Shape{o, w.size(2), w.size(3), c}; },
             [&](NhwcWeight& e) { e.packed = pack(); })
      .packed;
}

bool CudaBackend::conv2d_nhwc(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                              bool w_persistent, const Tensor& addend) {
  const DType dt = out.dtype();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3), o = w.size(0), ho = out.size(2), wo = out.size(3);
  const ConvShape s{n, c, h, wd, o, w.size(2), w.size(3), ho, wo};
  // A channels-last tensor (or a contiguous one with C == 1 or H == W == 1, the same bytes) is read in place.
  const bool x_nhwc = x.is_channels_last() || c == 1, out_nhwc = out.is_channels_last() || o == 1;
  Tensor xn = x;
  if (!x_nhwc) {
    xn = Tensor::empty_channels_last({n, c, h, wd}, dt, device());
    launch_transpose(xn.raw(), x.raw(), dt, n, c, h * wd, Tensor(), stream_);  // [N, C, HW] -> [N, HW, C]
  }
  const Tensor wn = nhwc_weight(w, w_persistent);
  if (out_nhwc) return conv2d_nhwc_packed(out, xn, s, wn, bias, p, addend);
  Tensor yn = Tensor::empty({n, ho, wo, o}, dt, device());
  if (!conv_->forward(yn.raw(), xn.raw(), wn.raw(), dt, s, p, !allow_tf32_, alloc_, /*nhwc=*/true)) return false;
  launch_transpose(out.raw(), yn.raw(), dt, n, ho * wo, o, bias, stream_);  // [N, HW, O] -> [N, O, HW] + bias
  if (addend.defined()) binary(out, out, addend, BinaryOp::kAdd);
  return true;
}

// out channels-last; xn x's bytes in NHWC order (a channels-last tensor, or a contiguous one whose bytes are the
// same: C == 1); wn [O, kh, kw, C] contiguous. False where cuDNN declines (nothing written).
bool CudaBackend::conv2d_nhwc_packed(Tensor& out, const Tensor& xn, const ConvShape& s, const Tensor& wn,
                                     const Tensor& bias, const Conv2dParams& p, const Tensor& addend) {
  const DType dt = out.dtype();
  // cuDNN writing out in place: bias and addend inside its plan where that is faster (and equal), else one
  // output pass. Or the GEMM path (cuda_conv_gemm.cu) or the implicit-GEMM kernel of our own where they apply and
  // the shape's timed choice among the three picks one of them.
  const auto cudnn = [&] {
    ConvEpilogue e;
    if ((bias.defined() || addend.defined()) && fusable_epilogue(out, bias, addend, &e)) {
      e.separate = [&] { launch_nhwc_epilogue(out, bias, addend, stream_); };
      e.agrees = [&](const void* fused_y) { return same_to_rounding(fused_y, out, alloc_, stream_); };
      if (conv_->forward_fused(out.raw(), xn.raw(), wn.raw(), dt, s, p, alloc_, e)) return true;
    }
    if (!conv_->forward(out.raw(), xn.raw(), wn.raw(), dt, s, p, !allow_tf32_, alloc_, /*nhwc=*/true)) return false;
    launch_nhwc_epilogue(out, bias, addend, stream_);
    return true;
  };
  if (conv_impl_ != ConvImpl::kAuto) return cudnn();
  // The few-channel kernels (cuda_conv_narrow.cu: conv_in, conv_out), where they take the case.
  NarrowConvArgs narrow_args;
  const bool narrow_takes = narrow_conv_ != NarrowConv::kOff && narrow_conv_args(out, xn, wn, bias, p, addend, narrow_args);
  const auto narrow = [&] {
    NvtxRange range("conv2d_narrow");
    return launch_conv_narrow(narrow_args, stream_);
  };
  if (narrow_takes && narrow_conv_ == NarrowConv::kForce && narrow()) return true;
  // The implicit-GEMM kernel of our own (cuda_gemm_wgmma.cu), where it takes the case.
  OwnConvArgs own_args;
  const OwnConv own_mode = own_conv_mode();
  const bool own_takes = own_mode != OwnConv::kOff && conv_own_args(out, xn, wn, bias, p, addend, own_args);
  // split > 1: split-K (each tile's k-steps on `split` SMs), for shapes of few tiles.
  const auto own = [&](int split) {
    NvtxRange range("conv2d_own");
    return launch_own_conv(own_args, split);
  };
  if (own_takes && own_mode == OwnConv::kForce && own(std::max(1, own_conv_split()))) return true;
  std::vector<std::function<bool()>> candidates{cudnn};
  std::vector<const char*> names{"cuDNN"};
  if (conv_gemm_ != ConvGemm::kOff && conv_gemm_applies(out, xn, wn, p, addend)) {
    const auto gemm_path = [&] { conv2d_nhwc_gemm(out, xn, wn, bias, p, addend); return true; };
    if (conv_gemm_ == ConvGemm::kForce) return gemm_path();
    candidates.push_back(gemm_path), names.push_back("GEMM");
  }
  if (narrow_takes && narrow_conv_ == NarrowConv::kAuto) candidates.push_back(narrow), names.push_back("narrow kernel");
  if (own_takes && own_mode == OwnConv::kAuto) {
    candidates.push_back([&] { return own(1); }), names.push_back("own kernel");
    add_split_candidates(own_args, own, candidates, names);
  }
  if (candidates.size() == 1) return cudnn();
  const int pick = conv_path_choice(out, xn, wn, bias, p, addend, candidates, names);
  return candidates[size_t(pick)]() || (pick != 0 && cudnn());
}

// a [N, C1, H, W] and b [N, C2, H, W] side by side along channels, all channels-last bf16, w [O, C1 + C2, kh, kw] ->
// out [N, O, Ho, Wo] (+ bias + addend). Candidates, timed per shape at its first eager call: the concatenation
// followed by conv2d's own choice (first: what a capture of an untimed shape takes), and the own implicit-GEMM
// kernel reading C1's k-steps of each tap from a's tensor map and the rest from b's (unsplit and split-K), which
// writes no concatenation. False (nothing done) where the own kernel does not take the case or the switch is off.
bool CudaBackend::conv2d_concat(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias,
                                const Conv2dParams& p, const Tensor& addend) {
  if (!concat_in_place_ || out.numel() == 0 || conv_impl_ != ConvImpl::kAuto || own_conv_mode() == OwnConv::kOff) return false;
  const DType dt = out.dtype();
  if (a.dtype() != dt || b.dtype() != dt || w.dtype() != dt || !prefers_channels_last(dt)) return false;
  NvtxRange range("conv2d_concat");
  DeviceGuard guard(index_);
  conv_engine();  // the concatenated candidate's cuDNN path uses conv_
  const Tensor wn = nhwc_weight(w, /*persistent=*/true);
  OwnConvArgs own_args;
  if (!conv_own_args(out, a, wn, bias, p, addend, own_args, b)) return false;
  const auto own = [&](int split) {
    NvtxRange own_range("conv2d_own_concat");
    return launch_own_conv(own_args, split);
  };
  const int64_t n = a.size(0), h = a.size(2), wd = a.size(3), c1 = a.size(1), c = c1 + b.size(1);
  const auto joined = [&] {
    Tensor x = Tensor::empty_channels_last({n, c, h, wd}, dt, device());
    if (!concat_channels_last(x, {a, b})) {
      Tensor first = x.narrow(1, 0, c1), second = x.narrow(1, c1, c - c1);
      copy(first, a), copy(second, b);
    }
    const ConvShape s{n, c, h, wd, out.size(1), wn.size(1), wn.size(2), out.size(2), out.size(3)};
    return conv2d_nhwc_packed(out, x, s, wn, bias, p, addend);
  };
  if (own_conv_mode() == OwnConv::kForce) return own(std::max(1, own_conv_split())) || joined();
  std::vector<std::function<bool()>> candidates{joined, [&] { return own(1); }};
  std::vector<const char*> names{"concatenated", "own kernel, two inputs"};
  add_split_candidates(own_args, own, candidates, names);
  const auto key = std::make_tuple(a.shape(), b.shape(), wn.shape(), p.stride_h, p.stride_w, p.pad_h, p.pad_w, bias.defined(),
                                   addend.defined());
  const int pick = conv_concat_choices_.fastest(key, stream_, candidates, [&](const std::vector<float>& ms, int best) {
    if (!cudnn_graph::log_enabled()) return;  // ATELIER_CUDNN_LOG=1, beside conv2d's [conv path] lines
    std::fprintf(stderr, "[conv concat] x%s + %s w%s -> %s: %s: %s\n", shape_str(a.shape()).c_str(), shape_str(b.shape()).c_str(),
                 shape_str(wn.shape()).c_str(), shape_str(out.shape()).c_str(), candidate_times(ms, names).c_str(), names[best]);
  });
  return candidates[size_t(pick)]() || (pick != 0 && joined());
}

// The own implicit-GEMM kernel for args in `split` parts per tile (1: unsplit; the workspace is the backend's).
bool CudaBackend::launch_own_conv(OwnConvArgs args, int split) {
  args.split = split;
  args.split_workspace = split > 1 ? conv_split_workspace() : nullptr;
  return launch_conv_implicit(args, cc_major_, stream_);
}

// The few-channel kernels' arguments for out = conv(x, w) + bias; false where they do not take the case: an addend,
// groups, strides or dilations other than 1, a bias in another dtype, x / out not dense channels-last, and the kernels'
// own conditions (conv_narrow_takes).
bool CudaBackend::narrow_conv_args(const Tensor& out, const Tensor& x, const Tensor& wn, const Tensor& bias, const Conv2dParams& p,
                                   const Tensor& addend, NarrowConvArgs& a) const {
  const DType dt = out.dtype();
  if (addend.defined() || p.groups != 1 || p.stride_h != 1 || p.stride_w != 1 || p.dilation_h != 1 || p.dilation_w != 1 ||
      x.dtype() != dt || wn.dtype() != dt || !x.is_channels_last() || !out.is_channels_last() || !wn.is_contiguous() ||
      (bias.defined() && (bias.dtype() != dt || !bias.is_contiguous())))
    return false;
  a.x = x.raw(), a.w = wn.raw(), a.bias = bias.defined() ? bias.raw() : nullptr, a.out = out.raw();
  a.dtype = dt;
  a.n = x.size(0), a.c = x.size(1), a.h = x.size(2), a.w_in = x.size(3);
  a.o = out.size(1), a.ho = out.size(2), a.wo = out.size(3), a.kh = wn.size(1), a.kw = wn.size(2);
  a.pad_h = p.pad_h, a.pad_w = p.pad_w;
  return conv_narrow_takes(a);
}

// The general path: per sample, blocks of output pixels are unfolded into a column matrix [groups, kc, width]
// and multiplied by the weights [groups, og, kc] in one batched GEMM straight into the output planes. A 1x1
// stride-1 unpadded convolution multiplies the input planes directly. Bias is the caller's.
void CudaBackend::conv2d_im2col(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  const DType dt = out.dtype();
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t o = w.size(0), kh = w.size(2), kw = w.size(3), ho = out.size(2), wo = out.size(3);
  const int64_t groups = p.groups, cg = c / groups, og = o / groups, kc = cg * kh * kw, pixels = ho * wo;
  const size_t elem = dtype_size(dt);
  const bool pointwise = multiplies_input(kh, kw, p);
  const int64_t width_budget = std::max<int64_t>(1, kIm2colBudgetBytes / int64_t(elem) / std::max<int64_t>(groups * kc, 1));
  const int64_t block = pointwise ? pixels : std::min(pixels, width_budget);
  std::shared_ptr<Buffer> col = pointwise ? nullptr : alloc_.allocate(size_t(groups * kc * block) * elem);
  const Im2colGeometry g{c, h, wd, kh, kw, wo, cg, groups, kc, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w};
  for (int64_t ni = 0; ni < n; ++ni) {
    const char* xs = static_cast<const char*>(x.raw()) + size_t(ni * c * h * wd) * elem;
    char* ys = static_cast<char*>(out.raw()) + size_t(ni * o * pixels) * elem;
    for (int64_t p0 = 0; p0 < pixels; p0 += block) {
      const int64_t width = std::min(block, pixels - p0);
      GemmCall call;
      call.m = og;
      call.n = width;
      call.k = kc;
      call.batch = groups;
      call.a = {w.raw(), dt, kc, og * kc, false};
      if (pointwise) {
        call.b = {xs, dt, pixels, cg * pixels, false};
      } else {
        dispatch_float(dt, "conv2d", [&](auto tag) {
          using T = decltype(tag);
          im2col_kernel<T><<<grid_for(groups * kc * width), kThreads, 0, stream_>>>(static_cast<T*>(col->data()),
                                                                                   reinterpret_cast<const T*>(xs), g, p0, width);
        });
        ATELIER_CUDA_LAUNCHED();
        call.b = {col->data(), dt, width, kc * width, false};
      }
      call.c = ys + size_t(p0) * elem;
      call.c_dtype = dt;
      call.ldc = pixels;
      call.c_batch_stride = og * pixels;
      run_gemm(call);
    }
  }
  if (bias.defined()) launch_channel_bias(out.raw(), dt, bias, n, o, pixels, stream_);
}

}  // namespace atelier::cuda
