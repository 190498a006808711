// AVX-512 helpers shared by the attention kernels (*_avx512.cpp only): loads of 16 KV elements
// (f32 / f16 / uint8 x_q) as f32 — all exact —, masked tails, horizontal sum/max, and exp(x ≤ 0).
#pragma once

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wuninitialized flags once
// they are inlined deeply enough; the pragma must be active where the header's lines are.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "base/kv_dtype.h"

namespace fathom::cpu::simd512 {
// Internal linkage: each ISA file keeps its own copy, so the linker never hands a generic caller
// (or another ISA's file) the one compiled with this ISA's instructions
// (scripts/check_isa_isolation.py).
namespace {

inline __mmask16 tail_mask(int32_t n) { return static_cast<__mmask16>((1u << n) - 1); }
// The lanes of a 16-element step with `left` elements remaining (all 16 when left >= 16).
inline __mmask16 lanes16(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : tail_mask(static_cast<int32_t>(left));
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 maskz_load16(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 maskz_load16(__mmask16 m, const uint16_t* p) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
inline __m512 maskz_load16(__mmask16 m, const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

// Horizontal sum / max by lane shuffles (maskz forms: the plain ones pass _mm512_undefined_ps,
// which GCC 12 flags as uninitialized once inlined).
template <int Imm>
inline __m512 lane_shuffle(__m512 v) {
  return _mm512_maskz_shuffle_f32x4(static_cast<__mmask16>(0xffff), v, v, Imm);
}
inline float hsum(__m512 v) {
  v = _mm512_add_ps(v, lane_shuffle<_MM_SHUFFLE(1, 0, 3, 2)>(v));
  v = _mm512_add_ps(v, lane_shuffle<_MM_SHUFFLE(2, 3, 0, 1)>(v));
  __m128 x = _mm512_maskz_extractf32x4_ps(static_cast<__mmask8>(0xf), v, 0);
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
inline float hmax(__m512 v) {
  v = _mm512_max_ps(v, lane_shuffle<_MM_SHUFFLE(1, 0, 3, 2)>(v));
  v = _mm512_max_ps(v, lane_shuffle<_MM_SHUFFLE(2, 3, 0, 1)>(v));
  __m128 x = _mm512_maskz_extractf32x4_ps(static_cast<__mmask8>(0xf), v, 0);
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// Σ x[0..d) for d a multiple of 16 (Σq of a query row: the min term of INT8 logits).
inline float sum_of(const float* x, int32_t d) {
  __m512 s = _mm512_setzero_ps();
  for (int32_t c = 0; c < d; c += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + c));
  return hsum(s);
}

// The parameters of 16 consecutive INT8 rows ({scale, min} pairs) → (scales, mins).
inline void load_params16(const KvInt8Row* p, __m512& scale, __m512& min) {
  const __m512 lo = _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  const __m512 hi = _mm512_loadu_ps(reinterpret_cast<const float*>(p) + 16);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  scale = _mm512_permutex2var_ps(lo, even, hi);
  min = _mm512_permutex2var_ps(lo, odd, hi);
}

// exp(x) for x <= 0 (Cephes expf: range reduction by ln 2 in two parts, degree-5 polynomial,
// 2^n applied with scalef): within 2 ulp of std::exp; very negative x (and -inf) gives 0.
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.5f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// cap·tanh(x / cap) lane by lane: soft_cap() (kernels/paged_kv.h) with this exp.
inline __m512 soft_cap(__m512 x, float cap) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(INT32_MIN));
  const __m512 t = exp_nonpositive(_mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(-2.0f / cap)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 mag = _mm512_mul_ps(_mm512_set1_ps(cap), _mm512_div_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t)));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(mag),
                                             _mm512_and_si512(_mm512_castps_si512(x), _mm512_castps_si512(sign))));
}

}  // namespace
}  // namespace fathom::cpu::simd512
