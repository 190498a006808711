// AVX-512 VNNI kQ8 kernels over PackedWeights panels (layout: packed_weights.h).
// Per 32-column block and activation row m, 16 rows at once:
//   P[r] = sum_j dpbusd(quant vector j, 4 activation bytes broadcast)      (exact int32)
//   Q8_0: acc[r] += float(P[r] - 128 qsum) * d[r] * dx          (weights stored as q + 128)
//   Q4_0: acc[r] += float(P[r] - 8 qsum) * d[r] * dx            (w = d (q - 8))
//   Q5_0: the same with q + 16 * (5th bit) and 16 qsum
//   Q4_1, Q5_1: acc[r] += float(P[r]) * d[r] * dx;  acc2[r] += m[r] * (dx qsum)   (w = d q + m)
// A call takes up to 8 activation rows (kMaxPackedMr; 32 registers hold their accumulators): 4 → 8
// rows a call made M = 16 10% (Q4_K), 16% (Q6_K) and 8% (Q8_0) faster on a Xeon (bench_matmul
// --batch --rows-per-call 4,8 with FATHOM_AMX=0).
// The row loops carry `#pragma GCC unroll 8`: GCC 12 unrolled only Q8_0's, and the others kept
// acc[] on the stack (a load and a store a row and sub-block) with one row's 8 dot products in
// flight. Unrolled, on a Zen 5 EPYC (bench_matmul --batch, 2 threads, alternating): Q4_K gate
// M = 16 576-690 -> 482-491 us, Q6_K 16384x2048 1323-1338 -> 1223-1264 us; 1B batch-16 step
// 51.7-58.6 -> 45.1-47.0 ms. The same operations in the same order: results are unchanged.
// Every activation row goes through the same instructions whatever mr is, so a row's result
// does not depend on the batch (batch invariance, bitwise decode == prefill).
// GCC 12 reports _mm512_undefined_* inside intrinsics as maybe-uninitialized (a known false
// positive); silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/matmul_avx512_common.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/quant_blocks.h"

namespace fathom::cpu::detail {
namespace {

using quant::load_u32;

// 4 activation bytes x[k..k+3] in every 32-bit lane.
inline __m512i bcast4(const int8_t* x) { return _mm512_set1_epi32(static_cast<int>(load_u32(reinterpret_cast<const uint8_t*>(x)))); }

// 16 rows' integer dot products over one 32-column sub-block: s_lo over columns 0..15 (the low
// nibbles against x[0..15]), s_hi over 16..31.
inline void dot_sub_block(const __m512i* lo, const __m512i* hi, const int8_t* x, __m512i& s_lo, __m512i& s_hi) {
  s_lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[0], bcast4(x));
  s_hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[0], bcast4(x + 16));
  for (int v = 1; v < 4; ++v) {
    s_lo = _mm512_dpbusd_epi32(s_lo, lo[v], bcast4(x + 4 * v));
    s_hi = _mm512_dpbusd_epi32(s_hi, hi[v], bcast4(x + 16 + 4 * v));
  }
}

template <int MR>
void dot_packed_q8_0(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nb = a.K / 32;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* qp = a.w + p * a.row_bytes;
    const uint8_t* sp = qp + nb * 512;
    StepPrefetch<512 + 32> prefetch(qp, prefetch_distance(a, kPrefetchBytes));  // a block's quants and d
    __m512 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, qp += 512) {
      prefetch();
      __m512i w[8];
      for (int j = 0; j < 8; ++j) w[j] = _mm512_load_si512(qp + 64 * j);
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + 32 * b)));
      #pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const int8_t* x = a.q + m * a.ldq + 32 * b;
        __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], bcast4(x));
        __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast4(x + 4));
        for (int j = 2; j < 8; j += 2) {
          s0 = _mm512_dpbusd_epi32(s0, w[j], bcast4(x + 4 * j));
          s1 = _mm512_dpbusd_epi32(s1, w[j + 1], bcast4(x + 4 * j + 4));
        }
        const __m512i s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(128 * a.qsum[m * a.ldqs + b]));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(a.qd[m * a.ldqs + b])), acc[m]);
      }
    }
    for (int m = 0; m < MR; ++m) store_panel(a.y + m * a.ldy, acc[m], p, a.rows_total);
  }
}

