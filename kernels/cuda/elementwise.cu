// Elementwise ops: bandwidth bound, a grid-stride loop over elements. Launch: grid
// min(ceil(n / 256), 4096), block 256 (the bias add indexes its column as i % n).
#include "kernels/cuda/elementwise.h"

namespace fathom::cuda {
namespace elementwise_detail {  // named: the kernels' names stay unique across the .cu files

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

inline dim3 grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  blocks = blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
  return dim3(static_cast<unsigned>(blocks));
}

__device__ __forceinline__ int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; }
__device__ __forceinline__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * kThreads; }

__global__ void __launch_bounds__(kThreads) add_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] += x[i];
}

// y: [rows][n]; total = rows · n.
__global__ void __launch_bounds__(kThreads) add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias,
                                                            int64_t total, int64_t n) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) y[i] += bias[i % n];
}

// y: [rows][n]; row r adds bias row which[r] of bias [*][n].
__global__ void __launch_bounds__(kThreads) add_row_bias_kernel(float* __restrict__ y, const float* __restrict__ bias,
                                                                const int32_t* __restrict__ which, int64_t total,
                                                                int64_t n) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) y[i] += bias[static_cast<int64_t>(which[i / n]) * n + i % n];
}

__global__ void __launch_bounds__(kThreads) to_f16_kernel(const float* __restrict__ x, __half* __restrict__ out,
                                                          int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = __float2half_rn(x[i]);
}

__global__ void __launch_bounds__(kThreads) to_bf16_kernel(const float* __restrict__ x,
                                                           __nv_bfloat16* __restrict__ out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = __float2bfloat16_rn(x[i]);
}

}  // namespace elementwise_detail

cudaError_t add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  using namespace elementwise_detail;
  if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  FATHOM_LAUNCH(add_kernel, grid_for(n), dim3(kThreads), 0, stream, y, x, n);
  return cudaGetLastError();
}

cudaError_t add_bias(float* y, const float* bias, int64_t rows, int64_t n, cudaStream_t stream) {
  using namespace elementwise_detail;
  if (rows < 0 || n < 0) return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  FATHOM_LAUNCH(add_bias_kernel, grid_for(rows * n), dim3(kThreads), 0, stream, y, bias, rows * n, n);
  return cudaGetLastError();
}

cudaError_t add_row_bias(float* y, const float* bias, const int32_t* which, int64_t rows, int64_t n,
                         cudaStream_t stream) {
  using namespace elementwise_detail;
  if (rows < 0 || n < 0) return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  FATHOM_LAUNCH(add_row_bias_kernel, grid_for(rows * n), dim3(kThreads), 0, stream, y, bias, which, rows * n, n);
  return cudaGetLastError();
}

cudaError_t convert_f32_to_f16(const float* x, __half* out, int64_t n, cudaStream_t stream) {
  using namespace elementwise_detail;
  if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  FATHOM_LAUNCH(to_f16_kernel, grid_for(n), dim3(kThreads), 0, stream, x, out, n);
  return cudaGetLastError();
}

cudaError_t convert_f32_to_bf16(const float* x, __nv_bfloat16* out, int64_t n, cudaStream_t stream) {
  using namespace elementwise_detail;
  if (n <= 0) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  FATHOM_LAUNCH(to_bf16_kernel, grid_for(n), dim3(kThreads), 0, stream, x, out, n);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
