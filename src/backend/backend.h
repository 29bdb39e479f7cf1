// The backend interface: what a device must implement so that every model runs on it.
// Model code never sees this; it calls the op API in backend/ops.h, which validates shapes, allocates the
// output on the input's device and calls the device's Backend. Backend methods receive tensors already
// validated; outputs are contiguous and freshly allocated unless a method says otherwise.
// Compute dtype: inputs are f32 on the CPU backend; the CUDA backend also takes bf16/f16 and accumulates in f32.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <utility>

#include "core/tensor.h"
#include "core/trace.h"

namespace atelier {

enum class UnaryOp { kIdentity, kSilu, kGelu, kGeluTanh, kQuickGelu, kRelu, kSigmoid, kTanh, kExp, kSqrt, kRsqrt, kSquare, kNeg, kSin, kCos };
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kMax, kMin };

// Row normalisation of norm_modulate: none (x as is), LayerNorm without affine, RMSNorm.
enum class NormKind { kNone, kLayer, kRms };
// The per-sample modulation of norm_modulate (see there); undefined tensors are left out.
struct NormModulation {
  // Default initializers: callers name only the parts they use ({.scale = s}) without -Wextra's warning.
  Tensor scale{}, shift{}, gate{}, residual{};
};
// An RMS norm over each row of rope's input, applied before the rotation (the q/k norms of FLUX and Z-Image):
// off unless `on`; gamma [D] optional (any float dtype).
struct RopeRms {
  bool on = false;
  Tensor gamma;
  float eps = 0.0f;
};
// One run of positions of a rope input along its sequence with its own RMS norm: a joint attention's streams
// (FLUX's double blocks: the text tokens with the text stream's q/k norms, then the image tokens with the
// image stream's) are runs of one q and one k. A list of runs covers the sequence in order.
struct RopeRmsRun {
  int64_t positions = 0;
  RopeRms rms;
};

// Upper bounds of |q| and |k| known before an FP8 attention runs (0: unknown): such an operand is quantized
// with the scale f8e4m3_scale(bound) (values beyond it saturate) and no amax pass reads it. For q/k that an RMS
// norm with weight gamma over D elements produced (and a rotation kept), sqrt(D) * max|gamma| bounds every element.
struct Fp8Bounds {
  float q = 0.0f, k = 0.0f;
};

struct Conv2dParams {
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int dilation_h = 1, dilation_w = 1;
  int groups = 1;
};

struct GemmParams {
  bool trans_a = false;  // a is [.., K, M] when true
  bool trans_b = false;  // b is [.., N, K] when true (linear weights)
  float alpha = 1.0f;
  float beta = 0.0f;     // out = alpha * a@b + beta * out (+ bias); beta != 0 reads out (residual fusion)
  UnaryOp epilogue = UnaryOp::kIdentity;  // applied after bias
  // When defined (contiguous, out's shape and dtype), beta's term reads it instead of out: out = alpha * a@b +
  // beta * addend (+ bias), and out is only written (a residual without first copying it into out).
  Tensor addend;
};

