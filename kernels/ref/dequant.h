#pragma once
// Scalar reference dequantization of every weight format fathom reads: the specification
// the SIMD kernels are tested against (bit-exact with ggml / gguf-py's numpy dequantization).
#include <cstdint>

#include "kernels/ggml_type.h"

namespace fathom::ref {

// dst[0..n) = dequantized elements of a row stored as `type`; n is a multiple of the block size.
// Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
// IQ4_XS, MXFP4.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even
float bf16_to_fp32(uint16_t h);

}  // namespace fathom::ref
