// AVX2 + FMA + F16C instantiation of the sparse-attention inner loops (8-lane vectors, scalar
// tails): what AMD Zen 2/3 and Intel CPUs without AVX-512 run. The portable table goes key by key
// and query row by query row with scalar f16 conversions; on an EPYC (Zen 3, 2 threads) it made
// every sparse policy slower than dense (bench_sparse_attention, 16k, d 64: SWA 4.5 ms, HiP's cached
// step 5.4, SparQ 6.5, dense 3.3), so the measured break-even turned them all off.
#include <algorithm>
#include <array>
#include <cmath>

#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/sparse_common.h"

namespace fathom::cpu::sparse {
namespace {
using namespace simd256;

float h2f(uint16_t h) { return _cvtsh_ss(h); }

float dot_f32(const float* q, const float* k, int32_t n) { return dot8(q, k, n); }
float dot_f16(const float* q, const uint16_t* k, int32_t n) { return dot8(q, k, n); }
float dot_u8(const float* q, const uint8_t* k, int32_t n) { return dot8(q, k, n); }
void axpy_f32(float a, const float* x, float* y, int32_t n) { axpy8(a, x, y, n); }
void axpy_f16(float a, const uint16_t* x, float* y, int32_t n) { axpy8(a, x, y, n); }
void axpy_u8(float a, const uint8_t* x, float* y, int32_t n) { axpy8(a, x, y, n); }
float max_of(const float* s, int32_t n) {
  __m256 vm = _mm256_set1_ps(-INFINITY);
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + i));
  float m = hmax(vm);
  for (; i < n; ++i) m = std::max(m, s[i]);
  return m;
}
float max_sum_exp(const float* s, int32_t n, float* mx) {
  const float best = max_of(s, n);
  const __m256 vs = _mm256_set1_ps(best);
  __m256 sum = _mm256_setzero_ps();
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) sum = _mm256_add_ps(sum, exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + i), vs)));
  float total = hsum(sum);
  for (; i < n; ++i) total += std::exp(s[i] - best);
  *mx = best;
  return total;
}

// SparQ step 1 on 16 positions of a k_t tile (dimension rows `stride` elements apart), G ≤ 4
// query rows: out[j·ld + s] = Σ_i qr[j·r + i]·tile[dims[i]][s], 2·G accumulators in registers.
// sum (nullable): sum[s] = (sum[s] when add_to_sum) + out[s] + out[ld + s] + …, in that order.
template <int G, typename T>
void kt_tile16_g(const T* tile, const int32_t* dims, int32_t r, const float* qr, float* out, int64_t ld, int32_t n_t,
                 int32_t stride, float* sum, bool add_to_sum) {
  __m256 lo[G], hi[G];
  for (int j = 0; j < G; ++j) lo[j] = hi[j] = _mm256_setzero_ps();
  for (int32_t i = 0; i < r; ++i) {
    const T* row = tile + static_cast<int64_t>(dims[i]) * stride;
    const __m256 x0 = load8(row), x1 = load8(row + 8);
    for (int j = 0; j < G; ++j) {
      const __m256 w = _mm256_set1_ps(qr[j * r + i]);
      lo[j] = _mm256_fmadd_ps(w, x0, lo[j]);
      hi[j] = _mm256_fmadd_ps(w, x1, hi[j]);
    }
  }
  __m256 sum_lo = _mm256_setzero_ps(), sum_hi = sum_lo;
  if (sum != nullptr) {
    int j = 0;
    if (add_to_sum) {
      sum_lo = n_t == 16 ? _mm256_loadu_ps(sum) : _mm256_maskload_ps(sum, lanes8(n_t));
      sum_hi = n_t == 16 ? _mm256_loadu_ps(sum + 8) : _mm256_maskload_ps(sum + 8, lanes8(n_t - 8));
    } else {
      sum_lo = lo[0];
      sum_hi = hi[0];
      j = 1;
    }
    for (; j < G; ++j) {
      sum_lo = _mm256_add_ps(sum_lo, lo[j]);
      sum_hi = _mm256_add_ps(sum_hi, hi[j]);
    }
  }
  if (n_t == 16) {
    for (int j = 0; j < G; ++j) {
      _mm256_storeu_ps(out + j * ld, lo[j]);
      _mm256_storeu_ps(out + j * ld + 8, hi[j]);
    }
    if (sum != nullptr) {
      _mm256_storeu_ps(sum, sum_lo);
      _mm256_storeu_ps(sum + 8, sum_hi);
    }
    return;
  }
  const __m256i m0 = lanes8(n_t), m1 = lanes8(n_t - 8);
  for (int j = 0; j < G; ++j) {
    _mm256_maskstore_ps(out + j * ld, m0, lo[j]);
    _mm256_maskstore_ps(out + j * ld + 8, m1, hi[j]);
  }
  if (sum != nullptr) {
    _mm256_maskstore_ps(sum, m0, sum_lo);
    _mm256_maskstore_ps(sum + 8, m1, sum_hi);
  }
}
// Any G, four query rows at a time (16 registers hold no more than 4 rows' accumulators, the
// dimension rows and a broadcast); later groups find the tile's rows in L1.
template <typename T>
bool kt_tile16(const T* tile, const int32_t* dims, int32_t r, const float* qr, int32_t G, float* out, int64_t ld,
               int32_t n_t, int32_t stride, float* sum) {
  for (int32_t j0 = 0; j0 < G; j0 += 4) {
    const float* q = qr + static_cast<int64_t>(j0) * r;
    float* o = out + j0 * ld;
    const bool add = j0 > 0;  // later groups add to the sum the first group stored
    switch (std::min(4, G - j0)) {
      case 1: kt_tile16_g<1>(tile, dims, r, q, o, ld, n_t, stride, sum, add); break;
      case 2: kt_tile16_g<2>(tile, dims, r, q, o, ld, n_t, stride, sum, add); break;
      case 3: kt_tile16_g<3>(tile, dims, r, q, o, ld, n_t, stride, sum, add); break;
      default: kt_tile16_g<4>(tile, dims, r, q, o, ld, n_t, stride, sum, add); break;
    }
  }
  return true;
}

