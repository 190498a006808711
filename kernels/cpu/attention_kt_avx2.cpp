// Dense partial attention over the transposed K plane (AVX2 + FMA + F16C): the decode path on CPUs
// without AVX-512 (AMD Zen 2/3, many Intel parts). attention_kt_avx512.cpp's method in 8-lane
// vectors:
//   logits[r][8 keys] = Σ_c q_r[c] · Kᵀ[c][8 keys]          one ymm per row and 8 keys
//   acc[r][8 dims] += p_r[t] · V[t][8 dims]                  one V load shared by the pass's rows
// Keys go 32 at a time (a super-tile of four 8-key vectors, at absolute multiples of 32), one
// online-softmax update per super-tile; the next super-tile's lines are prefetched into L2 a line
// or two per step of this one's loops. A pass takes up to 6 query rows (a GQA group's heads times
// the chunk's tokens), as many FMA chains as the 16 ymm registers hold beside the loads: 1-3 rows
// × 4 vectors, 4-6 rows × 2 (kLogitVectors, kValueVectors); more rows take more passes over the
// same tiles, from L1, split evenly. Against 2-row passes (one run, EPYC, AVX2, one thread, d 64,
// 8k keys, 3 kv heads, hot cache): a decode step's 3 rows per kv head 498 → 374 µs, a 5-token
// verify chunk's 15 rows 2071 → 1687 µs. The row kernel of attention_partial.inc (one dot product
// and horizontal sum per key and row, a conversion per row) ran at ~22% of the KV's line replay
// here (d 64, 16k, EPYC).
//
// Rows are independent: each row does the same operations in the same order whatever the other
// rows, their number or their key ranges (dead keys get probability 0 and add exactly +0), so a
// decode row gets bitwise the same result as inside a prefill chunk. INT8 as the AVX-512 kernel:
// logit = scale·(q·x_q) + min·Σq; V as Σ (p·scale)·x_q + Σ p·min.
// The driver (super-tile walk, fill, first prefetch, row groups) is attention_kt.inc, shared with
// attention_kt_avx512.cpp; this file gives it the vector types and the per-super-tile arithmetic.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/simd_avx2.h"

namespace fathom::cpu {
namespace {
using namespace simd256;

constexpr int32_t kKeys = 8;      // keys per vector
constexpr int32_t kSub = 4;       // vectors per super-tile
constexpr int32_t kRowGroup = 6;  // rows sharing one pass over a super-tile

// Rows split into passes as evenly as they go: 15 → 5 + 5 + 5, not 6 + 6 + 3 (a pass of few
// rows keeps too few FMA chains in flight to hide their latency).
inline int32_t rows_in_pass(int32_t left) {
  const int32_t passes = (left + kRowGroup - 1) / kRowGroup;
  return (left + passes - 1) / passes;
}

// Vectors a pass of N rows computes at once, so that its accumulators fit the 16 ymm registers
// with the loads and a broadcast: N rows × kLogitVectors<N> logit vectors (Kᵀ: keys) and
// N rows × kValueVectors<N> output vectors (V: 8 dims each), at most 12 either way.
template <int N>
constexpr int kLogitVectors = N <= 3 ? kSub : 2;
template <int N>
constexpr int kValueVectors = N <= 3 ? 4 : 2;
// With 4 vectors per row (N ≤ 3) the rows' broadcasts are held and each load is used at once
// (3·4 accumulators + 3 broadcasts + 1 load: 16 registers); with 2, the loads are held.
template <int N>
constexpr bool kHoldBroadcasts = N == 3;

// Into L2 (T1), as the AVX-512 kernel (the next super-tile would crowd this one out of L1).
constexpr int kTileLocality = kIntoL2;

struct SubTile {
  int32_t j0;      // absolute position of key 0
  int32_t lo, hi;  // union of the rows' ranges within the vector (absolute, inclusive); lo > hi: empty
  const void* kt;  // Kᵀ[0][j0] of its block; row c at + c·block_size
  const void* v;   // V[j0]; key t at + t·head_dim
  __m256 k_scale, k_min, v_scale, v_min;  // INT8 only
};

struct SuperTile {
  int32_t count;  // real vectors; the rest repeat the last with every key dead
  SubTile st[kSub];
  const void* next_kt[kSub];  // the next super-tile's (prefetched while this one is computed)
  const void* next_v[kSub];
};

// The parameters of 8 consecutive INT8 rows ({scale, min} pairs) → (scales, mins).
inline void load_kt_params(const KvInt8Row* p, __m256& scale, __m256& min) {
  const __m256 lo = _mm256_loadu_ps(reinterpret_cast<const float*>(p));      // s0 m0 s1 m1 | s2 m2 s3 m3
  const __m256 hi = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8);  // s4 m4 s5 m5 | s6 m6 s7 m7
  const __m256 s = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));       // s0 s1 s4 s5 | s2 s3 s6 s7
  const __m256 m = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  scale = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
  min = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(m), _MM_SHUFFLE(3, 1, 2, 0)));
}

