// TEMPORARY: ops not yet implemented on the CPU. Each moves to its own file (see cpu_backend.h).
#include "backend/cpu/cpu_backend.h"

namespace atelier {
#define PENDING(name) throw Error(std::string("cpu op not implemented yet: ") + name)
void CpuBackend::unary(Tensor&, const Tensor&, UnaryOp) { PENDING("unary"); }
void CpuBackend::binary(Tensor&, const Tensor&, const Tensor&, BinaryOp) { PENDING("binary"); }
void CpuBackend::lincomb(Tensor&, const std::vector<Tensor>&, const std::vector<float>&, int) { PENDING("lincomb"); }
void CpuBackend::glu(Tensor&, const Tensor&, UnaryOp) { PENDING("glu"); }
void CpuBackend::softmax(Tensor&, const Tensor&) { PENDING("softmax"); }
void CpuBackend::gemm(Tensor&, const Tensor&, const Tensor&, const Tensor&, const GemmParams&) { PENDING("gemm"); }
void CpuBackend::conv2d(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { PENDING("conv2d"); }
void CpuBackend::group_norm(Tensor&, const Tensor&, const Tensor&, const Tensor&, int, float, UnaryOp) { PENDING("group_norm"); }
void CpuBackend::layer_norm(Tensor&, const Tensor&, const Tensor&, const Tensor&, float) { PENDING("layer_norm"); }
void CpuBackend::rms_norm(Tensor&, const Tensor&, const Tensor&, float) { PENDING("rms_norm"); }
void CpuBackend::attention(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) { PENDING("attention"); }
}  // namespace atelier
