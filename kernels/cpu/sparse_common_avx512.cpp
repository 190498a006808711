// AVX-512 instantiation of the sparse-attention inner loops (F16C conversion in registers,
// masked tails, vectorised exp).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/sparse_common.h"

namespace fathom::cpu::sparse {
namespace {
using namespace simd512;

// Any KV element type (simd512::load16 / maskz_load16 overloads) as one callable each, for the
// templates below.
constexpr auto kLoad = [](const auto* p) { return load16(p); };
constexpr auto kMaskLoad = [](__mmask16 m, const auto* p) { return maskz_load16(m, p); };

float h2f(uint16_t h) { return _cvtsh_ss(h); }

// Two accumulators over 32-element steps, then a masked tail.
template <typename T, typename Load, typename MaskLoad>
float dot_any(const float* q, const T* k, int32_t n, Load load, MaskLoad mload) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int32_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load(k + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), load(k + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load(k + i), s0);
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i), mload(m, k + i), s1);
  }
  return hsum(_mm512_add_ps(s0, s1));
}
float dot_f32(const float* q, const float* k, int32_t n) { return dot_any(q, k, n, kLoad, kMaskLoad); }
float dot_f16(const float* q, const uint16_t* k, int32_t n) { return dot_any(q, k, n, kLoad, kMaskLoad); }
float dot_u8(const float* q, const uint8_t* k, int32_t n) { return dot_any(q, k, n, kLoad, kMaskLoad); }

