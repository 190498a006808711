// Built (never run here) when nvcc exists: references the launchers of kernels/cuda that live
// outside test-only code, so the cuBLAS path of gemm.cu and every kernel library symbol must
// resolve at link time. With a GPU it also runs: one tiny cuBLAS GEMM and the tiled one.
#include <cstdio>

#include "kernels/cuda/gemm.h"

int main() {
  using namespace fathom::cuda;
  GemmHandle* handle = nullptr;
  if (gemm_create(&handle) != cudaSuccess) {
    std::printf("no GPU / cuBLAS unavailable: link check only\n");
    return 0;
  }
  __half* ab = nullptr;
  float* c = nullptr;
  cudaMalloc(&ab, 2 * 16 * sizeof(__half));
  cudaMalloc(&c, 16 * sizeof(float));
  cudaMemset(ab, 0, 2 * 16 * sizeof(__half));
  const cudaError_t s1 = gemm_f16(handle, ab, 4, ab + 16, 4, c, 4, 4, 4, 4, nullptr);
  const cudaError_t s2 = gemm_f16_tiled(ab, 4, ab + 16, 4, c, 4, 4, 4, 4, nullptr);
  cudaDeviceSynchronize();
  std::printf("cublas %s, tiled %s\n", cudaGetErrorString(s1), cudaGetErrorString(s2));
  cudaFree(ab);
  cudaFree(c);
  gemm_destroy(handle);
  return s1 == cudaSuccess && s2 == cudaSuccess ? 0 : 1;
}
