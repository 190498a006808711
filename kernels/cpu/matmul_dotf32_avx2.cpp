// AVX2 dot kernels for Precision::kF32 (decode, M <= kMaxMr); same scheme as the AVX-512
// file: 32-element block formats compute d_b * sum_i q_i x_i + c_b * sum_i x_i per block
// (c_b = min, or -8 d_b / -16 d_b for Q4_0 / Q5_0) with the precomputed block sums of x;
// Q4_K / Q5_K / Q6_K unpack in registers; BF16, Q2_K, Q3_K, the IQ4 formats and MXFP4 go through the
// exact dequantizer 256 elements at a time; F32 / F16 stream.
#include <immintrin.h>

#include <type_traits>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/quant_blocks.h"

namespace fathom::cpu::detail {
namespace {

using namespace fathom::quant;

DequantFn g_dequant[kFmtCount];  // this level's exact dequantizers, set at registration

using cpu::simd256::hsum;

template <bool kHalf>
inline __m256 load_w(const uint8_t* row, int64_t k) {
  if constexpr (kHalf)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
  else
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
}

template <bool kHalf, int MR>
void dot_float(const DotArgs& a, int64_t n0, int64_t n1) {
  const int64_t K = a.K;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    __m256 acc[MR][2];
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      const __m256 w0 = load_w<kHalf>(row, k), w1 = load_w<kHalf>(row, k + 8);
      for (int m = 0; m < MR; ++m) {
        acc[m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a.x + m * a.ldx + k), acc[m][0]);
        acc[m][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a.x + m * a.ldx + k + 8), acc[m][1]);
      }
    }
    float tail[MR] = {};
    for (; k < K; ++k) {
      float w;
      if constexpr (kHalf) w = _cvtsh_ss(reinterpret_cast<const uint16_t*>(row)[k]);
      else w = reinterpret_cast<const float*>(row)[k];
      for (int m = 0; m < MR; ++m) tail[m] += w * a.x[m * a.ldx + k];
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(_mm256_add_ps(acc[m][0], acc[m][1])) + tail[m];
  }
}

template <GgmlType T> struct Q32;
template <> struct Q32<GgmlType::Q4_0> { static constexpr int kStride = 18, kQs = 2, kQh = -1, kOff = 8, kM = -1; };
template <> struct Q32<GgmlType::Q4_1> { static constexpr int kStride = 20, kQs = 4, kQh = -1, kOff = 0, kM = 2; };
template <> struct Q32<GgmlType::Q5_0> { static constexpr int kStride = 22, kQs = 6, kQh = 2, kOff = 16, kM = -1; };
template <> struct Q32<GgmlType::Q5_1> { static constexpr int kStride = 24, kQs = 8, kQh = 4, kOff = 0, kM = 2; };
template <> struct Q32<GgmlType::Q8_0> { static constexpr int kStride = 34, kQs = 2, kQh = -1, kOff = 0, kM = -1; };

inline __m256i bit4(uint32_t bits, int j0) {
  const __m256i sh = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(j0));
  const __m256i b = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(bits)), sh), _mm256_set1_epi32(1));
  return _mm256_slli_epi32(b, 4);
}