template <typename T, typename Load, typename MaskLoad>
void axpy_any(float a, const T* x, float* y, int32_t n, Load load, MaskLoad mload) {
  const __m512 va = _mm512_set1_ps(a);
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, mload(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}
void axpy_f32(float a, const float* x, float* y, int32_t n) { axpy_any(a, x, y, n, kLoad, kMaskLoad); }
void axpy_f16(float a, const uint16_t* x, float* y, int32_t n) { axpy_any(a, x, y, n, kLoad, kMaskLoad); }
void axpy_u8(float a, const uint8_t* x, float* y, int32_t n) { axpy_any(a, x, y, n, kLoad, kMaskLoad); }

// SparQ step 1 on 16 positions of a k_t tile (dimension rows `stride` elements apart):
// out[j·ld + s] = Σ_i qr[j·r + i]·tile[dims[i]][s], the G accumulators in registers (G a template
// parameter up to 8).
template <int G, typename T, typename Load>
void kt_tile16_g(const T* tile, const int32_t* dims, int32_t r, const float* qr, float* out, int64_t ld, int32_t n_t,
                 int32_t stride, float* sum, Load load) {
  __m512 acc[G];
  for (int j = 0; j < G; ++j) acc[j] = _mm512_setzero_ps();
  for (int32_t i = 0; i < r; ++i) {
    const __m512 row = load(tile + static_cast<int64_t>(dims[i]) * stride);
    for (int j = 0; j < G; ++j) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(qr[j * r + i]), row, acc[j]);
  }
  const __mmask16 m = lanes16(n_t);
  for (int j = 0; j < G; ++j) _mm512_mask_storeu_ps(out + j * ld, m, acc[j]);
  if (sum == nullptr) return;
  __m512 total = acc[0];  // row 0 + row 1 + …, group_sum's order
  for (int j = 1; j < G; ++j) total = _mm512_add_ps(total, acc[j]);
  _mm512_mask_storeu_ps(sum, m, total);
}
// Two tiles at once, 32 consecutive positions (a's 16, then b's n_b ≤ 16): 2·G independent FMA
// chains where one tile has G, each tile's arithmetic the same as kt_tile16_g's (same bits).
template <int G, typename T, typename Load>
void kt_tile16x2_g(const T* a, const T* b, const int32_t* dims, int32_t r, const float* qr, float* out, int64_t ld,
                   int32_t n_b, int32_t stride, float* sum, Load load) {
  __m512 acc_a[G], acc_b[G];
  for (int j = 0; j < G; ++j) acc_a[j] = acc_b[j] = _mm512_setzero_ps();
  for (int32_t i = 0; i < r; ++i) {
    const int64_t off = static_cast<int64_t>(dims[i]) * stride;
    const __m512 row_a = load(a + off), row_b = load(b + off);
    for (int j = 0; j < G; ++j) {
      const __m512 w = _mm512_set1_ps(qr[j * r + i]);
      acc_a[j] = _mm512_fmadd_ps(w, row_a, acc_a[j]);
      acc_b[j] = _mm512_fmadd_ps(w, row_b, acc_b[j]);
    }
  }
  const __mmask16 m = lanes16(n_b);
  for (int j = 0; j < G; ++j) {
    _mm512_storeu_ps(out + j * ld, acc_a[j]);
    _mm512_mask_storeu_ps(out + j * ld + 16, m, acc_b[j]);
  }
  if (sum == nullptr) return;
  __m512 total_a = acc_a[0], total_b = acc_b[0];  // row 0 + row 1 + …, group_sum's order
  for (int j = 1; j < G; ++j) {
    total_a = _mm512_add_ps(total_a, acc_a[j]);
    total_b = _mm512_add_ps(total_b, acc_b[j]);
  }
  _mm512_storeu_ps(sum, total_a);
  _mm512_mask_storeu_ps(sum + 16, m, total_b);
}
template <typename T>
bool kt_tile16x2(const T* a, const T* b, const int32_t* dims, int32_t r, const float* qr, int32_t G, float* out,
                 int64_t ld, int32_t n_b, int32_t stride, float* sum) {
  switch (G) {
    case 1: kt_tile16x2_g<1>(a, b, dims, r, qr, out, ld, n_b, stride, sum, kLoad); return true;
    case 2: kt_tile16x2_g<2>(a, b, dims, r, qr, out, ld, n_b, stride, sum, kLoad); return true;
    case 3: kt_tile16x2_g<3>(a, b, dims, r, qr, out, ld, n_b, stride, sum, kLoad); return true;
    case 4: kt_tile16x2_g<4>(a, b, dims, r, qr, out, ld, n_b, stride, sum, kLoad); return true;
    case 5: kt_tile16x2_g<5>(a, b, dims, r, qr, out, ld, n_b, stride, sum, kLoad); return true;
    case 6: kt_tile16x2_g<6>(a, b, dims, r, qr, out, ld, n_b, stride, sum, kLoad); return true;
    case 7: kt_tile16x2_g<7>(a, b, dims, r, qr, out, ld, n_b, stride, sum, kLoad); return true;
    case 8: kt_tile16x2_g<8>(a, b, dims, r, qr, out, ld, n_b, stride, sum, kLoad); return true;
    default: return false;
  }
}
template <typename T, typename Load>
bool kt_tile16_any(const T* tile, const int32_t* dims, int32_t r, const float* qr, int32_t G, float* out, int64_t ld,
                   int32_t n_t, int32_t stride, float* sum, Load load) {
  switch (G) {
    case 1: kt_tile16_g<1>(tile, dims, r, qr, out, ld, n_t, stride, sum, load); return true;
    case 2: kt_tile16_g<2>(tile, dims, r, qr, out, ld, n_t, stride, sum, load); return true;
    case 3: kt_tile16_g<3>(tile, dims, r, qr, out, ld, n_t, stride, sum, load); return true;
    case 4: kt_tile16_g<4>(tile, dims, r, qr, out, ld, n_t, stride, sum, load); return true;
    case 5: kt_tile16_g<5>(tile, dims, r, qr, out, ld, n_t, stride, sum, load); return true;
    case 6: kt_tile16_g<6>(tile, dims, r, qr, out, ld, n_t, stride, sum, load); return true;
    case 7: kt_tile16_g<7>(tile, dims, r, qr, out, ld, n_t, stride, sum, load); return true;
    case 8: kt_tile16_g<8>(tile, dims, r, qr, out, ld, n_t, stride, sum, load); return true;
    default: return false;
  }
}
// Returns false when not handled (G > 8): the caller takes the generic path.
bool kt_tile16(const float* tile, const int32_t* dims, int32_t r, const float* qr, int32_t G, float* out,
               int64_t ld, int32_t n_t, int32_t stride, float* sum) {
  return kt_tile16_any(tile, dims, r, qr, G, out, ld, n_t, stride, sum, kLoad);
}
bool kt_tile16(const uint16_t* tile, const int32_t* dims, int32_t r, const float* qr, int32_t G, float* out,
               int64_t ld, int32_t n_t, int32_t stride, float* sum) {
  return kt_tile16_any(tile, dims, r, qr, G, out, ld, n_t, stride, sum, kLoad);
}
bool kt_tile16(const uint8_t* tile, const int32_t* dims, int32_t r, const float* qr, int32_t G, float* out,
               int64_t ld, int32_t n_t, int32_t stride, float* sum) {
  return kt_tile16_any(tile, dims, r, qr, G, out, ld, n_t, stride, sum, kLoad);
}

