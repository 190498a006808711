// AVX2 f32 GEMM tile kernel (prefill) and activation quantization for Precision::kQ8.
// gemm_f32 transposes the dequantized weight tile into panels p[K][16] and runs a 6 x 16
// outer-product microkernel (12 accumulators, 2 panel loads + 6 broadcasts per k).
#include <immintrin.h>

#include "kernels/cpu/matmul_kernels.h"

namespace fathom::cpu::detail {
namespace {

constexpr int kNr = 16;
constexpr int kMr = 6;
constexpr int kMaxK = 256;

inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// panel[k][0..16) = w[n][k] for n < N (zero for n >= N), k < K rounded up to 8.
void pack_panel(const float* w, int64_t ldw, int64_t N, int64_t K, float* panel) {
  alignas(32) float tmp[8];
  for (int64_t k0 = 0; k0 < K; k0 += 8) {
    const int64_t kc = K - k0 < 8 ? K - k0 : 8;
    for (int h = 0; h < 2; ++h) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const int64_t n = h * 8 + i;
        if (n >= N) {
          r[i] = _mm256_setzero_ps();
        } else if (kc == 8) {
          r[i] = _mm256_loadu_ps(w + n * ldw + k0);
        } else {
          for (int j = 0; j < 8; ++j) tmp[j] = j < kc ? w[n * ldw + k0 + j] : 0.0f;
          r[i] = _mm256_load_ps(tmp);
        }
      }
      transpose8(r);
      for (int i = 0; i < 8; ++i) _mm256_store_ps(panel + (k0 + i) * kNr + h * 8, r[i]);
    }
  }
}

template <int MR>
void micro(const float* x, int64_t ldx, const float* panel, int64_t K, float* y, int64_t ldy, int64_t ncols,
           bool accumulate) {
  __m256 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_load_ps(panel + k * kNr), w1 = _mm256_load_ps(panel + k * kNr + 8);
    for (int m = 0; m < MR; ++m) {
      const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
      acc[m][0] = _mm256_fmadd_ps(xb, w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(xb, w1, acc[m][1]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    float* yr = y + m * ldy;
    if (ncols == kNr) {
      if (accumulate) {
        acc[m][0] = _mm256_add_ps(acc[m][0], _mm256_loadu_ps(yr));
        acc[m][1] = _mm256_add_ps(acc[m][1], _mm256_loadu_ps(yr + 8));
      }
      _mm256_storeu_ps(yr, acc[m][0]);
      _mm256_storeu_ps(yr + 8, acc[m][1]);
    } else {
      alignas(32) float out[kNr];
      _mm256_store_ps(out, acc[m][0]);
      _mm256_store_ps(out + 8, acc[m][1]);
      for (int64_t j = 0; j < ncols; ++j) yr[j] = accumulate ? yr[j] + out[j] : out[j];
    }
  }
}

using MicroFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, bool);
constexpr MicroFn kMicro[kMr + 1] = {nullptr, micro<1>, micro<2>, micro<3>, micro<4>, micro<5>, micro<6>};

void gemm_f32(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t M, int64_t N, int64_t K,
              float* y, int64_t ldy, bool accumulate) {
  alignas(32) float panel[kMaxK * kNr];
  for (int64_t k0 = 0; k0 < K; k0 += kMaxK) {
    const int64_t kc = K - k0 < kMaxK ? K - k0 : kMaxK;
    const bool acc = accumulate || k0 > 0;
    for (int64_t n0 = 0; n0 < N; n0 += kNr) {
      const int64_t nc = N - n0 < kNr ? N - n0 : kNr;
      pack_panel(w + n0 * ldw + k0, ldw, nc, kc, panel);
      for (int64_t m0 = 0; m0 < M; m0 += kMr) {
        const int64_t mr = M - m0 < kMr ? M - m0 : kMr;
        kMicro[mr](x + m0 * ldx + k0, ldx, panel, kc, y + m0 * ldy + n0, ldy, nc, acc);
      }
    }
  }
}

inline int32_t hsum_i32(__m256i v) {
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(t);
}

void quantize_q8(const float* x, int64_t K, int8_t* q, float* qd, int32_t* qsum, int16_t* qsum16) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 32; ++b, x += 32, q += 32) {
    __m256 v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + 8 * j);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                              _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i i[4];
    for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vid));
    const int32_t s0 = hsum_i32(_mm256_add_epi32(i[0], i[1])), s1 = hsum_i32(_mm256_add_epi32(i[2], i[3]));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    qd[b] = d;
    qsum[b] = s0 + s1;
    qsum16[2 * b] = static_cast<int16_t>(s0);
    qsum16[2 * b + 1] = static_cast<int16_t>(s1);
  }
}

}  // namespace

void register_avx2_gemm(KernelTable& t) {
  t.gemm_f32 = gemm_f32;
  t.quantize_q8 = quantize_q8;
}

}  // namespace fathom::cpu::detail
