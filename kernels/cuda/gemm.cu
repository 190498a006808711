// Dense GEMM. nvcc: cuBLAS. Row-major C[M][N] = A[M][K]·B[N][K]ᵀ is, in cuBLAS's column-major
// view, Cᵀ (N×M, ld ldc) = op(B)·op(A) with B stored as a K×N column-major matrix (transposed:
// CUBLAS_OP_T) and A as K×M (CUBLAS_OP_N); inputs f16/bf16, C f32, CUBLAS_COMPUTE_32F (tensor
// cores with f32 accumulation; no TF32 or f16 reduction).
// Emulation: gemm_f16 / gemm_bf16 stand in for cuBLAS with a plain host loop (cuBLAS is not our
// code to verify; the loop is ~30x faster than emulating the tiled kernel, which kept the
// whole-model emulated tests from running many tokens). Same arithmetic as the tiled kernel:
// inputs widened to f32, summed over k in order in f32.
// Tiled kernel (gemm_*_tiled: tested under emulation, and compiled under nvcc for the resource check): grid
// (ceil(N/32), ceil(M/32)), block (32, 8); a 32×32 tile of C per block, 4 outputs per thread
// (rows ty, ty+8, ty+16, ty+24), K in steps of 32 through shared memory as f32 ([32][33]:
// the pad avoids bank conflicts on the transposed B reads). Sums over k in order, in f32.
#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <vector>

#ifdef __CUDACC__
#include <cublas_v2.h>
#endif

namespace fathom::cuda {
namespace gemm_detail {  // named: the kernels' names stay unique across the .cu files

constexpr int kTile = 32;
constexpr int kRowsPerThread = 4;
constexpr int kThreadsY = kTile / kRowsPerThread;

__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

// grid (ceil(n / kTile), ceil(m / kTile)), block (kTile, kThreadsY)
template <typename T>
__global__ void __launch_bounds__(kTile * kThreadsY) gemm_tiled_kernel(const T* __restrict__ a, int64_t lda,
                                                                     const T* __restrict__ b, int64_t ldb,
                                                                     float* __restrict__ c, int64_t ldc, int m, int n,
                                                                     int k) {
  __shared__ float as[kTile][kTile + 1];  // as[row of C tile][k]
  __shared__ float bs[kTile][kTile + 1];  // bs[col of C tile][k]
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int row0 = static_cast<int>(blockIdx.y) * kTile, col0 = static_cast<int>(blockIdx.x) * kTile;
  float acc[kRowsPerThread];
FATHOM_UNROLL
  for (int r = 0; r < kRowsPerThread; ++r) acc[r] = 0.0f;
  for (int k0 = 0; k0 < k; k0 += kTile) {
    // Each thread loads 4 elements of each tile; tx runs along k, so global reads are coalesced.
FATHOM_UNROLL
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = ty + r * kThreadsY, kk = k0 + tx;
      as[i][tx] = (row0 + i < m && kk < k) ? to_f32(a[static_cast<int64_t>(row0 + i) * lda + kk]) : 0.0f;
      bs[i][tx] = (col0 + i < n && kk < k) ? to_f32(b[static_cast<int64_t>(col0 + i) * ldb + kk]) : 0.0f;
    }
    __syncthreads();
FATHOM_UNROLL
    for (int kk = 0; kk < kTile; ++kk) {
      const float bv = bs[tx][kk];
FATHOM_UNROLL
      for (int r = 0; r < kRowsPerThread; ++r) acc[r] += as[ty + r * kThreadsY][kk] * bv;
    }
    __syncthreads();
  }
FATHOM_UNROLL
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int row = row0 + ty + r * kThreadsY, col = col0 + tx;
    if (row < m && col < n) c[static_cast<int64_t>(row) * ldc + col] = acc[r];
  }
}

inline bool valid_shape(int64_t lda, int64_t ldb, int64_t ldc, int32_t m, int32_t n, int32_t k) {
  return m >= 0 && n >= 0 && k >= 0 && lda >= k && ldb >= k && ldc >= n;
}

template <typename T>
cudaError_t tiled(const T* a, int64_t lda, const T* b, int64_t ldb, float* c, int64_t ldc, int32_t m, int32_t n,
                  int32_t k, cudaStream_t stream) {
  if (!valid_shape(lda, ldb, ldc, m, n, k)) return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile), static_cast<unsigned>((m + kTile - 1) / kTile));
  FATHOM_LAUNCH(gemm_tiled_kernel<T>, grid, dim3(kTile, kThreadsY), 0, stream, a, lda, b, ldb, c, ldc, m, n, k);
  return cudaGetLastError();
}

}  // namespace gemm_detail

#ifdef __CUDACC__

struct GemmHandle {
  cublasHandle_t blas = nullptr;
};

cudaError_t gemm_create(GemmHandle** handle) {
  auto* h = new GemmHandle;
  if (cublasCreate(&h->blas) != CUBLAS_STATUS_SUCCESS) {
    delete h;
    return cudaErrorUnknown;
  }
  *handle = h;
  return cudaSuccess;
}

void gemm_destroy(GemmHandle* handle) {
  if (!handle) return;
  cublasDestroy(handle->blas);
  delete handle;
}

