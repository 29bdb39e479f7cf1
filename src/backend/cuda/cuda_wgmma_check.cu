// The wgmma self-check kernel (cuda_wgmma_check.h).
#include "backend/cuda/cuda_wgmma_check.h"

#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_wgmma.cuh"

namespace atelier::cuda {
namespace {

constexpr int kRows = 64, kCols = 64, kMaxK = 128, kThreads = 128;
constexpr size_t kSmem = size_t(kRows) * kMaxK * 2 * 2 + 1024;  // A and B, and room to align to 1024 B

__device__ __forceinline__ uint32_t pack_bits(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

template <bool A_REGS, bool B_MN>
__global__ void __launch_bounds__(kThreads) wgmma_check_kernel(float* c, const uint16_t* a, const uint16_t* b, int k) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sa = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sb = sa + kRows * kMaxK * 2;
  const int tid = int(threadIdx.x);
  for (int i = tid; i < kRows * k; i += kThreads) {
    const int r = i / k, kk = i % k;
    *reinterpret_cast<uint16_t*>(sa + (kk / 64) * kRows * 128 + wgmma::sw128_offset(r, kk % 64)) = a[i];
    if (B_MN) {  // b [k][64]: K rows of 64 N-elements
      const int row = i / kCols, n = i % kCols;
      *reinterpret_cast<uint16_t*>(sb + wgmma::sw128_offset(row, n)) = b[i];
    } else {  // b [64][k]
      *reinterpret_cast<uint16_t*>(sb + (kk / 64) * kCols * 128 + wgmma::sw128_offset(r, kk % 64)) = b[i];
    }
  }
  wgmma::fence_async_smem();
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  uint32_t af[kMaxK / 16][4];
  if (A_REGS) {
    for (int ks = 0; ks < k / 16; ++ks) {
      const uint16_t* r0 = a + (16 * warp + g) * k + ks * 16 + 2 * t;
      const uint16_t* r8 = r0 + 8 * k;
      af[ks][0] = pack_bits(r0[0], r0[1]);
      af[ks][1] = pack_bits(r8[0], r8[1]);
      af[ks][2] = pack_bits(r0[8], r0[9]);
      af[ks][3] = pack_bits(r8[8], r8[9]);
    }
  }
  float d[32];
  for (float& x : d) x = 0.0f;
  wgmma::fence();
  const uint32_t a_addr = smem_u32(sa), b_addr = smem_u32(sb);
  for (int ks = 0; ks < k / 16; ++ks) {
    const uint32_t k_major = (ks / 4) * kRows * 128 + (ks % 4) * 32;  // 64-row atom columns (A, and B [64][k])
    const uint64_t db = B_MN ? wgmma::desc_sw128(b_addr + ks * 16 * 128, k * 128, wgmma::kAtomGroupBytes)
                             : wgmma::desc_sw128(b_addr + k_major, 0, wgmma::kAtomGroupBytes);
    if (A_REGS) {
      wgmma::mma_m64n64k16_rs<B_MN ? 1 : 0>(d, af[ks], db, true);
    } else {
      wgmma::mma_m64n64k16_ss<B_MN ? 1 : 0>(d, wgmma::desc_sw128(a_addr + k_major, 0, wgmma::kAtomGroupBytes), db, true);
    }
  }
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operands(d);
  for (int j = 0; j < kCols / 8; ++j)
    for (int e = 0; e < 4; ++e) c[(16 * warp + g + 8 * (e / 2)) * kCols + 8 * j + 2 * t + (e % 2)] = d[4 * j + e];
}

}  // namespace

std::vector<float> wgmma_check(const WgmmaCase& wc, const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                               std::string* why) {
  int dev = 0, major = 0;
  ATELIER_CUDA_OK(cudaGetDevice(&dev));
  ATELIER_CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major != 9) {
    *why = "wgmma needs an sm_90 device";
    return {};
  }
  ATELIER_CHECK(wc.k == 64 || wc.k == 128, "wgmma_check: k must be 64 or 128");
  ATELIER_CHECK(a.size() == size_t(kRows) * wc.k && b.size() == size_t(kCols) * wc.k, "wgmma_check: operand sizes");
  uint16_t *da = nullptr, *db = nullptr;
  float* dc = nullptr;
  ATELIER_CUDA_OK(cudaMalloc(&da, a.size() * 2));
  ATELIER_CUDA_OK(cudaMalloc(&db, b.size() * 2));
  ATELIER_CUDA_OK(cudaMalloc(&dc, size_t(kRows) * kCols * 4));
  ATELIER_CUDA_OK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  ATELIER_CUDA_OK(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  const auto launch = [&](auto kernel) {
    ATELIER_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    kernel<<<1, kThreads, kSmem>>>(dc, da, db, wc.k);
  };
  if (wc.a_in_registers) {
    if (wc.b_mn_major) launch(wgmma_check_kernel<true, true>);
    else launch(wgmma_check_kernel<true, false>);
  } else {
    if (wc.b_mn_major) launch(wgmma_check_kernel<false, true>);
    else launch(wgmma_check_kernel<false, false>);
  }
  ATELIER_CUDA_OK(cudaGetLastError());
  std::vector<float> c(size_t(kRows) * kCols);
  const cudaError_t err = cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  ATELIER_CUDA_OK(err);
  return c;
}

}  // namespace atelier::cuda
