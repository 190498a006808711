#pragma once
// Matrix multiplication against weights in their stored GGUF format, multi-threaded and
// SIMD-dispatched at run time (AVX-512 VNNI / AVX2 / portable).
//   W: [N rows][K] in `wtype` (row stride ggml_row_size(wtype, K) bytes), as in GGUF
//      (a tensor with dims {K, N}).
//   x: [M][K] f32 activations (row stride K);  y: [M][N] f32 (row stride N).
// y[m][n] = sum_k x[m][k] * W[n][k].
// Precision::kF32: weights are dequantized on the fly in registers and multiplied with f32
//   activations (f32 accumulation): matches an f32 reference up to summation order.
// Precision::kQ8: activations are quantized on the fly to 8-bit blocks and multiplied with
//   integer dot products (VNNI) where that is how the format is fast, as ggml does it.
//   Faster; adds activation-quantization error.
#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/ggml_type.h"

namespace fathom::cpu {

enum class Precision { kF32, kQ8 };

void matmul(ThreadPool& pool, GgmlType wtype, const void* W, int64_t N, int64_t K, const float* x,
            int64_t M, float* y, Precision precision = Precision::kF32);

// One row of W (row index `row`, K elements) dequantized to f32: embedding lookup.
void dequantize_row(GgmlType wtype, const void* W, int64_t K, int64_t row, float* dst);

// Name of the SIMD level chosen at run time: "avx512", "avx2" or "portable".
const char* simd_level();

}  // namespace fathom::cpu