// Lane i of the result = the sum of the 16 lanes of v[i] (a transpose-and-add tree: 45 shuffles and
// adds for 16 sums, against ~8 per sum one by one).
inline __m512 sum_lanes16(const __m512* v) {
  __m512 a[8], b[4];
  for (int k = 0; k < 8; ++k)  // per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3], x = v[2k], y = v[2k+1]
    a[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  for (int k = 0; k < 4; ++k) {  // per 128-bit lane: the lane's sums of v[4k .. 4k+3]
    const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(a[2 * k]), _mm512_castps_pd(a[2 * k + 1]));
    const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(a[2 * k]), _mm512_castps_pd(a[2 * k + 1]));
    b[k] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  }
  // b[k]'s four 128-bit lanes each hold partial sums of v[4k .. 4k+3]: add the lanes across.
  const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
  const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
}

// Prefetches the d elements of row rows[i + kPrefetchAhead] of base, when there is one.
template <typename T>
void prefetch_row_ahead(const T* base, const int64_t* rows, int32_t i, int32_t n, int32_t d) {
  if (i + kPrefetchAhead < n) prefetch_lines<3>(base + rows[i + kPrefetchAhead], static_cast<int64_t>(d) * sizeof(T));
}

// The 16-lane partial dot products part[r0 + j][i] = q_{r0+j} · x[row i0 + i] (lanes still to be
// summed) of RB query rows and m ≤ 16 keys: each key's row converted once per 64 columns for all
// RB rows (converting it again for every row cost ~3x the conversions: the stores to `part` may
// alias the row, so the compiler cannot reuse a conversion across rows).
template <int RB, typename T>
void partial_dots(const T* base, const int64_t* rows, int32_t i0, int32_t m, int32_t n, const float* q, int32_t r0,
                  int32_t d, const T* also, bool prefetch, float (*part)[16][16]) {
  for (int32_t i = 0; i < m; ++i) {
    if (prefetch) {
      prefetch_row_ahead(base, rows, i0 + i, n, d);
      if (also != nullptr) prefetch_row_ahead(also, rows, i0 + i, n, d);
    }
    const T* x = base + rows[i0 + i];
    __m512 s[RB];
    for (int j = 0; j < RB; ++j) s[j] = _mm512_setzero_ps();
    for (int32_t c = 0; c < d; c += 64) {
      const __m512 x0 = load16(x + c), x1 = load16(x + c + 16), x2 = load16(x + c + 32), x3 = load16(x + c + 48);
      for (int j = 0; j < RB; ++j) {
        const float* qr = q + static_cast<int64_t>(r0 + j) * d + c;
        const __m512 a = _mm512_fmadd_ps(_mm512_loadu_ps(qr), x0, _mm512_mul_ps(_mm512_loadu_ps(qr + 16), x1));
        const __m512 b = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 32), x2, _mm512_mul_ps(_mm512_loadu_ps(qr + 48), x3));
        s[j] = _mm512_add_ps(s[j], _mm512_add_ps(a, b));
      }
    }
    for (int j = 0; j < RB; ++j) _mm512_store_ps(part[r0 + j][i], s[j]);
  }
}

