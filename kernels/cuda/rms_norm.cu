// RMSNorm: one block per row; each thread accumulates a strided slice of x^2, warps reduce with
// shuffles, warp sums meet in shared memory, then every thread scales its slice.
#include "kernels/cuda/rms_norm.h"

namespace fathom::cuda {
namespace rms_norm_detail {  // named, not anonymous: names stay unique across the .cu files

constexpr int kThreads = 256;  // 8 warps; rows are >= 1k wide in every supported model
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// grid: (rows), block: (kThreads)
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                            float* __restrict__ y, int64_t n, float eps) {
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float row_scale;
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * n;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;

  float ss = 0.0f;
  for (int64_t i = tid; i < n; i += kThreads) ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  if (lane == 0) warp_sums[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    float v = lane < kThreads / 32 ? warp_sums[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) row_scale = rsqrtf(v / static_cast<float>(n) + eps);
  }
  __syncthreads();
  const float scale = row_scale;
  for (int64_t i = tid; i < n; i += kThreads) yr[i] = xr[i] * scale * w[i];
}

}  // namespace rms_norm_detail

cudaError_t rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
                     cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  using rms_norm_detail::rms_norm_kernel;
  FATHOM_LAUNCH(rms_norm_kernel, dim3(static_cast<unsigned>(rows)), dim3(rms_norm_detail::kThreads), 0, stream, x, w,
                y, n, eps);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
