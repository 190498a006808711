// AVX2 + FMA + F16C instantiation of the partial attention kernel.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/simd_avx2.h"

namespace fathom::cpu {
namespace {
using namespace simd256;

float dot(const float* a, const float* b, int32_t n) { return dot8(a, b, n); }
float dot_h(const float* a, const uint16_t* b, int32_t n) { return dot8(a, b, n); }
void axpy_h(float alpha, const uint16_t* x, float* y, int32_t n) { axpy8(alpha, x, y, n); }
void axpy(float alpha, const float* x, float* y, int32_t n) { axpy8(alpha, x, y, n); }
void scale(float* y, float alpha, int32_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] *= alpha;
}
void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

// INT8 rows: the raw x_q as f32 (exact), same loops as dot / axpy.
float dot_u8(const float* a, const uint8_t* b, int32_t n) { return dot8(a, b, n); }
void axpy_u8(float alpha, const uint8_t* x, float* y, int32_t n) { axpy8(alpha, x, y, n); }
void u8_to_f32(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(src + i));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

#include "kernels/cpu/attention_partial.inc"

}  // namespace

namespace {
// The Kᵀ kernel where the view has the plane (the engine's decode), else the row kernel.
void partial_attention_any_layout(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                                  LogitScale scale, float* acc, float* m, float* l, float* scratch) {
  if (partial_attention_kt_applies(kv)) partial_attention_kt_avx2(kv, head, rows, t0, t1, scale, acc, m, l, scratch);
  else partial_attention(kv, head, rows, t0, t1, scale, acc, m, l, scratch);
}
}  // namespace

PartialAttentionFn partial_attention_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")
             ? &partial_attention_any_layout
             : nullptr;
}

}  // namespace fathom::cpu
