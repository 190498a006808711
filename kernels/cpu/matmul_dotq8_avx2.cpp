// AVX2 dot kernels for Precision::kQ8, as ggml does them without VNNI: _mm256_maddubs_epi16
// (u8 weights x s8 activations -> s16 pair sums) then _mm256_madd_epi16 to s32, one f32
// scale per 32-element block.
// Offsets (Q4_0: 8, Q5_0: 16, Q6_K: 32) and mins are applied through the activation block
// sums; Q8_0's signed weights use the sign trick (|w| x sign(x, w)). maddubs saturates at
// 2^15: pairs stay below it for 4-6 bit weights (2 * 63 * 127) and for |w| <= 128 (2 * 128 * 127).
#include <immintrin.h>

#include <type_traits>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/quant_blocks.h"

namespace fathom::cpu::detail {
namespace {

using namespace fathom::quant;

using cpu::simd256::hsum;
inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
// Sum of u8 x s8 products, as 8 int32 lanes.
inline __m256 dot_us8(__m256i w, __m256i x) {
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
inline float h2f(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

template <GgmlType T> struct Q32;
template <> struct Q32<GgmlType::Q4_0> { static constexpr int kStride = 18, kQs = 2, kQh = -1, kOff = 8, kM = -1; };
template <> struct Q32<GgmlType::Q4_1> { static constexpr int kStride = 20, kQs = 4, kQh = -1, kOff = 0, kM = 2; };
template <> struct Q32<GgmlType::Q5_0> { static constexpr int kStride = 22, kQs = 6, kQh = 2, kOff = 16, kM = -1; };
template <> struct Q32<GgmlType::Q5_1> { static constexpr int kStride = 24, kQs = 8, kQh = 4, kOff = 0, kM = 2; };
template <> struct Q32<GgmlType::Q8_0> { static constexpr int kStride = 34, kQs = 2, kQh = -1, kOff = 0, kM = -1; };

// 0xFF in byte i where bit i of `bits` is set (ggml's bytes_from_bits_32).
inline __m256i bytes_from_bits(uint32_t bits) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i bytes = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf),
                                        _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

template <GgmlType T, int MR>
void dot_q32(const DotArgs& a, int64_t n0, int64_t n1) {
  using F = Q32<T>;
  const int64_t nb = a.K / 32;
  const __m256i nib = _mm256_set1_epi8(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* blk = a.w + n * a.row_bytes;
    __m256 acc[MR];
    float corr[MR] = {};
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, blk += F::kStride) {
      const float d = h2f(blk);
      __m256i w;
      if constexpr (T == GgmlType::Q8_0) {
        w = load32(blk + 2);
      } else {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + F::kQs));
        w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), nib);
        if constexpr (F::kQh >= 0)
          w = _mm256_or_si256(w, _mm256_and_si256(bytes_from_bits(load_u32(blk + F::kQh)), _mm256_set1_epi8(16)));
      }
      const __m256i wabs = T == GgmlType::Q8_0 ? _mm256_sign_epi8(w, w) : w;
      float c = 0.0f;
      if constexpr (F::kM >= 0) c = h2f(blk + F::kM);
      else if constexpr (F::kOff != 0) c = -static_cast<float>(F::kOff) * d;
      for (int m = 0; m < MR; ++m) {
        const __m256i x = load32(a.q + m * a.ldq + b * 32);
        const float dx = a.qd[m * a.ldqs + b];
        const __m256 p = dot_us8(wabs, T == GgmlType::Q8_0 ? _mm256_sign_epi8(x, w) : x);
        acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), p, acc[m]);
        if constexpr (F::kM >= 0 || F::kOff != 0) corr[m] += c * dx * static_cast<float>(a.qsum[m * a.ldqs + b]);
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]) + corr[m];
  }
}

