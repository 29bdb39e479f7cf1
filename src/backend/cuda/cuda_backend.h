// The CUDA backend: one instance per visible GPU, registered lazily by init_cuda_backends() (cuda_init.h)
// the first time a CUDA device is asked for. Every op is enqueued on the device's one stream without host
// synchronisation; synchronize() waits for it. Storage dtypes are f32, bf16 and f16 with f32 compute.
// Op families live in their own files: cuda_copy.cu, cuda_elementwise.cu, cuda_gemm.cu, cuda_conv.cu,
// cuda_norm.cu, cuda_attention.cu (flash kernel) and cuda_attention_gemm.cu (the general path).
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_conv_narrow.h"
#include "backend/cuda/cuda_event_timing.h"

namespace atelier::cuda {

class GemmEngine;
class ConvEngine;
class CudnnSdpa;
class CudnnSdpaFp8;
struct GemmCall;
struct ConvShape;
struct OwnConvArgs;

// Which convolution implementation to use (tests force each one). kAuto prefers cuDNN when it loads, in
// channels-last layout for 16-bit ungrouped convolutions (cuDNN's fast tensor-core kernels are NHWC: the
// activations are transposed in and out around the call, the weights once; ATELIER_CONV_NHWC=0 keeps NCHW),
// else NCHW; kCudnnNchw forces cuDNN in NCHW; kIm2col the im2col + GEMM path.
enum class ConvImpl { kAuto, kCudnn, kCudnnNchw, kIm2col };
// Which attention implementation to use: the tensor-core flash kernel (bf16/f16, head dim a multiple of 8,
// at most 256, equal q/v head dims), cuDNN's fused SDPA node (cuda_sdpa.h: bf16/f16 without a mask), or the
// general path (two batched GEMMs around a masked softmax, any dtype and head dims). kAuto takes, per shape,
// the faster of cuDNN and the flash kernel where both apply (timed at the shape's first eager call), else
// the flash kernel whenever it applies; kCudnnSdpa forces cuDNN (throws where it declines: tests).
enum class AttentionImpl { kAuto, kFlash, kGemm, kCudnnSdpa };
// Channels-last convolutions as one cuBLASLt GEMM over an im2col matrix (cuda_conv_gemm.cu) where it applies and
// ConvImpl is kAuto: kAuto where timed faster than cuDNN per shape (at its first eager call), kOff never, kForce
// always (tests). ATELIER_CONV_GEMM=0|force; kAuto by default.
enum class ConvGemm { kAuto, kOff, kForce };
ConvGemm conv_gemm_default();
// Whether the upsamplers run as one 2x2 convolution per output phase (cuda_conv_upsample.cu): kAuto where timed faster
// than upsampling then convolving per shape, kOff never, kForce always (tests). ATELIER_UPSAMPLE_PHASES=0|force.
enum class UpsamplePhases { kAuto, kOff, kForce };
UpsamplePhases upsample_phases_default();

class CudaBackend final : public Backend {
 public:
  CudaBackend(int index, const cudaDeviceProp& prop);
  ~CudaBackend() override;
  Device device() const override { return Device::cuda(index_); }
  std::string name() const override { return name_; }

  std::shared_ptr<Buffer> allocate(size_t bytes) override { return alloc_.allocate(bytes); }
  void copy_between_devices(Tensor& dst, const Tensor& src) override;
  void upload(Tensor& dst, const HostFill& fill) override;
  void synchronize() override;
  uint64_t mark_queue() override;  // an event recorded on the stream, from a ring of kQueueMarks
  void wait_for_mark(uint64_t mark) override;
  void bind_current_thread() override;
  size_t bytes_reserved() const override { return alloc_.bytes_reserved(); }
  void release_cached() override { alloc_.release_cached(); }
  std::vector<std::pair<std::string, double>> counters() const override {
    const DeviceAllocator::Stats a = alloc_.stats();
    return {{"cuda_mallocs", double(a.mallocs)}, {"cuda_malloc_seconds", a.malloc_seconds},
            {"allocator_larger_reuses", double(a.larger_reuses)}, {"bytes_reserved", double(bytes_reserved())}};
  }
  // CUDA graphs (cuda_graph.cu).
  std::unique_ptr<CapturedWork> capture(const std::function<void()>& fn) override;
  bool can_capture() const override { return true; }
  // Batched launches (cuda_batch.cc): fn's work recorded into a graph, launched as one; the executable graph of an
  // earlier batch with the same kernels is updated in place rather than instantiated again.
  void run_batched(const std::function<void()>& fn) override;
  std::unique_ptr<trace::DeviceTimer> make_device_timer() override;  // cuda_timer.cu

