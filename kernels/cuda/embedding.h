#pragma once
// Token embedding lookup from a (possibly quantized) table on the device.
// Spec: ref::dequantize_row (kernels/ref/dequant.h) of the token's row, times `scale`.
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/ggml_type.h"

namespace fathom::cuda {

// out[t][:] = dequantize(table row ids[t]) * scale, f32, for n_tokens tokens.
//   table: [n_rows] rows of `dim` elements stored as `type` (F32, F16, BF16, Q8_0, IQ4_NL, Q2_K,
//          Q3_K, Q4_K, Q6_K, IQ4_XS, MXFP4),
//          each row ggml_row_size(type, dim) bytes (dim a multiple of the type's block size)
//   ids:   [n_tokens] int32; an id outside [0, n_rows) yields a row of zeros
//   out:   [n_tokens][dim] f32
//   scale: 1, or √dim for Gemma's scaled embeddings (applied as one f32 multiply)
// Bit-exact with ref::dequantize_row followed by `* scale` (products are rounded before the
// subtraction, as the ref does, so nvcc's FMA contraction cannot change a value).
cudaError_t embedding_lookup(const void* table, GgmlType type, int64_t n_rows, int64_t dim, const int32_t* ids,
                             int64_t n_tokens, float scale, float* out, cudaStream_t stream);

// The same rows written as f16 (each f32 value rounded to nearest, as convert_f32_to_f16 does):
// the CUDA backend dequantizes weight rows for its f16 GEMM with it, 2 bytes written an element
// instead of 4 written, 4 read and 2 written through an f32 buffer.
cudaError_t embedding_lookup_f16(const void* table, GgmlType type, int64_t n_rows, int64_t dim, const int32_t* ids,
                                 int64_t n_tokens, float scale, __half* out, cudaStream_t stream);

}  // namespace fathom::cuda