// No pair kernel here: sparq_scores takes the tiles one at a time (kt_tile16 already runs 2·G
// independent chains, a tile's two 8-lane halves; two tiles' would not fit in 16 registers).
template <typename T>
bool kt_tile16x2(const T*, const T*, const int32_t*, int32_t, const float*, int32_t, float*, int64_t, int32_t, int32_t,
                 float*) {
  return false;
}

// Prefetches the d elements of row rows[i + kPrefetchAhead] of base, when there is one.
template <typename T>
void prefetch_row_ahead(const T* base, const int64_t* rows, int32_t i, int32_t n, int32_t d) {
  if (i + kPrefetchAhead < n) prefetch_lines<3>(base + rows[i + kPrefetchAhead], static_cast<int64_t>(d) * sizeof(T));
}

// The 8-lane partial dot products part[r0 + j][i] = q_{r0+j} · x[row i0 + i] (lanes still to be
// summed) of RB ≤ 4 query rows and m ≤ 8 keys: each key's row converted once per 32 columns for
// all RB rows, two accumulators per row (8 registers, 4 for the converted row).
template <int RB, typename T>
void partial_dots(const T* base, const int64_t* rows, int32_t i0, int32_t m, int32_t n, const float* q, int32_t r0,
                  int32_t d, const T* also, bool prefetch, float (*part)[8][8]) {
  for (int32_t i = 0; i < m; ++i) {
    if (prefetch) {
      prefetch_row_ahead(base, rows, i0 + i, n, d);
      if (also != nullptr) prefetch_row_ahead(also, rows, i0 + i, n, d);
    }
    const T* x = base + rows[i0 + i];
    __m256 s0[RB], s1[RB];
    for (int j = 0; j < RB; ++j) s0[j] = s1[j] = _mm256_setzero_ps();
    for (int32_t c = 0; c < d; c += 32) {
      const __m256 x0 = load8(x + c), x1 = load8(x + c + 8), x2 = load8(x + c + 16), x3 = load8(x + c + 24);
      for (int j = 0; j < RB; ++j) {
        const float* qr = q + static_cast<int64_t>(r0 + j) * d + c;
        s0[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qr), x0, s0[j]);
        s1[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 8), x1, s1[j]);
        s0[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 16), x2, s0[j]);
        s1[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 24), x3, s1[j]);
      }
    }
    for (int j = 0; j < RB; ++j) _mm256_store_ps(part[r0 + j][i], _mm256_add_ps(s0[j], s1[j]));
  }
}

