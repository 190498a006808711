// AVX-512 dot kernels for Precision::kF32 (decode, M <= kMaxMr): weights are unpacked to f32
// in registers and multiplied with f32 activations with FMA, f32 accumulation.
//
// 32-element block formats compute, per block b,  d_b * sum_i q_i x_i + c_b * sum_i x_i
// with q_i the raw unsigned quant and c_b the block's min (Q4_1, Q5_1) or -8 d_b / -16 d_b
// (Q4_0 / Q5_0); sum_i x_i comes precomputed per block (DotArgs::bsum). The block scales of
// 16 blocks are fetched (load_scales16) and converted together.
// Q4_K / Q5_K / Q6_K unpack in registers (Q4_K / Q5_K with per-sub-block scales and the block
// sums of x for the mins); BF16, Q2_K, Q3_K, the IQ4 formats and MXFP4 dequantize 256 elements at a
// time into an L1 buffer (the exact dequant kernel) and FMA from there; F32 and F16 stream.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 false positive in intrinsics
#include <immintrin.h>

#include <type_traits>

#include "kernels/cpu/matmul_avx512_common.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/quant_blocks.h"

namespace fathom::cpu::detail {
namespace {

using namespace fathom::quant;

DequantFn g_dequant[kFmtCount];  // this level's exact dequantizers, set at registration

// ---- F32 / F16 -------------------------------------------------------------------------------

template <bool kHalf>
inline __m512 load_w(const uint8_t* row, int64_t k) {
  if constexpr (kHalf)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k)));
  else
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
}
template <bool kHalf>
inline __m512 load_w_tail(const uint8_t* row, int64_t k, __mmask16 mask) {
  if constexpr (kHalf)
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, row + 2 * k));
  else
    return _mm512_maskz_loadu_ps(mask, reinterpret_cast<const float*>(row) + k);
}

template <bool kHalf, int MR>
void dot_float(const DotArgs& a, int64_t n0, int64_t n1) {
  const int64_t K = a.K;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    __m512 acc[MR][2];
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      const __m512 w0 = load_w<kHalf>(row, k), w1 = load_w<kHalf>(row, k + 16);
      for (int m = 0; m < MR; ++m) {
        acc[m][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(a.x + m * a.ldx + k), acc[m][0]);
        acc[m][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(a.x + m * a.ldx + k + 16), acc[m][1]);
      }
    }
    for (; k < K; k += 16) {
      const __mmask16 mask = K - k >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (K - k)) - 1);
      const __m512 w = load_w_tail<kHalf>(row, k, mask);
      for (int m = 0; m < MR; ++m)
        acc[m][0] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(mask, a.x + m * a.ldx + k), acc[m][0]);
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(_mm512_add_ps(acc[m][0], acc[m][1]));
  }
}

// ---- 32-element block formats ----------------------------------------------------------------

template <GgmlType T, int MR>
void dot_q32(const DotArgs& a, int64_t n0, int64_t n1) {
  using F = Q32<T>;
  constexpr int kOff = T == GgmlType::Q8_0 ? 0 : F::kOff;  // Q8_0 weights are used signed here
  constexpr bool kBsum = F::kMin || kOff != 0;
  static const ScaleIdx<F::kStride, F::kMin> si;
  const int64_t nb = a.K / 32;
  const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 sixteen = _mm512_set1_ps(16.0f);
  alignas(64) float dbuf[16];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    __m512 acc[MR], accc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = accc[m] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < nb; g0 += 16) {
      const int gn = static_cast<int>(nb - g0 < 16 ? nb - g0 : 16);
      const __mmask16 gmask = static_cast<__mmask16>((1u << gn) - 1);
      const uint8_t* blk = row + g0 * F::kStride;
      const __m512i dm = load_scales16<T>(blk, gn, si);
      const __m512 d16 = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
      _mm512_store_ps(dbuf, d16);
      if constexpr (kBsum) {
        const __m512 c16 = F::kMin ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1))
                                   : _mm512_mul_ps(d16, _mm512_set1_ps(-static_cast<float>(kOff)));
        for (int m = 0; m < MR; ++m)
          accc[m] = _mm512_fmadd_ps(c16, _mm512_maskz_loadu_ps(gmask, a.bsum + m * a.ldb + g0), accc[m]);
      }
      for (int j = 0; j < gn; ++j, blk += F::kStride) {
        __m512 lo, hi;
        if constexpr (T == GgmlType::Q8_0) {
          lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2))));
          hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18))));
        } else {
          const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + F::kQs)));
          lo = _mm512_permutexvar_ps(v, lut);  // float(low nibble): the permute reads 4 index bits
          hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
          if constexpr (F::kQh >= 0) {
            const uint32_t qh = load_u32(blk + F::kQh);
            lo = _mm512_mask_add_ps(lo, static_cast<__mmask16>(qh), lo, sixteen);
            hi = _mm512_mask_add_ps(hi, static_cast<__mmask16>(qh >> 16), hi, sixteen);
          }
        }
        const __m512 d = _mm512_set1_ps(dbuf[j]);
        for (int m = 0; m < MR; ++m) {
          const float* x = a.x + m * a.ldx + (g0 + j) * 32;
          const __m512 t = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(x)));
          acc[m] = _mm512_fmadd_ps(d, t, acc[m]);
        }
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(_mm512_add_ps(acc[m], accc[m]));
  }
}

