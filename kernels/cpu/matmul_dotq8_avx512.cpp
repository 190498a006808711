// AVX-512 VNNI dot kernels for Precision::kQ8: weights stay packed, activations are 8-bit
// blocks of 32 (see DotArgs), products are _mm512_dpbusd_epi32 (u8 weights x s8 activations,
// 64 pairs per instruction) and each 32-element block is scaled once in f32.
//
// Unsigned weights: the formats' offsets are removed through the activation block sums,
//   sum_i (q_i - c) x_i = sum_i q_i x_i - c * qsum  (Q4_0: c = 8, Q5_0: 16, Q6_K: 32 per 16),
// and Q8_0's signed weights are made unsigned as q + 128 (xor 0x80), c = 128.
// Per-block weight scales of 16 consecutive blocks are fetched together (load_scales16) and
// converted together; a permute spreads them over the lanes of each block pair.
// GCC 12 reports _mm512_undefined_* inside intrinsics as maybe-uninitialized (a known false
// positive); silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <type_traits>

#include "kernels/cpu/matmul_avx512_common.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/quant_blocks.h"

namespace fathom::cpu::detail {
namespace {

using namespace fathom::quant;

// ---- formats with 32-element blocks --------------------------------------------------------

// kIq4nlValues + 128 (unsigned) in each 128-bit lane, for a byte shuffle of nibble indices.
inline __m512i iq4_table_u() {
  return _mm512_xor_si512(_mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues))),
                          _mm512_set1_epi8(static_cast<char>(0x80)));
}

// 64 unsigned weight bytes of blocks b0 and b1 (element order), or b0 and zeros when !two.
template <GgmlType T>
inline __m512i unpack_pair(const uint8_t* b0, bool two) {
  using F = Q32<T>;
  const uint8_t* b1 = b0 + F::kStride;
  if constexpr (T == GgmlType::Q8_0) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + F::kQs));
    __m512i w = _mm512_zextsi256_si512(lo);
    if (two) w = _mm512_inserti64x4(w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + F::kQs)), 1);
    else w = _mm512_inserti64x4(w, _mm256_set1_epi8(static_cast<char>(0x80)), 1);  // xor -> 0
    return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    // [qs0 | qs0 | qs1 | qs1] >> [0 | 4 | 0 | 4] & 0xF = [lo0 | hi0 | lo1 | hi1].
    __m512i w = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + F::kQs)));
    w = two ? _mm512_mask_broadcast_i32x4(w, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + F::kQs)))
            : _mm512_maskz_mov_epi32(0x00FF, w);
    const __m512i shifts = _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0, 0,
                                            0x0004000400040004, 0x0004000400040004, 0, 0);
    w = _mm512_and_si512(_mm512_srlv_epi16(w, shifts), _mm512_set1_epi8(0x0F));
    if constexpr (T == GgmlType::IQ4_NL) w = _mm512_shuffle_epi8(iq4_table_u(), w);  // level + 128
    if constexpr (F::kQh >= 0) {
      uint64_t bits = load_u32(b0 + F::kQh);
      if (two) bits |= static_cast<uint64_t>(load_u32(b1 + F::kQh)) << 32;
      w = _mm512_mask_add_epi8(w, _cvtu64_mask64(bits), w, _mm512_set1_epi8(16));
    }
    return w;
  }
}

