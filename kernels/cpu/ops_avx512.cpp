// AVX-512 versions of ops.h's element-wise exp work, 16 elements per step. The scalar versions
// spend one libm call per element: the gated activations ~0.3 ms of serial work per SmolLM2
// token (30 layers x 1536), 4% of a two-thread decode step; the sampler's softmax over Gemma's
// 262144-token vocabulary ~2.5 ms per sampled token, 19% of its decode rate.
// Both reduce to exp of a non-positive argument (simd512::exp_nonpositive, ~2 ulp):
//   silu(g) = g / (1 + e^-g) for g >= 0, g e^g / (1 + e^g) for g < 0      (e = exp(-|g|))
//   1 + tanh(y) = 2 / (1 + e) for y >= 0, 2 e / (1 + e) for y < 0,  e = exp(-2|y|)
// (GELU of a large negative g is then accurate; 1 + tanhf(y) in f32 rounds it to ~0.)
#include "kernels/cpu/ops_avx512.h"

#include <cmath>

#include "kernels/cpu/simd_avx512.h"

namespace fathom::cpu {
namespace {

using namespace simd512;

// f(16 gate values, 16 up values) over [0, n), the tail masked.
template <typename F>
inline void gated(float* gate, const float* up, int64_t n, F f) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
    _mm512_mask_storeu_ps(gate + i, m, f(g, u));
  }
}

inline __m512 abs_ps(__m512 x) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x); }

}  // namespace

void silu_mul_avx512(float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  gated(gate, up, n, [&](__m512 g, __m512 u) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), abs_ps(g)));
    const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 num = _mm512_mask_mul_ps(g, neg, g, e);  // g, or g e for g < 0
    return _mm512_mul_ps(_mm512_div_ps(num, _mm512_add_ps(one, e)), u);
  });
}

void gelu_tanh_mul_avx512(float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
  const __m512 k0 = _mm512_set1_ps(0.7978845608028654f), k1 = _mm512_set1_ps(0.044715f);
  gated(gate, up, n, [&](__m512 g, __m512 u) {
    const __m512 y = _mm512_mul_ps(k0, _mm512_fmadd_ps(_mm512_mul_ps(k1, g), _mm512_mul_ps(g, g), g));
    const __m512 e = exp_nonpositive(_mm512_mul_ps(_mm512_set1_ps(-2.0f), abs_ps(y)));
    // 1 + tanh(y) = 2 / (1 + e) for y >= 0, 2 e / (1 + e) for y < 0: no cancellation near -1.
    const __mmask16 neg = _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 num = _mm512_mask_mov_ps(_mm512_set1_ps(2.0f), neg, _mm512_add_ps(e, e));
    const __m512 one_plus_tanh = _mm512_div_ps(num, _mm512_add_ps(one, e));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(half, g), one_plus_tanh), u);
  });
}

namespace {

// exp(t) for t <= 0, and exactly 0 below -87.5 (where expf reaches the denormals; -inf too).
inline __m512 exp_or_zero(__m512 t) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(t, _mm512_set1_ps(-87.5f), _CMP_GE_OQ), exp_nonpositive(t));
}

// Adds the 16 floats of v to two double accumulators.
inline void add_pd(__m512 v, __m512d& lo, __m512d& hi) {
  lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

}  // namespace

double exp_scaled_inplace_avx512(float* x, int64_t n, float shift, float scale) {
  const __m512 vs = _mm512_set1_ps(shift), vk = _mm512_set1_ps(scale);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_or_zero(_mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vs), vk)));
    _mm512_mask_storeu_ps(x + i, m, e);
    add_pd(e, lo, hi);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

double sum_exp_avx512(const float* x, int64_t n, float shift) {
  const __m512 vs = _mm512_set1_ps(shift);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    add_pd(_mm512_maskz_mov_ps(m, exp_or_zero(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vs))), lo, hi);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

void rms_norm_avx512(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    __m512d ss[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int u = 0; u < 4; ++u) {
        const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(xr + i + 8 * u));
        ss[u] = _mm512_fmadd_pd(v, v, ss[u]);
      }
    for (; i < n; i += 8) {
      const __mmask8 m = n - i >= 8 ? static_cast<__mmask8>(0xff) : static_cast<__mmask8>((1u << (n - i)) - 1);
      const __m512d v = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, xr + i));
      ss[0] = _mm512_fmadd_pd(v, v, ss[0]);
    }
    const double sum = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(ss[0], ss[1]), _mm512_add_pd(ss[2], ss[3])));
    const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps)));
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = lanes16(n - j);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + j), inv);
      _mm512_mask_storeu_ps(yr + j, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + j)));
    }
  }
}

void max_pool_interior_avx512(const float* src, int32_t n, int32_t r, float* dst) {
  // Four output vectors per round, each its own chain of 2r dependent maxima (a max is ~4 cycles of
  // latency: one chain alone left the loads idle, ~4 us for 8k positions at r = 3).
  const int32_t end = n - r;  // outputs [r, end)
  for (int32_t t = r; t < end; t += 64) {
    __mmask16 m[4];
    __m512 v[4];
    for (int j = 0; j < 4; ++j) {
      const int32_t left = end - t - 16 * j;
      m[j] = left > 0 ? lanes16(left) : 0;  // past the end: no loads, no stores
      v[j] = _mm512_maskz_loadu_ps(m[j], src + (t - r) + 16 * j);  // lane i of output t + 16j + i
    }
    for (int32_t k = 1; k <= 2 * r; ++k)
      for (int j = 0; j < 4; ++j) v[j] = _mm512_max_ps(v[j], _mm512_maskz_loadu_ps(m[j], src + (t - r) + 16 * j + k));
    for (int j = 0; j < 4; ++j) _mm512_mask_storeu_ps(dst + t + 16 * j, m[j], v[j]);
  }
}

void fp32_to_fp16_avx512(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  if (i < n) {
    const __mmask16 tail = tail_mask(static_cast<int32_t>(n - i));
    _mm256_mask_storeu_epi16(dst + i, tail,
                             _mm512_cvtps_ph(_mm512_maskz_loadu_ps(tail, src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

}  // namespace fathom::cpu
