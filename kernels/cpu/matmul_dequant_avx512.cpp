// AVX-512 row dequantization, bit-exact with ref::dequantize_row: the same products and
// sums in the same order (a product followed by an add goes through rounded() so the
// compiler cannot fuse it into an FMA). 16 elements per vector.
// GCC 12 reports _mm512_undefined_* inside intrinsics as maybe-uninitialized (a known false
// positive); silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include <type_traits>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/quant_blocks.h"

namespace fathom::cpu::detail {
namespace {

using namespace fathom::quant;

inline __m512 rounded(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
// 16 bytes -> 16 int32 lanes (zero-extended).
inline __m512i u8x16(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512 to_f(__m512i v) { return _mm512_cvtepi32_ps(v); }

void dq_f32(const void* src, float* y, int64_t n) { std::memcpy(y, src, static_cast<size_t>(n) * 4); }

void dq_f16(const void* src, float* y, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
  for (; i < n; ++i) y[i] = h2f(h[i]);
}

void dq_bf16(const void* src, float* y, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i)));
    _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
  }
  for (; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
    std::memcpy(y + i, &bits, 4);
  }
}

template <bool kQ5, bool kMin, typename B>
void dq_q4q5(const void* src, float* y, int64_t n) {
  const B* b = static_cast<const B*>(src);
  const __m512i mask = _mm512_set1_epi32(0xF), sixteen = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const __m512i v = u8x16(b[i].qs);
    __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_srli_epi32(v, 4);
    if constexpr (kQ5) {
      const uint32_t qh = load_u32(b[i].qh);
      lo = _mm512_mask_or_epi32(lo, static_cast<__mmask16>(qh), lo, sixteen);
      hi = _mm512_mask_or_epi32(hi, static_cast<__mmask16>(qh >> 16), hi, sixteen);
    }
    const __m512 d = _mm512_set1_ps(h2f(b[i].d));
    if constexpr (kMin) {
      const __m512 m = _mm512_set1_ps(h2f(b[i].m));
      _mm512_storeu_ps(y, _mm512_add_ps(rounded(_mm512_mul_ps(to_f(lo), d)), m));
      _mm512_storeu_ps(y + 16, _mm512_add_ps(rounded(_mm512_mul_ps(to_f(hi), d)), m));
    } else {
      const __m512i off = _mm512_set1_epi32(kQ5 ? 16 : 8);
      _mm512_storeu_ps(y, _mm512_mul_ps(to_f(_mm512_sub_epi32(lo, off)), d));
      _mm512_storeu_ps(y + 16, _mm512_mul_ps(to_f(_mm512_sub_epi32(hi, off)), d));
    }
  }
}

void dq_q8_0(const void* src, float* y, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const __m512 d = _mm512_set1_ps(h2f(b[i].d));
    const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs)));
    const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 16)));
    _mm512_storeu_ps(y, _mm512_mul_ps(to_f(q0), d));
    _mm512_storeu_ps(y + 16, _mm512_mul_ps(to_f(q1), d));
  }
}

// Q4_K and Q5_K: per pair of sub-blocks (64 elements) one 32-byte chunk of nibbles.
template <bool kQ5, typename B>
void dq_qk45(const void* src, float* y, int64_t n) {
  const B* b = static_cast<const B*>(src);
  const __m512i mask = _mm512_set1_epi32(0xF), sixteen = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
      uint8_t sc, m;
      scale_min_k4(j, b[i].scales, &sc, &m);
      const __m512 d1 = _mm512_set1_ps(d * sc), m1 = _mm512_set1_ps(dmin * m);
      scale_min_k4(j + 1, b[i].scales, &sc, &m);
      const __m512 d2 = _mm512_set1_ps(d * sc), m2 = _mm512_set1_ps(dmin * m);
      for (int l = 0; l < 32; l += 16) {
        const __m512i v = u8x16(q + l);
        __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_srli_epi32(v, 4);
        if constexpr (kQ5) {
          const __m512i h = u8x16(reinterpret_cast<const uint8_t*>(b[i].qh) + l);
          lo = _mm512_mask_or_epi32(lo, _mm512_test_epi32_mask(h, _mm512_set1_epi32(1 << j)), lo, sixteen);
          hi = _mm512_mask_or_epi32(hi, _mm512_test_epi32_mask(h, _mm512_set1_epi32(2 << j)), hi, sixteen);
        }
        _mm512_storeu_ps(y + l, _mm512_sub_ps(rounded(_mm512_mul_ps(d1, to_f(lo))), m1));
        _mm512_storeu_ps(y + 32 + l, _mm512_sub_ps(rounded(_mm512_mul_ps(d2, to_f(hi))), m2));
      }
    }
  }
}