// ---- K-quants in registers --------------------------------------------------------------------

// Q4_K / Q5_K: per sub-block j, (d sc_j) sum_i q_i x_i - (dmin m_j) sum_i x_i, with the
// block sums of x from DotArgs::bsum (8 per super-block, one 8-lane FMA).
template <bool kQ5, int MR>
void dot_qk45(const DotArgs& a, int64_t n0, int64_t n1) {
  using B = std::conditional_t<kQ5, BlockQ5_K, BlockQ4_K>;
  const int64_t nsb = a.K / kQKK;
  const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 sixteen = _mm512_set1_ps(16.0f);
  alignas(32) float dsc[8];
  for (int64_t n = n0; n < n1; ++n) {
    const B* b = reinterpret_cast<const B*>(a.w + n * a.row_bytes);
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
      _mm256_store_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b[i].d)), sc8));
      const __m256 dmin8 = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b[i].dmin)), mn8);
      for (int m = 0; m < MR; ++m)
        accm[m] = _mm256_fmadd_ps(dmin8, _mm256_loadu_ps(a.bsum + m * a.ldb + i * 8), accm[m]);
      for (int c = 0; c < 4; ++c) {
        __m512 ta[MR], tb[MR];
        for (int m = 0; m < MR; ++m) ta[m] = tb[m] = _mm512_setzero_ps();
        for (int l = 0; l < 32; l += 16) {
          const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs + 32 * c + l)));
          __m512 lo = _mm512_permutexvar_ps(v, lut);  // uses the low 4 bits of each lane
          __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
          if constexpr (kQ5) {
            const __m512i h = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qh + l)));
            lo = _mm512_mask_add_ps(lo, _mm512_test_epi32_mask(h, _mm512_set1_epi32(1 << (2 * c))), lo, sixteen);
            hi = _mm512_mask_add_ps(hi, _mm512_test_epi32_mask(h, _mm512_set1_epi32(2 << (2 * c))), hi, sixteen);
          }
          for (int m = 0; m < MR; ++m) {
            const float* x = a.x + m * a.ldx + i * kQKK + 64 * c + l;
            ta[m] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x), ta[m]);
            tb[m] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 32), tb[m]);
          }
        }
        const __m512 da = _mm512_set1_ps(dsc[2 * c]), db = _mm512_set1_ps(dsc[2 * c + 1]);
        for (int m = 0; m < MR; ++m) acc[m] = _mm512_fmadd_ps(db, tb[m], _mm512_fmadd_ps(da, ta[m], acc[m]));
      }
    }
    for (int m = 0; m < MR; ++m) {
      const __m128 t = _mm_add_ps(_mm256_castps256_ps128(accm[m]), _mm256_extractf128_ps(accm[m], 1));
      const __m128 t2 = _mm_add_ps(t, _mm_movehl_ps(t, t));
      a.y[m * a.ldy + n] = hsum(acc[m]) - _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
    }
  }
}

// Q6_K: 16-element groups with their own scale: w = (d sc_g) (q - 32).
template <int MR>
void dot_q6_k(const DotArgs& a, int64_t n0, int64_t n1) {
  const int64_t nsb = a.K / kQKK;
  const __m512i nib = _mm512_set1_epi32(0xF), three = _mm512_set1_epi32(3), off = _mm512_set1_epi32(32);
  for (int64_t n = n0; n < n1; ++n) {
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(a.w + n * a.row_bytes);
    __m512 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i) {
      const float d = _cvtsh_ss(b[i].d);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b[i].ql + 64 * h;
        const uint8_t* qh = b[i].qh + 32 * h;
        const int8_t* sc = b[i].scales + 8 * h;
        for (int l = 0; l < 32; l += 16) {
          const __m512i A = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + l)));
          const __m512i C = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + l + 32)));
          const __m512i H = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + l)));
          const __m512i q[4] = {
              _mm512_or_si512(_mm512_and_si512(A, nib), _mm512_slli_epi32(_mm512_and_si512(H, three), 4)),
              _mm512_or_si512(_mm512_and_si512(C, nib), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H, 2), three), 4)),
              _mm512_or_si512(_mm512_srli_epi32(A, 4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(H, 4), three), 4)),
              _mm512_or_si512(_mm512_srli_epi32(C, 4), _mm512_slli_epi32(_mm512_srli_epi32(H, 6), 4)),
          };
          for (int t = 0; t < 4; ++t) {
            // Elements 128 h + 32 t + l .. +16: group 2 t + l / 16 of this half.
            const __m512 w = _mm512_mul_ps(_mm512_set1_ps(d * sc[2 * t + l / 16]),
                                           _mm512_cvtepi32_ps(_mm512_sub_epi32(q[t], off)));
            for (int m = 0; m < MR; ++m)
              acc[m] = _mm512_fmadd_ps(w, _mm512_loadu_ps(a.x + m * a.ldx + i * kQKK + 128 * h + 32 * t + l), acc[m]);
          }
        }
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]);
  }
}

