// The CPU backend: f32 compute, OpenBLAS for GEMM (and convolution through im2col), OpenMP for the rest.
// Each op family lives in its own file (cpu_copy.cc, cpu_elementwise.cc, cpu_gemm.cc, cpu_conv.cc,
// cpu_norm.cc, cpu_attention.cc).
#pragma once
#include <atomic>

#include "backend/backend.h"
#include "backend/cpu/cpu_allocator.h"

namespace atelier {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu(); }
  std::string name() const override { return "cpu"; }

  std::shared_ptr<Buffer> allocate(size_t bytes) override { return alloc_.allocate(bytes); }
  void copy_between_devices(Tensor& dst, const Tensor& src) override;
  size_t bytes_reserved() const override { return alloc_.bytes_reserved(); }
  // Bytes of live tensors (the rest of bytes_reserved() is freed blocks kept for reuse).
  size_t bytes_in_use() const { return alloc_.bytes_in_use(); }
  void release_cached() override { alloc_.release_cached(); }
  std::vector<std::pair<std::string, double>> counters() const override {
    return {{"host_allocations", double(alloc_.system_allocations())}, {"bytes_reserved", double(bytes_reserved())}};
  }

  void copy(Tensor& dst, const Tensor& src) override;
  void fill(Tensor& dst, float value) override;
  void embedding(Tensor& out, const Tensor& ids, const Tensor& table) override;

  void unary(Tensor& out, const Tensor& x, UnaryOp op) override;
  void binary(Tensor& out, const Tensor& a, const Tensor& b, BinaryOp op) override;
  void lincomb(Tensor& out, const std::vector<Tensor>& inputs, const std::vector<float>& coeffs, int coeff_rows) override;
  void glu(Tensor& out, const Tensor& x, UnaryOp act) override;
  void softmax(Tensor& out, const Tensor& x) override;

  void gemm(Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmParams& p) override;
  void quantize_rows_fp8(Tensor& q, Tensor& scale, const Tensor& x) override;
  void gemm_fp8(Tensor& out, const Tensor& x8, const Tensor& xs, const Tensor& w8, const Tensor& ws, const Tensor& bias,
                float beta, UnaryOp act) override;
  void conv2d(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
              const Tensor& addend) override;

  void group_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps, UnaryOp act) override;
  void layer_norm(Tensor& out, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) override;
  void rms_norm(Tensor& out, const Tensor& x, const Tensor& gamma, float eps) override;
  void norm_modulate(Tensor& out, const Tensor& x, NormKind kind, float eps, const Tensor& gamma,
                     const NormModulation& m) override;
  void rope(Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int seq_dim, const RopeRms& rms) override;

  void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float scale) override;
  // q, k, v quantized per tensor (the bytes CUDA makes), attention in f32 of the dequantized values (cpu_fp8.cc).
  void attention_fp8(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                     const Fp8Bounds& bounds) override;

  // Channels-last activations on the CPU, for tests only: the CPU computes NCHW (its convolution and group
  // norm run on packed copies), so this costs copies and gains nothing, but it runs the op layer's
  // channels-last paths and every model with them where CI can check them against the goldens.
  bool prefers_channels_last(DType) const override { return channels_last_for_tests_.load(); }
  void set_channels_last_for_tests(bool on) { channels_last_for_tests_.store(on); }

 private:
  // x [B, H, S, D] -> contiguous f32 s * e4m3(x / s), quantized per tensor (attention_fp8's operands): s =
  // f8e4m3_scale(bound) when bound > 0, else f8e4m3_scale(amax).
  Tensor fp8_tensor_values(const Tensor& x, float bound);
  void conv2d_nchw(Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);

  CpuAllocator alloc_;
  std::atomic<bool> channels_last_for_tests_{false};
};

CpuBackend& cpu_backend();

}  // namespace atelier