void dq_q6_k(const void* src, float* y, int64_t n) {
  const BlockQ6_K* b = static_cast<const BlockQ6_K*>(src);
  const __m512i mask = _mm512_set1_epi32(0xF), three = _mm512_set1_epi32(3), off = _mm512_set1_epi32(32);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = h2f(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; l += 16) {
        const int is = l / 16;
        const __m512i a = u8x16(ql + l), c = u8x16(ql + l + 32), hb = u8x16(qh + l);
        const __m512i q1 = _mm512_or_si512(_mm512_and_si512(a, mask), _mm512_slli_epi32(_mm512_and_si512(hb, three), 4));
        const __m512i q2 = _mm512_or_si512(_mm512_and_si512(c, mask),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 2), three), 4));
        const __m512i q3 = _mm512_or_si512(_mm512_srli_epi32(a, 4),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 4), three), 4));
        const __m512i q4 = _mm512_or_si512(_mm512_srli_epi32(c, 4), _mm512_slli_epi32(_mm512_srli_epi32(hb, 6), 4));
        _mm512_storeu_ps(y + l, _mm512_mul_ps(_mm512_set1_ps(d * sc[is]), to_f(_mm512_sub_epi32(q1, off))));
        _mm512_storeu_ps(y + l + 32, _mm512_mul_ps(_mm512_set1_ps(d * sc[is + 2]), to_f(_mm512_sub_epi32(q2, off))));
        _mm512_storeu_ps(y + l + 64, _mm512_mul_ps(_mm512_set1_ps(d * sc[is + 4]), to_f(_mm512_sub_epi32(q3, off))));
        _mm512_storeu_ps(y + l + 96, _mm512_mul_ps(_mm512_set1_ps(d * sc[is + 6]), to_f(_mm512_sub_epi32(q4, off))));
      }
    }
  }
}

// Q2_K / Q3_K: per shift j of a 32-byte half of qs, the 32 elements 128 h + 32 j + l as bytes
// (Q3_K: q - 4 where the 3rd bit is clear), then two 16-element sub-blocks. The products are
// exact (ref/dequant.cpp), so (d sc) q in any order gives the ref's bits.
template <bool kQ3, typename B>
void dq_q23_k(const void* src, float* y, int64_t n) {
  const B* b = static_cast<const B*>(src);
  const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = h2f(b[i].d);
    __m512 dl, ml = _mm512_setzero_ps();
    __m256i hm = _mm256_setzero_si256();
    if constexpr (kQ3) {
      alignas(16) int8_t sc[16];
      q3_k_scales(b[i].scales, sc);
      dl = _mm512_mul_ps(_mm512_set1_ps(d), to_f(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc)))));
      hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].hmask));
    } else {
      const __m512i sc = u8x16(b[i].scales);
      dl = _mm512_mul_ps(_mm512_set1_ps(d), to_f(_mm512_and_si512(sc, _mm512_set1_epi32(0xF))));
      ml = _mm512_mul_ps(_mm512_set1_ps(h2f(b[i].dmin)), to_f(_mm512_srli_epi32(sc, 4)));
    }
    alignas(64) float dls[16], mls[16];
    _mm512_store_ps(dls, dl);
    _mm512_store_ps(mls, ml);
    for (int h = 0; h < 2; ++h) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * h));
      for (int j = 0; j < 4; ++j, y += 32) {
        __m256i v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), three);
        if constexpr (kQ3) {
          const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + j)), one);
          v = _mm256_sub_epi8(_mm256_or_si256(v, _mm256_slli_epi16(hb, 2)), four);
        }
        for (int t = 0; t < 2; ++t) {
          const int s = 8 * h + 2 * j + t;
          const __m128i bytes = t ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v);
          const __m512 f = to_f(_mm512_cvtepi8_epi32(bytes));
          if constexpr (kQ3)
            _mm512_storeu_ps(y + 16 * t, _mm512_mul_ps(_mm512_set1_ps(dls[s]), f));
          else
            _mm512_storeu_ps(y + 16 * t, _mm512_sub_ps(rounded(_mm512_mul_ps(_mm512_set1_ps(dls[s]), f)), _mm512_set1_ps(mls[s])));
        }
      }
    }
  }
}