template <GgmlType T, int MR>
void dot_q32(const DotArgs& a, int64_t n0, int64_t n1) {
  using F = Q32<T>;
  static const ScaleIdx<F::kStride, F::kMin> si;
  const int64_t nb = a.K / 32;
  const __m512i pair_base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i two_v = _mm512_set1_epi32(2);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    prefetch_ahead(row, a.row_bytes);
    __m512 acc[MR], corr[MR];
    for (int m = 0; m < MR; ++m) acc[m] = corr[m] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < nb; g0 += 16) {
      const int gn = static_cast<int>(nb - g0 < 16 ? nb - g0 : 16);
      const __mmask16 gmask = static_cast<__mmask16>((1u << gn) - 1);
      const uint8_t* blk = row + g0 * F::kStride;
      const __m512i dm = load_scales16<T>(blk, gn, si);
      const __m512 d16 = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
      __m512 s16[MR];
      for (int m = 0; m < MR; ++m) {
        const __m512 dx = _mm512_maskz_loadu_ps(gmask, a.qd + m * a.ldqs + g0);
        const __m512 qs = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(gmask, a.qsum + m * a.ldqs + g0));
        s16[m] = _mm512_mul_ps(d16, dx);
        if constexpr (F::kMin) {
          const __m512 m16 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1));
          corr[m] = _mm512_fmadd_ps(_mm512_mul_ps(m16, dx), qs, corr[m]);
        } else {
          corr[m] = _mm512_fmadd_ps(s16[m], qs, corr[m]);
        }
      }
      __m512i pidx = pair_base;
      int p = 0;
      for (; p + 1 < gn; p += 2, blk += 2 * F::kStride) {
        const __m512i w = unpack_pair<T>(blk, true);
        for (int m = 0; m < MR; ++m) {
          const __m512i x = _mm512_loadu_si512(a.q + m * a.ldq + (g0 + p) * 32);
          const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_permutexvar_ps(pidx, s16[m]), acc[m]);
        }
        pidx = _mm512_add_epi32(pidx, two_v);
      }
      if (p < gn) {
        const __m512i w = unpack_pair<T>(blk, false);
        for (int m = 0; m < MR; ++m) {
          const __m512i x = _mm512_maskz_loadu_epi8(0xFFFFFFFFull, a.q + m * a.ldq + (g0 + p) * 32);
          const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_permutexvar_ps(pidx, s16[m]), acc[m]);
        }
      }
    }
    for (int m = 0; m < MR; ++m) {
      const float c = F::kMin ? hsum(corr[m]) : -static_cast<float>(F::kOff) * hsum(corr[m]);
      a.y[m * a.ldy + n] = hsum(acc[m]) + c;
    }
  }
}

// ---- Q4_0 / Q4_1 on nibble-split activations ---------------------------------------------
// A group of 4 blocks (72 / 80 bytes) is read with two loads and one word permute gathers its
// 64 quant bytes (blocks side by side). Low nibbles meet DotArgs::xs[g][0..63], high nibbles
// xs[g][64..127], so both dpbusd land in the same lanes (lane l: block l / 4) and a group costs
// one int->float conversion and one FMA. The scales and mins of 16 blocks are fetched and
// converted together (load_scales16); the min / offset term is one FMA per 16 blocks.

// qs[8j + t] = word t of the quants of block j of a group.
template <GgmlType T>
struct SplitIdx {
  __m512i qs;
  SplitIdx() {
    using F = Q32<T>;
    alignas(64) int16_t q[32];
    for (int j = 0; j < 4; ++j)
      for (int t = 0; t < 8; ++t) q[8 * j + t] = static_cast<int16_t>(j * F::kStride / 2 + F::kQs / 2 + t);
    qs = _mm512_load_si512(q);
  }
};

// Group j (0..3) of a run of 16 blocks: z0 / z1 hold its words 0..31 / 32..63.
template <GgmlType T, int MR>
inline void q4_split_group(__m512i z0, __m512i z1, const __m512i qidx, int j, const int8_t* const* xs,
                           const __m512* s16, __m512* acc) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i qs = _mm512_permutex2var_epi16(z0, qidx, z1);
  const __m512i lo = _mm512_and_si512(qs, nib), hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), nib);
  // Lane l takes the scale of block 4j + l / 4.
  const __m512i spread = _mm512_add_epi32(_mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2),
                                          _mm512_set1_epi32(4 * j));
  for (int m = 0; m < MR; ++m) {
    __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xs[m] + 128 * j));
    dp = _mm512_dpbusd_epi32(dp, hi, _mm512_loadu_si512(xs[m] + 128 * j + 64));
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_permutexvar_ps(spread, s16[m]), acc[m]);
  }
}

