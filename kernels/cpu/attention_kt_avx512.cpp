// Dense partial attention over the transposed K plane (AVX-512): the decode path.
//
// The row kernel of attention_partial.inc computes one q·k dot product per key and row and ends
// each with a horizontal sum; at decode (one query token, G rows per kv head) that leaves it
// latency-bound at 3-4 GB/s, a quarter of the memory bandwidth. Here logits come from the K^T
// tile ([head_dim][block_size] per block and kv head, kept by the block pool for SparQ):
//   logits[r][16 keys] = Σ_c q_r[c] · Kᵀ[c][16 keys]      one zmm per row, no horizontal sums
// and V is accumulated with the rows' output columns held in registers:
//   acc[r][64 dims] += p_r[t] · V[t][64 dims]              one V load shared by up to 4 rows
// Keys go 64 at a time (a super-tile of four 16-key sub-tiles): one online-softmax update per 64
// keys. While one super-tile is computed, the next one's tiles are prefetched a line or two per
// step of its loops (blocks are scattered in the pool, so the hardware prefetcher does not see
// one stream, and a burst of prefetches stalls on the core's few fill buffers). Measured on a
// shuffled 201 MB cache (d 64, G 3, 1 thread): 3.8 GB/s before both changes, 8.0 after; in L2
// 11 -> 16 GB/s.
//
// Rows are independent: each row does the same operations in the same order whatever the other
// rows, their number or their key ranges (keys outside a row's [lo, hi] get probability 0 and
// contribute exactly +0 — they lie inside the rows' union, so they hold written, finite data).
// A decode row therefore gets bitwise the same result as the same row inside a prefill chunk.
// INT8: logit = scale·(q·x_q) + min·Σq; V as Σ (p·scale)·x_q + Σ p·min, per row of the tile.
// The driver (super-tile walk, fill, first prefetch, row groups) is attention_kt.inc, shared with
// attention_kt_avx2.cpp; this file gives it the vector types and the per-super-tile arithmetic.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/simd_avx512.h"