// partial_dots at d = 64 with the RB query rows held in registers (4·RB vectors): the generic loop
// reloads them for every key, since its stores to `part` may alias q (12 of a key's ~46 µops at
// RB = 3). Same operations in the same order: the same partials bit for bit.
template <int RB, typename T>
void partial_dots64(const T* base, const int64_t* rows, int32_t i0, int32_t m, int32_t n, const float* q, int32_t r0,
                    const T* also, bool prefetch, float (*part)[16][16]) {
  __m512 qv[RB][4];
  for (int j = 0; j < RB; ++j)
    for (int c = 0; c < 4; ++c) qv[j][c] = _mm512_loadu_ps(q + static_cast<int64_t>(r0 + j) * 64 + 16 * c);
  for (int32_t i = 0; i < m; ++i) {
    if (prefetch) {
      prefetch_row_ahead(base, rows, i0 + i, n, 64);
      if (also != nullptr) prefetch_row_ahead(also, rows, i0 + i, n, 64);
    }
    const T* x = base + rows[i0 + i];
    const __m512 x0 = load16(x), x1 = load16(x + 16), x2 = load16(x + 32), x3 = load16(x + 48);
    for (int j = 0; j < RB; ++j) {
      const __m512 a = _mm512_fmadd_ps(qv[j][0], x0, _mm512_mul_ps(qv[j][1], x1));
      const __m512 b = _mm512_fmadd_ps(qv[j][2], x2, _mm512_mul_ps(qv[j][3], x3));
      _mm512_store_ps(part[r0 + j][i], _mm512_add_ps(_mm512_setzero_ps(), _mm512_add_ps(a, b)));
    }
  }
}

// out[r·ld + i] = scale · q_r · x[row i] for 16 keys at a time: the R·16 dot products left as
// vectors (partial_dots, up to 4 query rows per pass over the keys) and summed across by
// sum_lanes16. False when d is not a multiple of 64 (the caller's key-by-key path).
template <typename T>
bool dot_rows_any(const T* base, const int64_t* rows, int32_t n, const float* q, int32_t R, int32_t d, float scale,
                  float* out, int64_t ld, const T* also) {
  if (d % 64 != 0) return false;
  alignas(64) float part[kMaxRows][16][16];  // [r][key][lane]
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int32_t i0 = 0; i0 < n; i0 += 16) {
    const int32_t m = std::min(16, n - i0);
    for (int32_t r0 = 0; r0 < R; r0 += 4) {
      const bool prefetch = r0 == 0;  // later passes find the rows in L1
      if (d == 64) {
        switch (std::min(4, R - r0)) {
          case 1: partial_dots64<1>(base, rows, i0, m, n, q, r0, also, prefetch, part); break;
          case 2: partial_dots64<2>(base, rows, i0, m, n, q, r0, also, prefetch, part); break;
          case 3: partial_dots64<3>(base, rows, i0, m, n, q, r0, also, prefetch, part); break;
          default: partial_dots64<4>(base, rows, i0, m, n, q, r0, also, prefetch, part); break;
        }
        continue;
      }
      switch (std::min(4, R - r0)) {
        case 1: partial_dots<1>(base, rows, i0, m, n, q, r0, d, also, prefetch, part); break;
        case 2: partial_dots<2>(base, rows, i0, m, n, q, r0, d, also, prefetch, part); break;
        case 3: partial_dots<3>(base, rows, i0, m, n, q, r0, d, also, prefetch, part); break;
        default: partial_dots<4>(base, rows, i0, m, n, q, r0, d, also, prefetch, part); break;
      }
    }
    for (int32_t r = 0; r < R; ++r) {
      __m512 v[16];
      for (int32_t i = 0; i < 16; ++i) v[i] = i < m ? _mm512_load_ps(part[r][i]) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(out + r * ld + i0, lanes16(m), _mm512_mul_ps(sum_lanes16(v), vscale));
    }
  }
  return true;
}
bool dot_rows(const float* base, const int64_t* rows, int32_t n, const float* q, int32_t R, int32_t d, float scale,
              float* out, int64_t ld, const float* also) {
  return dot_rows_any(base, rows, n, q, R, d, scale, out, ld, also);
}
bool dot_rows(const uint16_t* base, const int64_t* rows, int32_t n, const float* q, int32_t R, int32_t d, float scale,
              float* out, int64_t ld, const uint16_t* also) {
  return dot_rows_any(base, rows, n, q, R, d, scale, out, ld, also);
}

