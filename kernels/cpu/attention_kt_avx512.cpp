// Dense partial attention over the transposed K plane (AVX-512): the decode path.
//
// The row kernel of attention_partial.inc computes one q·k dot product per key and row and ends
// each with a horizontal sum; at decode (one query token, G rows per kv head) that leaves it
// latency-bound at 3-4 GB/s, a quarter of the memory bandwidth. Here logits come from the K^T
// tile ([head_dim][block_size] per block and kv head, kept by the block pool for SparQ):
//   logits[r][16 keys] = Σ_c q_r[c] · Kᵀ[c][16 keys]      one zmm per row, no horizontal sums
// and V is accumulated with the rows' output columns held in registers:
//   acc[r][64 dims] += p_r[t] · V[t][64 dims]              one V load shared by up to 4 rows
// The next tiles are prefetched (blocks are scattered in the pool, so the hardware prefetcher
// does not see one stream).
//
// Rows are independent: each row does the same operations in the same order whatever the other
// rows, their number or their key ranges (keys outside a row's [lo, hi] get probability 0 and
// contribute exactly +0 — they lie inside the rows' union, so they hold written, finite data).
// A decode row therefore gets bitwise the same result as the same row inside a prefill chunk.
// INT8: logit = scale·(q·x_q) + min·Σq; V as Σ (p·scale)·x_q + Σ p·min, per row of the tile.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/simd_avx512.h"

namespace fathom::cpu {
namespace {
using namespace simd512;

constexpr int32_t kKeys = 16;     // keys per sub-tile: one zmm of logits per row
constexpr int32_t kRowGroup = 4;  // rows sharing one pass over a sub-tile
constexpr int32_t kAhead = 2;     // blocks prefetched ahead (each tile starts a new page: no HW stream)

inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T0);
}

float sum_of(const float* x, int32_t d) {  // d a multiple of 16
  __m512 s = _mm512_setzero_ps();
  for (int32_t c = 0; c < d; c += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + c));
  return hsum(s);
}

// 16 KvInt8Row {scale, min} pairs → (scales, mins).
inline void load_params16(const KvInt8Row* p, __m512& scale, __m512& min) {
  const __m512 lo = _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  const __m512 hi = _mm512_loadu_ps(reinterpret_cast<const float*>(p) + 16);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  scale = _mm512_permutex2var_ps(lo, even, hi);
  min = _mm512_permutex2var_ps(lo, odd, hi);
}

struct SubTile {
  int32_t j0;      // absolute position of key 0
  int32_t lo, hi;  // union of the rows' ranges within the sub-tile (absolute, inclusive)
  const void* kt;  // Kᵀ[0][0] of the sub-tile; row c at + c·block_size
  const void* v;   // V[0][0] of the sub-tile; key t at + t·head_dim
  __m512 k_scale, k_min, v_scale, v_min;  // INT8 only
};

// acc[r][c0 .. c0 + 16·NV) = corr_r · acc + Σ_t p_r[t] · V[t][...] (+ p_min_r), N rows.
template <typename T, int N, int NV>
inline void accumulate_v(const SubTile& st, int32_t d, int32_t c0, const float (*p)[kKeys], const float* corr,
                         const float* p_min, float* const* out) {
  __m512 a[N][NV];
  for (int i = 0; i < N; ++i)
    for (int v = 0; v < NV; ++v) a[i][v] = _mm512_mul_ps(_mm512_loadu_ps(out[i] + c0 + 16 * v), _mm512_set1_ps(corr[i]));
  const T* vt = static_cast<const T*>(st.v);
  for (int32_t t = st.lo - st.j0; t <= st.hi - st.j0; ++t) {
    __m512 x[NV];
    for (int v = 0; v < NV; ++v) x[v] = load16(vt + static_cast<int64_t>(t) * d + c0 + 16 * v);
    for (int i = 0; i < N; ++i) {
      const __m512 pi = _mm512_set1_ps(p[i][t]);
      for (int v = 0; v < NV; ++v) a[i][v] = _mm512_fmadd_ps(pi, x[v], a[i][v]);
    }
  }
  for (int i = 0; i < N; ++i)
    for (int v = 0; v < NV; ++v) {
      if constexpr (std::is_same_v<T, uint8_t>) a[i][v] = _mm512_add_ps(a[i][v], _mm512_set1_ps(p_min[i]));
      _mm512_storeu_ps(out[i] + c0 + 16 * v, a[i][v]);
    }
}

