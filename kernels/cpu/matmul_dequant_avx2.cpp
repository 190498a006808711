// AVX2 row dequantization, bit-exact with ref::dequantize_row (same products and sums in the
// same order; rounded() keeps a product followed by an add from being fused into an FMA).
// 8 elements per vector.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/quant_blocks.h"

namespace fathom::cpu::detail {
namespace {

using namespace fathom::quant;

inline __m256 rounded(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
// 8 bytes -> 8 int32 lanes (zero-extended).
inline __m256i u8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline __m256 to_f(__m256i v) { return _mm256_cvtepi32_ps(v); }
// Lane i: bit (j0 + i) of `bits`, moved to bit 4 (value 16 or 0).
inline __m256i bit4(uint32_t bits, int j0) {
  const __m256i sh = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(j0));
  const __m256i b = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(bits)), sh), _mm256_set1_epi32(1));
  return _mm256_slli_epi32(b, 4);
}

void dq_f32(const void* src, float* y, int64_t n) { std::memcpy(y, src, static_cast<size_t>(n) * 4); }

void dq_f16(const void* src, float* y, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) y[i] = h2f(h[i]);
}

void dq_bf16(const void* src, float* y, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
    _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
  }
  for (; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
    std::memcpy(y + i, &bits, 4);
  }
}

template <bool kQ5, bool kMin, typename B>
void dq_q4q5(const void* src, float* y, int64_t n) {
  const B* b = static_cast<const B*>(src);
  const __m256i mask = _mm256_set1_epi32(0xF);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const __m256 d = _mm256_set1_ps(h2f(b[i].d));
    uint32_t qh = 0;
    if constexpr (kQ5) qh = load_u32(b[i].qh);
    for (int j = 0; j < 16; j += 8) {
      const __m256i v = u8x8(b[i].qs + j);
      __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_srli_epi32(v, 4);
      if constexpr (kQ5) {
        lo = _mm256_or_si256(lo, bit4(qh, j));
        hi = _mm256_or_si256(hi, bit4(qh, j + 16));
      }
      if constexpr (kMin) {
        const __m256 m = _mm256_set1_ps(h2f(b[i].m));
        _mm256_storeu_ps(y + j, _mm256_add_ps(rounded(_mm256_mul_ps(to_f(lo), d)), m));
        _mm256_storeu_ps(y + 16 + j, _mm256_add_ps(rounded(_mm256_mul_ps(to_f(hi), d)), m));
      } else {
        const __m256i off = _mm256_set1_epi32(kQ5 ? 16 : 8);
        _mm256_storeu_ps(y + j, _mm256_mul_ps(to_f(_mm256_sub_epi32(lo, off)), d));
        _mm256_storeu_ps(y + 16 + j, _mm256_mul_ps(to_f(_mm256_sub_epi32(hi, off)), d));
      }
    }
  }
}

void dq_q8_0(const void* src, float* y, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, y += kQK) {
    const __m256 d = _mm256_set1_ps(h2f(b[i].d));
    for (int j = 0; j < 32; j += 8) {
      const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + j)));
      _mm256_storeu_ps(y + j, _mm256_mul_ps(to_f(q), d));
    }
  }
}

template <bool kQ5, typename B>
void dq_qk45(const void* src, float* y, int64_t n) {
  const B* b = static_cast<const B*>(src);
  const __m256i mask = _mm256_set1_epi32(0xF), sixteen = _mm256_set1_epi32(16);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
      uint8_t sc, m;
      scale_min_k4(j, b[i].scales, &sc, &m);
      const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(dmin * m);
      scale_min_k4(j + 1, b[i].scales, &sc, &m);
      const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(dmin * m);
      for (int l = 0; l < 32; l += 8) {
        const __m256i v = u8x8(q + l);
        __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_srli_epi32(v, 4);
        if constexpr (kQ5) {
          const __m256i h = u8x8(reinterpret_cast<const uint8_t*>(b[i].qh) + l);
          const __m256i b1 = _mm256_and_si256(h, _mm256_set1_epi32(1 << j));
          const __m256i b2 = _mm256_and_si256(h, _mm256_set1_epi32(2 << j));
          lo = _mm256_or_si256(lo, _mm256_andnot_si256(_mm256_cmpeq_epi32(b1, _mm256_setzero_si256()), sixteen));
          hi = _mm256_or_si256(hi, _mm256_andnot_si256(_mm256_cmpeq_epi32(b2, _mm256_setzero_si256()), sixteen));
        }
        _mm256_storeu_ps(y + l, _mm256_sub_ps(rounded(_mm256_mul_ps(d1, to_f(lo))), m1));
        _mm256_storeu_ps(y + 32 + l, _mm256_sub_ps(rounded(_mm256_mul_ps(d2, to_f(hi))), m2));
      }
    }
  }
}