// Q4_0 / Q4_1 (kQ5 false) and Q5_0 / Q5_1 (kQ5 true): w = d (q - c) or d q + m.
template <bool kMin, bool kQ5, int MR>
void dot_packed_q4(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nb = a.K / 32;
  constexpr int kScale = kMin ? 64 : 32;
  constexpr int kQuant = kQ5 ? 320 : 256;
  constexpr int32_t kOffset = kQ5 ? 16 : 8;  // c of Q4_0 / Q5_0
  const __m512i sixteen = _mm512_set1_epi8(16);
  // 5th bits: byte j of each lane spread to the lane's 4 bytes, then bit t (low nibbles) and
  // bit 4 + t (high nibbles) tested in byte t.
  const __m512i lo_bits = _mm512_set1_epi32(0x08040201), hi_bits = _mm512_set1_epi32(static_cast<int>(0x80402010u));
  const __m512i dword_base = _mm512_set_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0, 0x0C0C0C0C, 0x08080808, 0x04040404, 0,
                                              0x0C0C0C0C, 0x08080808, 0x04040404, 0, 0x0C0C0C0C, 0x08080808, 0x04040404, 0);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* qp = a.w + p * a.row_bytes;
    const uint8_t* sp = qp + nb * kQuant;
    StepPrefetch<kQuant + kScale> prefetch(qp, prefetch_distance(a, kPrefetchBytes));
    __m512 acc[MR], acc2[MR];
    for (int m = 0; m < MR; ++m) acc[m] = acc2[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, qp += kQuant) {
      prefetch();
      __m512i lo[4], hi[4];
      load_nibbles(qp, lo, hi);
      if constexpr (kQ5) {
        const __m512i h = _mm512_load_si512(qp + 256);
        for (int j = 0; j < 4; ++j) {
          // vpshufb indexes within 128-bit lanes: dword k of a lane takes its own byte 4k + j.
          const __m512i idx = _mm512_add_epi8(_mm512_set1_epi8(static_cast<char>(j)), dword_base);
          const __m512i hj = _mm512_shuffle_epi8(h, idx);
          lo[j] = _mm512_mask_add_epi8(lo[j], _mm512_test_epi8_mask(hj, lo_bits), lo[j], sixteen);
          hi[j] = _mm512_mask_add_epi8(hi[j], _mm512_test_epi8_mask(hj, hi_bits), hi[j], sixteen);
        }
      }
      // d (then, Q4_1, m) of the 16 rows, f16.
      const __m256i d16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + kScale * b));
      const __m512 d = _mm512_cvtph_ps(d16);
      #pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        __m512i s0, s1;
        dot_sub_block(lo, hi, a.q + m * a.ldq + 32 * b, s0, s1);
        __m512i s = _mm512_add_epi32(s0, s1);
        const float dx = a.qd[m * a.ldqs + b];
        const int32_t qsum = a.qsum[m * a.ldqs + b];
        if constexpr (kMin) {
          const __m512 mins = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + kScale * b + 32)));
          acc2[m] = _mm512_fmadd_ps(mins, _mm512_set1_ps(a.qds[m * a.ldqs + b]), acc2[m]);  // dx · qsum
        } else {
          s = _mm512_sub_epi32(s, _mm512_set1_epi32(kOffset * qsum));
        }
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[m]);
      }
    }
    for (int m = 0; m < MR; ++m)
      store_panel(a.y + m * a.ldy, kMin ? _mm512_add_ps(acc[m], acc2[m]) : acc[m], p, a.rows_total);
  }
}

// Q4_K super-block panel (packed_weights.cpp): per 32-column sub-block j the Q4_1 nibble
// vectors, 16 rows' 6-bit scale and min (bytes), and per super-block the rows' d and dmin:
//   acc[r] += float(P) * (d sc_j)[r] * dx;  acc2[r] += (dmin m_j)[r] * (dx qsum)
template <int MR>
void dot_packed_q4_k(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    StepPrefetch<2368 / 8> prefetch(u, prefetch_distance(a, kKQuantPrefetchBytes));
    __m512 acc[MR], acc2[MR];
    for (int m = 0; m < MR; ++m) acc[m] = acc2[m] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i, u += 2368) {
      const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 2304)));
      const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 2336)));
      for (int j = 0; j < 8; ++j) {
        prefetch();
        __m512i lo[4], hi[4];
        load_nibbles(u + 256 * j, lo, hi);
        const __m512 sc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(u + 2048 + 16 * j)))));
        const __m512 mn = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(u + 2176 + 16 * j)))));
        #pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
          __m512i s0, s1;
          dot_sub_block(lo, hi, a.q + m * a.ldq + 256 * i + 32 * j, s0, s1);
          const int64_t blk = m * a.ldqs + 8 * i + j;
          const float dx = a.qd[blk];
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(sc, _mm512_set1_ps(dx)), acc[m]);
          acc2[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(a.qds[blk]), acc2[m]);  // dx · qsum, formed once per matmul (quantize_activations)
        }
      }
    }
    for (int m = 0; m < MR; ++m) store_panel(a.y + m * a.ldy, _mm512_sub_ps(acc[m], acc2[m]), p, a.rows_total);
  }
}