// 16 bytes of nibbles (one 32-group) -> y[0..31] = scale * table[nibble] (the IQ4 levels or the
// MXFP4 values, looked up with one byte shuffle).
inline void dq_iq4_group(const uint8_t* qs, float scale, float* y, const int8_t* levels = kIq4nlValues) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(levels)), nib = _mm_set1_epi8(0x0F);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(raw, nib));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(raw, 4), nib));
  const __m512 d = _mm512_set1_ps(scale);
  _mm512_storeu_ps(y, _mm512_mul_ps(d, to_f(_mm512_cvtepi8_epi32(lo))));
  _mm512_storeu_ps(y + 16, _mm512_mul_ps(d, to_f(_mm512_cvtepi8_epi32(hi))));
}

void dq_iq4_nl(const void* src, float* y, int64_t n) {
  const BlockIQ4_NL* b = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) dq_iq4_group(b[i].qs, h2f(b[i].d), y);
}

void dq_mxfp4(const void* src, float* y, int64_t n) {
  const BlockMXFP4* b = static_cast<const BlockMXFP4*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) dq_iq4_group(b[i].qs, e8m0_half(b[i].e), y, kMxfp4Values);
}

void dq_iq4_xs(const void* src, float* y, int64_t n) {
  const BlockIQ4_XS* b = static_cast<const BlockIQ4_XS*>(src);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = h2f(b[i].d);
    for (int g = 0; g < 8; ++g, y += 32) dq_iq4_group(b[i].qs + 16 * g, d * static_cast<float>(iq4_xs_scale(b[i], g)), y);
  }
}

}  // namespace

void register_avx512_dequant(KernelTable& t) {
  t.dequant[kF32] = dq_f32;
  t.dequant[kF16] = dq_f16;
  t.dequant[kBF16] = dq_bf16;
  t.dequant[kQ4_0] = dq_q4q5<false, false, BlockQ4_0>;
  t.dequant[kQ4_1] = dq_q4q5<false, true, BlockQ4_1>;
  t.dequant[kQ5_0] = dq_q4q5<true, false, BlockQ5_0>;
  t.dequant[kQ5_1] = dq_q4q5<true, true, BlockQ5_1>;
  t.dequant[kQ8_0] = dq_q8_0;
  t.dequant[kQ4_K] = dq_qk45<false, BlockQ4_K>;
  t.dequant[kQ5_K] = dq_qk45<true, BlockQ5_K>;
  t.dequant[kQ6_K] = dq_q6_k;
  t.dequant[kQ2_K] = dq_q23_k<false, BlockQ2_K>;
  t.dequant[kQ3_K] = dq_q23_k<true, BlockQ3_K>;
  t.dequant[kIQ4_NL] = dq_iq4_nl;
  t.dequant[kIQ4_XS] = dq_iq4_xs;
  t.dequant[kMXFP4] = dq_mxfp4;
}

}  // namespace fathom::cpu::detail