// N rows (r0 .. r0 + N) over one sub-tile: logits from Kᵀ, online softmax, V.
template <typename T, int N>
void rows_over_subtile(const SubTile& st, int32_t d, int32_t bs, const PartialRows& rows, int32_t r0,
                       const float* q_sum, float scale_factor, float* acc, float* m, float* l) {
  constexpr bool kInt8 = std::is_same_v<T, uint8_t>;
  const T* kt = static_cast<const T*>(st.kt);
  __m512 s0[N], s1[N];
  const float* q[N];
  for (int i = 0; i < N; ++i) {
    s0[i] = s1[i] = _mm512_setzero_ps();
    q[i] = rows.q[r0 + i];
  }
  for (int32_t c = 0; c < d; c += 2) {
    const __m512 k0 = load16(kt + static_cast<int64_t>(c) * bs), k1 = load16(kt + static_cast<int64_t>(c + 1) * bs);
    for (int i = 0; i < N; ++i) {
      s0[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][c]), k0, s0[i]);
      s1[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][c + 1]), k1, s1[i]);
    }
  }
  alignas(64) float p[N][kKeys];
  float corr[N], p_min[N];
  float* out[N];
  for (int i = 0; i < N; ++i) {
    const int32_t r = r0 + i;
    out[i] = acc + static_cast<int64_t>(r) * d;
    corr[i] = 1.0f;
    p_min[i] = 0.0f;
    const int32_t lo = std::max(st.lo, rows.lo[r]), hi = std::min(st.hi, rows.hi[r]);
    if (lo > hi) {  // no key of this row here: contributes nothing
      _mm512_store_ps(p[i], _mm512_setzero_ps());
      continue;
    }
    __m512 s = _mm512_add_ps(s0[i], s1[i]);
    if constexpr (kInt8) s = _mm512_fmadd_ps(st.k_scale, s, _mm512_mul_ps(st.k_min, _mm512_set1_ps(q_sum[r])));
    s = _mm512_mul_ps(s, _mm512_set1_ps(scale_factor));
    const __mmask16 live = static_cast<__mmask16>(tail_mask(hi - st.j0 + 1) & ~tail_mask(lo - st.j0));
    s = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), live, s);
    const float m_new = std::max(m[r], hmax(s));
    if (m_new != m[r]) corr[i] = std::exp(m[r] - m_new);  // m = -inf before any key: 0 (acc, l are 0)
    const __m512 e = _mm512_maskz_mov_ps(live, exp_nonpositive(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
    l[r] = l[r] * corr[i] + hsum(e);
    m[r] = m_new;
    if constexpr (kInt8) {
      p_min[i] = hsum(_mm512_mul_ps(e, st.v_min));
      _mm512_store_ps(p[i], _mm512_mul_ps(e, st.v_scale));
    } else {
      _mm512_store_ps(p[i], e);
    }
  }
  int32_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) accumulate_v<T, N, 4>(st, d, c0, p, corr, p_min, out);
  for (; c0 < d; c0 += 16) accumulate_v<T, N, 1>(st, d, c0, p, corr, p_min, out);
}