// Q6_K super-block panel: per sub-block j the low-nibble vectors, two vectors of 2-bit highs
// and the rows' int8 scales of its two 16-column groups; per super-block the rows' d.
// Low nibbles are the sub-block's columns 0..15 (group 2j), high nibbles 16..31 (group 2j + 1):
//   t[r] = float(P_hi - 32 qsum16_hi) * (d sc_hi)[r] + float(P_lo - 32 qsum16_lo) * (d sc_lo)[r]
//   acc[r] += t[r] * dx        (dx once per sub-block: 5 vector operations a row, not 6)
template <int MR>
void dot_packed_q6_k(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    StepPrefetch<3392 / 8> prefetch(u, prefetch_distance(a, kKQuantPrefetchBytes));
    __m512 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i, u += 3392) {
      const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 3328)));
      for (int j = 0; j < 8; ++j) {
        prefetch();
        __m512i lo[4], hi[4];
        load_q6_k(u, j, lo, hi);
        const __m256i sc8 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u + 3072 + 32 * j));
        const __m512 sc_lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(sc8))));
        const __m512 sc_hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(sc8, 1))));
        #pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
          __m512i s0, s1;
          dot_sub_block(lo, hi, a.q + m * a.ldq + 256 * i + 32 * j, s0, s1);
          const int64_t blk = m * a.ldqs + 8 * i + j;
          const int32_t* q16x32 = a.q16x32 + m * 2 * a.ldqs + 2 * (8 * i + j);  // 32 qsum16, as int32
          const __m512 dx = _mm512_set1_ps(a.qd[blk]);
          s0 = _mm512_sub_epi32(s0, _mm512_set1_epi32(q16x32[0]));
          s1 = _mm512_sub_epi32(s1, _mm512_set1_epi32(q16x32[1]));
          const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), sc_hi, _mm512_mul_ps(_mm512_cvtepi32_ps(s0), sc_lo));
          acc[m] = _mm512_fmadd_ps(t, dx, acc[m]);
        }
      }
    }
    for (int m = 0; m < MR; ++m) store_panel(a.y + m * a.ldy, acc[m], p, a.rows_total);
  }
}

// Q3_K super-block panel (pack_q3_k): per sub-block j two vectors of 2-bit quants and one of 3rd
// bits become the Q4 nibble vectors of u = q + 4 (0..7); per 16-column group the rows' int8
// scale, per super-block their d, as Q6_K with the offset 4:
//   acc[r] += float(P_lo - 4 qsum16_lo) * d sc_lo * dx + float(P_hi - 4 qsum16_hi) * d sc_hi * dx
template <int MR>
void dot_packed_q3_k(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  const __m512i three = _mm512_set1_epi8(3);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    StepPrefetch<1856 / 8> prefetch(u, prefetch_distance(a, kPrefetchBytes));
    __m512 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i, u += 1856) {
      const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 1792)));
      for (int j = 0; j < 8; ++j) {
        prefetch();
        const uint8_t* q = u + 192 * j;
        const __m512i l0 = _mm512_load_si512(q), l1 = _mm512_load_si512(q + 64), h3 = _mm512_load_si512(q + 128);
        __m512i lo[4], hi[4];
        for (int k = 0; k < 4; ++k) {
          lo[k] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l0, 2 * k), three),
                                            _mm512_slli_epi16(_mm512_srli_epi16(h3, k), 2), _mm512_set1_epi8(4), 0xF8);
          hi[k] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l1, 2 * k), three),
                                            _mm512_srli_epi16(h3, 2 + k), _mm512_set1_epi8(4), 0xF8);
        }
        const __m256i sc8 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u + 1536 + 32 * j));
        const __m512 sc_lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(sc8))));
        const __m512 sc_hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(sc8, 1))));
        #pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
          __m512i s0, s1;
          dot_sub_block(lo, hi, a.q + m * a.ldq + 256 * i + 32 * j, s0, s1);
          const int64_t blk = m * a.ldqs + 8 * i + j;
          const int16_t* q16 = a.qsum16 + m * 2 * a.ldqs + 2 * (8 * i + j);
          const __m512 dx = _mm512_set1_ps(a.qd[blk]);
          s0 = _mm512_sub_epi32(s0, _mm512_set1_epi32(4 * q16[0]));
          s1 = _mm512_sub_epi32(s1, _mm512_set1_epi32(4 * q16[1]));
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(sc_lo, dx), acc[m]);
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(sc_hi, dx), acc[m]);
        }
      }
    }
    for (int m = 0; m < MR; ++m) store_panel(a.y + m * a.ldy, acc[m], p, a.rows_total);
  }
}

