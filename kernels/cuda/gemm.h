#pragma once
// Dense GEMM for prefill on the device: C = A·Bᵀ with f16 or bf16 inputs and f32 accumulation.
// Under nvcc it is cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F); under the emulator (tests) the
// tiled shared-memory kernel of gemm.cu stands in behind the same functions. The tiled kernel
// is also exported (gemm_*_tiled) so both builds compile and resource-check it.
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"

namespace fathom::cuda {

// Owns the cuBLAS handle under nvcc (nothing under emulation). One per stream-using thread.
struct GemmHandle;
cudaError_t gemm_create(GemmHandle** handle);
void gemm_destroy(GemmHandle* handle);

// C[m][n] = Σ_k A[m][k] · B[n][k] (row-major, f32 accumulate), for m < M, n < N, k < K.
//   A: activations [M][lda] (lda >= K), f16 / bf16
//   B: weights [N][ldb] (ldb >= K), same type (the usual [out][in] layout of a linear layer)
//   C: [M][ldc] f32 (ldc >= N), overwritten
// Device pointers. Returns cudaErrorInvalidValue on bad shapes, or a failed cuBLAS call as
// cudaErrorUnknown (nvcc builds only).
cudaError_t gemm_f16(GemmHandle* handle, const __half* a, int64_t lda, const __half* b, int64_t ldb, float* c,
                     int64_t ldc, int32_t m, int32_t n, int32_t k, cudaStream_t stream);
cudaError_t gemm_bf16(GemmHandle* handle, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                      float* c, int64_t ldc, int32_t m, int32_t n, int32_t k, cudaStream_t stream);

// The tiled stand-in itself (same contract, no handle).
cudaError_t gemm_f16_tiled(const __half* a, int64_t lda, const __half* b, int64_t ldb, float* c, int64_t ldc,
                           int32_t m, int32_t n, int32_t k, cudaStream_t stream);
cudaError_t gemm_bf16_tiled(const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb, float* c,
                            int64_t ldc, int32_t m, int32_t n, int32_t k, cudaStream_t stream);

}  // namespace fathom::cuda