// acc[r][c] += Σ_i a[r·ld + i]·x[row i][c] with the accumulators in registers: RB rows × 4 vectors
// (64 columns) per pass over the rows, each row's 64 columns converted once for all RB rows.
// (Row by row with axpy, every key reloaded and stored each accumulator and converted the row
// again for every query row: ~3x the instructions, and a store-to-load chain per key.)
template <int RB, typename T>
void axpy_rows_block(const T* base, const int64_t* rows, int32_t n, const float* a, int64_t ld, float* acc, int32_t d,
                     int32_t c0, bool prefetch) {
  __m512 s[RB][4];
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < 4; ++j) s[r][j] = _mm512_loadu_ps(acc + r * d + c0 + 16 * j);
  for (int32_t i = 0; i < n; ++i) {
    if (prefetch) prefetch_row_ahead(base, rows, i, n, d);
    const T* x = base + rows[i] + c0;
    const __m512 x0 = load16(x), x1 = load16(x + 16), x2 = load16(x + 32), x3 = load16(x + 48);
    for (int r = 0; r < RB; ++r) {
      const __m512 w = _mm512_set1_ps(a[r * ld + i]);
      s[r][0] = _mm512_fmadd_ps(w, x0, s[r][0]);
      s[r][1] = _mm512_fmadd_ps(w, x1, s[r][1]);
      s[r][2] = _mm512_fmadd_ps(w, x2, s[r][2]);
      s[r][3] = _mm512_fmadd_ps(w, x3, s[r][3]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(acc + r * d + c0 + 16 * j, s[r][j]);
}
// False (nothing done) when d is not a multiple of 64: the caller's row-by-row path.
template <typename T>
bool axpy_rows_any(const T* base, const int64_t* rows, int32_t n, int32_t R, const float* a, int64_t ld, float* acc,
                   int32_t d) {
  if (d % 64 != 0) return false;
  for (int32_t c0 = 0; c0 < d; c0 += 64)
    for (int32_t r0 = 0; r0 < R; r0 += 6) {
      const bool prefetch = c0 == 0 && r0 == 0;  // later passes find the rows in L1 / L2
      const float* ar = a + r0 * ld;
      float* accr = acc + static_cast<int64_t>(r0) * d;
      switch (std::min(6, R - r0)) {
        case 1: axpy_rows_block<1>(base, rows, n, ar, ld, accr, d, c0, prefetch); break;
        case 2: axpy_rows_block<2>(base, rows, n, ar, ld, accr, d, c0, prefetch); break;
        case 3: axpy_rows_block<3>(base, rows, n, ar, ld, accr, d, c0, prefetch); break;
        case 4: axpy_rows_block<4>(base, rows, n, ar, ld, accr, d, c0, prefetch); break;
        case 5: axpy_rows_block<5>(base, rows, n, ar, ld, accr, d, c0, prefetch); break;
        default: axpy_rows_block<6>(base, rows, n, ar, ld, accr, d, c0, prefetch); break;
      }
    }
  return true;
}
bool axpy_rows(const float* base, const int64_t* rows, int32_t n, int32_t R, const float* a, int64_t ld, float* acc,
               int32_t d) {
  return axpy_rows_any(base, rows, n, R, a, ld, acc, d);
}
bool axpy_rows(const uint16_t* base, const int64_t* rows, int32_t n, int32_t R, const float* a, int64_t ld, float* acc,
               int32_t d) {
  return axpy_rows_any(base, rows, n, R, a, ld, acc, d);
}

float exp_shifted(float* s, int32_t n, float shift) {
  const __m512 vs = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), vs));
    _mm512_mask_storeu_ps(s + i, m, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
  }
  return hsum(sum);
}
float max_of(const float* s, int32_t n) {
  __m512 vm = _mm512_set1_ps(-INFINITY);
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, s + i));
  }
  return hmax(vm);
}
float max_sum_exp(const float* s, int32_t n, float* mx) {
  const float best = max_of(s, n);
  const __m512 vs = _mm512_set1_ps(best);
  __m512 sum = _mm512_setzero_ps();
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), vs));
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
  }
  *mx = best;
  return hsum(sum);
}

