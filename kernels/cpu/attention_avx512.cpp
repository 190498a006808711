// AVX-512 instantiation of the partial attention kernel.
#include "kernels/cpu/simd_avx512.h"  // first: its pragma must wrap <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_partial.h"

namespace fathom::cpu {
namespace {
using simd512::exp_nonpositive;
using simd512::load16;
using simd512::maskz_load16;

float dot(const float* a, const float* b, int32_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int32_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + i), _mm512_maskz_loadu_ps(mask, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}
float dot_h(const float* a, const uint16_t* b, int32_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int32_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), load16(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16(b + i), s0);
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + i), maskz_load16(mask, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}
void axpy_h(float alpha, const uint16_t* x, float* y, int32_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load16(x + i), _mm512_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * _cvtsh_ss(x[i]);
}
void axpy(float alpha, const float* x, float* y, int32_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}
void scale(float* y, float alpha, int32_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(va, _mm512_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] *= alpha;
}
float exp_shifted(float* s, int32_t n, float shift) {
  const __m512 vs = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 mask = simd512::lanes16(n - i);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + i), vs));
    _mm512_mask_storeu_ps(s + i, mask, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
  }
  return _mm512_reduce_add_ps(sum);
}
void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

// INT8 rows: the raw x_q as f32 (exact), same loop structure as dot / axpy.
float dot_u8(const float* a, const uint8_t* b, int32_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int32_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), load16(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), load16(b + i), s0);
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + i), maskz_load16(mask, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}
void axpy_u8(float alpha, const uint8_t* x, float* y, int32_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load16(x + i), _mm512_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * static_cast<float>(x[i]);
}
void u8_to_f32(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16(src + i));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

#include "kernels/cpu/attention_partial.inc"

// ---- Many rows over one key range: the small GEMM of bifurcated attention ----------------------
// Rows are the vector lanes (16 per zmm), so there is no horizontal sum: for a sub-tile of 16
// keys, logits[t][rows] = Σ_c Qᵀ[c][rows]·K[t][c] (K[t][c] broadcast), softmax element-wise per
// lane, accᵀ[c][rows] = corr·accᵀ[c][rows] + Σ_t P[t][rows]·V[t][c]. Each K/V sub-tile is
// converted to f32 once (INT8 dequantized as scale·x_q + min) and used by every row vector.
// Every lane does the same operations in the same order, so a row's result does not depend on
// the other rows. Requires every row to have the same [lo, hi].
constexpr int32_t kSubTile = 16;
constexpr int32_t kCols = 8;  // output columns per pass of the P·V loop

void load_rows_f32(const PagedKvView& kv, const void* base, const KvInt8Row* params, int64_t off, int64_t param0,
                   int32_t n, float* dst) {
  const int32_t d = kv.head_dim;
  switch (kv.dtype) {
    case KvDtype::kF32: std::copy_n(static_cast<const float*>(base) + off, static_cast<int64_t>(n) * d, dst); break;
    case KvDtype::kF16: f16_to_f32(static_cast<const uint16_t*>(base) + off, dst, static_cast<int64_t>(n) * d); break;
    case KvDtype::kI8:
      for (int32_t t = 0; t < n; ++t) {
        const KvInt8Row p = params[param0 + t];
        const uint8_t* src = static_cast<const uint8_t*>(base) + off + static_cast<int64_t>(t) * d;
        const __m512 vs = _mm512_set1_ps(p.scale), vm = _mm512_set1_ps(p.min);
        int32_t c = 0;
        for (; c + 16 <= d; c += 16) _mm512_storeu_ps(dst + t * d + c, _mm512_fmadd_ps(vs, load16(src + c), vm));
        for (; c < d; ++c) dst[t * d + c] = p.scale * static_cast<float>(src[c]) + p.min;
      }
      break;
  }
  std::fill(dst + static_cast<int64_t>(n) * d, dst + static_cast<int64_t>(kSubTile) * d, 0.0f);  // unused keys
}