// All-ones in the lanes of keys [lo, hi] (absolute) of the vector at j0.
inline __m256 live_lanes(int32_t j0, int32_t lo, int32_t hi) {
  const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(j0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i ge = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo - 1)), le = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi + 1), idx);
  return _mm256_castsi256_ps(_mm256_and_si256(ge, le));
}

// acc[r][c0 .. c0 + 8·NV) = corr_r · acc + Σ_t p_r[t] · V[t][...] (+ p_min_r), N rows.
template <typename T, int N, int NV>
inline void accumulate_v(const SuperTile& sp, int32_t d, int32_t c0, const float (*p)[kSub * kKeys],
                         const float* corr, const float* p_min, float* const* out) {
  __m256 a[N][NV];
  for (int i = 0; i < N; ++i)
    for (int v = 0; v < NV; ++v) a[i][v] = _mm256_mul_ps(_mm256_loadu_ps(out[i] + c0 + 8 * v), _mm256_set1_ps(corr[i]));
  for (int32_t u = 0; u < sp.count; ++u) {
    const SubTile& st = sp.st[u];
    const T* vt = static_cast<const T*>(st.v);
    const T* vn = static_cast<const T*>(sp.next_v[u]);
    for (int32_t t = st.lo - st.j0; t <= st.hi - st.j0; ++t) {
      if (vn) prefetch_lines<kTileLocality>(vn + static_cast<int64_t>(t) * d + c0, 8 * NV * static_cast<int64_t>(sizeof(T)));
      if constexpr (kHoldBroadcasts<N> && NV > 2) {
        __m256 pi[N];
        for (int i = 0; i < N; ++i) pi[i] = _mm256_set1_ps(p[i][u * kKeys + t]);
        for (int v = 0; v < NV; ++v) {
          const __m256 x = load8(vt + static_cast<int64_t>(t) * d + c0 + 8 * v);
          for (int i = 0; i < N; ++i) a[i][v] = _mm256_fmadd_ps(pi[i], x, a[i][v]);
        }
      } else {
        __m256 x[NV];
        for (int v = 0; v < NV; ++v) x[v] = load8(vt + static_cast<int64_t>(t) * d + c0 + 8 * v);
        for (int i = 0; i < N; ++i) {
          const __m256 pi = _mm256_set1_ps(p[i][u * kKeys + t]);
          for (int v = 0; v < NV; ++v) a[i][v] = _mm256_fmadd_ps(pi, x[v], a[i][v]);
        }
      }
    }
  }
  for (int i = 0; i < N; ++i)
    for (int v = 0; v < NV; ++v) {
      if constexpr (std::is_same_v<T, uint8_t>) a[i][v] = _mm256_add_ps(a[i][v], _mm256_set1_ps(p_min[i]));
      _mm256_storeu_ps(out[i] + c0 + 8 * v, a[i][v]);
    }
}