namespace fathom::cpu {
namespace {
using namespace simd512;

constexpr int32_t kKeys = 16;     // keys per sub-tile: one zmm of logits per row
constexpr int32_t kRowGroup = 4;  // rows sharing one pass over a sub-tile
inline int32_t rows_in_pass(int32_t left) { return std::min(left, kRowGroup); }

// Into L2 (T1), not L1: the next super-tile's 16 KiB (d 64, f16) would crowd this one's lines
// out of a 48 KiB L1 shared with the accumulators, and an L2 hit is a few cycles behind. Measured
// (bench_sparse_attention, dense, d 64, 16k keys from memory, 2 threads, alternating): median
// 614 / 598 µs with T0, 519 / 501 with T1; bench_decode SmolLM2 dense at 8k, 2 rounds of 2:
// 11.63-12.03 ms a token with T0, 10.90-11.33 with T1; Gemma 3 at 8k and prefill: no change.
// (No software prefetch at all: 800 µs.)
constexpr int kTileLocality = kIntoL2;

struct SubTile {
  int32_t j0;      // absolute position of key 0
  int32_t lo, hi;  // union of the rows' ranges within the sub-tile (absolute, inclusive); lo > hi: empty
  const void* kt;  // Kᵀ[0][0] of the sub-tile; row c at + c·block_size
  const void* v;   // V[0][0] of the sub-tile; key t at + t·head_dim
  __m512 k_scale, k_min, v_scale, v_min;  // INT8 only
};

// kSub sub-tiles of consecutive keys (one "super-tile", absolute keys [64 s, 64 s + 64)): the
// logits of all of them are taken before one online-softmax update and one pass over V. Taking
// 64 keys at a time gives the FMA chains of the logits kSub-fold independence and pays the
// softmax's serial part (max, exp of the correction, sums) and the accumulator reload once per
// 64 keys instead of per 16: the kernel was latency-bound at about memory speed, so it could not
// hide memory latency. Sub-tiles past `count` repeat the last real one with every key dead.
constexpr int32_t kSub = 4;
struct SuperTile {
  int32_t count;
  SubTile st[kSub];
  // The next super-tile's sub-tiles (Kᵀ and V), prefetched a line or two at a time while this
  // one is computed (a burst of a few hundred prefetches would wait for the core's few fill
  // buffers and stall the pipeline). Null when there is none.
  const void* next_kt[kSub];
  const void* next_v[kSub];
};

// acc[r][c0 .. c0 + 16·NV) = corr_r · acc + Σ_t p_r[t] · V[t][...] (+ p_min_r), N rows.
template <typename T, int N, int NV>
inline void accumulate_v(const SuperTile& sp, int32_t d, int32_t c0, const float (*p)[kSub * kKeys],
                         const float* corr, const float* p_min, float* const* out) {
  __m512 a[N][NV];
  for (int i = 0; i < N; ++i)
    for (int v = 0; v < NV; ++v) a[i][v] = _mm512_mul_ps(_mm512_loadu_ps(out[i] + c0 + 16 * v), _mm512_set1_ps(corr[i]));
  for (int32_t u = 0; u < sp.count; ++u) {
    const SubTile& st = sp.st[u];
    const T* vt = static_cast<const T*>(st.v);
    const T* vn = static_cast<const T*>(sp.next_v[u]);
    for (int32_t t = st.lo - st.j0; t <= st.hi - st.j0; ++t) {
      if (vn) prefetch_lines<kTileLocality>(vn + static_cast<int64_t>(t) * d + c0, 16 * NV * static_cast<int64_t>(sizeof(T)));
      __m512 x[NV];
      for (int v = 0; v < NV; ++v) x[v] = load16(vt + static_cast<int64_t>(t) * d + c0 + 16 * v);
      for (int i = 0; i < N; ++i) {
        const __m512 pi = _mm512_set1_ps(p[i][u * kKeys + t]);
        for (int v = 0; v < NV; ++v) a[i][v] = _mm512_fmadd_ps(pi, x[v], a[i][v]);
      }
    }
  }
  for (int i = 0; i < N; ++i)
    for (int v = 0; v < NV; ++v) {
      if constexpr (std::is_same_v<T, uint8_t>) a[i][v] = _mm512_add_ps(a[i][v], _mm512_set1_ps(p_min[i]));
      _mm512_storeu_ps(out[i] + c0 + 16 * v, a[i][v]);
    }
}

// N rows (r0 .. r0 + N) over one super-tile: logits from Kᵀ, online softmax, V.
// logits (nullable): row r's logit of key j, for the keys it attends, to logits[r·ld + j − t_base]
// (a masked store: only live keys are written).
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
  __m512 s[N][kSub];
  const float* q[N];
  for (int i = 0; i < N; ++i) {
    for (int u = 0; u < kSub; ++u) s[i][u] = _mm512_setzero_ps();
    q[i] = rows.q[r0 + i];
  }
  for (int32_t c = 0; c < d; ++c) {
    __m512 k[kSub];
    for (int u = 0; u < kSub; ++u) {
      k[u] = load16(kt[u] + static_cast<int64_t>(c) * bs);
      if (kn[u]) prefetch_lines<kTileLocality>(kn[u] + static_cast<int64_t>(c) * bs, 1);
    }
    for (int i = 0; i < N; ++i) {
      const __m512 qc = _mm512_set1_ps(q[i][c]);
      for (int u = 0; u < kSub; ++u) s[i][u] = _mm512_fmadd_ps(qc, k[u], s[i][u]);
    }
  }
  alignas(64) float p[N][kSub * kKeys];
  float corr[N], p_min[N];
  float* out[N];
  for (int i = 0; i < N; ++i) {
    const int32_t r = r0 + i;
    out[i] = acc + static_cast<int64_t>(r) * d;
    corr[i] = 1.0f;
    p_min[i] = 0.0f;
    __mmask16 live[kSub];
    bool any = false;
    for (int u = 0; u < kSub; ++u) {
      const SubTile& st = sp.st[u];
      const int32_t lo = std::max(st.lo, rows.lo[r]), hi = std::min(st.hi, rows.hi[r]);
      live[u] = u < sp.count && lo <= hi
                    ? static_cast<__mmask16>(tail_mask(hi - st.j0 + 1) & ~tail_mask(lo - st.j0))
                    : __mmask16{0};
      any = any || live[u] != 0;
    }
    if (!any) {  // no key of this row here: contributes nothing
      for (int u = 0; u < kSub; ++u) _mm512_store_ps(p[i] + u * kKeys, _mm512_setzero_ps());
      continue;
    }
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int u = 0; u < kSub; ++u) {
      __m512 x = s[i][u];
      if constexpr (kInt8) x = _mm512_fmadd_ps(sp.st[u].k_scale, x, _mm512_mul_ps(sp.st[u].k_min, _mm512_set1_ps(q_sum[r])));
      x = _mm512_mul_ps(x, _mm512_set1_ps(scale_factor.scale));
      if (scale_factor.cap > 0.0f) x = simd512::soft_cap(x, scale_factor.cap);
      s[i][u] = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), live[u], x);
      mx = _mm512_max_ps(mx, s[i][u]);
      if (logits != nullptr && live[u] != 0) {  // the live keys: one range of lanes, all at keys ≥ t_base
        const int64_t at = r * ld + (sp.st[u].j0 - t_base);
        if (at >= r * ld) {
          _mm512_mask_storeu_ps(logits + at, live[u], s[i][u]);
        } else {  // a sub-tile that starts before t_base: pack its live lanes (no pointer before the row)
          const int first = __builtin_ctz(live[u]);
          _mm512_mask_compressstoreu_ps(logits + at + first, live[u], s[i][u]);
        }
      }
    }
    const float m_new = std::max(m[r], hmax(mx));
    if (m_new != m[r]) corr[i] = std::exp(m[r] - m_new);  // m = -inf before any key: 0 (acc, l are 0)
    __m512 e_sum = _mm512_setzero_ps(), pm_sum = _mm512_setzero_ps();
    for (int u = 0; u < kSub; ++u) {
      const __m512 e = _mm512_maskz_mov_ps(live[u], exp_nonpositive(_mm512_sub_ps(s[i][u], _mm512_set1_ps(m_new))));
      e_sum = _mm512_add_ps(e_sum, e);
      if constexpr (kInt8) {
        pm_sum = _mm512_fmadd_ps(e, sp.st[u].v_min, pm_sum);
        _mm512_store_ps(p[i] + u * kKeys, _mm512_mul_ps(e, sp.st[u].v_scale));
      } else {
        _mm512_store_ps(p[i] + u * kKeys, e);
      }
    }
    l[r] = l[r] * corr[i] + hsum(e_sum);
    m[r] = m_new;
    if constexpr (kInt8) p_min[i] = hsum(pm_sum);
  }
  int32_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) accumulate_v<T, N, 4>(sp, d, c0, p, corr, p_min, out);
  for (; c0 < d; c0 += 16) accumulate_v<T, N, 1>(sp, d, c0, p, corr, p_min, out);
}