template <typename T>
void kt_partial(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                float scale_factor, float* acc, float* m, float* l) {
  constexpr bool kInt8 = std::is_same_v<T, uint8_t>;
  const int32_t d = kv.head_dim, bs = kv.block_size, R = rows.count;
  const KeyRange keys = start_partial(rows, t0, t1, d, acc, m, l);
  const int32_t row_lo = keys.lo, row_hi = keys.hi;
  if (row_hi < row_lo) return;
  thread_local std::vector<float> q_sum;  // INT8: Σ q per row
  if constexpr (kInt8) {
    q_sum.resize(R);
    for (int32_t r = 0; r < R; ++r) q_sum[r] = sum_of(rows.q[r], d);
  }
  const T* k_t = static_cast<const T*>(kv.k_t);
  const T* v = static_cast<const T*>(kv.v);
  const int64_t tile_bytes = static_cast<int64_t>(bs) * d * sizeof(T);
  const int32_t b_first = row_lo / bs, b_last = row_hi / bs;
  auto prefetch_block = [&](int32_t b) {
    const int64_t off = kv.tile_offset(b, head);
    prefetch_bytes(k_t + off, tile_bytes);
    prefetch_bytes(v + off, tile_bytes);
    if constexpr (kInt8) {
      const int64_t p0 = kv.row_index(b * bs, head);
      prefetch_bytes(kv.k_rows + p0, bs * static_cast<int64_t>(sizeof(KvInt8Row)));
      prefetch_bytes(kv.v_rows + p0, bs * static_cast<int64_t>(sizeof(KvInt8Row)));
    }
  };
  for (int32_t b = b_first; b < std::min(b_last + 1, b_first + kAhead); ++b) prefetch_block(b);
  for (int32_t b = b_first; b <= b_last; ++b) {
    if (b + kAhead <= b_last) prefetch_block(b + kAhead);
    const int64_t off = kv.tile_offset(b, head);
    for (int32_t j0 = b * bs; j0 < (b + 1) * bs; j0 += kKeys) {
      if (j0 + kKeys - 1 < row_lo || j0 > row_hi) continue;
      SubTile st;
      st.j0 = j0;
      st.lo = std::max(j0, row_lo);
      st.hi = std::min(j0 + kKeys - 1, row_hi);
      st.kt = k_t + off + (j0 - b * bs);
      st.v = v + off + static_cast<int64_t>(j0 - b * bs) * d;
      if constexpr (kInt8) {
        const int64_t p0 = kv.row_index(j0, head);
        load_params16(kv.k_rows + p0, st.k_scale, st.k_min);
        load_params16(kv.v_rows + p0, st.v_scale, st.v_min);
      }
      int32_t r0 = 0;
      for (; r0 + kRowGroup <= R; r0 += kRowGroup)
        rows_over_subtile<T, kRowGroup>(st, d, bs, rows, r0, q_sum.data(), scale_factor, acc, m, l);
      switch (R - r0) {
        case 3: rows_over_subtile<T, 3>(st, d, bs, rows, r0, q_sum.data(), scale_factor, acc, m, l); break;
        case 2: rows_over_subtile<T, 2>(st, d, bs, rows, r0, q_sum.data(), scale_factor, acc, m, l); break;
        case 1: rows_over_subtile<T, 1>(st, d, bs, rows, r0, q_sum.data(), scale_factor, acc, m, l); break;
        default: break;
      }
    }
  }
}

}  // namespace

bool partial_attention_kt_applies(const PagedKvView& kv) {
  return kv.k_t != nullptr && kv.head_dim % 16 == 0 && kv.block_size % kKeys == 0;
}

void partial_attention_kt_avx512(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                                 float scale, float* acc, float* m, float* l, float* /*scratch*/) {
  switch (kv.dtype) {
    case KvDtype::kF32: kt_partial<float>(kv, head, rows, t0, t1, scale, acc, m, l); break;
    case KvDtype::kF16: kt_partial<uint16_t>(kv, head, rows, t0, t1, scale, acc, m, l); break;
    case KvDtype::kI8: kt_partial<uint8_t>(kv, head, rows, t0, t1, scale, acc, m, l); break;
  }
}

}  // namespace fathom::cpu