void dq_q6_k(const void* src, float* y, int64_t n) {
  const BlockQ6_K* b = static_cast<const BlockQ6_K*>(src);
  const __m256i mask = _mm256_set1_epi32(0xF), three = _mm256_set1_epi32(3), off = _mm256_set1_epi32(32);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = h2f(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; l += 8) {
        const int is = l / 16;
        const __m256i a = u8x8(ql + l), c = u8x8(ql + l + 32), hb = u8x8(qh + l);
        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, mask), _mm256_slli_epi32(_mm256_and_si256(hb, three), 4));
        const __m256i q2 = _mm256_or_si256(_mm256_and_si256(c, mask),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 2), three), 4));
        const __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(a, 4),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, 4), three), 4));
        const __m256i q4 = _mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_slli_epi32(_mm256_srli_epi32(hb, 6), 4));
        _mm256_storeu_ps(y + l, _mm256_mul_ps(_mm256_set1_ps(d * sc[is]), to_f(_mm256_sub_epi32(q1, off))));
        _mm256_storeu_ps(y + l + 32, _mm256_mul_ps(_mm256_set1_ps(d * sc[is + 2]), to_f(_mm256_sub_epi32(q2, off))));
        _mm256_storeu_ps(y + l + 64, _mm256_mul_ps(_mm256_set1_ps(d * sc[is + 4]), to_f(_mm256_sub_epi32(q3, off))));
        _mm256_storeu_ps(y + l + 96, _mm256_mul_ps(_mm256_set1_ps(d * sc[is + 6]), to_f(_mm256_sub_epi32(q4, off))));
      }
    }
  }
}

// Q2_K / Q3_K: per shift j of a 32-byte half of qs, the 32 elements 128 h + 32 j + l as bytes
// (Q3_K: q - 4 where the 3rd bit is clear), then four 8-element quarters of two sub-blocks. The
// products are exact (ref/dequant.cpp), so (d sc) q in any order gives the ref's bits.
template <bool kQ3, typename B>
void dq_q23_k(const void* src, float* y, int64_t n) {
  const B* b = static_cast<const B*>(src);
  const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const float d = h2f(b[i].d);
    float dl[16], ml[16] = {};
    __m256i hm = _mm256_setzero_si256();
    if constexpr (kQ3) {
      int8_t sc[16];
      q3_k_scales(b[i].scales, sc);
      for (int s = 0; s < 16; ++s) dl[s] = d * static_cast<float>(sc[s]);
      hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].hmask));
    } else {
      const float dmin = h2f(b[i].dmin);
      for (int s = 0; s < 16; ++s) {
        dl[s] = d * static_cast<float>(b[i].scales[s] & 0xF);
        ml[s] = dmin * static_cast<float>(b[i].scales[s] >> 4);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs + 32 * h));
      for (int j = 0; j < 4; ++j, y += 32) {
        __m256i v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), three);
        if constexpr (kQ3) {
          const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + j)), one);
          v = _mm256_sub_epi8(_mm256_or_si256(v, _mm256_slli_epi16(hb, 2)), four);
        }
        const __m128i halves[2] = {_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)};
        for (int t = 0; t < 4; ++t) {
          const int s = 8 * h + 2 * j + t / 2;
          const __m128i bytes = t % 2 ? _mm_srli_si128(halves[t / 2], 8) : halves[t / 2];
          const __m256 f = to_f(_mm256_cvtepi8_epi32(bytes));
          if constexpr (kQ3)
            _mm256_storeu_ps(y + 8 * t, _mm256_mul_ps(_mm256_set1_ps(dl[s]), f));
          else
            _mm256_storeu_ps(y + 8 * t, _mm256_sub_ps(rounded(_mm256_mul_ps(_mm256_set1_ps(dl[s]), f)), _mm256_set1_ps(ml[s])));
        }
      }
    }
  }
}

// 16 bytes of nibbles (one 32-group) -> y[0..31] = scale * table[nibble] (the IQ4 levels or the
// MXFP4 values, looked up with one byte shuffle).
inline void dq_iq4_group(const uint8_t* qs, float scale, float* y, const int8_t* table = kIq4nlValues) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(table));
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), nib = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_shuffle_epi8(t, _mm_and_si128(raw, nib));
  const __m128i hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(raw, 4), nib));
  const __m256 d = _mm256_set1_ps(scale);
  _mm256_storeu_ps(y, _mm256_mul_ps(d, to_f(_mm256_cvtepi8_epi32(lo))));
  _mm256_storeu_ps(y + 8, _mm256_mul_ps(d, to_f(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
  _mm256_storeu_ps(y + 16, _mm256_mul_ps(d, to_f(_mm256_cvtepi8_epi32(hi))));
  _mm256_storeu_ps(y + 24, _mm256_mul_ps(d, to_f(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
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

void register_avx2_dequant(KernelTable& t) {
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
