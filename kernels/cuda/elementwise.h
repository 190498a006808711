#pragma once
// Small elementwise ops of the forward pass on the device: residual add, bias add, and the
// f32 -> f16 / bf16 conversions that feed the prefill GEMM (kernels/cuda/gemm.h). Spec:
// cpu::add_inplace (kernels/cpu/ops.h) for the adds (one f32 addition per element, so results
// are bit-identical); __float2half_rn / __float2bfloat16_rn (round to nearest even) for the
// conversions.
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"

namespace fathom::cuda {

// y[i] += x[i] for n floats (device pointers).
cudaError_t add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);

// y[r][c] += bias[c] for rows × n floats; y: [rows][n], bias: [n] (device pointers).
cudaError_t add_bias(float* y, const float* bias, int64_t rows, int64_t n, cudaStream_t stream);

// y[r][c] += bias[which[r]][c] for rows × n floats: a row per (token, expert) pair plus its
// expert's bias row (gpt-oss). y: [rows][n], which: [rows], bias: [*][n] (device pointers).
cudaError_t add_row_bias(float* y, const float* bias, const int32_t* which, int64_t rows, int64_t n,
                         cudaStream_t stream);

// out[i] = round_to_nearest_even(x[i]) for n elements (device pointers).
cudaError_t convert_f32_to_f16(const float* x, __half* out, int64_t n, cudaStream_t stream);
cudaError_t convert_f32_to_bf16(const float* x, __nv_bfloat16* out, int64_t n, cudaStream_t stream);

}  // namespace fathom::cuda