template <bool kQ5, int MR>
void dot_qk45(const DotArgs& a, int64_t n0, int64_t n1) {
  using B = std::conditional_t<kQ5, BlockQ5_K, BlockQ4_K>;
  const int64_t nsb = a.K / kQKK;
  const __m256i nib = _mm256_set1_epi8(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    const B* b = reinterpret_cast<const B*>(a.w + n * a.row_bytes);
    __m256 acc[MR], accm[MR];
    for (int m = 0; m < MR; ++m) acc[m] = accm[m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i) {
      uint32_t sm[4];
      unpack_scales_mins_k4(b[i].scales, sm);
      const __m256 sc8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm))));
      const __m256 mn8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 2))));
      const __m256 d8 = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d)), sc8);
      const __m256 dmin8 = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b[i].dmin)), mn8);
      __m256 s8[MR];
      for (int m = 0; m < MR; ++m) {
        const __m256 dx = _mm256_loadu_ps(a.qd + m * a.ldqs + i * 8);
        const __m256 qs = _mm256_cvtepi32_ps(load32(a.qsum + m * a.ldqs + i * 8));
        s8[m] = _mm256_mul_ps(d8, dx);
        accm[m] = _mm256_fmadd_ps(_mm256_mul_ps(dmin8, dx), qs, accm[m]);
      }
      __m256i qh = _mm256_setzero_si256();
      if constexpr (kQ5) qh = load32(b[i].qh);
      for (int j = 0; j < 8; ++j) {
        const __m256i raw = load32(b[i].qs + 32 * (j / 2));
        __m256i w = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(raw, 4) : raw, nib);
        if constexpr (kQ5)
          w = _mm256_or_si256(w, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1)), 4));
        const __m256i sel = _mm256_set1_epi32(j);
        for (int m = 0; m < MR; ++m) {
          const __m256 p = dot_us8(w, load32(a.q + m * a.ldq + i * kQKK + 32 * j));
          acc[m] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(s8[m], sel), p, acc[m]);
        }
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]) - hsum(accm[m]);
  }
}

template <int MR>
void dot_q6_k(const DotArgs& a, int64_t n0, int64_t n1) {
  const int64_t nsb = a.K / kQKK;
  const __m256i nib = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30);
  for (int64_t n = n0; n < n1; ++n) {
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(a.w + n * a.row_bytes);
    __m256 acc[MR];
    float corr[MR] = {};
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i) {
      const float d = _cvtsh_ss(b[i].d);
      const int8_t* sc = b[i].scales;
      for (int h = 0; h < 2; ++h) {
        const __m256i l0 = load32(b[i].ql + 64 * h), l1 = load32(b[i].ql + 64 * h + 32);
        const __m256i qh = load32(b[i].qh + 32 * h);
        const __m256i w[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, nib), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2)),
            _mm256_or_si256(_mm256_and_si256(l1, nib), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nib), _mm256_and_si256(qh, hi2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nib), _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2)),
        };
        for (int t = 0; t < 4; ++t) {
          const int g = 8 * h + 2 * t;  // 16-element groups g, g + 1 = 32-block (i * 8 + g / 2)
          const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
          const int64_t blk = i * 8 + g / 2;
          for (int m = 0; m < MR; ++m) {
            const __m256i p16 = _mm256_maddubs_epi16(w[t], load32(a.q + m * a.ldq + blk * 32));
            const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, scv));
            const float ds = d * a.qd[m * a.ldqs + blk];
            acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(ds), p, acc[m]);
            const int16_t* s16 = a.qsum16 + m * 2 * a.ldqs + 2 * blk;
            corr[m] += ds * static_cast<float>(sc[g] * s16[0] + sc[g + 1] * s16[1]);
          }
        }
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]) - 32.0f * corr[m];
  }
}

