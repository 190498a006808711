#pragma once
// Quantized matrix-vector product for decode on the device: y = W·x for 1..kQuantGemvMaxRows
// activation rows (a batched decode step, speculative verify rows), W read once a launch.
// Spec: ref::dequantize_row of each weight row, then a dot product with x (the op-test grid,
// test_backend_ops, compares with the dot in double).
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/ggml_type.h"

namespace fathom::cuda {

constexpr int32_t kQuantGemvMaxRows = 64;

// y[m][n] = Σ_k W[n][k] · x[m][k] for m < n_x, n < n_out.
//   W: [n_out] rows of K elements stored as `type` (Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q6_K
//      or IQ4_XS), ggml_row_size(type, K) bytes each, the matrix 16-byte aligned; K a multiple of
//      the block size (32 or 256)
//   x: [n_x][K] f32, 16-byte aligned (read as f32: no on-the-fly quantization, so the only
//      rounding is the f32 products and sums)
//   y: [n_x][n_out] f32
// n_x in 1..kQuantGemvMaxRows: up to 4 rows, one warp a weight row; more, up to 4 weight rows a
// warp sharing each x load (quant_gemv.cu). Row m's result does not depend on n_x (bitwise). More rows
// (prefill): the dense GEMM path. Returns cudaErrorInvalidValue on unsupported type, shape or
// alignment.
cudaError_t quant_gemv(GgmlType type, const void* w, int64_t n_out, int64_t k, const float* x, int32_t n_x, float* y,
                       cudaStream_t stream);

}  // namespace fathom::cuda