// IQ4_XS super-block panel (pack_iq4_xs): the nibble vectors become levels + 128 with one byte
// shuffle; per sub-block the rows' signed scale, per super-block their d:
//   acc[r] += float(P - 128 qsum) * (d ls_j)[r] * dx
template <int MR>
void dot_packed_iq4_xs(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  const __m512i table = _mm512_xor_si512(
      _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4nlValues))),
      _mm512_set1_epi8(static_cast<char>(0x80)));
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    StepPrefetch<2240 / 8> prefetch(u, prefetch_distance(a, kPrefetchBytes));
    __m512 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i, u += 2240) {
      const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 2176)));
      for (int j = 0; j < 8; ++j) {
        prefetch();
        __m512i lo[4], hi[4];
        load_nibbles(u + 256 * j, lo, hi);
        for (int v = 0; v < 4; ++v) {
          lo[v] = _mm512_shuffle_epi8(table, lo[v]);
          hi[v] = _mm512_shuffle_epi8(table, hi[v]);
        }
        const __m512 sc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(u + 2048 + 16 * j)))));
        #pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
          __m512i s0, s1;
          dot_sub_block(lo, hi, a.q + m * a.ldq + 256 * i + 32 * j, s0, s1);
          const int64_t blk = m * a.ldqs + 8 * i + j;
          const __m512i s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(128 * a.qsum[blk]));
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc, _mm512_set1_ps(a.qd[blk])), acc[m]);
        }
      }
    }
    for (int m = 0; m < MR; ++m) store_panel(a.y + m * a.ldy, acc[m], p, a.rows_total);
  }
}

// IQ4_NL: the Q4_0 panel; its nibbles become levels + 128 with one byte shuffle:
//   acc[r] += float(P - 128 qsum) * d[r] * dx
template <int MR>
void dot_packed_iq4_nl(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nb = a.K / 32;
  const __m512i table = _mm512_xor_si512(
      _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4nlValues))),
      _mm512_set1_epi8(static_cast<char>(0x80)));
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* qp = a.w + p * a.row_bytes;
    const uint8_t* sp = qp + nb * 256;
    StepPrefetch<256 + 32> prefetch(qp, prefetch_distance(a, kPrefetchBytes));
    __m512 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, qp += 256) {
      prefetch();
      __m512i lo[4], hi[4];
      load_nibbles(qp, lo, hi);
      for (int v = 0; v < 4; ++v) {
        lo[v] = _mm512_shuffle_epi8(table, lo[v]);
        hi[v] = _mm512_shuffle_epi8(table, hi[v]);
      }
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + 32 * b)));
      #pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        __m512i s0, s1;
        dot_sub_block(lo, hi, a.q + m * a.ldq + 32 * b, s0, s1);
        const __m512i s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(128 * a.qsum[m * a.ldqs + b]));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(a.qd[m * a.ldqs + b])), acc[m]);
      }
    }
    for (int m = 0; m < MR; ++m) store_panel(a.y + m * a.ldy, acc[m], p, a.rows_total);
  }
}