void partial_attention_rows(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                            LogitScale scale_factor, float* acc, float* m, float* l, float* /*scratch*/) {
  const int32_t d = kv.head_dim, bs = kv.block_size, R = rows.count;
  const int32_t n_vec = (R + 15) / 16, Rp = n_vec * 16;
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(2 * Rp) * d + 2 * Rp + 2 * kSubTile * d);
  float* qt = buf.data();                 // [d][Rp]  Qᵀ, pad rows 0
  float* at = qt + static_cast<int64_t>(Rp) * d;  // [d][Rp]  accᵀ
  float* mv = at + static_cast<int64_t>(Rp) * d;  // [Rp]
  float* lv = mv + Rp;                    // [Rp]
  float* kb = lv + Rp;                    // [16][d]
  float* vb = kb + kSubTile * d;          // [16][d]
  for (int32_t c = 0; c < d; ++c)
    for (int32_t r = 0; r < Rp; ++r) qt[static_cast<int64_t>(c) * Rp + r] = r < R ? rows.q[r][c] : 0.0f;
  std::fill(at, at + static_cast<int64_t>(Rp) * d, 0.0f);
  std::fill(mv, mv + Rp, -INFINITY);
  std::fill(lv, lv + Rp, 0.0f);
  const int32_t lo = std::max(t0, R > 0 ? rows.lo[0] : t1), hi = std::min(t1 - 1, R > 0 ? rows.hi[0] : t0 - 1);
  const __m512 vscale = _mm512_set1_ps(scale_factor.scale);
  for (int32_t g = lo; g <= hi;) {
    const int32_t b = g / bs;
    const int32_t n = std::min({kSubTile, hi - g + 1, (b + 1) * bs - g});  // keys [g, g + n), one block
    const int64_t off = kv.tile_offset(b, head) + static_cast<int64_t>(g - b * bs) * d;
    const int64_t param0 = kv.dtype == KvDtype::kI8 ? kv.row_index(g, head) : 0;
    load_rows_f32(kv, kv.k, kv.k_rows, off, param0, n, kb);
    load_rows_f32(kv, kv.v, kv.v_rows, off, param0, n, vb);
    for (int32_t rv = 0; rv < n_vec; ++rv) {
      __m512 s[kSubTile];
      for (int32_t t = 0; t < kSubTile; ++t) s[t] = _mm512_setzero_ps();
      for (int32_t c = 0; c < d; ++c) {
        const __m512 q = _mm512_loadu_ps(qt + static_cast<int64_t>(c) * Rp + rv * 16);
        for (int32_t t = 0; t < kSubTile; ++t) s[t] = _mm512_fmadd_ps(q, _mm512_set1_ps(kb[t * d + c]), s[t]);
      }
      __m512 mx = _mm512_set1_ps(-INFINITY);
      for (int32_t t = 0; t < kSubTile; ++t) {
        s[t] = _mm512_mul_ps(s[t], vscale);
        if (scale_factor.cap > 0.0f) s[t] = simd512::soft_cap(s[t], scale_factor.cap);
        if (t < n) mx = _mm512_max_ps(mx, s[t]);
      }
      const __m512 m_old = _mm512_loadu_ps(mv + rv * 16);
      const __m512 m_new = _mm512_max_ps(m_old, mx);
      const __m512 corr = exp_nonpositive(_mm512_sub_ps(m_old, m_new));  // m_old = -inf: ~0, acc and l are 0
      __m512 sum = _mm512_setzero_ps();
      for (int32_t t = 0; t < kSubTile; ++t) {
        s[t] = t < n ? exp_nonpositive(_mm512_sub_ps(s[t], m_new)) : _mm512_setzero_ps();
        sum = _mm512_add_ps(sum, s[t]);
      }
      _mm512_storeu_ps(mv + rv * 16, m_new);
      _mm512_storeu_ps(lv + rv * 16, _mm512_fmadd_ps(_mm512_loadu_ps(lv + rv * 16), corr, sum));
      // Eight output columns at a time: eight independent FMA chains (one column's 16 keys in a
      // row is a dependent chain that waits on the FMA latency at every step).
      int32_t c = 0;
      for (; c + kCols <= d; c += kCols) {
        __m512 x[kCols];
        for (int32_t i = 0; i < kCols; ++i)
          x[i] = _mm512_mul_ps(_mm512_loadu_ps(at + static_cast<int64_t>(c + i) * Rp + rv * 16), corr);
        for (int32_t t = 0; t < kSubTile; ++t)
          for (int32_t i = 0; i < kCols; ++i) x[i] = _mm512_fmadd_ps(s[t], _mm512_set1_ps(vb[t * d + c + i]), x[i]);
        for (int32_t i = 0; i < kCols; ++i) _mm512_storeu_ps(at + static_cast<int64_t>(c + i) * Rp + rv * 16, x[i]);
      }
      for (; c < d; ++c) {
        float* a = at + static_cast<int64_t>(c) * Rp + rv * 16;
        __m512 x = _mm512_mul_ps(_mm512_loadu_ps(a), corr);
        for (int32_t t = 0; t < kSubTile; ++t) x = _mm512_fmadd_ps(s[t], _mm512_set1_ps(vb[t * d + c]), x);
        _mm512_storeu_ps(a, x);
      }
    }
    g += n;
  }
  for (int32_t r = 0; r < R; ++r) {
    m[r] = mv[r];
    l[r] = lv[r];
    for (int32_t c = 0; c < d; ++c) acc[static_cast<int64_t>(r) * d + c] = at[static_cast<int64_t>(c) * Rp + r];
  }
}

}  // namespace

namespace {
void partial_attention_any_layout(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                                  LogitScale scale, float* acc, float* m, float* l, float* scratch) {
  if (partial_attention_kt_applies(kv)) partial_attention_kt_avx512(kv, head, rows, t0, t1, scale, acc, m, l, scratch);
  else partial_attention(kv, head, rows, t0, t1, scale, acc, m, l, scratch);
}
bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}
}  // namespace

PartialAttentionFn partial_attention_avx512() { return has_avx512() ? &partial_attention_any_layout : nullptr; }

PartialAttentionFn partial_attention_rows_avx512() { return has_avx512() ? &partial_attention_rows : nullptr; }

}  // namespace fathom::cpu
