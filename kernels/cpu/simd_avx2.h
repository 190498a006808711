// AVX2 helpers shared by the *_avx2.cpp kernels (compiled with -mavx2 -mfma -mf16c only): loads of
// 8 KV elements (f32 / f16 / uint8 x_q) as f32 — all exact —, lane masks for tails, horizontal
// sum / max, and exp(x ≤ 0).
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace fathom::cpu::simd256 {
// Internal linkage: each ISA file keeps its own copy, so the linker never hands a generic caller
// (or another ISA's file) the one compiled with this ISA's instructions
// (scripts/check_isa_isolation.py).
namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 load8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// One element as f32 (the scalar tails of the loops above).
inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t h) { return _cvtsh_ss(h); }
inline float to_f32(uint8_t x) { return static_cast<float>(x); }

// All-ones in lanes i < left (all 8 when left ≥ 8), for _mm256_maskstore_ps.
inline __m256i lanes8(int64_t left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(left < 8 ? left : 8)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline float hsum(__m256 v) {
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t2 = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}
inline float hmax(__m256 v) {
  const __m128 t = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t2 = _mm_max_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_max_ss(t2, _mm_movehdup_ps(t2)));
}

// Lane i of the result = the sum of the 8 lanes of v[i] (a horizontal-add tree: 6 hadds, 2
// permutes and an add for 8 sums).
inline __m256 sum_lanes8(const __m256* v) {
  const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
  // b0 = [Σ v0..v3 over lanes 0-3 | the same over lanes 4-7], b1 for v4..v7
  const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);
  return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

// exp(x) for x ≤ 0 (Cephes expf: range reduction by ln 2 in two parts, degree-5 polynomial); 2^n
// built in the exponent bits, x clamped so that n ≥ -126 and the result stays a normal float or
// underflows through the polynomial.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// cap·tanh(x / cap) lane by lane: soft_cap() (kernels/paged_kv.h) with this exp.
inline __m256 soft_cap(__m256 x, float cap) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 t = exp_nonpositive(_mm256_mul_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(-2.0f / cap)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 mag = _mm256_mul_ps(_mm256_set1_ps(cap), _mm256_div_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t)));
  return _mm256_or_ps(mag, _mm256_and_ps(x, sign));
}

// q · k over n elements of any KV type: two accumulators over 16-element steps, an 8-element
// step, then a scalar tail added after the horizontal sum.
template <typename T>
inline float dot8(const float* q, const T* k, int32_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(k + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), s0);
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += q[i] * to_f32(k[i]);
  return s;
}
// y += a · x over n elements of any KV type.
template <typename T>
inline void axpy8(float a, const T* x, float* y, int32_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load8(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * to_f32(x[i]);
}
// s[i] = exp(s[i] − shift) for s[i] ≤ shift; returns Σ s[i].
inline float exp_shifted(float* s, int32_t n, float shift) {
  const __m256 vs = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + i), vs));
    _mm256_storeu_ps(s + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = hsum(sum);
  for (; i < n; ++i) total += (s[i] = std::exp(s[i] - shift));
  return total;
}

}  // namespace
}  // namespace fathom::cpu::simd256