template <GgmlType T, int MR>
void dot_q4_split(const DotArgs& a, int64_t n0, int64_t n1) {
  using F = Q32<T>;
  constexpr int kWords = F::kStride / 2;  // 16-bit words per block
  static const ScaleIdx<F::kStride, F::kMin> si;
  static const SplitIdx<T> ix;
  const int64_t nb = a.K / 32;
  const __mmask32 hi_mask = (1u << (4 * kWords - 32)) - 1;  // words 32.. of a group
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    prefetch_ahead(row, a.row_bytes);
    __m512 acc[MR], acc2[MR];
    for (int m = 0; m < MR; ++m) acc[m] = acc2[m] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < nb; g0 += 16) {
      const int gn = static_cast<int>(nb - g0 < 16 ? nb - g0 : 16);
      const __mmask16 gmask = static_cast<__mmask16>((1u << gn) - 1);
      const uint8_t* blk = row + g0 * F::kStride;
      const __m512i dm = load_scales16<T>(blk, gn, si);
      const __m512 d16 = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
      const __m512 c16 = F::kMin ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1)) : d16;
      __m512 s16[MR];
      const int8_t* xs[MR];
      for (int m = 0; m < MR; ++m) {
        s16[m] = _mm512_mul_ps(d16, _mm512_maskz_loadu_ps(gmask, a.qd + m * a.ldqs + g0));
        acc2[m] = _mm512_fmadd_ps(c16, _mm512_maskz_loadu_ps(gmask, a.qds + m * a.ldqs + g0), acc2[m]);
        xs[m] = a.xs + m * a.ldsg * 128 + g0 * 32;
      }
      int j = 0;
      for (; 4 * j + 4 <= gn; ++j, blk += 4 * F::kStride)
        q4_split_group<T, MR>(_mm512_loadu_si512(blk), _mm512_maskz_loadu_epi16(hi_mask, blk + 64), ix.qs, j, xs, s16, acc);
      if (4 * j < gn) {
        const __mmask32 tail = (1u << ((gn - 4 * j) * kWords)) - 1;
        q4_split_group<T, MR>(_mm512_maskz_loadu_epi16(tail, blk), _mm512_setzero_si512(), ix.qs, j, xs, s16, acc);
      }
    }
    for (int m = 0; m < MR; ++m) {
      // Q4_0: w = d (q - 8), so the offset term is -8 d sum(x).
      const __m512 t = F::kMin ? _mm512_add_ps(acc[m], acc2[m]) : _mm512_fmadd_ps(acc2[m], _mm512_set1_ps(-8.0f), acc[m]);
      a.y[m * a.ldy + n] = hsum(t);
    }
  }
}

// ---- K-quants -------------------------------------------------------------------------------

template <bool kQ5, int MR>
void dot_qk45(const DotArgs& a, int64_t n0, int64_t n1) {
  using B = std::conditional_t<kQ5, BlockQ5_K, BlockQ4_K>;
  const int64_t nsb = a.K / kQKK;
  // 16-bit shift counts: 0 in the low 256 bits (low nibbles), 4 in the high 256 bits.
  constexpr int64_t k4 = 0x0004000400040004;
  const __m512i shifts = _mm512_set_epi64(k4, k4, k4, k4, 0, 0, 0, 0);
  const __m512i pair_base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    const B* b = reinterpret_cast<const B*>(a.w + n * a.row_bytes);
    prefetch_ahead(a.w + n * a.row_bytes, a.row_bytes);
    __m512 acc[MR];
    __m256 accm[MR];
    for (int m = 0; m < MR; ++m) {
      acc[m] = _mm512_setzero_ps();
      accm[m] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nsb; ++i) {
      uint32_t sm[4];
      unpack_scales_mins_k4(b[i].scales, sm);
      const __m256 sc8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm))));
      const __m256 mn8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 2))));
      const __m256 d8 = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d)), sc8);
      const __m256 dmin8 = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b[i].dmin)), mn8);
      __m512 s8[MR];
      for (int m = 0; m < MR; ++m) {
        const __m256 dx = _mm256_loadu_ps(a.qd + m * a.ldqs + i * 8);
        const __m256 qs = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qsum + m * a.ldqs + i * 8)));
        s8[m] = _mm512_castps256_ps512(_mm256_mul_ps(d8, dx));
        accm[m] = _mm256_fmadd_ps(_mm256_mul_ps(dmin8, dx), qs, accm[m]);
      }
      __m512i pidx = pair_base;
      for (int c = 0; c < 4; ++c) {
        // Chunk c: 32 bytes, low nibbles = sub-block 2c, high nibbles = sub-block 2c + 1.
        const __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * c)));
        __m512i w = _mm512_and_si512(_mm512_srlv_epi16(raw, shifts), nib);
        if constexpr (kQ5) {
          // qh[l] bit j is the 5th bit of sub-block j, element l.
          const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qh)));
          const uint64_t sel = (0x0101010101010101ull << (2 * c));  // bit 2c in the low half
          const __m512i want = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi64(static_cast<int64_t>(sel)),
                                                       _mm512_set1_epi64(static_cast<int64_t>(sel << 1)));
          w = _mm512_mask_add_epi8(w, _mm512_test_epi8_mask(h, want), w, _mm512_set1_epi8(16));
        }
        for (int m = 0; m < MR; ++m) {
          const __m512i x = _mm512_loadu_si512(a.q + m * a.ldq + i * kQKK + 64 * c);
          const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_permutexvar_ps(pidx, s8[m]), acc[m]);
        }
        pidx = _mm512_add_epi32(pidx, _mm512_set1_epi32(2));
      }
    }
    for (int m = 0; m < MR; ++m) {
      const __m128 t = _mm_add_ps(_mm256_castps256_ps128(accm[m]), _mm256_extractf128_ps(accm[m], 1));
      const __m128 t2 = _mm_add_ps(t, _mm_movehl_ps(t, t));
      const float mins = _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
      a.y[m * a.ldy + n] = hsum(acc[m]) - mins;
    }
  }
}