// order_key of 16 floats at once, compared unsigned; the passing indices compressed to the front
// of a vector stored whole (out has 16 spare entries).
int32_t indices_at_least(const float* s, int32_t n, uint32_t key, int32_t* out) {
  const __m512i vkey = _mm512_set1_epi32(static_cast<int32_t>(key)), top = _mm512_set1_epi32(INT32_MIN);
  const __m512i step = _mm512_set1_epi32(16);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int32_t c = 0;
  for (int32_t i = 0; i < n; i += 16, idx = _mm512_add_epi32(idx, step)) {
    const __mmask16 m = lanes16(n - i);
    const __m512i u = _mm512_castps_si512(_mm512_add_ps(_mm512_maskz_loadu_ps(m, s + i), _mm512_setzero_ps()));
    const __m512i k = _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31), top));
    const __mmask16 pass = _mm512_mask_cmpge_epu32_mask(m, k, vkey);
    _mm512_storeu_si512(out + c, _mm512_maskz_compress_epi32(pass, idx));
    c += __builtin_popcount(pass);
  }
  return c;
}

uint32_t kth_largest_key(const uint32_t* keys, int32_t m, int32_t k) {
  // The k-th largest lies in [min, max], so it shares their common leading bits: the bisection
  // starts below them (SWA's and SparQ's candidate keys are floats of one sign and a few
  // exponents, so ~10 of the 32 passes go). The counts stay in vector lanes (a mask-to-register
  // move and popcount per 16 keys was the loop's bottleneck).
  __m512i lo = _mm512_set1_epi32(-1), hi = _mm512_setzero_si512();
  for (int32_t i = 0; i < m; i += 16) {
    const __mmask16 in = lanes16(m - i);
    const __m512i x = _mm512_maskz_loadu_epi32(in, keys + i);
    lo = _mm512_mask_min_epu32(lo, in, lo, x);
    hi = _mm512_mask_max_epu32(hi, in, hi, x);
  }
  const uint32_t kmin = _mm512_reduce_min_epu32(lo), kmax = _mm512_reduce_max_epu32(hi);
  if (kmin == kmax) return kmin;
  const int top = 31 - __builtin_clz(kmin ^ kmax);             // highest bit where they differ
  uint32_t t = kmax & ~static_cast<uint32_t>((2ull << top) - 1);  // their common leading bits
  const __m512i one = _mm512_set1_epi32(1);
  for (int bit = top; bit >= 0; --bit) {
    const uint32_t trial = t | (1u << bit);
    const __m512i vt = _mm512_set1_epi32(static_cast<int32_t>(trial));
    __m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512();
    int32_t i = 0;
    for (; i + 32 <= m; i += 32) {
      c0 = _mm512_mask_add_epi32(c0, _mm512_cmpge_epu32_mask(_mm512_loadu_si512(keys + i), vt), c0, one);
      c1 = _mm512_mask_add_epi32(c1, _mm512_cmpge_epu32_mask(_mm512_loadu_si512(keys + i + 16), vt), c1, one);
    }
    for (; i < m; i += 16) {
      const __mmask16 in = lanes16(m - i);
      c0 = _mm512_mask_add_epi32(c0, _mm512_mask_cmpge_epu32_mask(in, _mm512_maskz_loadu_epi32(in, keys + i), vt), c0, one);
    }
    if (_mm512_reduce_add_epi32(_mm512_add_epi32(c0, c1)) >= k) t = trial;
  }
  return t;
}

constexpr decltype(Kernels::run_partial) kRunPartial = &partial_attention_kt_logits_avx512;

#include "kernels/cpu/sparse_common.inc"

}  // namespace

const Kernels* kernels_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")
             ? &kTable
             : nullptr;
}

}  // namespace fathom::cpu::sparse