  void copy(Tensor& dst, const Tensor& src) override;
  void fill(Tensor& dst, float value) override;
  void copy_many(const std::vector<std::pair<Tensor, Tensor>>& pairs) override;  // cuda_copy.cu
  bool concat_channels_last(Tensor& out, const std::vector<Tensor>& parts) override;  // cuda_copy.cu
  void upsample_nearest2d(Tensor& out, const Tensor& x, int factor) override;  // cuda_copy.cu
  bool upsample2x_conv2d(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) override;  // cuda_conv_upsample.cu
  void embedding(Tensor& out, const Tensor& ids, const Tensor& table) override;

  void unary(Tensor& out, const Tensor& x, UnaryOp op) override;
  void binary(Tensor& out, const Tensor& a, const Tensor& b, BinaryOp op) override;
  void lincomb(Tensor& out, const std::vector<Tensor>& inputs, const std::vector<float>& coeffs, int coeff_rows) override;
  void glu(Tensor& out, const Tensor& x, UnaryOp act) override;
  bool guidance_combine(Tensor& out, const Tensor& cond, const Tensor& uncond, const std::vector<float>& scales) override;  // cuda_elementwise.cu
  bool timestep_features(Tensor& out, const Tensor& t, const Tensor& freqs, bool flip_sin_to_cos) override;  // cuda_elementwise.cu
  void softmax(Tensor& out, const Tensor& x) override;

  void gemm(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmParams& p) override;
  Tensor linear_glu(const Tensor& x, const Tensor& w, const Tensor& bias, UnaryOp act) override;  // cuda_gemm.cu (the kernel: cuda_gemm_wgmma.cu)
  // FP8 linear layers (cuda_fp8.cu).
  void quantize_rows_fp8(Tensor& q, Tensor& scale, const Tensor& x) override;
  void gemm_fp8(Tensor& out, const Tensor& x8, const Tensor& xs, const Tensor& w8, const Tensor& ws, const Tensor& bias,
                float beta, UnaryOp act) override;
  // The gate folded into the product: ws * gate and bias * gate made by one small kernel, then the scaled FP8
  // product accumulating onto out (ATELIER_FP8_GATED=0: declined, for comparisons).
  bool gemm_fp8_gated(Tensor& out, const Tensor& x8, const Tensor& xs, const Tensor& w8, const Tensor& ws, const Tensor& bias,
                      const Tensor& gate) override;
  void conv2d(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
              const Tensor& addend) override;
  // The own implicit-GEMM kernel reading a's k-steps from one tensor map and b's from a second, timed per shape
  // against the concatenation and conv2d's own choice (cuda_conv.cu).
  bool conv2d_concat(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                     const Tensor& addend) override;
  // The own implicit-GEMM kernel with the shortcut's k-steps after conv2's taps (weights and biases packed once per
  // weight), timed per shape against the shortcut followed by conv2 with it as the addend; false (ops runs that)
  // where the latter is faster or the kernel does not take the case (cuda_conv_shortcut.cu).
  bool conv2d_shortcut(Tensor& out, const Tensor& h, const Tensor& w, const Tensor& bias, const Conv2dParams& p, const Tensor& s1,
                       const Tensor& s2, const Tensor& ws, const Tensor& bs) override;
  // Channels-last where the convolutions run channels-last: 16-bit data on cuDNN (ConvImpl kAuto or kCudnn,
  // ATELIER_CONV_NHWC not 0); f32 and forced NCHW/im2col keep NCHW.
  bool prefers_channels_last(DType dtype) const override;