// Q2_K / Q3_K: per 32-block (elements 128 h + 32 j + l of a super-block) the 2-bit quants of
// qs[32 h + l] at bits 2j (Q3_K: | the hmask bit << 2, so u = q + 4 in 0..7); maddubs then a madd
// with the two 16-element groups' integer scales. Q3_K's offset 4 and Q2_K's mins go through
// the activations' 16-element sums (qsum16), like Q6_K's offset.
template <bool kQ3, int MR>
void dot_q23_k(const DotArgs& a, int64_t n0, int64_t n1) {
  using B = std::conditional_t<kQ3, BlockQ3_K, BlockQ2_K>;
  const int64_t nsb = a.K / kQKK;
  const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  for (int64_t n = n0; n < n1; ++n) {
    const B* b = reinterpret_cast<const B*>(a.w + n * a.row_bytes);
    __m256 acc[MR];
    float corr[MR] = {};
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i) {
      const float d = _cvtsh_ss(b[i].d);
      int16_t sc[16], mn[16] = {};  // per 16-element group: integer scale (and Q2_K min)
      float dmin = 0.0f;
      __m256i hm = _mm256_setzero_si256();
      if constexpr (kQ3) {
        const int a0 = static_cast<int>(load_u32(b[i].scales)), a1 = static_cast<int>(load_u32(b[i].scales + 4));
        const __m128i lo = _mm_and_si128(_mm_srlv_epi32(_mm_setr_epi32(a0, a1, a0, a1), _mm_setr_epi32(0, 0, 4, 4)),
                                         _mm_set1_epi8(0x0F));
        const __m128i hi = _mm_and_si128(
            _mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(load_u32(b[i].scales + 8))), _mm_setr_epi32(0, 2, 4, 6)),
            _mm_set1_epi8(0x03));
        const __m128i s8 = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi32(hi, 4)), _mm_set1_epi8(32));  // q3_k_scales
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(sc), _mm256_cvtepi8_epi16(s8));
        hm = load32(b[i].hmask);
      } else {
        for (int g = 0; g < 16; ++g) {
          sc[g] = static_cast<int16_t>(b[i].scales[g] & 0xF);
          mn[g] = static_cast<int16_t>(b[i].scales[g] >> 4);
        }
        dmin = _cvtsh_ss(b[i].dmin);
      }
      for (int h = 0; h < 2; ++h) {
        const __m256i q32 = load32(b[i].qs + 32 * h);
        for (int j = 0; j < 4; ++j) {
          __m256i w = _mm256_and_si256(_mm256_srli_epi16(q32, 2 * j), three);
          if constexpr (kQ3) w = _mm256_or_si256(w, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one), 2));
          const int g = 8 * h + 2 * j;  // its 16-element groups g, g + 1
          const int64_t blk = i * 8 + 4 * h + j;
          const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
          for (int m = 0; m < MR; ++m) {
            const __m256i p16 = _mm256_maddubs_epi16(w, load32(a.q + m * a.ldq + blk * 32));
            const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, scv));
            const float dx = a.qd[m * a.ldqs + blk];
            acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), p, acc[m]);
            const int16_t* s16 = a.qsum16 + m * 2 * a.ldqs + 2 * blk;
            if constexpr (kQ3) corr[m] += d * dx * static_cast<float>(sc[g] * s16[0] + sc[g + 1] * s16[1]);
            else corr[m] += dmin * dx * static_cast<float>(mn[g] * s16[0] + mn[g + 1] * s16[1]);
          }
        }
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]) - (kQ3 ? 4.0f : 1.0f) * corr[m];
  }
}

// IQ4_NL / IQ4_XS: the nibbles of a 32-group become its signed levels with one byte shuffle
// (kIq4nlValues), multiplied with the sign trick as Q8_0 (|w| <= 127: maddubs cannot saturate).
inline __m256i iq4_levels(const uint8_t* qs, __m256i table) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), nib = _mm_set1_epi8(0x0F);
  const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), nib), _mm_and_si128(raw, nib));
  return _mm256_shuffle_epi8(table, idx);
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