namespace gemm_detail {

cudaError_t cublas_gemm(GemmHandle* handle, const void* a, int64_t lda, const void* b, int64_t ldb, float* c,
                        int64_t ldc, int32_t m, int32_t n, int32_t k, cudaDataType_t type, cudaStream_t stream) {
  if (!handle || !valid_shape(lda, ldb, ldc, m, n, k) || lda > 0x7fffffff || ldb > 0x7fffffff || ldc > 0x7fffffff)
    return cudaErrorInvalidValue;
  if (m == 0 || n == 0) return cudaSuccess;
  if (cublasSetStream(handle->blas, stream) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t s =
      cublasGemmEx(handle->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, type, static_cast<int>(ldb), a, type,
                   static_cast<int>(lda), &beta, c, CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown;
}

}  // namespace gemm_detail

cudaError_t gemm_f16(GemmHandle* handle, const __half* a, int64_t lda, const __half* b, int64_t ldb, float* c,
                     int64_t ldc, int32_t m, int32_t n, int32_t k, cudaStream_t stream) {
  return gemm_detail::cublas_gemm(handle, a, lda, b, ldb, c, ldc, m, n, k, CUDA_R_16F, stream);
}

cudaError_t gemm_bf16(GemmHandle* handle, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                      float* c, int64_t ldc, int32_t m, int32_t n, int32_t k, cudaStream_t stream) {
  return gemm_detail::cublas_gemm(handle, a, lda, b, ldb, c, ldc, m, n, k, CUDA_R_16BF, stream);
}

#else  // emulation: a host loop behind the same interface (see the top of the file)

struct GemmHandle {};

namespace gemm_detail {

template <typename T>
cudaError_t host_gemm(const T* a, int64_t lda, const T* b, int64_t ldb, float* c, int64_t ldc, int32_t m, int32_t n,
                      int32_t k) {
  if (!valid_shape(lda, ldb, ldc, m, n, k)) return cudaErrorInvalidValue;
  // A widened to f32 once; then columns of C 8 at a time: B's 8 rows widened once into a [k][8]
  // tile, 8 independent in-order sums per row of A (vectorisable across the 8, each still summed
  // over k in order).
  constexpr int kCols = 8;
  thread_local std::vector<float> tile, a32;  // reused: fresh pages for every call cost page faults
  tile.resize(static_cast<size_t>(k) * kCols);
  a32.resize(static_cast<size_t>(m) * k);
  for (int32_t i = 0; i < m; ++i)
    for (int32_t kk = 0; kk < k; ++kk) a32[static_cast<size_t>(i) * k + kk] = to_f32(a[static_cast<int64_t>(i) * lda + kk]);
  for (int32_t j0 = 0; j0 < n; j0 += kCols) {
    const int32_t cols = std::min(kCols, n - j0);
    for (int32_t u = 0; u < kCols; ++u)
      for (int32_t kk = 0; kk < k; ++kk)
        tile[static_cast<size_t>(kk) * kCols + u] = u < cols ? to_f32(b[static_cast<int64_t>(j0 + u) * ldb + kk]) : 0.0f;
    for (int32_t i = 0; i < m; ++i) {
      const float* row = a32.data() + static_cast<size_t>(i) * k;
      float acc[kCols] = {};
      for (int32_t kk = 0; kk < k; ++kk)
        for (int32_t u = 0; u < kCols; ++u) acc[u] += row[kk] * tile[static_cast<size_t>(kk) * kCols + u];
      for (int32_t u = 0; u < cols; ++u) c[static_cast<int64_t>(i) * ldc + j0 + u] = acc[u];
    }
  }
  return cudaSuccess;
}

}  // namespace gemm_detail

cudaError_t gemm_create(GemmHandle** handle) {
  *handle = new GemmHandle;
  return cudaSuccess;
}

void gemm_destroy(GemmHandle* handle) { delete handle; }

cudaError_t gemm_f16(GemmHandle* handle, const __half* a, int64_t lda, const __half* b, int64_t ldb, float* c,
                     int64_t ldc, int32_t m, int32_t n, int32_t k, cudaStream_t stream) {
  if (!handle) return cudaErrorInvalidValue;
  return gemm_detail::host_gemm(a, lda, b, ldb, c, ldc, m, n, k);
}

cudaError_t gemm_bf16(GemmHandle* handle, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                      float* c, int64_t ldc, int32_t m, int32_t n, int32_t k, cudaStream_t stream) {
  if (!handle) return cudaErrorInvalidValue;
  return gemm_detail::host_gemm(a, lda, b, ldb, c, ldc, m, n, k);
}

#endif

cudaError_t gemm_f16_tiled(const __half* a, int64_t lda, const __half* b, int64_t ldb, float* c, int64_t ldc,
                           int32_t m, int32_t n, int32_t k, cudaStream_t stream) {
  return gemm_detail::tiled(a, lda, b, ldb, c, ldc, m, n, k, stream);
}

cudaError_t gemm_bf16_tiled(const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb, float* c,
                            int64_t ldc, int32_t m, int32_t n, int32_t k, cudaStream_t stream) {
  return gemm_detail::tiled(a, lda, b, ldb, c, ldc, m, n, k, stream);
}

}  // namespace fathom::cuda