  void group_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps, UnaryOp act) override;
  void group_norm_offset(Tensor& out, const Tensor& x, const Tensor& offset, const Tensor& gamma, const Tensor& beta, int groups,
                         float eps, UnaryOp act) override;
  // The one-kernel channels-last norms (slice, grid) read the two parts where they lie (group_norm_nhwc with x2).
  bool group_norm_concat(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& gamma, const Tensor& beta, int groups,
                         float eps, UnaryOp act) override;
  void layer_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) override;
  void rms_norm(Tensor& out, const Tensor& x, const Tensor& gamma, float eps) override;
  void norm_modulate(Tensor& out, const Tensor& x, NormKind kind, float eps, const Tensor& gamma,
                     const NormModulation& m) override;
  void norm_modulate_fp8(Tensor& out, Tensor& q, Tensor& scale, const Tensor& x, NormKind kind, float eps,
                         const Tensor& gamma, const NormModulation& m, bool out_needed) override;
  void rope(Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms) override;

  void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) override;
  // cuDNN's fused FP8 attention (cuda_fp8_attention.cu) where fp8_attention_takes the case, else attention().
  void attention_fp8(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                     const Fp8Bounds& bounds) override;
  // The same, cuDNN's e4m3 output handed over as rows (no requantization) where the FP8 path ran.
  bool attention_fp8_rows(Tensor& out, Tensor& rows8, Tensor& row_scale, const Tensor& q, const Tensor& k, const Tensor& v,
                          float scale, const Fp8Bounds& bounds, bool write_out) override;
  // The same with q and k written in e4m3 by the normalising rope's register kernel (rope_e4m3) where FP8
  // attention takes the case: no 16-bit q/k, no quantization pass over them.
  bool rope_attention_fp8_rows(Tensor& out, Tensor& rows8, Tensor& row_scale, const Tensor& qx, const Tensor& kx, const Tensor& v,
                               const Tensor& cos, const Tensor& sin, const std::vector<RopeRmsRun>& q_runs,
                               const std::vector<RopeRmsRun>& k_runs, float scale, const Fp8Bounds& bounds,
                               bool write_out) override;

  // --- CUDA-specific controls (benchmarks, tests) ---------------------------------------------------
  cudaStream_t stream() const { return stream_; }
  int index() const { return index_; }
  int sm_count() const { return sm_count_; }
  int cc_major() const { return cc_major_; }
  size_t bytes_in_use() const { return alloc_.bytes_in_use(); }
  // f32 GEMMs may use TF32 tensor cores (about 10 bits of mantissa; off by default so that f32 results
  // match the CPU backend to f32 rounding). Also from the environment: ATELIER_CUDA_TF32=1.
  void set_allow_tf32(bool allow) { allow_tf32_ = allow; }
  bool allow_tf32() const { return allow_tf32_; }
  void set_conv_impl(ConvImpl impl) { conv_impl_ = impl; }
  void set_conv_gemm(ConvGemm mode) { conv_gemm_ = mode; }
  int64_t conv_gemm_calls() const { return conv_gemm_calls_.load(); }  // convolutions the GEMM path ran
  void set_upsample_phases(UpsamplePhases mode) { upsample_phases_ = mode; }
  // Whether the own implicit-GEMM kernel's product over the four phases is one of the upsamplers' candidates
  // (cuda_conv_upsample.cu); on unless ATELIER_OWN_PHASES=0.
  void set_own_phases(bool on) { own_phases_ = on; }
  static bool own_phases_default();
  // The few-channel convolution kernels (cuda_conv_narrow.h): a timed candidate (kAuto), never, or forced.
  void set_narrow_conv(NarrowConv mode) { narrow_conv_ = mode; }
  int64_t upsample_phase_calls() const { return upsample_phase_calls_.load(); }  // upsamplers run as phase convolutions
  // "cudnn <version>" or "im2col+gemm (cuDNN not loaded: <why>)": what kAuto uses on this machine.
  std::string conv_impl_name();
  void set_attention_impl(AttentionImpl impl) { attention_impl_ = impl; }
  // Whether cuDNN's fused SDPA node can be used on this machine; *why says why not (cuDNN missing or older
  // than 9.13.1, ATELIER_CUDNN_SDPA=0).
  bool cudnn_sdpa_available(std::string* why);
  // FP8 attention for attention_fp8 (the DiT blocks under --dtype fp8): on by default since session 14 (H200:
  // a FLUX 1024² FP8 step 90.5 -> 82-84 ms, docs/performance.md "Session 14"). Off, attention_fp8 runs the 16-bit
  // attention(). Also ATELIER_FP8_ATTENTION=0.
  void set_fp8_attention(bool on) { fp8_attention_ = on; }
  // The default: on unless ATELIER_FP8_ATTENTION=0.
  static bool fp8_attention_default();
  // Whether attention_fp8 runs FP8 attention for these operands (*why: why not): switched on, Hopper or newer,
  // cuDNN's FP8 graph available, bf16/f16 operands of equal heads and head dims (a multiple of 16 up to 256),
  // 16-byte aligned rows, a dense output, a shape cuDNN has not declined.
  bool fp8_attention_takes(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, std::string* why);
  // Queries per block of the flash kernel: 64 or 128 (two m-tiles per warp), 0 = chosen per call from the
  // grid size. Tests and benchmarks force each.
  void set_flash_block_rows(int rows) { flash_block_rows_ = rows; }
  // Key tile of the 128-query kernels at head dims 48/64/128: 0 = the measured best per head dim (wide at 48
  // and 128, narrow at 64; docs/performance.md), kFlashNarrowKeys / kFlashWideKeys force one (tests, benches).
  static constexpr int kFlashNarrowKeys = 1;
  static constexpr int kFlashWideKeys = 2;
  void set_flash_key_tile(int mode) { flash_key_tile_ = mode; }
  // Channels-last group norms of at most 8 MB (or with enough samples to fill the device at 16 chunks each):
  // at most 16 statistics chunks per sample, merged by every block of the apply kernel instead of by a merge
  // kernel of its own: one launch fewer per group norm (61 per SD UNet call, ~5 us each at batch 2). Off:
  // measured slower on the H200 (SD step 7.02 against 6.49 ms at batch 2, session 11); also ATELIER_GN_APPLY_MERGE=1.
  void set_group_norm_apply_merge(bool on) { gn_apply_merge_ = on; }
  void set_group_norm_offset_in_kernels(bool on) { gn_offset_in_kernels_ = on; }
  // group_norm_concat and conv2d_concat read a skip concatenation's parts where they lie; off: both decline and
  // ops concatenate (ATELIER_CONCAT_IN_PLACE=0; A/B runs and the tests' reference path).
  void set_concat_in_place(bool on) { concat_in_place_ = on; }
  // conv2d_shortcut: kAuto (the default) times the folded kernel per shape against the separate shortcut,
  // kOff declines (=0), kForce folds wherever the kernel takes the case (=force; tests).
  enum class FoldShortcut { kAuto, kOff, kForce };
  void set_fold_shortcut(FoldShortcut mode) { fold_shortcut_ = mode; }
  static FoldShortcut fold_shortcut_default();  // the environment's (ATELIER_FOLD_SHORTCUT), else the default
  int64_t folded_shortcuts() const { return folded_shortcuts_.load(); }  // conv2d_shortcut calls that ran folded
  // norm_modulate_fp8 in one pass (the vector kernel quantizes the rows it holds); off: norm_modulate, then
  // quantize_rows_fp8, as Backend's default (the parity test compares the two; the same bytes). Also
  // ATELIER_FUSED_FP8_NORM=0.
  void set_fused_fp8_norm_modulate(bool on) { fused_fp8_norm_modulate_ = on; }
  // norm_modulate's vector kernels specialised for the operand combinations the models use (absent operands
  // compiled out: cuda_norm_modulate.cu, ModBits); off: the form that tests its pointers at run time (the same
  // bytes: a GPU test compares the two). Also ATELIER_NORM_MODULATE_SPECIALIZED=0.
  void set_specialized_norm_modulate(bool on) { specialized_norm_modulate_ = on; }
  // Enqueues one GEMM (used by conv2d's im2col path and the general attention path too).
  void run_gemm(const GemmCall& call);

 private:
  // While a guard lives, a batch open on the calling thread (run_batched) is launched and closed (the host copy,
  // wait or queue mark that follows must come after the work gathered so far), then opened again.
  class BatchPause {
   public:
    explicit BatchPause(CudaBackend& b);
    ~BatchPause();
    BatchPause(const BatchPause&) = delete;
    BatchPause& operator=(const BatchPause&) = delete;

   private:
    CudaBackend& b_;
    bool paused_ = false;
  };
  struct BatchGraphs;  // cuda_batch.cc: executable graphs of earlier batches, by their kernels
  bool batch_open_here() const;  // a batch is being gathered on the calling thread
  bool open_batch();              // false (nothing open) where capture could not begin
  void launch_batch();            // ends the open batch's capture and launches it (throws where capture failed)
  void drop_batch() noexcept;     // ends the open batch's capture without running its work
  // The cuBLASLt engine of this device, made at first use.
  GemmEngine& gemm_engine();
  // The start-up thread's work: the engines made and cuDNN's engine libraries loaded before their first use; with
  // first_calls, also the libraries' first calls (GemmEngine::warm_up, ConvEngine::warm_up).
  void prewarm(bool first_calls) noexcept;
  // Attention through two batched GEMMs and a masked softmax, in chunks of queries (any dtype/head dims).
  void attention_gemm(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale);
  // The tensor-core flash kernel; returns false when the inputs are outside what it supports.
  bool attention_flash(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale);
  // cuDNN's fused SDPA (unmasked bf16/f16); false when it declines or our kernel measured faster (kAuto).
  bool attention_cudnn(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale);
  // Makes sdpa_fp8_ (with conv_'s cuDNN handle); false with *why when cuDNN's FP8 graph cannot be used.
  bool cudnn_sdpa_fp8(std::string* why);
  // attention_fp8's work; with rows8 (heads-merged out) cuDNN writes its e4m3 output there and row_scale gets
  // the output's scale (out then written only with write_out). False (out written by attention()) when the
  // FP8 path did not run.
  // With q8_given/k8_given (e4m3 q and k made already, scaled by their bounds), q and k only describe the case
  // and `fallback16` writes out where cuDNN declines.
  bool run_fp8_attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale, const Fp8Bounds& bounds,
                         Tensor* rows8, Tensor* row_scale, bool write_out = true, const Tensor* q8_given = nullptr,
                         const Tensor* k8_given = nullptr, const std::function<void()>& fallback16 = {});
  // rope (positions along dim 2, rms.on) of x into q8 [x's shape] e4m3 contiguous over the scale
  // f8e4m3_scale(bound), as FP8 attention quantizes a bounded q or k; false (nothing launched) where the register
  // kernel cannot take x.
  bool rope_e4m3(Tensor& q8, const Tensor& x, const Tensor& cos, const Tensor& sin, const RopeRms& rms, float bound);
  void conv2d_im2col(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);
  // cuDNN in NHWC: x read in place when channels-last (else transposed in), the result written in place when
  // out is channels-last (else transposed back), bias and addend added in one output pass; false when cuDNN
  // declines (nothing written to out).
  bool conv2d_nhwc(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p, bool w_persistent,
                   const Tensor& addend);
  // The channels-last output part of conv2d_nhwc: cuDNN or the GEMM path into out (channels-last) from xn (x's bytes
  // in NHWC order) and wn [O, kh, kw, C]; false where cuDNN declines.
  bool conv2d_nhwc_packed(Tensor& out, const Tensor& xn, const ConvShape& s, const Tensor& wn, const Tensor& bias,
                          const Conv2dParams& p, const Tensor& addend);
  // cuda_conv_gemm.cu: whether the GEMM path can take the case (x, out channels-last; wn [O, kh, kw, C]); the path
  // itself; the arguments of the implicit-GEMM kernel of our own (false where it does not take the case); and which
  // candidate is fastest for this shape (timed at the first eager call, then cached).
  bool conv_gemm_applies(const Tensor& out, const Tensor& x, const Tensor& wn, const Conv2dParams& p, const Tensor& addend) const;
  void conv2d_nhwc_gemm(Tensor& out, const Tensor& x, const Tensor& wn, const Tensor& bias, const Conv2dParams& p,
                        const Tensor& addend);
  bool conv_own_args(const Tensor& out, const Tensor& x, const Tensor& wn, const Tensor& bias, const Conv2dParams& p,
                     const Tensor& addend, OwnConvArgs& a, const Tensor& x2 = {}) const;
  bool narrow_conv_args(const Tensor& out, const Tensor& x, const Tensor& wn, const Tensor& bias, const Conv2dParams& p,
                        const Tensor& addend, NarrowConvArgs& a) const;
  int conv_path_choice(const Tensor& out, const Tensor& x, const Tensor& wn, const Tensor& bias, const Conv2dParams& p,
                       const Tensor& addend, const std::vector<std::function<bool()>>& candidates, const std::vector<const char*>& names);
  // The own kernel's split-K workspace (allocated at the first call, then kept).
  void* conv_split_workspace();
  bool launch_own_conv(OwnConvArgs args, int split);
  // Group norm of x (+ offset) into out (cuda_group_norm_nhwc.cu); false, enqueuing nothing, where its kernels do not
  // apply (either not channels-last, different dtypes, channel counts or buffers they cannot take). With x2, the norm
  // of x and x2 side by side along channels (out's channels: x's, then x2's), read where they lie (the one-kernel
  // paths only).
  bool group_norm_nhwc(Tensor& out, const Tensor& x, const Tensor& offset, const Tensor& gamma, const Tensor& beta, int groups,
                       float eps, UnaryOp act, const Tensor& x2 = {});
  // w [O, C, kh, kw] as [O, kh, kw, C], cached per weight buffer when `persistent` (model weights).
  Tensor nhwc_weight(const Tensor& w, bool persistent);
  // The entry of `cache` made from weight w (an Entry whose `source` is a weak pointer to the weight's buffer), made
  // again by make(entry), after `source` is set, where there is none, w's buffer is not the one it was made from (a
  // model's weights keep their buffers; an address reused by a later model's weight is a new buffer, and the old
  // weak pointer has expired) or fits(entry) fails; a new weight first drops the entries of weights freed since.
  // The caller holds nhwc_mu_ (the caches of prepared weights: nhwc_weight, phase_weights).
  template <typename Entry, typename Fits, typename Make>
  static Entry& weight_entry(std::unordered_map<const void*, Entry>& cache, const Tensor& w, Fits&& fits, Make&& make) {
    if (!cache.count(w.raw())) std::erase_if(cache, [](const auto& kv) { return kv.second.source.expired(); });
    Entry& e = cache[w.raw()];
    if (e.source.expired() || e.source.lock() != w.buffer() || !fits(e)) {
      e.source = w.buffer();
      make(e);
    }
    return e;
  }
  // The cuDNN engine (convolutions; its handle serves the SDPA engines too), made at its first use: conv_engine()
  // takes engines_mu_, conv_engine_locked() is for a caller that holds it.
  ConvEngine& conv_engine();
  ConvEngine& conv_engine_locked();
  // A tensor of `like`'s shape in `dtype` (a cast copy, or `like` itself when it already has it).
  Tensor as_dtype(const Tensor& like, DType dtype);

  int index_;
  std::string name_;
  int sm_count_ = 0;
  int cc_major_ = 0;  // compute capability
  size_t max_smem_optin_ = 0;
  cudaStream_t stream_ = nullptr;
  // mark_queue's events, reused in turn; a mark older than the ring (its event recorded again since) is waited
  // for by synchronizing the whole stream, which passes it too.
  static constexpr int kQueueMarks = 8;
  std::mutex marks_mu_;
  std::array<cudaEvent_t, kQueueMarks> marks_{};
  uint64_t marks_issued_ = 0;
  DeviceAllocator alloc_;
  PinnedStaging staging_;
  std::unique_ptr<GemmEngine> gemm_;
  std::unique_ptr<ConvEngine> conv_;  // conv_engine(): made at its first use
  // Choices kept across processes (backend/choice_store.h) for this card, driver, cuDNN, cuBLASLt and binary: the
  // TimedChoice members below and the SDPA engine's. Made with conv_ (cuDNN's version is part of what they hold for).
  std::unique_ptr<ChoiceStore> choices_;
  std::unique_ptr<CudnnSdpa> sdpa_;  // created with conv_ (it shares cuDNN's handle), lazily
  std::unique_ptr<CudnnSdpaFp8> sdpa_fp8_;  // likewise
  std::mutex engines_mu_;
  bool allow_tf32_ = false;
  ConvImpl conv_impl_ = ConvImpl::kAuto;
  bool conv_nhwc_ = true;  // ATELIER_CONV_NHWC=0 turns kAuto's channels-last path off
  ConvGemm conv_gemm_ = ConvGemm::kAuto;
  std::atomic<int64_t> conv_gemm_calls_{0};
  std::shared_ptr<Buffer> conv_split_ws_;  // conv_split_workspace()
  // (out shape, x shape, kh, kw, stride h/w, pad h/w, dtype, bias?, addend?, the candidates' names) -> the fastest one's index
  TimedChoice<std::tuple<std::vector<int64_t>, std::vector<int64_t>, int, int, int, int, int, int, int, bool, bool, std::string>>
      conv_choices_;
  struct NhwcWeight {
    std::weak_ptr<Buffer> source;  // the NCHW weight's buffer: expired -> the entry is stale
    Tensor packed;
  };
  std::mutex nhwc_mu_;
  std::unordered_map<const void*, NhwcWeight> nhwc_weights_;
  // An upsampler's weights as its four output phases' 2x2 kernels [4 * O, 2, 2, C] and its bias tiled to [4 * O]
  // (cuda_conv_upsample.cu), cached per weight buffer (under nhwc_mu_).
  struct PhaseWeights {
    std::weak_ptr<Buffer> source;
    const void* bias_source = nullptr;
    Tensor weight, bias;
  };
  PhaseWeights phase_weights(const Tensor& w, const Tensor& bias);
  void make_phase_weights(PhaseWeights& e, const Tensor& w, const Tensor& bias);
  std::unordered_map<const void*, PhaseWeights> phase_weights_;
  UpsamplePhases upsample_phases_ = upsample_phases_default();
  bool own_phases_ = own_phases_default();
  NarrowConv narrow_conv_ = narrow_conv_default();
  // Which of the candidates (0: upsample, then convolve; then the phases' paths) is fastest for this shape (timed
  // at its first eager call).
  int upsample_phase_choice(const Tensor& out, const Tensor& x, const Tensor& bias, const std::vector<std::function<bool()>>& candidates,
                            const std::vector<const char*>& names);
  // (x shape, out channels, dtype, bias?, the candidates' names) -> the fastest candidate's index
  TimedChoice<std::tuple<std::vector<int64_t>, int64_t, int, bool, std::string>> upsample_phase_choices_;
  // conv2d_concat's per shape (the parts', the packed weight's, strides, paddings, bias and addend present).
  TimedChoice<std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, int, int, int, int, bool, bool>>
      conv_concat_choices_;
  std::atomic<int64_t> upsample_phase_calls_{0};
  // conv2d_shortcut's packed operands per conv2 weight (under nhwc_mu_): [O, kh, kw, C] and the shortcut's [O, Cs]
  // side by side along k as [O, kh * kw * C + Cs], and the two biases' sum [O] (rounded once).
  struct ShortcutWeights {
    std::weak_ptr<Buffer> source;
    const void* shortcut_source = nullptr;
    const void* bias_source = nullptr;
    const void* shortcut_bias_source = nullptr;
    Tensor weight, bias;
  };
  ShortcutWeights shortcut_weights(const Tensor& w, const Tensor& wn, const Tensor& bias, const Tensor& ws, const Tensor& bs);
  std::unordered_map<const void*, ShortcutWeights> shortcut_weights_;
  // conv2d_shortcut's per shape (h's, s1's, s2's or none, w's and ws's, paddings, biases present) -> 0: separate
  TimedChoice<std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>,
                         int, int, bool, bool>>
      conv_shortcut_choices_;
  FoldShortcut fold_shortcut_ = fold_shortcut_default();
  std::atomic<int64_t> folded_shortcuts_{0};
  AttentionImpl attention_impl_ = AttentionImpl::kAuto;
  int flash_block_rows_ = 0;
  int flash_key_tile_ = 0;
  bool gn_apply_merge_ = false;
  bool concat_in_place_ = true;  // ATELIER_CONCAT_IN_PLACE=0: group_norm_concat and conv2d_concat decline
  bool gn_offset_in_kernels_ = true;  // ATELIER_GN_OFFSET_IN_KERNELS=0: group_norm_offset adds in a pass of its own
  bool fused_fp8_norm_modulate_ = true;
  bool specialized_norm_modulate_ = true;
  bool fp8_attention_ = false;
  // The open batch (run_batched): the thread gathering it (a default id when none), and earlier batches' graphs.
  std::atomic<std::thread::id> batch_thread_{};
  std::shared_ptr<BatchGraphs> batch_graphs_;  // made (and its deleter taken) in cuda_batch.cc
};