// Device work recorded once and replayed many times (a CUDA graph): the same kernels on the same addresses.
// The memory its intermediates were allocated in during recording stays reserved for it (a private pool)
// until it is destroyed. Obtained from Backend::capture.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  // Enqueues the recorded work again (asynchronously, on the device's queue).
  virtual void replay() = 0;
  // Device bytes held for the recording's intermediates.
  virtual size_t pool_bytes() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;

  // --- memory -------------------------------------------------------------------------------------
  virtual std::shared_ptr<Buffer> allocate(size_t bytes) = 0;
  // Copies between this device and the host (either direction); both tensors contiguous, same bytes.
  virtual void copy_between_devices(Tensor& dst, const Tensor& src) = 0;
  // dst (contiguous, on this device) = the bytes `fill` writes (Tensor::from_host). A device in host memory has
  // them written in place, in one piece.
  virtual void upload(Tensor& dst, const HostFill& fill) { fill(dst.raw(), 0, dst.nbytes()); }
  virtual void synchronize() {}
  // A mark in this device's queue after everything enqueued so far, and a wait for the host until the device
  // has passed it: a host loop can enqueue step n + 1 before it waits for step n, so that the device does not
  // idle while the host prepares a step. On a device that runs ops as they are called (the CPU) every mark is
  // already passed (0).
  virtual uint64_t mark_queue() { return 0; }
  virtual void wait_for_mark(uint64_t mark) { (void)mark; }
  // Makes this device the calling thread's current one, for a thread that works on one device only (a
  // server worker): every op then finds its device already current instead of switching to it and back.
  virtual void bind_current_thread() {}
  // Bytes held by the allocator (live + cached), for metrics and leak tests.
  virtual size_t bytes_reserved() const { return 0; }
  virtual void release_cached() {}
  // Named figures of the backend's own bookkeeping (device allocations made and their host time, ...), for a
  // server's status: what a stalled worker is read against.
  virtual std::vector<std::pair<std::string, double>> counters() const { return {}; }

  // Whether image activations of `dtype` should live channels-last on this device (Tensor::
  // empty_channels_last): the op layer then makes convolution outputs channels-last, and group norm,
  // elementwise ops, concat and upsampling keep that layout, so that no convolution transposes its input or
  // output and a transformer's tokens are a view of the image. Off (everything NCHW) by default.
  virtual bool prefers_channels_last(DType dtype) const {
    (void)dtype;
    return false;
  }

  // --- recorded execution -------------------------------------------------------------------------
  // Records the device work that `fn` enqueues on this device instead of running it, and returns it for
  // replay. `fn` must stay on the device: no copies from or to the host, no synchronisation. Devices that
  // cannot record (the CPU) return nullptr without calling fn. Throws atelier::Error when recording fails;
  // none of fn's work has run then.
  virtual std::unique_ptr<CapturedWork> capture(const std::function<void()>& fn) {
    (void)fn;
    return nullptr;
  }
  virtual bool can_capture() const { return false; }
  // Runs `fn`, whose device work this device may gather and launch as one (CUDA: recorded into a graph that is
  // launched when fn returns), so that the few small kernels between two replayed recordings (a sampler's update,
  // the next call's inputs) run back to back instead of each waiting out its own launch. Unlike capture(), fn's
  // work runs exactly once, as if enqueued eagerly: host copies, synchronisation and queue marks inside fn are
  // allowed (the device first launches what it has gathered). Devices that cannot (the CPU) just call fn. If fn
  // throws, work gathered and not yet launched is dropped and the error propagates. Trace ranges opened inside fn
  // get no device times (the range around the call gets the whole batch's).
  virtual void run_batched(const std::function<void()>& fn) { fn(); }
  // A timer of this device's queue for traced ranges (trace::set_device_timer); nullptr when the device
  // executes synchronously (the CPU: host times are device times).
  virtual std::unique_ptr<trace::DeviceTimer> make_device_timer() { return nullptr; }

  // --- data movement ------------------------------------------------------------------------------
  // dst[i] = cast(src[i]) over dst's shape; both may be strided (a zero stride broadcasts), dtypes may differ.
  virtual void copy(Tensor& dst, const Tensor& src) = 0;
  virtual void fill(Tensor& dst, float value) = 0;
  // dst = src for each (dst, src) pair, by copy's rules; no pair's destination may overlap another pair's source
  // or destination (as with memcpy: a device may run them at once). A device may move them all in one launch (a
  // CUDA graph's inputs before a replay, the rows of a concatenation along its first dimension: each launch is
  // device time at a step's boundary); the default copies pair by pair.
  virtual void copy_many(const std::vector<std::pair<Tensor, Tensor>>& pairs) {
    for (const auto& [dst, src] : pairs) {
      Tensor d = dst;
      copy(d, src);
    }
  }
  // Channels-last concatenation along channels in one pass: out [N, C, H, W] and parts [N, C_i, H, W], all
  // channels-last and of one dtype, sum of C_i = C; each out pixel's channels are the parts' side by side. False
  // (nothing done) where the device has no such kernel or the case is not one it takes: ops::concat then copies
  // part by part.
  virtual bool concat_channels_last(Tensor& out, const std::vector<Tensor>& parts) {
    (void)out, (void)parts;
    return false;
  }
  // x [N, C, H, W] (any strides) -> out [N, C, H*f, W*f] contiguous, nearest neighbour. The default is one
  // strided copy from a view that repeats each element (zero strides); a device may have a faster kernel.
  virtual void upsample_nearest2d(Tensor& out, const Tensor& x, int factor) {
    const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), f = factor, wo = w * f;
    Tensor dst(out.buffer(), {n, c, h, f, w, f}, {c * h * f * wo, h * f * wo, f * wo, wo, f, 1}, out.dtype(), out.offset());
    const Shape& s = x.strides();
    Tensor src(x.buffer(), {n, c, h, f, w, f}, {s[0], s[1], s[2], 0, s[3], 0}, x.dtype(), x.offset());
    copy(dst, src);
  }
  // x [N, C, H, W] channels-last -> out [N, C, H*f, W*f] channels-last, nearest neighbour: one strided copy in
  // [N, H, f, W, f, C] order, each input pixel's channel run repeated f x f times (zero strides over the two f dims).
  void upsample_nearest2d_channels_last(Tensor& out, const Tensor& x, int factor) {
    const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), f = factor, wo = w * f;
    Tensor dst(out.buffer(), {n, h, f, w, f, c}, {h * f * wo * c, f * wo * c, wo * c, f * c, c, 1}, out.dtype(), out.offset());
    const Shape& s = x.strides();
    copy(dst, Tensor(x.buffer(), {n, h, f, w, f, c}, {s[0], s[2], 0, s[3], 0, s[1]}, x.dtype(), x.offset()));
  }
  // out[n, :] = table[ids[n], :]; ids i32 or i64 [N]; table [V, D]; out [N, D].
  virtual void embedding(Tensor& out, const Tensor& ids, const Tensor& table) = 0;

  // --- elementwise --------------------------------------------------------------------------------
  virtual void unary(Tensor& out, const Tensor& x, UnaryOp op) = 0;
  // a and b are broadcast views (zero strides) with out's shape.
  virtual void binary(Tensor& out, const Tensor& a, const Tensor& b, BinaryOp op) = 0;
  // out = sum_i coeffs[s, i] * inputs[i] per sample s along dim 0 (coeffs [S, n], or [1, n] for all samples).
  // Samplers, CFG combine and img2img noising are all this one fused op.
  virtual void lincomb(Tensor& out, const std::vector<Tensor>& inputs, const std::vector<float>& coeffs, int coeff_rows) = 0;
  // out = uncond + scales[s] * (cond - uncond) for each row s along dim 0, all [S, ...] f32 packed alike (contiguous,
  // or all channels-last: either way row s is one block of memory and elements pair up as they lie), each op
  // rounded to f32 as ops::sub, mul and add round it (classifier-free guidance in diffusers' form). False (nothing
  // done) where the device has no such kernel: ops::guidance_combine then runs those three ops.
  virtual bool guidance_combine(Tensor& out, const Tensor& cond, const Tensor& uncond, const std::vector<float>& scales) {
    (void)out, (void)cond, (void)uncond, (void)scales;
    return false;
  }
  // t [rows] or [1] f32, freqs [1, half] f32 -> out [rows, dim] (f32, bf16 or f16): sin(t * freq) then cos(t * freq)
  // (cos first with flip_sin_to_cos), zeros past 2 * half; each product and function in f32 as ops::mul and
  // ops::unary compute them (no contraction, the same sinf / cosf), rounded to out's dtype once. False (nothing done)
  // where the device has no such kernel: ops::timestep_features then runs those ops.
  virtual bool timestep_features(Tensor& out, const Tensor& t, const Tensor& freqs, bool flip_sin_to_cos) {
    (void)out, (void)t, (void)freqs, (void)flip_sin_to_cos;
    return false;
  }
  // x [.., 2H] -> out [.., H] = x[.., :H] * act(x[.., H:]) (GEGLU with kGelu).
  virtual void glu(Tensor& out, const Tensor& x, UnaryOp act) = 0;
  // Softmax over the last dim, in place allowed (out may alias x).
  virtual void softmax(Tensor& out, const Tensor& x) = 0;

  // --- linear algebra -----------------------------------------------------------------------------
  // a [B, M, K] (or [B, K, M]), b [B, K, N] (or [B, N, K]) with B broadcast when a or b has batch 1;
  // out [B, M, N]; bias [N] optional (undefined Tensor = none).
  virtual void gemm(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmParams& p) = 0;
  // x [..., K], w [2H, K], bias [2H] optional, all one dtype -> [..., H] = (x w[:H]^T + bias[:H]) *
  // act(x w[H:]^T + bias[H:]): a gated linear unit (GEGLU with kGelu) inside its product. An undefined tensor (this
  // default) where the backend has no such kernel for the case: nothing was allocated or computed, and
  // ops::linear_glu runs the product and ops::glu.
  virtual Tensor linear_glu(const Tensor& x, const Tensor& w, const Tensor& bias, UnaryOp act) {
    (void)x, (void)w, (void)bias, (void)act;
    return Tensor();
  }
  // x [R, C] (unit last stride) -> q [R, C] f8e4m3 and scale [R] f32, both contiguous: per row r,
  // scale[r] = f8e4m3_scale(amax_r) (core/dtype.h: a power of two; 1 for a row of zeros) and q[r, c] =
  // e4m3(x[r, c] / scale[r]) (exact: a power of two), rounded to nearest even and saturated to +-448, so that
  // every backend makes the same bytes.
  virtual void quantize_rows_fp8(Tensor& q, Tensor& scale, const Tensor& x) = 0;
  // out [M, N] contiguous = act(xs[m] * ws[n] * sum_k x8[m, k] w8[n, k] + bias[n] + beta * out), accumulated in
  // f32; x8 [M, K] contiguous and w8 [N, K] (row stride >= K, unit last stride) f8e4m3 with xs [M], ws [N] f32
  // (quantize_rows_fp8); bias [N] in out's dtype, optional.
  virtual void gemm_fp8(Tensor& out, const Tensor& x8, const Tensor& xs, const Tensor& w8, const Tensor& ws,
                        const Tensor& bias, float beta, UnaryOp act) = 0;
  // out [M, N] contiguous += gate[n] * (xs[m] * ws[n] * sum_k x8[m, k] w8[n, k] + bias[n]) in place, gate [N]
  // contiguous in out's dtype (one sample's adaLN gate): where the backend folds the gate into the product's
  // column scales and bias. False where it does not (this default): nothing was written.
  virtual bool gemm_fp8_gated(Tensor& out, const Tensor& x8, const Tensor& xs, const Tensor& w8, const Tensor& ws,
                              const Tensor& bias, const Tensor& gate) {
    (void)out, (void)x8, (void)xs, (void)w8, (void)ws, (void)bias, (void)gate;
    return false;
  }
  // x [N, C, H, W], w [O, C/groups, kh, kw], bias [O] optional -> out [N, O, Ho, Wo] = conv(x) + bias +
  // addend, addend optional: a view with out's shape (zero strides broadcast, e.g. a per-sample [N, O, 1, 1]
  // time embedding or a full residual), added in the convolution's output pass where the device can.
  // x and out are contiguous or, where prefers_channels_last(dtype) says so, channels-last (each
  // independently; w contiguous).
  virtual void conv2d(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                      const Tensor& addend) = 0;
  // conv2d of a [N, C1, H, W] and b [N, C2, H, W] side by side along channels (as group_norm_concat: all channels-last,
  // one dtype; w [O, C1 + C2, kh, kw]). False (nothing done: this default) where the device cannot; ops::conv2d then
  // concatenates them.
  virtual bool conv2d_concat(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias,
                             const Conv2dParams& p, const Tensor& addend) {
    (void)out, (void)a, (void)b, (void)w, (void)bias, (void)p, (void)addend;
    return false;
  }
  // out [N, O, Ho, Wo] = conv2d(h, w, bias, p) + conv2d(x, ws [O, Cs, 1, 1], bs) with x = [s1, s2] side by side along
  // channels (s2 may be undefined: s1 alone), x [N, Cs, Ho, Wo]: a resnet's second convolution and its 1x1 shortcut,
  // whose sum is all the block needs. h, s1, s2 and out channels-last, one dtype; bias and bs optional. A backend may
  // accumulate both products in one pass (the shortcut's output never written). False (this default) where it does
  // not: nothing was written, and ops::conv2d_with_shortcut runs the shortcut and then conv2 with it as the addend.
  virtual bool conv2d_shortcut(Tensor& out, const Tensor& h, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                               const Tensor& s1, const Tensor& s2, const Tensor& ws, const Tensor& bs) {
    (void)out, (void)h, (void)w, (void)bias, (void)p, (void)s1, (void)s2, (void)ws, (void)bs;
    return false;
  }
  // out [N, O, 2H, 2W] = conv2d(x upsampled 2x by nearest neighbour, w [O, C, 3, 3], bias [O] optional) with stride
  // 1 and padding 1 (the upsamplers of SD's UNet and VAE), x [N, C, H, W] and out both channels-last, w in out's
  // dtype. A backend may compute it without the upsampled tensor: per output phase (row and column parity) it is a
  // 2x2 convolution of x with summed weights. False (this default) where it does not: nothing was written, and
  // ops::upsample2x_conv2d upsamples and convolves.
  virtual bool upsample2x_conv2d(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias) {
    (void)out, (void)x, (void)w, (void)bias;
    return false;
  }

  // --- normalisation ------------------------------------------------------------------------------
  // x [N, C, *] normalised over (C/groups, *) per group; gamma/beta [C] optional; act fused after the affine.
  // x and out are both contiguous or, where prefers_channels_last(dtype) says so, both channels-last 4-D.
  virtual void group_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps, UnaryOp act) = 0;
  // group_norm of x + offset, offset [N, C] (x's dtype, unit channel stride, any sample stride) added per (sample,
  // channel) before the statistics: a resnet's time embedding joins in the norm that is its only reader. This
  // default adds it in a pass of its own (binary) and normalises the sum; a backend may add it inside its kernels.
  virtual void group_norm_offset(Tensor& out, const Tensor& x, const Tensor& offset, const Tensor& gamma, const Tensor& beta,
                                 int groups, float eps, UnaryOp act);
  // group_norm of a [N, C1, H, W] and b [N, C2, H, W] side by side along channels into out [N, C1 + C2, H, W], all
  // channels-last and of one dtype (ops::ChannelConcat: a UNet's skip concatenation read where its parts lie). False
  // (nothing done: this default) where the device cannot; ops::group_norm then concatenates them.
  virtual bool group_norm_concat(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& gamma, const Tensor& beta,
                                 int groups, float eps, UnaryOp act) {
    (void)out, (void)a, (void)b, (void)gamma, (void)beta, (void)groups, (void)eps, (void)act;
    return false;
  }
  // Over the last dim D; gamma/beta [D] optional.
  virtual void layer_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) = 0;
  virtual void rms_norm(Tensor& out, const Tensor& x, const Tensor& gamma, float eps) = 0;

  // x [B, T, D] contiguous; kind picks the row normalisation (none, LayerNorm without affine, RMSNorm), gamma
  // [D] its optional weight; m's scale/shift/gate are [B, D] per-sample vectors (broadcast over T) and its
  // residual [B, T, D], each optional. out [B, T, D] contiguous, every step rounded to the dtype as the
  // unfused ops round: n = norm(x) * gamma; n = n * (1 + scale); n = n + shift; out = residual + gate * n.
  // (adaLN modulation and gated residuals of DiT blocks in one pass.)
  virtual void norm_modulate(Tensor& out, const Tensor& x, NormKind kind, float eps, const Tensor& gamma,
                             const NormModulation& m) = 0;
  // norm_modulate, and its rows quantized as quantize_rows_fp8 quantizes them: q [B*T, D] f8e4m3, scale
  // [B*T] f32 (an FP8 GEMM's input). The same values as the two calls, which is what this default does; a
  // backend may do it in one pass (CUDA: the row is in registers when its amax is taken). out_needed false:
  // only q and scale are read afterwards, so a backend may leave out unwritten (this default writes it).
  virtual void norm_modulate_fp8(Tensor& out, Tensor& q, Tensor& scale, const Tensor& x, NormKind kind, float eps,
                                 const Tensor& gamma, const NormModulation& m, bool out_needed) {
    (void)out_needed;
    norm_modulate(out, x, kind, eps, gamma, m);
    quantize_rows_fp8(q, scale, out.reshape({q.size(0), q.size(1)}));
  }

  // --- rotary position embedding ------------------------------------------------------------------
  // x [B, A, C, D] (any strides, unit last stride), positions along dim seq_dim (1 or 2, size S); cos/sin
  // [S, D/2] contiguous in x's dtype; out [B, A, C, D] contiguous: each pair (x0, x1) = (x[2i], x[2i+1])
  // becomes (x0 c - x1 s, x0 s + x1 c) with (c, s) of (position, i), every product rounded to the dtype
  // before the sum (as the unfused mul/sub/add ops of the reference round). With rms.on, each row of D is
  // first normalised as rms_norm does (x / sqrt(mean(x^2) + eps) * gamma, rounded to the dtype as rms_norm
  // writes it) and the rotation applies to that: the q/k norm and RoPE in one pass, x read once.
  virtual void rope(Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms) = 0;

  // --- attention ----------------------------------------------------------------------------------
  // q [B, H, Sq, D], k [B, Hk, Sk, D], v [B, Hk, Sk, Dv] with H % Hk == 0 (grouped-query attention);
  // mask optional, additive f32, broadcastable to [B, H, Sq, Sk] (zero strides allowed); out [B, H, Sq, Dv]
  // with a unit last stride, contiguous or a [B, Sq, H, Dv] buffer seen through a permute (heads merged).
  // q/k/v may be strided views (e.g. heads split out of a fused projection) with a unit last-dim stride.
  virtual void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) = 0;
  // FP8 attention (DiT blocks with --dtype fp8): q [B, H, Sq, D], k/v [B, H, Sk, D] (no mask, no grouped
  // heads), each quantized per tensor as quantize_rows_fp8 quantizes a row: s = f8e4m3_scale(amax) (1 for zeros;
  // of the bound where `bounds` gives one), x8 = e4m3(x / s) with IEEE division, nearest even, saturation (the
  // same bytes on every backend); out = the attention of the dequantized s * x8. A device's FP8 kernel may take
  // the probabilities and the output through e4m3 too (cuDNN's does: 2^-4 relative per element, averaged over
  // the keys); the CPU computes them in f32. A backend without FP8 attention for a case runs attention() on
  // q, k, v (this default).
  virtual void attention_fp8(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                             const Fp8Bounds& bounds) {
    (void)bounds;
    attention(out, q, k, v, Tensor(), scale);
  }
  // attention_fp8 that also hands over its e4m3 result for an FP8 GEMM: rows8 [B*Sq, H*Dv] f8e4m3 and
  // row_scale [B*Sq] f32 (every row the output's per-tensor scale), out [B, H, Sq, Dv] a heads-merged view,
  // written only with write_out when the rows are handed over. False when the backend has no e4m3 output for
  // the case (this default): then `out` was written and the rows were not.
  virtual bool attention_fp8_rows(Tensor& out, Tensor& rows8, Tensor& row_scale, const Tensor& q, const Tensor& k,
                                  const Tensor& v, float scale, const Fp8Bounds& bounds, bool write_out) {
    (void)rows8;
    (void)row_scale;
    (void)write_out;
    attention_fp8(out, q, k, v, scale, bounds);
    return false;
  }
  // attention_fp8_rows of q = rope(qx) and k = rope(kx) (each as Backend::rope with positions along dim 2, each
  // run of positions with its RMS norm: q_runs / k_runs cover Sq / Sk in order; qx [B, H, Sq, D], kx [B, H, Sk, D]
  // with unit last strides, cos/sin [S, D/2] contiguous) where q and k are bounded (bounds.q, bounds.k > 0) and
  // the rope pass can write them in e4m3 itself: the same bytes as that sequence, without the 16-bit q and k.
  // True: rows8/row_scale written (and out with write_out); false: nothing was written (this default), the
  // caller ropes and calls attention_fp8_rows.
  virtual bool rope_attention_fp8_rows(Tensor& out, Tensor& rows8, Tensor& row_scale, const Tensor& qx, const Tensor& kx,
                                       const Tensor& v, const Tensor& cos, const Tensor& sin,
                                       const std::vector<RopeRmsRun>& q_runs, const std::vector<RopeRmsRun>& k_runs,
                                       float scale, const Fp8Bounds& bounds, bool write_out) {
    (void)out, (void)rows8, (void)row_scale, (void)qx, (void)kx, (void)v, (void)cos, (void)sin, (void)q_runs, (void)k_runs;
    (void)scale, (void)bounds, (void)write_out;
    return false;
  }

 protected:
  // For attention paths that write contiguous [B, H, Sq, Dv] rows only: attention into a contiguous
  // temporary, then one strided copy into `out` (a heads-merged view).
  void attention_through_temporary(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                   float scale) {
    Tensor tmp = Tensor::empty(out.shape(), out.dtype(), out.device());
    attention(tmp, q, k, v, mask, scale);
    copy(out, tmp);
  }
};

// The backend that owns `dev`; throws atelier::Error when that device is unavailable.
Backend& backend_for(Device dev);
// Registry used by backends at start-up (the CPU backend is always present).
void register_backend(Device::Kind kind, int index, Backend* backend);
bool backend_available(Device dev);

}  // namespace atelier