template <int MR>
void dot_q6_k(const DotArgs& a, int64_t n0, int64_t n1) {
  const int64_t nsb = a.K / kQKK;
  // Lane j of a 64-element pair covers group (j / 4) of the four 16-element groups.
  const __m512i grp = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i nib = _mm512_set1_epi8(0x0F), hi2 = _mm512_set1_epi8(0x30);
  const __m512i sh_lo = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);  // t = 0 | 1: qh << 4, << 2
  const __m512i sh_hi = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);  // t = 2 | 3: qh >> 0, >> 2
  const __m512i dup16 = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  for (int64_t n = n0; n < n1; ++n) {
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(a.w + n * a.row_bytes);
    prefetch_ahead(a.w + n * a.row_bytes, a.row_bytes);
    __m512 acc[MR], corr[MR];
    for (int m = 0; m < MR; ++m) acc[m] = corr[m] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i) {
      const __m512 sc16 = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b[i].d)),
                                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].scales)))));
      __m512 s16[MR];
      for (int m = 0; m < MR; ++m) {
        // 16-element group g uses the activation scale of 32-block g / 2.
        const __m512 dx = _mm512_permutexvar_ps(dup16, _mm512_castps256_ps512(_mm256_loadu_ps(a.qd + m * a.ldqs + i * 8)));
        s16[m] = _mm512_mul_ps(sc16, dx);
        const __m512 qs = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qsum16 + m * 2 * a.ldqs + i * 16))));
        corr[m] = _mm512_fmadd_ps(s16[m], qs, corr[m]);
      }
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b[i].ql + 64 * h;
        const __m512i l64 = _mm512_loadu_si512(ql);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qh + 32 * h)));
        // t = 0, 1: elements 0..63 of the half; t = 2, 3: elements 64..127.
        const __m512i w01 = _mm512_ternarylogic_epi32(_mm512_and_si512(l64, nib), _mm512_sllv_epi64(qh, sh_lo), hi2, 0xF8);
        const __m512i w23 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l64, 4), nib),
                                                      _mm512_srlv_epi64(qh, sh_hi), hi2, 0xF8);
        const __m512i ws[2] = {w01, w23};
        for (int c = 0; c < 2; ++c) {
          const __m512i gidx = _mm512_add_epi32(grp, _mm512_set1_epi32(8 * h + 4 * c));
          for (int m = 0; m < MR; ++m) {
            const __m512i x = _mm512_loadu_si512(a.q + m * a.ldq + i * kQKK + 128 * h + 64 * c);
            const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ws[c], x);
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_permutexvar_ps(gidx, s16[m]), acc[m]);
          }
        }
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]) - 32.0f * hsum(corr[m]);
  }
}