// ---- any format through the exact dequantizer --------------------------------------------------

// Bytes of 256 elements.
constexpr int64_t chunk_bytes(int f) {
  switch (f) {
    case kBF16: return 512;
    case kQ2_K: return 84;
    case kQ3_K: return 110;
    case kIQ4_NL: return 8 * 18;
    case kIQ4_XS: return 136;
    case kMXFP4: return 8 * 17;
    default: return 0;  // no dot_dequant kernel
  }
}

template <int F, int MR>
void dot_dequant(const DotArgs& a, int64_t n0, int64_t n1) {
  constexpr int64_t kChunk = 256;
  alignas(64) float buf[kChunk];
  const DequantFn dq = g_dequant[F];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    // dot_float's order of operations (two accumulators over 32-column steps, then masked
    // 16-column steps into the first; chunks are whole steps): bitwise F32's and F16's products.
    __m512 acc[MR][2];
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < a.K; k0 += kChunk) {
      // The last chunk of a BF16 row may be short (masked below).
      const int64_t kc = a.K - k0 < kChunk ? a.K - k0 : kChunk;
      dq(row + k0 / kChunk * chunk_bytes(F), buf, kc);
      int64_t k = 0;
      for (; k + 32 <= kc; k += 32) {
        const __m512 w0 = _mm512_load_ps(buf + k), w1 = _mm512_load_ps(buf + k + 16);
        for (int m = 0; m < MR; ++m) {
          acc[m][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(a.x + m * a.ldx + k0 + k), acc[m][0]);
          acc[m][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(a.x + m * a.ldx + k0 + k + 16), acc[m][1]);
        }
      }
      for (; k < kc; k += 16) {
        const __mmask16 mask = kc - k >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (kc - k)) - 1);
        const __m512 w = _mm512_maskz_loadu_ps(mask, buf + k);
        for (int m = 0; m < MR; ++m)
          acc[m][0] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(mask, a.x + m * a.ldx + k0 + k), acc[m][0]);
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(_mm512_add_ps(acc[m][0], acc[m][1]));
  }
}

template <bool kHalf> struct FloatK { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_float<kHalf, MR>(a, b, e); } }; };
template <GgmlType T> struct Q32K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q32<T, MR>(a, b, e); } }; };
template <bool kQ5> struct QK45K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_qk45<kQ5, MR>(a, b, e); } }; };
template <int MR> struct Q6K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q6_k<MR>(a, b, e); } };
template <int F> struct DqK { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_dequant<F, MR>(a, b, e); } }; };

}  // namespace

void register_avx512_dot_f32(KernelTable& t) {
  for (int f = 0; f < kFmtCount; ++f) g_dequant[f] = t.dequant[f];
  t.dot_f32[kF32] = by_mr<FloatK<false>::K>;
  t.dot_f32[kF16] = by_mr<FloatK<true>::K>;
  t.dot_f32[kQ4_0] = by_mr<Q32K<GgmlType::Q4_0>::K>;
  t.dot_f32[kQ4_1] = by_mr<Q32K<GgmlType::Q4_1>::K>;
  t.dot_f32[kQ5_0] = by_mr<Q32K<GgmlType::Q5_0>::K>;
  t.dot_f32[kQ5_1] = by_mr<Q32K<GgmlType::Q5_1>::K>;
  t.dot_f32[kQ8_0] = by_mr<Q32K<GgmlType::Q8_0>::K>;
  if (g_dequant[kBF16]) t.dot_f32[kBF16] = by_mr<DqK<kBF16>::K>;
  t.dot_f32[kQ4_K] = by_mr<QK45K<false>::K>;
  t.dot_f32[kQ5_K] = by_mr<QK45K<true>::K>;
  t.dot_f32[kQ6_K] = by_mr<Q6K>;
  // Q2_K, Q3_K, IQ4_NL, IQ4_XS: the exact dequantizer into an L1 buffer, then FMA (the kQ8
  // kernels are their decode path).
  t.dot_f32[kQ2_K] = by_mr<DqK<kQ2_K>::K>;
  t.dot_f32[kQ3_K] = by_mr<DqK<kQ3_K>::K>;
  t.dot_f32[kIQ4_NL] = by_mr<DqK<kIQ4_NL>::K>;
  t.dot_f32[kIQ4_XS] = by_mr<DqK<kIQ4_XS>::K>;
  t.dot_f32[kMXFP4] = by_mr<DqK<kMXFP4>::K>;
}

}  // namespace fathom::cpu::detail