// out[r·ld + i] = scale · q_r · x[row i] for 8 keys at a time: the R·8 dot products left as vectors
// (partial_dots, up to 4 query rows per pass over the keys) and summed across by sum_lanes8.
// False when d is not a multiple of 32 (the caller's key-by-key path).
template <typename T>
bool dot_rows(const T* base, const int64_t* rows, int32_t n, const float* q, int32_t R, int32_t d, float scale,
              float* out, int64_t ld, const T* also) {
  if (d % 32 != 0) return false;
  alignas(32) float part[kMaxRows][8][8];  // [r][key][lane]
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int32_t i0 = 0; i0 < n; i0 += 8) {
    const int32_t m = std::min(8, n - i0);
    for (int32_t r0 = 0; r0 < R; r0 += 4) {
      const bool prefetch = r0 == 0;  // later passes find the rows in L1
      switch (std::min(4, R - r0)) {
        case 1: partial_dots<1>(base, rows, i0, m, n, q, r0, d, also, prefetch, part); break;
        case 2: partial_dots<2>(base, rows, i0, m, n, q, r0, d, also, prefetch, part); break;
        case 3: partial_dots<3>(base, rows, i0, m, n, q, r0, d, also, prefetch, part); break;
        default: partial_dots<4>(base, rows, i0, m, n, q, r0, d, also, prefetch, part); break;
      }
    }
    for (int32_t r = 0; r < R; ++r) {
      __m256 v[8];
      for (int32_t i = 0; i < 8; ++i) v[i] = i < m ? _mm256_load_ps(part[r][i]) : _mm256_setzero_ps();
      const __m256 sums = _mm256_mul_ps(sum_lanes8(v), vscale);
      if (m == 8) _mm256_storeu_ps(out + r * ld + i0, sums);
      else _mm256_maskstore_ps(out + r * ld + i0, lanes8(m), sums);
    }
  }
  return true;
}

// acc[r][c] += Σ_i a[r·ld + i]·x[row i][c] with the accumulators in registers: RB ≤ 2 rows × 4
// vectors (32 columns) per pass over the rows, each row's 32 columns converted once for both.
template <int RB, typename T>
void axpy_rows_block(const T* base, const int64_t* rows, int32_t n, const float* a, int64_t ld, float* acc, int32_t d,
                     int32_t c0, bool prefetch) {
  __m256 s[RB][4];
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < 4; ++j) s[r][j] = _mm256_loadu_ps(acc + r * d + c0 + 8 * j);
  for (int32_t i = 0; i < n; ++i) {
    if (prefetch) prefetch_row_ahead(base, rows, i, n, d);
    const T* x = base + rows[i] + c0;
    const __m256 x0 = load8(x), x1 = load8(x + 8), x2 = load8(x + 16), x3 = load8(x + 24);
    for (int r = 0; r < RB; ++r) {
      const __m256 w = _mm256_set1_ps(a[r * ld + i]);
      s[r][0] = _mm256_fmadd_ps(w, x0, s[r][0]);
      s[r][1] = _mm256_fmadd_ps(w, x1, s[r][1]);
      s[r][2] = _mm256_fmadd_ps(w, x2, s[r][2]);
      s[r][3] = _mm256_fmadd_ps(w, x3, s[r][3]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(acc + r * d + c0 + 8 * j, s[r][j]);
}
// False (nothing done) when d is not a multiple of 32: the caller's row-by-row path.
template <typename T>
bool axpy_rows(const T* base, const int64_t* rows, int32_t n, int32_t R, const float* a, int64_t ld, float* acc,
               int32_t d) {
  if (d % 32 != 0) return false;
  for (int32_t c0 = 0; c0 < d; c0 += 32)
    for (int32_t r0 = 0; r0 < R; r0 += 2) {
      const bool prefetch = c0 == 0 && r0 == 0;  // later passes find the rows in L1 / L2
      const float* ar = a + r0 * ld;
      float* accr = acc + static_cast<int64_t>(r0) * d;
      if (R - r0 >= 2) axpy_rows_block<2>(base, rows, n, ar, ld, accr, d, c0, prefetch);
      else axpy_rows_block<1>(base, rows, n, ar, ld, accr, d, c0, prefetch);
    }
  return true;
}

// Per 8-bit mask: the indices of its set bits, packed low to high, 4 bits each (the permutation
// that moves the passing lanes to the front: AVX2 has no compress).
constexpr std::array<uint32_t, 256> kPackIndices = [] {
  std::array<uint32_t, 256> t{};
  for (uint32_t mask = 0; mask < 256; ++mask) {
    uint32_t packed = 0, k = 0;
    for (uint32_t lane = 0; lane < 8; ++lane)
      if (mask & (1u << lane)) packed |= lane << (4 * k++);
    t[mask] = packed;
  }
  return t;
}();

// order_key of 8 floats at once, moved to the signed domain (x ^ 0x80000000 orders as signed what
// x orders as unsigned: AVX2 compares only signed); the passing indices packed to the front of a
// vector stored whole (out has 16 spare entries).
int32_t indices_at_least(const float* s, int32_t n, uint32_t key, int32_t* out) {
  const __m256i vkey = _mm256_set1_epi32(static_cast<int32_t>(key ^ 0x80000000u));
  const __m256i step = _mm256_set1_epi32(8), shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int32_t c = 0, i = 0;
  for (; i + 8 <= n; i += 8, idx = _mm256_add_epi32(idx, step)) {
    const __m256i u = _mm256_castps_si256(_mm256_add_ps(_mm256_loadu_ps(s + i), _mm256_setzero_ps()));
    // order_key(x) ^ 0x80000000 = u ^ (u < 0 ? 0x7fffffff : 0)
    const __m256i k = _mm256_xor_si256(u, _mm256_srli_epi32(_mm256_srai_epi32(u, 31), 1));
    const int pass = ~_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(vkey, k))) & 0xff;
    const __m256i perm = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int32_t>(kPackIndices[pass])), shifts), _mm256_set1_epi32(7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), _mm256_permutevar8x32_epi32(idx, perm));
    c += __builtin_popcount(pass);
  }
  for (; i < n; ++i) {  // branch-free: the slot is overwritten until a key passes
    out[c] = i;
    c += order_key(s[i]) >= key;
  }
  return c;
}