// The 16 signed scales (-32..31) of a Q3_K super-block as bytes (quant::q3_k_scales in SIMD).
inline __m128i q3_k_scales16(const uint8_t* s) {
  const int a0 = static_cast<int>(load_u32(s)), a1 = static_cast<int>(load_u32(s + 4));
  const __m128i lo = _mm_and_si128(_mm_srlv_epi32(_mm_setr_epi32(a0, a1, a0, a1), _mm_setr_epi32(0, 0, 4, 4)),
                                   _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(load_u32(s + 8))), _mm_setr_epi32(0, 2, 4, 6)),
                                   _mm_set1_epi8(0x03));
  return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi32(hi, 4)), _mm_set1_epi8(32));
}

// Q2_K / Q3_K: per 64 elements (128 h + 64 c ..: shifts j = 2c, 2c + 1 of qs[32 h ..]) one
// dpbusd of the unsigned 2-bit quants (Q3_K: | the hmask bit << 2, u = q + 4); lane k covers
// 16-element group 8h + 4c + k / 4. Q3_K's offset 4 and Q2_K's mins go through qsum16.
template <bool kQ3, int MR>
void dot_q23_k(const DotArgs& a, int64_t n0, int64_t n1) {
  using B = std::conditional_t<kQ3, BlockQ3_K, BlockQ2_K>;
  const int64_t nsb = a.K / kQKK;
  const __m512i grp = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i dup16 = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i three = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
  // 16-bit shift counts s in the low 256 bits, s + 1 in the high 256 bits, per s = 2c (quants:
  // twice that) and, for the hmask bits, s = 4h + 2c.
  const auto halves = [](int64_t s_lo, int64_t s_hi) {
    constexpr int64_t k1 = 0x0001000100010001;
    return _mm512_set_epi64(k1 * s_hi, k1 * s_hi, k1 * s_hi, k1 * s_hi, k1 * s_lo, k1 * s_lo, k1 * s_lo, k1 * s_lo);
  };
  const __m512i qshift[2] = {halves(0, 2), halves(4, 6)};
  const __m512i hshift[4] = {halves(0, 1), halves(2, 3), halves(4, 5), halves(6, 7)};
  for (int64_t n = n0; n < n1; ++n) {
    const B* b = reinterpret_cast<const B*>(a.w + n * a.row_bytes);
    prefetch_ahead(a.w + n * a.row_bytes, a.row_bytes);
    __m512 acc[MR], corr[MR];
    for (int m = 0; m < MR; ++m) acc[m] = corr[m] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i) {
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(b[i].d));
      __m512 sc16, mn16 = _mm512_setzero_ps();
      __m512i hm = _mm512_setzero_si512();
      if constexpr (kQ3) {
        sc16 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q3_k_scales16(b[i].scales))));
        hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].hmask)));
      } else {
        const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].scales)));
        sc16 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(s, _mm512_set1_epi32(0xF))));
        mn16 = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b[i].dmin)), _mm512_cvtepi32_ps(_mm512_srli_epi32(s, 4)));
      }
      __m512 s16[MR];
      for (int m = 0; m < MR; ++m) {
        // 16-element group g uses the activation scale of 32-block g / 2.
        const __m512 dx = _mm512_permutexvar_ps(dup16, _mm512_castps256_ps512(_mm256_loadu_ps(a.qd + m * a.ldqs + i * 8)));
        s16[m] = _mm512_mul_ps(sc16, dx);
        const __m512 qs = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qsum16 + m * 2 * a.ldqs + i * 16))));
        corr[m] = _mm512_fmadd_ps(kQ3 ? s16[m] : _mm512_mul_ps(mn16, dx), qs, corr[m]);
      }
      for (int h = 0; h < 2; ++h) {
        const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * h)));
        for (int c = 0; c < 2; ++c) {
          __m512i w = _mm512_and_si512(_mm512_srlv_epi16(q, qshift[c]), three);
          if constexpr (kQ3)
            w = _mm512_or_si512(w, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hm, hshift[2 * h + c]), one), 2));
          const __m512i gidx = _mm512_add_epi32(grp, _mm512_set1_epi32(8 * h + 4 * c));
          for (int m = 0; m < MR; ++m) {
            const __m512i x = _mm512_loadu_si512(a.q + m * a.ldq + i * kQKK + 128 * h + 64 * c);
            const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_permutexvar_ps(gidx, s16[m]), acc[m]);
          }
        }
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]) - (kQ3 ? 4.0f : 1.0f) * hsum(corr[m]);
  }
}