template <GgmlType T, int MR>
void dot_q32(const DotArgs& a, int64_t n0, int64_t n1) {
  using F = Q32<T>;
  const int64_t nb = a.K / 32;
  const __m256i nib = _mm256_set1_epi32(0xF);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* blk = a.w + n * a.row_bytes;
    __m256 acc[MR];
    float corr[MR] = {};
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, blk += F::kStride) {
      uint16_t dh;
      __builtin_memcpy(&dh, blk, 2);
      const float d = _cvtsh_ss(dh);
      __m256 w[4];  // elements 0-7, 8-15, 16-23, 24-31 as floats
      if constexpr (T == GgmlType::Q8_0) {
        for (int j = 0; j < 4; ++j)
          w[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * j))));
      } else {
        uint32_t qh = 0;
        if constexpr (F::kQh >= 0) qh = load_u32(blk + F::kQh);
        for (int j = 0; j < 2; ++j) {
          const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + F::kQs + 8 * j)));
          __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_srli_epi32(v, 4);
          if constexpr (F::kQh >= 0) {
            lo = _mm256_or_si256(lo, bit4(qh, 8 * j));
            hi = _mm256_or_si256(hi, bit4(qh, 16 + 8 * j));
          }
          w[j] = _mm256_cvtepi32_ps(lo);
          w[j + 2] = _mm256_cvtepi32_ps(hi);
        }
      }
      float c = 0.0f;  // per-block constant times sum(x)
      if constexpr (F::kM >= 0) {
        uint16_t mh;
        __builtin_memcpy(&mh, blk + F::kM, 2);
        c = _cvtsh_ss(mh);
      } else if constexpr (F::kOff != 0) {
        c = -static_cast<float>(F::kOff) * d;
      }
      const __m256 vd = _mm256_set1_ps(d);
      for (int m = 0; m < MR; ++m) {
        const float* x = a.x + m * a.ldx + b * 32;
        __m256 t = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
        t = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), t);
        t = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), t);
        t = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), t);
        acc[m] = _mm256_fmadd_ps(vd, t, acc[m]);
        if constexpr (F::kM >= 0 || F::kOff != 0) corr[m] += c * a.bsum[m * a.ldb + b];
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]) + corr[m];
  }
}

// Q4_K / Q5_K in registers: per sub-block j, (d sc_j) sum_i q_i x_i - (dmin m_j) sum_i x_i,
// with the block sums of x from DotArgs::bsum.
template <bool kQ5, int MR>
void dot_qk45(const DotArgs& a, int64_t n0, int64_t n1) {
  using B = std::conditional_t<kQ5, BlockQ5_K, BlockQ4_K>;
  const int64_t nsb = a.K / kQKK;
  const __m256i nib = _mm256_set1_epi32(0xF);
  const __m256 sixteen = _mm256_set1_ps(16.0f);
  alignas(32) float dsc[8];
  for (int64_t n = n0; n < n1; ++n) {
    const B* b = reinterpret_cast<const B*>(a.w + n * a.row_bytes);
    __m256 acc[MR], accm[MR];
    for (int m = 0; m < MR; ++m) acc[m] = accm[m] = _mm256_setzero_ps();
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
        __m256 ta[MR], tb[MR];
        for (int m = 0; m < MR; ++m) ta[m] = tb[m] = _mm256_setzero_ps();
        for (int l = 0; l < 32; l += 8) {
          const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + 32 * c + l)));
          __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, nib));
          __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
          if constexpr (kQ5) {
            const __m256i h = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qh + l)));
            const __m256i z = _mm256_setzero_si256();
            const __m256 ba = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(h, _mm256_set1_epi32(1 << (2 * c))), z));
            const __m256 bb = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(h, _mm256_set1_epi32(2 << (2 * c))), z));
            lo = _mm256_add_ps(lo, _mm256_andnot_ps(ba, sixteen));
            hi = _mm256_add_ps(hi, _mm256_andnot_ps(bb, sixteen));
          }
          for (int m = 0; m < MR; ++m) {
            const float* x = a.x + m * a.ldx + i * kQKK + 64 * c + l;
            ta[m] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), ta[m]);
            tb[m] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 32), tb[m]);
          }
        }
        const __m256 da = _mm256_set1_ps(dsc[2 * c]), db = _mm256_set1_ps(dsc[2 * c + 1]);
        for (int m = 0; m < MR; ++m) acc[m] = _mm256_fmadd_ps(db, tb[m], _mm256_fmadd_ps(da, ta[m], acc[m]));
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]) - hsum(accm[m]);
  }
}