// The driver's ISA hooks (attention_kt.inc).
inline void load_kt_params(const KvInt8Row* p, __m512& scale, __m512& min) { load_params16(p, scale, min); }
inline float q_row_sum(const float* q, int32_t d) { return sum_of(q, d); }

#include "kernels/cpu/attention_kt.inc"

}  // namespace

void partial_attention_kt_avx512(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                                 LogitScale scale, float* acc, float* m, float* l, float* /*scratch*/) {
  switch (kv.dtype) {
    case KvDtype::kF32: kt_partial<float>(kv, head, rows, t0, t1, scale, acc, m, l); break;
    case KvDtype::kF16: kt_partial<uint16_t>(kv, head, rows, t0, t1, scale, acc, m, l); break;
    case KvDtype::kI8: kt_partial<uint8_t>(kv, head, rows, t0, t1, scale, acc, m, l); break;
  }
}

void partial_attention_kt_logits_avx512(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0,
                                        int32_t t1, LogitScale scale, float* acc, float* m, float* l, float* logits,
                                        int64_t ld) {
  switch (kv.dtype) {
    case KvDtype::kF32: kt_partial<float>(kv, head, rows, t0, t1, scale, acc, m, l, logits, ld); break;
    case KvDtype::kF16: kt_partial<uint16_t>(kv, head, rows, t0, t1, scale, acc, m, l, logits, ld); break;
    case KvDtype::kI8: kt_partial<uint8_t>(kv, head, rows, t0, t1, scale, acc, m, l, logits, ld); break;
  }
}

}  // namespace fathom::cpu