// N rows (r0 .. r0 + N) over one super-tile: logits from Kᵀ, online softmax, V.
// logits (nullable): row r's logit of key j, for the keys it attends, to logits[r·ld + j − t_base].
template <typename T, int N>
void rows_over_supertile(const SuperTile& sp, int32_t d, int32_t bs, const PartialRows& rows, int32_t r0,
                         const float* q_sum, LogitScale scale_factor, float* acc, float* m, float* l, float* logits,
                         int64_t ld, int32_t t_base) {
  constexpr bool kInt8 = std::is_same_v<T, uint8_t>;
  const T* kt[kSub];
  const T* kn[kSub];
  for (int u = 0; u < kSub; ++u) {
    kt[u] = static_cast<const T*>(sp.st[u].kt);
    kn[u] = static_cast<const T*>(sp.next_kt[u]);
  }
  __m256 s[N][kSub];
  const float* q[N];
  for (int i = 0; i < N; ++i) {
    for (int u = 0; u < kSub; ++u) s[i][u] = _mm256_setzero_ps();
    q[i] = rows.q[r0 + i];
  }
  // A Kᵀ row of a tile is bs·sizeof(T) bytes (32 at f16, block 16): the next super-tile's line is
  // asked for by the first row in it, and once per pair of vectors (their keys share the line).
  constexpr int64_t kElem = sizeof(T);
  const int64_t row_bytes = bs * kElem;
  constexpr int NK = kLogitVectors<N>;
  for (int u0 = 0; u0 < kSub; u0 += NK) {  // NK vectors of keys at a time, every row
    __m256 a[N][NK];
    for (int i = 0; i < N; ++i)
      for (int u = 0; u < NK; ++u) a[i][u] = _mm256_setzero_ps();
    for (int32_t c = 0; c < d; ++c) {
      const bool new_line = ((c * row_bytes) & 63) < row_bytes;
      for (int u = 0; u < NK; ++u)
        if ((u0 + u) % 2 == 0 && new_line && kn[u0 + u])
          prefetch_lines<kTileLocality>(kn[u0 + u] + static_cast<int64_t>(c) * bs, 1);
      if constexpr (kHoldBroadcasts<N>) {
        __m256 qc[N];
        for (int i = 0; i < N; ++i) qc[i] = _mm256_set1_ps(q[i][c]);
        for (int u = 0; u < NK; ++u) {
          const __m256 k = load8(kt[u0 + u] + static_cast<int64_t>(c) * bs);
          for (int i = 0; i < N; ++i) a[i][u] = _mm256_fmadd_ps(qc[i], k, a[i][u]);
        }
      } else {
        __m256 k[NK];
        for (int u = 0; u < NK; ++u) k[u] = load8(kt[u0 + u] + static_cast<int64_t>(c) * bs);
        for (int i = 0; i < N; ++i) {
          const __m256 qc = _mm256_set1_ps(q[i][c]);
          for (int u = 0; u < NK; ++u) a[i][u] = _mm256_fmadd_ps(qc, k[u], a[i][u]);
        }
      }
    }
    for (int i = 0; i < N; ++i)
      for (int u = 0; u < NK; ++u) s[i][u0 + u] = a[i][u];
  }
  alignas(32) float p[N][kSub * kKeys];
  float corr[N], p_min[N];
  float* out[N];
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  for (int i = 0; i < N; ++i) {
    const int32_t r = r0 + i;
    out[i] = acc + static_cast<int64_t>(r) * d;
    corr[i] = 1.0f;
    p_min[i] = 0.0f;
    __m256 live[kSub];
    bool any = false;
    for (int u = 0; u < kSub; ++u) {
      const SubTile& st = sp.st[u];
      const int32_t lo = std::max(st.lo, rows.lo[r]), hi = std::min(st.hi, rows.hi[r]);
      live[u] = u < sp.count && lo <= hi ? live_lanes(st.j0, lo, hi) : _mm256_setzero_ps();
      any = any || (u < sp.count && lo <= hi);
    }
    if (!any) {  // no key of this row here: contributes nothing
      for (int u = 0; u < kSub; ++u) _mm256_store_ps(p[i] + u * kKeys, _mm256_setzero_ps());
      continue;
    }
    __m256 mx = neg_inf;
    for (int u = 0; u < kSub; ++u) {
      __m256 x = s[i][u];
      if constexpr (kInt8) x = _mm256_fmadd_ps(sp.st[u].k_scale, x, _mm256_mul_ps(sp.st[u].k_min, _mm256_set1_ps(q_sum[r])));
      x = _mm256_mul_ps(x, _mm256_set1_ps(scale_factor.scale));
      if (scale_factor.cap > 0.0f) x = simd256::soft_cap(x, scale_factor.cap);
      s[i][u] = _mm256_blendv_ps(neg_inf, x, live[u]);
      mx = _mm256_max_ps(mx, s[i][u]);
      if (logits != nullptr && _mm256_movemask_ps(live[u]) != 0) {  // the live keys, all at keys ≥ t_base
        alignas(32) float lane[kKeys];
        _mm256_store_ps(lane, s[i][u]);
        const int32_t j0 = sp.st[u].j0, lo = std::max(sp.st[u].lo, rows.lo[r]), hi = std::min(sp.st[u].hi, rows.hi[r]);
        for (int32_t j = lo; j <= hi; ++j) logits[r * ld + (j - t_base)] = lane[j - j0];
      }
    }
    const float m_new = std::max(m[r], hmax(mx));
    if (m_new != m[r]) corr[i] = std::exp(m[r] - m_new);  // m = -inf before any key: 0 (acc, l are 0)
    __m256 e_sum = _mm256_setzero_ps(), pm_sum = _mm256_setzero_ps();
    for (int u = 0; u < kSub; ++u) {
      const __m256 e = _mm256_and_ps(live[u], exp_nonpositive(_mm256_sub_ps(s[i][u], _mm256_set1_ps(m_new))));
      e_sum = _mm256_add_ps(e_sum, e);
      if constexpr (kInt8) {
        pm_sum = _mm256_fmadd_ps(e, sp.st[u].v_min, pm_sum);
        _mm256_store_ps(p[i] + u * kKeys, _mm256_mul_ps(e, sp.st[u].v_scale));
      } else {
        _mm256_store_ps(p[i] + u * kKeys, e);
      }
    }
    l[r] = l[r] * corr[i] + hsum(e_sum);
    m[r] = m_new;
    if constexpr (kInt8) p_min[i] = hsum(pm_sum);
  }
  constexpr int NV = kValueVectors<N>;
  int32_t c0 = 0;
  for (; c0 + 8 * NV <= d; c0 += 8 * NV) accumulate_v<T, N, NV>(sp, d, c0, p, corr, p_min, out);
  for (; c0 < d; c0 += 8) accumulate_v<T, N, 1>(sp, d, c0, p, corr, p_min, out);
}