// IQ4_NL / IQ4_XS / MXFP4 (T): 32-groups of nibble indices into a table of signed levels.
template <GgmlType T, int MR>
void dot_iq4(const DotArgs& a, int64_t n0, int64_t n1) {
  const int64_t nb = a.K / 32;
  const int8_t* levels = T == GgmlType::MXFP4 ? kMxfp4Values : kIq4nlValues;
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(levels)));
  alignas(32) float dsc[8];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    __m256 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nb; ++blk) {
      float d;
      const uint8_t* qs;
      if constexpr (T == GgmlType::IQ4_XS) {
        const BlockIQ4_XS& b = reinterpret_cast<const BlockIQ4_XS*>(row)[blk / 8];
        const int g = static_cast<int>(blk % 8);
        if (g == 0)
          _mm256_store_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b.d)), _mm256_cvtepi32_ps(iq4_xs_scales8(b))));
        d = dsc[g];
        qs = b.qs + 16 * g;
      } else if constexpr (T == GgmlType::MXFP4) {
        const BlockMXFP4& b = reinterpret_cast<const BlockMXFP4*>(row)[blk];
        d = e8m0_half(b.e);
        qs = b.qs;
      } else {
        const BlockIQ4_NL& b = reinterpret_cast<const BlockIQ4_NL*>(row)[blk];
        d = _cvtsh_ss(b.d);
        qs = b.qs;
      }
      // MXFP4 has zero levels: sign(x, 0) = 0 and |0| = 0, so the product is 0 either way.
      const __m256i w = iq4_levels(qs, table), wabs = _mm256_sign_epi8(w, w);
      for (int m = 0; m < MR; ++m) {
        const __m256 p = dot_us8(wabs, _mm256_sign_epi8(load32(a.q + m * a.ldq + blk * 32), w));
        acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.qd[m * a.ldqs + blk]), p, acc[m]);
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]);
  }
}

#include "kernels/cpu/matmul_by_mr.inc"  // by_mr, this file's own copy

template <GgmlType T> struct Q32K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q32<T, MR>(a, b, e); } }; };
template <bool kQ5> struct QK45K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_qk45<kQ5, MR>(a, b, e); } }; };
template <int MR> struct Q6K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q6_k<MR>(a, b, e); } };
template <bool kQ3> struct Q23K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q23_k<kQ3, MR>(a, b, e); } }; };
template <GgmlType T> struct IQ4K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_iq4<T, MR>(a, b, e); } }; };

}  // namespace

void register_avx2_dot_q8(KernelTable& t) {
  t.dot_q8[kQ4_0] = by_mr<Q32K<GgmlType::Q4_0>::K>;
  t.dot_q8[kQ4_1] = by_mr<Q32K<GgmlType::Q4_1>::K>;
  t.dot_q8[kQ5_0] = by_mr<Q32K<GgmlType::Q5_0>::K>;
  t.dot_q8[kQ5_1] = by_mr<Q32K<GgmlType::Q5_1>::K>;
  t.dot_q8[kQ8_0] = by_mr<Q32K<GgmlType::Q8_0>::K>;
  t.dot_q8[kQ4_K] = by_mr<QK45K<false>::K>;
  t.dot_q8[kQ5_K] = by_mr<QK45K<true>::K>;
  t.dot_q8[kQ6_K] = by_mr<Q6K>;
  t.dot_q8[kQ2_K] = by_mr<Q23K<false>::K>;
  t.dot_q8[kQ3_K] = by_mr<Q23K<true>::K>;
  t.dot_q8[kIQ4_NL] = by_mr<IQ4K<GgmlType::IQ4_NL>::K>;
  t.dot_q8[kIQ4_XS] = by_mr<IQ4K<GgmlType::IQ4_XS>::K>;
  t.dot_q8[kMXFP4] = by_mr<IQ4K<GgmlType::MXFP4>::K>;
}

}  // namespace fathom::cpu::detail
