#pragma once
// AVX-512 versions of ops.h silu_mul / gelu_tanh_mul (activation_avx512.cpp); ops.cpp calls them
// when the active SIMD level is avx512. Same contract, results within ~3 ulp of the scalar ones.
#include <cstdint>

namespace fathom::cpu {

void silu_mul_avx512(float* gate, const float* up, int64_t n);
void gelu_tanh_mul_avx512(float* gate, const float* up, int64_t n);

}  // namespace fathom::cpu