// The 8 signed 32-group scales (-32..31) of an IQ4_XS super-block as int32 lanes.
inline __m256i iq4_xs_scales8(const BlockIQ4_XS& b) {
  const __m256i g = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(load_u32(b.scales_l))),
                                                        _mm256_slli_epi32(g, 2)), _mm256_set1_epi32(0xF));
  const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b.scales_h), _mm256_slli_epi32(g, 1)),
                                      _mm256_set1_epi32(3));
  return _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
}

// IQ4_XS: per pair of 32-groups (32 bytes of qs) one dpbusd of the levels + 128 (a byte shuffle
// of the nibbles); the +128 goes through the activations' block sums.
template <int MR>
void dot_iq4_xs(const DotArgs& a, int64_t n0, int64_t n1) {
  const int64_t nsb = a.K / kQKK;
  constexpr int64_t k4 = 0x0004000400040004;
  // 128-bit lanes [A | A | B | B] of the 32 bytes A B >> [0 | 4 | 0 | 4]: group 2c's low then high
  // nibbles, then group 2c + 1's (the element order).
  const __m512i shifts = _mm512_set_epi64(k4, k4, 0, 0, k4, k4, 0, 0);
  const __m512i pair_base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i nib = _mm512_set1_epi8(0x0F), table = iq4_table_u();
  for (int64_t n = n0; n < n1; ++n) {
    const BlockIQ4_XS* b = reinterpret_cast<const BlockIQ4_XS*>(a.w + n * a.row_bytes);
    prefetch_ahead(a.w + n * a.row_bytes, a.row_bytes);
    __m512 acc[MR];
    __m256 corr[MR];
    for (int m = 0; m < MR; ++m) {
      acc[m] = _mm512_setzero_ps();
      corr[m] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nsb; ++i) {
      const __m256 s8 = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d)), _mm256_cvtepi32_ps(iq4_xs_scales8(b[i])));
      __m512 sx[MR];
      for (int m = 0; m < MR; ++m) {
        const __m256 t = _mm256_mul_ps(s8, _mm256_loadu_ps(a.qd + m * a.ldqs + i * 8));
        sx[m] = _mm512_castps256_ps512(t);
        const __m256 qs = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qsum + m * a.ldqs + i * 8)));
        corr[m] = _mm256_fmadd_ps(t, qs, corr[m]);
      }
      __m512i pidx = pair_base;
      for (int c = 0; c < 4; ++c) {
        const __m512i raw = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * c)));
        const __m512i idx = _mm512_and_si512(_mm512_srlv_epi16(_mm512_shuffle_i64x2(raw, raw, 0x50), shifts), nib);
        const __m512i w = _mm512_shuffle_epi8(table, idx);
        for (int m = 0; m < MR; ++m) {
          const __m512i x = _mm512_loadu_si512(a.q + m * a.ldq + i * kQKK + 64 * c);
          const __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_permutexvar_ps(pidx, sx[m]), acc[m]);
        }
        pidx = _mm512_add_epi32(pidx, _mm512_set1_epi32(2));
      }
    }
    for (int m = 0; m < MR; ++m) {
      const __m128 t = _mm_add_ps(_mm256_castps256_ps128(corr[m]), _mm256_extractf128_ps(corr[m], 1));
      const __m128 t2 = _mm_add_ps(t, _mm_movehl_ps(t, t));
      a.y[m * a.ldy + n] = hsum(acc[m]) - 128.0f * _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
    }
  }
}

