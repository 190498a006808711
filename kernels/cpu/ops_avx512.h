#pragma once
// AVX-512 versions of ops.h functions (ops_avx512.cpp); ops.cpp calls them when the active SIMD
// level is avx512. Same contracts, results within a few ulp of the scalar ones.
#include <cstdint>

namespace fathom::cpu {

void silu_mul_avx512(float* gate, const float* up, int64_t n);
void gelu_tanh_mul_avx512(float* gate, const float* up, int64_t n);
double exp_scaled_inplace_avx512(float* x, int64_t n, float shift, float scale);
double sum_exp_avx512(const float* x, int64_t n, float shift);
// f32 -> f16, round to nearest even (bit-identical to ref::fp32_to_fp16 for every non-NaN input).
void fp32_to_fp16_avx512(const float* src, uint16_t* dst, int64_t n);

}  // namespace fathom::cpu
