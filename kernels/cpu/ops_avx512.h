#pragma once
// AVX-512 versions of ops.h functions (ops_avx512.cpp); ops.cpp calls them when the active SIMD
// level is avx512. Same contracts, results within a few ulp of the scalar ones.
#include <cstdint>

namespace fathom::cpu {

void silu_mul_avx512(float* gate, const float* up, int64_t n);
void gelu_tanh_mul_avx512(float* gate, const float* up, int64_t n);
double exp_scaled_inplace_avx512(float* x, int64_t n, float shift, float scale);
double sum_exp_avx512(const float* x, int64_t n, float shift);
// RMS norm of each row: the sum of squares in double (4 chains of 8 lanes instead of one
// dependent chain: ~10x faster at n = 576), then y = x · inv · w in f32 as the scalar version.
void rms_norm_avx512(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps);
// max_pool's interior for small r: dst[t] = max(src[t − r .. t + r]) for t in [r, n − r), one pass
// of 2r + 1 unaligned loads per 16 outputs (r <= 16, n >= 2r + 1).
void max_pool_interior_avx512(const float* src, int32_t n, int32_t r, float* dst);
// f32 -> f16, round to nearest even (bit-identical to ref::fp32_to_fp16 for every non-NaN input).
void fp32_to_fp16_avx512(const float* src, uint16_t* dst, int64_t n);

}  // namespace fathom::cpu