// MXFP4: per pair of 32-blocks one dpbusd of the values + 128 (a byte shuffle of the nibbles,
// laid out as unpack_pair's); each block's power-of-two scale times its activation scale covers
// its 8 lanes, and the +128 goes through the block sums (in integers, so no float rounding of
// the correction can depend on how many activation rows a call has).
template <int MR>
void dot_mxfp4(const DotArgs& a, int64_t n0, int64_t n1) {
  const int64_t nb = a.K / 32;
  constexpr int64_t k4 = 0x0004000400040004;
  const __m512i shifts = _mm512_set_epi64(k4, k4, 0, 0, k4, k4, 0, 0);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i table = _mm512_xor_si512(
      _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values))),
      _mm512_set1_epi8(static_cast<char>(0x80)));
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    prefetch_ahead(row, a.row_bytes);
    __m512 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
      const bool two = b + 1 < nb;
      const BlockMXFP4* blk = reinterpret_cast<const BlockMXFP4*>(row) + b;
      // [qs0 | qs0 | qs1 | qs1] >> [0 | 4 | 0 | 4] & 0xF: the element order of the two blocks.
      __m512i raw = _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[0].qs)));
      raw = two ? _mm512_mask_broadcast_i32x4(raw, 0xFF00, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[1].qs)))
                : _mm512_maskz_mov_epi32(0x00FF, raw);
      const __m512i w = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srlv_epi16(raw, shifts), nib));
      const float d0 = e8m0_half(blk[0].e), d1 = two ? e8m0_half(blk[1].e) : 0.0f;
      for (int m = 0; m < MR; ++m) {
        const int8_t* xq = a.q + m * a.ldq + b * 32;
        const __m512i x = two ? _mm512_loadu_si512(xq) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, xq);
        // The +128 removed in integers, from lane 0 of each block: -128 qsum.
        const int32_t* qs = a.qsum + m * a.ldqs + b;
        const __m512i off = _mm512_mask_set1_epi32(_mm512_maskz_set1_epi32(0x0001, -128 * qs[0]), 0x0100,
                                                   two ? -128 * qs[1] : 0);
        const __m512i dp = _mm512_dpbusd_epi32(off, w, x);
        const float* dx = a.qd + m * a.ldqs + b;
        const float s0 = d0 * dx[0], s1 = two ? d1 * dx[1] : 0.0f;
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s0), _mm512_set1_ps(s1)), acc[m]);
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]);
  }
}

template <int MR> struct MXFP4K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_mxfp4<MR>(a, b, e); } };
template <bool kQ3> struct Q23K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q23_k<kQ3, MR>(a, b, e); } }; };
template <int MR> struct IQ4XSK { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_iq4_xs<MR>(a, b, e); } };
template <GgmlType T> struct Q4SplitK { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q4_split<T, MR>(a, b, e); } }; };
template <GgmlType T> struct Q32K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q32<T, MR>(a, b, e); } }; };
template <bool kQ5> struct QK45K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_qk45<kQ5, MR>(a, b, e); } }; };
template <int MR> struct Q6K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q6_k<MR>(a, b, e); } };

}  // namespace

void register_avx512_dot_q8(KernelTable& t) {
  t.dot_q8[kQ4_0] = by_mr<Q4SplitK<GgmlType::Q4_0>::K>;
  t.dot_q8[kQ4_1] = by_mr<Q4SplitK<GgmlType::Q4_1>::K>;
  t.q8_split[kQ4_0] = t.q8_split[kQ4_1] = true;
  t.dot_q8[kQ5_0] = by_mr<Q32K<GgmlType::Q5_0>::K>;
  t.dot_q8[kQ5_1] = by_mr<Q32K<GgmlType::Q5_1>::K>;
  t.dot_q8[kQ8_0] = by_mr<Q32K<GgmlType::Q8_0>::K>;
  t.dot_q8[kQ4_K] = by_mr<QK45K<false>::K>;
  t.dot_q8[kQ5_K] = by_mr<QK45K<true>::K>;
  t.dot_q8[kQ6_K] = by_mr<Q6K>;
  t.dot_q8[kQ2_K] = by_mr<Q23K<false>::K>;
  t.dot_q8[kQ3_K] = by_mr<Q23K<true>::K>;
  t.dot_q8[kIQ4_NL] = by_mr<Q32K<GgmlType::IQ4_NL>::K>;
  t.dot_q8[kIQ4_XS] = by_mr<IQ4XSK>;
  t.dot_q8[kMXFP4] = by_mr<MXFP4K>;
}

}  // namespace fathom::cpu::detail
