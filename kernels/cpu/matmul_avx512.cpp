// AVX-512 f32 GEMM tile kernel (prefill) and activation quantization for Precision::kQ8.
//
// gemm_f32: y[M][N] (+)= x[M][K] . w[N][K]^T for one dequantized weight tile (N <= 32 rows,
// K <= 256 columns, both L1/L2-resident). The tile is transposed into a panel p[K][32] so the
// microkernel is an outer product: per k, 2 vector loads of p and 8 broadcasts of x feed
// 16 FMAs into an 8 x 32 block of y held in 16 registers (no horizontal sums).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 false positive in intrinsics
#include <immintrin.h>

#include "kernels/cpu/matmul_kernels.h"

namespace fathom::cpu::detail {
namespace {

constexpr int kNr = 32;    // panel width (columns of y per microkernel)
constexpr int kMr = 8;     // rows of y per microkernel
constexpr int kMaxK = 256;  // the driver's tile depth

// 16x16 transpose of rows r[0..15] (16 floats each) in registers.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // r[4q + j]: row-quad q, column j within each 128-bit lane (lane L = columns 4L..4L+3).
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], _MM_SHUFFLE(2, 0, 2, 0));
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], _MM_SHUFFLE(3, 1, 3, 1));
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], _MM_SHUFFLE(2, 0, 2, 0));
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], _MM_SHUFFLE(3, 1, 3, 1));
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// panel[k][0..32) = w[n][k] for n < N (zero for n >= N), k < K rounded up to 16.
void pack_panel(const float* w, int64_t ldw, int64_t N, int64_t K, float* panel) {
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    const __mmask16 km = K - k0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (K - k0)) - 1);
    for (int h = 0; h < 2; ++h) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t n = h * 16 + i;
        r[i] = n < N ? _mm512_maskz_loadu_ps(km, w + n * ldw + k0) : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_store_ps(panel + (k0 + i) * kNr + h * 16, r[i]);
    }
  }
}

template <int MR>
void micro(const float* x, int64_t ldx, const float* panel, int64_t K, float* y, int64_t ldy, int64_t ncols,
           bool accumulate) {
  __m512 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m512 w0 = _mm512_load_ps(panel + k * kNr), w1 = _mm512_load_ps(panel + k * kNr + 16);
    for (int m = 0; m < MR; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * ldx + k]);
      acc[m][0] = _mm512_fmadd_ps(xb, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(xb, w1, acc[m][1]);
    }
  }
  const __mmask16 m0 = ncols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << ncols) - 1);
  const __mmask16 m1 = ncols >= 32 ? 0xFFFF : ncols <= 16 ? 0 : static_cast<__mmask16>((1u << (ncols - 16)) - 1);
  for (int m = 0; m < MR; ++m) {
    float* yr = y + m * ldy;
    if (accumulate) {
      acc[m][0] = _mm512_add_ps(acc[m][0], _mm512_maskz_loadu_ps(m0, yr));
      acc[m][1] = _mm512_add_ps(acc[m][1], _mm512_maskz_loadu_ps(m1, yr + 16));
    }
    _mm512_mask_storeu_ps(yr, m0, acc[m][0]);
    _mm512_mask_storeu_ps(yr + 16, m1, acc[m][1]);
  }
}

using MicroFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, bool);
constexpr MicroFn kMicro[kMr + 1] = {nullptr, micro<1>, micro<2>, micro<3>, micro<4>,
                                     micro<5>, micro<6>, micro<7>, micro<8>};

void gemm_f32(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t M, int64_t N, int64_t K,
              float* y, int64_t ldy, bool accumulate) {
  alignas(64) float panel[kMaxK * kNr];
  for (int64_t k0 = 0; k0 < K; k0 += kMaxK) {  // the driver passes K <= kMaxK; loop for safety
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

// ---- activation quantization ----------------------------------------------------------------

void quantize_q8(const float* x, int64_t K, int8_t* q, float* qd, int32_t* qsum, int16_t* qsum16) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 32; ++b, x += 32, q += 32) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(q1));
    const int32_t s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
    qd[b] = d;
    qsum[b] = s0 + s1;
    qsum16[2 * b] = static_cast<int16_t>(s0);
    qsum16[2 * b + 1] = static_cast<int16_t>(s1);
  }
}

}  // namespace

void register_avx512_gemm(KernelTable& t) {
  t.gemm_f32 = gemm_f32;
  t.quantize_q8 = quantize_q8;
}

}  // namespace fathom::cpu::detail