// The driver's ISA hooks (attention_kt.inc). Σ q in scalar order.
inline float q_row_sum(const float* q, int32_t d) {
  float s = 0.0f;
  for (int32_t c = 0; c < d; ++c) s += q[c];
  return s;
}

#include "kernels/cpu/attention_kt.inc"

}  // namespace

void partial_attention_kt_avx2(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                               LogitScale scale, float* acc, float* m, float* l, float* /*scratch*/) {
  switch (kv.dtype) {
    case KvDtype::kF32: kt_partial<float>(kv, head, rows, t0, t1, scale, acc, m, l); break;
    case KvDtype::kF16: kt_partial<uint16_t>(kv, head, rows, t0, t1, scale, acc, m, l); break;
    case KvDtype::kI8: kt_partial<uint8_t>(kv, head, rows, t0, t1, scale, acc, m, l); break;
  }
}

void partial_attention_kt_logits_avx2(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0,
                                      int32_t t1, LogitScale scale, float* acc, float* m, float* l, float* logits,
                                      int64_t ld) {
  switch (kv.dtype) {
    case KvDtype::kF32: kt_partial<float>(kv, head, rows, t0, t1, scale, acc, m, l, logits, ld); break;
    case KvDtype::kF16: kt_partial<uint16_t>(kv, head, rows, t0, t1, scale, acc, m, l, logits, ld); break;
    case KvDtype::kI8: kt_partial<uint8_t>(kv, head, rows, t0, t1, scale, acc, m, l, logits, ld); break;
  }
}

}  // namespace fathom::cpu