// The backend of cuda:`index` (throws atelier::Error when that device is not available).
CudaBackend& cuda_backend(int index);

// concat_channels_last's one-pass kernel: launches so far (tests: which path ran), and its switch (default on,
// unless ATELIER_CONCAT_ONE_PASS=0: one copy per part).
int64_t concat_one_pass_launches();
void set_concat_one_pass(bool on);
// Contiguous device-to-device copies (copy, copy_many) as kernels, up to 8 in one launch: launches so far (tests),
// and the switch to the driver's cudaMemcpyAsync instead (ATELIER_DRIVER_COPIES=1; default off).
int64_t copy_many_launches();
void set_driver_copies(bool on);
bool driver_copies();
// run_batched's figures so far (tests, benchmarks): batches launched, graphs instantiated for them and updated in
// place, pauses (a host copy, wait or mark inside a batch), and its switch (default on, unless
// ATELIER_LAUNCH_BATCHES=0: fn runs eagerly).
struct LaunchBatchStats {
  int64_t launched = 0, instantiated = 0, updated = 0, paused = 0;
};
LaunchBatchStats launch_batch_stats();
void set_launch_batches(bool on);
bool launch_batches();
// Whether the calling thread is gathering a batch on `stream` (small uploads may then go in kernel parameters:
// the batch runs once, unlike a recording replayed later).
bool batching_on(cudaStream_t stream);
// The fused guidance combine's and timestep features' launches so far (tests: which path ran).
int64_t guidance_combine_launches();
int64_t timestep_features_launches();

}  // namespace atelier::cuda