// Q6_K in registers: w = (d sc_g) (q - 32) per 16-element group g.
template <int MR>
void dot_q6_k(const DotArgs& a, int64_t n0, int64_t n1) {
  const int64_t nsb = a.K / kQKK;
  const __m256i nib = _mm256_set1_epi32(0xF), three = _mm256_set1_epi32(3), off = _mm256_set1_epi32(32);
  for (int64_t n = n0; n < n1; ++n) {
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(a.w + n * a.row_bytes);
    __m256 acc[MR];
    for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i) {
      const float d = _cvtsh_ss(b[i].d);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b[i].ql + 64 * h;
        const uint8_t* qh = b[i].qh + 32 * h;
        const int8_t* sc = b[i].scales + 8 * h;
        for (int l = 0; l < 32; l += 8) {
          const __m256i A = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ql + l)));
          const __m256i C = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ql + l + 32)));
          const __m256i H = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qh + l)));
          const __m256i q[4] = {
              _mm256_or_si256(_mm256_and_si256(A, nib), _mm256_slli_epi32(_mm256_and_si256(H, three), 4)),
              _mm256_or_si256(_mm256_and_si256(C, nib), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(H, 2), three), 4)),
              _mm256_or_si256(_mm256_srli_epi32(A, 4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(H, 4), three), 4)),
              _mm256_or_si256(_mm256_srli_epi32(C, 4), _mm256_slli_epi32(_mm256_srli_epi32(H, 6), 4)),
          };
          for (int t = 0; t < 4; ++t) {
            const __m256 w = _mm256_mul_ps(_mm256_set1_ps(d * sc[2 * t + l / 16]),
                                           _mm256_cvtepi32_ps(_mm256_sub_epi32(q[t], off)));
            for (int m = 0; m < MR; ++m)
              acc[m] = _mm256_fmadd_ps(w, _mm256_loadu_ps(a.x + m * a.ldx + i * kQKK + 128 * h + 32 * t + l), acc[m]);
          }
        }
      }
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(acc[m]);
  }
}

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

// dot_float's order of operations over the dequantized values (two accumulators over 16-column
// steps, a scalar tail past the last whole step; chunks are whole steps), so a matrix gives
// bitwise the same products as F32 or F16 (a model's Hugging Face BF16 directory as its GGUF).
template <int F, int MR>
void dot_dequant(const DotArgs& a, int64_t n0, int64_t n1) {
  constexpr int64_t kChunk = 256;
  alignas(32) float buf[kChunk];
  const DequantFn dq = g_dequant[F];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = a.w + n * a.row_bytes;
    __m256 acc[MR][2];
    float tail[MR] = {};
    for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < a.K; k0 += kChunk) {
      const int64_t kc = a.K - k0 < kChunk ? a.K - k0 : kChunk;
      dq(row + k0 / kChunk * chunk_bytes(F), buf, kc);
      int64_t k = 0;
      for (; k + 16 <= kc; k += 16) {
        const __m256 w0 = _mm256_load_ps(buf + k), w1 = _mm256_load_ps(buf + k + 8);
        for (int m = 0; m < MR; ++m) {
          acc[m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a.x + m * a.ldx + k0 + k), acc[m][0]);
          acc[m][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a.x + m * a.ldx + k0 + k + 8), acc[m][1]);
        }
      }
      for (; k < kc; ++k)
        for (int m = 0; m < MR; ++m) tail[m] += buf[k] * a.x[m * a.ldx + k0 + k];
    }
    for (int m = 0; m < MR; ++m) a.y[m * a.ldy + n] = hsum(_mm256_add_ps(acc[m][0], acc[m][1])) + tail[m];
  }
}

#include "kernels/cpu/matmul_by_mr.inc"  // by_mr, this file's own copy

template <bool kHalf> struct FloatK { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_float<kHalf, MR>(a, b, e); } }; };
template <GgmlType T> struct Q32K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q32<T, MR>(a, b, e); } }; };
template <bool kQ5> struct QK45K { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_qk45<kQ5, MR>(a, b, e); } }; };
template <int MR> struct Q6K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_q6_k<MR>(a, b, e); } };
template <int F> struct DqK { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_dequant<F, MR>(a, b, e); } }; };

}  // namespace

void register_avx2_dot_f32(KernelTable& t) {
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