// As the AVX-512 version: bit by bit from the common leading bits of min and max, the counts kept
// in vector lanes (keys ≥ trial counted as m − keys < trial, signed compares in the shifted domain).
uint32_t kth_largest_key(const uint32_t* keys, int32_t m, int32_t k) {
  __m256i lo = _mm256_set1_epi32(-1), hi = _mm256_setzero_si256();
  int32_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + i));
    lo = _mm256_min_epu32(lo, x);
    hi = _mm256_max_epu32(hi, x);
  }
  alignas(32) uint32_t l8[8], h8[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l8), lo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(h8), hi);
  uint32_t kmin = l8[0], kmax = h8[0];
  for (int j = 1; j < 8; ++j) kmin = std::min(kmin, l8[j]), kmax = std::max(kmax, h8[j]);
  for (int32_t j = i; j < m; ++j) kmin = std::min(kmin, keys[j]), kmax = std::max(kmax, keys[j]);
  if (kmin == kmax) return kmin;
  const int top = 31 - __builtin_clz(kmin ^ kmax);
  uint32_t t = kmax & ~static_cast<uint32_t>((2ull << top) - 1);
  const __m256i flip = _mm256_set1_epi32(INT32_MIN);
  for (int bit = top; bit >= 0; --bit) {
    const uint32_t trial = t | (1u << bit);
    const __m256i vt = _mm256_set1_epi32(static_cast<int32_t>(trial ^ 0x80000000u));
    __m256i c0 = _mm256_setzero_si256(), c1 = _mm256_setzero_si256();  // −(keys < trial) per lane
    int32_t j = 0;
    for (; j + 16 <= m; j += 16) {
      const __m256i x0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + j)), flip);
      const __m256i x1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + j + 8)), flip);
      c0 = _mm256_add_epi32(c0, _mm256_cmpgt_epi32(vt, x0));
      c1 = _mm256_add_epi32(c1, _mm256_cmpgt_epi32(vt, x1));
    }
    for (; j + 8 <= m; j += 8) {
      const __m256i x0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + j)), flip);
      c0 = _mm256_add_epi32(c0, _mm256_cmpgt_epi32(vt, x0));
    }
    alignas(32) int32_t c8[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(c8), _mm256_add_epi32(c0, c1));
    int32_t below = 0;
    for (int l = 0; l < 8; ++l) below -= c8[l];
    for (; j < m; ++j) below += keys[j] < trial;
    if (m - below >= k) t = trial;
  }
  return t;
}

constexpr decltype(Kernels::run_partial) kRunPartial = &partial_attention_kt_logits_avx2;

#include "kernels/cpu/sparse_common.inc"

}  // namespace

const Kernels* kernels_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") ? &kTable
                                                                                                          : nullptr;
}

}  // namespace fathom::cpu::sparse