// Q2_K super-block panel (pack_q2_k): per sub-block j two vectors of 2-bit quants (as Q3_K's) and
// per 16-column group the rows' scale|min byte; per super-block their d and dmin:
//   acc[r] += float(P_lo) * d sc_lo * dx + float(P_hi) * d sc_hi * dx
//   acc2[r] += dmin m_lo * (dx qsum16_lo) + dmin m_hi * (dx qsum16_hi)
template <int MR>
void dot_packed_q2_k(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  const __m512i three = _mm512_set1_epi8(3), low4 = _mm512_set1_epi32(0xF);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    StepPrefetch<1344 / 8> prefetch(u, prefetch_distance(a, kPrefetchBytes));
    __m512 acc[MR], acc2[MR];
    for (int m = 0; m < MR; ++m) acc[m] = acc2[m] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i, u += 1344) {
      const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 1280)));
      const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 1312)));
      for (int j = 0; j < 8; ++j) {
        prefetch();
        const __m512i l0 = _mm512_load_si512(u + 128 * j), l1 = _mm512_load_si512(u + 128 * j + 64);
        __m512i lo[4], hi[4];
        for (int k = 0; k < 4; ++k) {
          lo[k] = _mm512_and_si512(_mm512_srli_epi16(l0, 2 * k), three);
          hi[k] = _mm512_and_si512(_mm512_srli_epi16(l1, 2 * k), three);
        }
        const __m512i sm_lo = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(u + 1024 + 32 * j)));
        const __m512i sm_hi = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(u + 1040 + 32 * j)));
        const __m512 sc_lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(sm_lo, low4)));
        const __m512 sc_hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(sm_hi, low4)));
        const __m512 mn_lo = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(sm_lo, 4)));
        const __m512 mn_hi = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(sm_hi, 4)));
        #pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
          __m512i s0, s1;
          dot_sub_block(lo, hi, a.q + m * a.ldq + 256 * i + 32 * j, s0, s1);
          const int64_t blk = m * a.ldqs + 8 * i + j;
          const int16_t* q16 = a.qsum16 + m * 2 * a.ldqs + 2 * (8 * i + j);
          const float dx = a.qd[blk];
          const __m512 vdx = _mm512_set1_ps(dx);
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(sc_lo, vdx), acc[m]);
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(sc_hi, vdx), acc[m]);
          acc2[m] = _mm512_fmadd_ps(mn_lo, _mm512_set1_ps(dx * static_cast<float>(q16[0])), acc2[m]);
          acc2[m] = _mm512_fmadd_ps(mn_hi, _mm512_set1_ps(dx * static_cast<float>(q16[1])), acc2[m]);
        }
      }
    }
    for (int m = 0; m < MR; ++m) store_panel(a.y + m * a.ldy, _mm512_sub_ps(acc[m], acc2[m]), p, a.rows_total);
  }
}

template <int MR> struct PackedQ2K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q2_k<MR>(a, b, e); } };
template <int MR> struct PackedIQ4NL { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_iq4_nl<MR>(a, b, e); } };
template <int MR> struct PackedQ3K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q3_k<MR>(a, b, e); } };
template <int MR> struct PackedIQ4XS { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_iq4_xs<MR>(a, b, e); } };
template <int MR> struct PackedQ4K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q4_k<MR>(a, b, e); } };
template <int MR> struct PackedQ6K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q6_k<MR>(a, b, e); } };
template <int MR> struct PackedQ8_0 { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q8_0<MR>(a, b, e); } };
template <bool kMin, bool kQ5> struct PackedQ4 { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q4<kMin, kQ5, MR>(a, b, e); } }; };

}  // namespace

void register_avx512_dot_packed(KernelTable& t) {
  t.dot_packed[kQ8_0] = by_mr<PackedQ8_0, kMaxPackedMr>;
  t.dot_packed[kQ4_0] = by_mr<PackedQ4<false, false>::K, kMaxPackedMr>;
  t.dot_packed[kQ4_1] = by_mr<PackedQ4<true, false>::K, kMaxPackedMr>;
  t.dot_packed[kQ5_0] = by_mr<PackedQ4<false, true>::K, kMaxPackedMr>;
  t.dot_packed[kQ5_1] = by_mr<PackedQ4<true, true>::K, kMaxPackedMr>;
  t.dot_packed[kQ4_K] = by_mr<PackedQ4K, kMaxPackedMr>;
  t.dot_packed[kQ6_K] = by_mr<PackedQ6K, kMaxPackedMr>;
  t.dot_packed[kQ3_K] = by_mr<PackedQ3K, kMaxPackedMr>;
  t.dot_packed[kIQ4_XS] = by_mr<PackedIQ4XS, kMaxPackedMr>;
  t.dot_packed[kIQ4_NL] = by_mr<PackedIQ4NL, kMaxPackedMr>;
  t.dot_packed[kQ2_K] = by_mr<PackedQ2K, kMaxPackedMr>;
  t.packed_max_mr = kMaxPackedMr;
}

}  // namespace fathom::cpu::detail
