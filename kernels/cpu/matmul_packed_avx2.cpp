// AVX2 kQ8 kernels over PackedWeights panels (layout: packed_weights.h), for CPUs without
// AVX-512 VNNI (AMD Zen 2/3, many Intel parts). A 64-byte panel vector is two ymm halves:
// bytes 0..31 hold rows 0..7 of the panel, bytes 32..63 rows 8..15 (4 quants a lane), so each
// half is an 8-row panel of its own. Per 32-column block, half and activation row m:
//   P[r] = Σ_v maddubs(nibble vector v, 4 activation bytes broadcast)   (u8 × s8 → s16 pairs)
// summed in 16 bits, widened once with madd(·, 1), then
//   acc[r] += float(P[r] − c·qsum) · d[r]·dx            (Q4_0 c = 8, Q5_0 c = 16)
//   acc[r] += float(P[r]) · d[r]·dx + m[r] · (dx·qsum)    (Q4_1, Q5_1; K-quants with sc and min)
// No horizontal sums and no scalar scale work per row: the stored kernels (matmul_dotq8_avx2.cpp)
// spend ~12 instructions per row and 32 columns, these ~4, so decode reaches the memory bound
// and prefill does ~2x the work per cycle (bench_matmul, docs/performance-cpu-hosts.md).
// 16-bit sums cannot overflow: a maddubs lane is at most 2·q·127 (q ≤ 15, 31, 63 for 4, 5, 6
// bits), so 8 of them stay below 2^15 at 4 bits, 4 at 5 bits, 2 at 6 bits (Q3_K's 3-bit u = q + 4
// is summed as Q6_K's). Q8_0's unsigned panel quants (q + 128) would saturate maddubs
// (2·255·127 > 2^15): they are made signed again and, like IQ4_NL's and IQ4_XS's signed levels,
// multiplied with the sign trick.
// Every activation row goes through the same instructions whatever mr is (batch invariance,
// bitwise decode == prefill), as in the AVX-512 kernels.
// A call takes up to 64 activation rows (KernelTable::packed_max_mr; the AVX-512 kernels take 8):
// the weight vectors are unpacked once for all of them. Up to 8 rows keep their accumulators in
// locals (RowAccs<MR>), more (prefill, batches over 8) in an L1 buffer (RowAccs<0>). The row loop
// walks the rows with pointer bumps (ActRows) and reads dx·qsum precomputed per block
// (DotArgs::qds), so it is the maddubs and their sums plus a handful of float operations; batched
// decode (8-16 rows) ran 10-18% faster per matrix for each of the two changes, and 64-row calls
// another 7-18% on Q6_K (bench_matmul --batch, docs/performance.md).
#include <immintrin.h>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/matmul_prefetch.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/quant_blocks.h"

namespace fathom::cpu::detail {
namespace {

using quant::load_u32;

#include "kernels/cpu/matmul_by_mr.inc"  // by_mr, this file's own copy

inline __m256i load32(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
// 4 activation bytes x[k..k+3] in every 32-bit lane.
inline __m256i bcast4(const int8_t* x) { return _mm256_set1_epi32(static_cast<int>(load_u32(reinterpret_cast<const uint8_t*>(x)))); }
// 8 f16 at p (16 bytes) as f32.
inline __m256 f16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// 8 bytes at p (unsigned / signed) as f32.
inline __m256 u8x8(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))); }
inline __m256 s8x8(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))); }
// 8 signed bytes at p as 16-bit pairs (s, s), one a 32-bit lane: madd against it scales both
// halves of a lane's pair sum by the same s.
inline __m256i pair16(const uint8_t* p) {
  const __m256i s = _mm256_cvtepu16_epi32(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
}
inline __m256i widen(__m256i s16) { return _mm256_madd_epi16(s16, _mm256_set1_epi16(1)); }
// Signed quants w (|w| <= 128) times the 4 activation bytes at x in every lane, widened to the
// lanes' i32 sums: the sign trick, |w| times x with w's sign (a maddubs pair stays below 2^15).
inline __m256i signed_dot4(__m256i w, __m256i w_abs, const int8_t* x) {
  return widen(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(bcast4(x), w)));
}

// The nibble vectors of one half (8 rows) of a 32-column sub-block whose 4 quant vectors start
// at p: lo[v] = columns 4v..4v+3, hi[v] = columns 16 + 4v..
inline void load_nibbles(const uint8_t* p, int h, __m256i* lo, __m256i* hi) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  for (int v = 0; v < 4; ++v) {
    const __m256i raw = load32(p + 64 * v + 32 * h);
    lo[v] = _mm256_and_si256(raw, nib);
    hi[v] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib);
  }
}

// Signed quant vectors w[0..7] of one half (vector j: columns 4j..4j+3 of a 32-column block),
// |w| in w_abs, against the 32 activation bytes at x: the lanes' i32 sums (exact integers).
inline __m256i signed_dot32(const __m256i* w, const __m256i* w_abs, const int8_t* x) {
  __m256i s = signed_dot4(w[0], w_abs[0], x);
  for (int j = 1; j < 8; ++j) s = _mm256_add_epi32(s, signed_dot4(w[j], w_abs[j], x + 4 * j));
  return s;
}

// IQ4_NL / IQ4_XS: one half's nibble vectors (load_nibbles; low nibbles into w[0..3], high into
// w[4..7], so vector j holds columns 4j..4j+3) mapped to their signed levels, and |levels|.
inline void iq4_levels(const uint8_t* p, int h, __m256i table, __m256i* w, __m256i* w_abs) {
  load_nibbles(p, h, w, w + 4);
  for (int j = 0; j < 8; ++j) {
    w[j] = _mm256_shuffle_epi8(table, w[j]);
    w_abs[j] = _mm256_abs_epi8(w[j]);
  }
}

// One half's maddubs of a sub-block against activation row x (32 bytes): the 8 products of
// lo[v] with x[4v..] and of hi[v] with x[16 + 4v..], as s16 pair sums.
struct SubBlockProducts {
  __m256i lo[4], hi[4];
  SubBlockProducts(const __m256i* wl, const __m256i* wh, const int8_t* x) {
    for (int v = 0; v < 4; ++v) {
      lo[v] = _mm256_maddubs_epi16(wl[v], bcast4(x + 4 * v));
      hi[v] = _mm256_maddubs_epi16(wh[v], bcast4(x + 16 + 4 * v));
    }
  }
  SubBlockProducts() = default;
  // Both halves' products (weights lo0/hi0 and lo1/hi1) against one activation block, the two
  // halves' maddubs interleaved and sharing the broadcasts (one-row calls).
  static void both(const __m256i* lo0, const __m256i* hi0, const __m256i* lo1, const __m256i* hi1, const int8_t* x,
                   SubBlockProducts& p0, SubBlockProducts& p1) {
    for (int v = 0; v < 4; ++v) {
      const __m256i xl = bcast4(x + 4 * v), xh = bcast4(x + 16 + 4 * v);
      p0.lo[v] = _mm256_maddubs_epi16(lo0[v], xl);
      p1.lo[v] = _mm256_maddubs_epi16(lo1[v], xl);
      p0.hi[v] = _mm256_maddubs_epi16(hi0[v], xh);
      p1.hi[v] = _mm256_maddubs_epi16(hi1[v], xh);
    }
  }
  // All 32 columns (4-bit quants: 8 products fit 16 bits).
  __m256i sum4bit() const {
    const __m256i a = _mm256_add_epi16(_mm256_add_epi16(lo[0], lo[1]), _mm256_add_epi16(lo[2], lo[3]));
    const __m256i b = _mm256_add_epi16(_mm256_add_epi16(hi[0], hi[1]), _mm256_add_epi16(hi[2], hi[3]));
    return widen(_mm256_add_epi16(a, b));
  }
  // All 32 columns (5-bit quants: 4 products a 16-bit sum).
  __m256i sum5bit() const {
    const __m256i a = _mm256_add_epi16(_mm256_add_epi16(lo[0], lo[1]), _mm256_add_epi16(lo[2], lo[3]));
    const __m256i b = _mm256_add_epi16(_mm256_add_epi16(hi[0], hi[1]), _mm256_add_epi16(hi[2], hi[3]));
    return _mm256_add_epi32(widen(a), widen(b));
  }
  // 16-bit sums of columns 0..15 (lo) and 16..31 (hi): two maddubs of 6-bit quants (vectors v and
  // v + 1), or all four of 3-bit ones.
  __m256i lo_pair(int v) const { return _mm256_add_epi16(lo[v], lo[v + 1]); }
  __m256i hi_pair(int v) const { return _mm256_add_epi16(hi[v], hi[v + 1]); }
  __m256i lo_sum() const { return _mm256_add_epi16(lo_pair(0), lo_pair(2)); }
  __m256i hi_sum() const { return _mm256_add_epi16(hi_pair(0), hi_pair(2)); }
  // Columns 0..15 and 16..31 apart, widened (6-bit quants: 2 products a 16-bit sum).
  __m256i lo6bit() const { return _mm256_add_epi32(widen(lo_pair(0)), widen(lo_pair(2))); }
  __m256i hi6bit() const { return _mm256_add_epi32(widen(hi_pair(0)), widen(hi_pair(2))); }
};

// y[r0 + r] = v[r] for the panel's rows below rows_total (r0 = 16 p + 8 h).
inline void store_half(float* y, __m256 v, int64_t p, int h, int64_t rows_total) {
  const int64_t r0 = p * PackedWeights::kPanelRows + 8 * h;
  const int64_t n = rows_total - r0;
  if (n >= 8) {
    _mm256_storeu_ps(y + r0, v);
  } else if (n > 0) {
    alignas(32) float t[8];
    _mm256_store_ps(t, v);
    for (int64_t i = 0; i < n; ++i) y[r0 + i] = t[i];
  }
}

// More activation rows than registers hold (MR == 0, a.mr up to kManyPackedMr: prefill and large
// batches): their accumulators, 64 bytes a row, stay in this L1-resident buffer.
alignas(32) thread_local __m256 many_rows_acc[kManyPackedMr][2];

// A call's accumulators acc(m, h), activation row m and panel half h, zeroed: MR rows in locals
// (registers where the compiler can), or for MR == 0 a.mr rows in many_rows_acc. Each row takes
// the same instructions either way (batch invariance); the many-row call unpacks each weight
// vector once for all its rows instead of once per kMaxPackedMr.
template <int MR> struct RowAccs {
  __m256 v[MR > 0 ? MR : 1][2];  // MR > 0 only
  int n;                          // MR == 0 only: a.mr
  explicit RowAccs(const DotArgs& a) : n(a.mr) {
    for (int m = 0; m < rows(); ++m) at(m, 0) = at(m, 1) = _mm256_setzero_ps();
  }
  int rows() const {
    if constexpr (MR > 0) return MR;
    else return n;
  }
  __m256& operator()(int m, int h) { return at(m, h); }
  void store(const DotArgs& a, int64_t p) {
    for (int m = 0; m < rows(); ++m)
      for (int h = 0; h < 2; ++h) store_half(a.y + m * a.ldy, at(m, h), p, h, a.rows_total);
  }

 private:
  __m256& at(int m, int h) {
    if constexpr (MR > 0) return v[m][h];
    else return many_rows_acc[m][h];
  }
};

// One 32-column activation block b of the call's rows, row after row: pointer bumps only, so
// that the row loop spends no instructions on index arithmetic or scalar conversions. A batch's
// activations come block-major (packed_block_major), so the rows' blocks sit side by side.
struct ActRows {
  const int8_t* x;      // the block's 32 quants
  const float* dx;      // its scale
  const float* dxq;     // scale · sum of its quants
  const int32_t* qsum;  // sum of its quants
  const int16_t* q16;   // sums of its two 16-column halves
  int64_t ldq, ldqs;
  ActRows(const DotArgs& a, int64_t b)
      : x(a.q + b * a.ldqb),
        dx(a.qd + b * a.ldsb),
        dxq(a.qds + b * a.ldsb),
        qsum(a.qsum + b * a.ldsb),
        q16(a.qsum16 + 2 * b * a.ldsb),
        ldq(a.ldq),
        ldqs(a.ldqs) {}
  void next() { x += ldq, dx += ldqs, dxq += ldqs, qsum += ldqs, q16 += 2 * ldqs; }
};

// The int8 scales of a sub-block's two 16-column groups in one half (8 rows each at p_lo, p_hi)
// as 16-bit pairs (s, s) a lane (pair16), for madd against the groups' 16-bit sums; and the
// quants' offset c = 1 << shift: S − c (sc_lo qsum16_lo + sc_hi qsum16_hi), one madd a row.
struct GroupScales {
  __m256i lo, hi, off;  // off: (c sc_lo, c sc_hi) a lane
  GroupScales(const uint8_t* p_lo, const uint8_t* p_hi, int shift)
      : lo(pair16(p_lo)), hi(pair16(p_hi)), off(_mm256_slli_epi16(_mm256_blend_epi16(lo, hi, 0xAA), shift)) {}
  __m256i minus_offset(__m256i s, const ActRows& r) const {
    const __m256i q16 = _mm256_set1_epi32(static_cast<int>(load_u32(reinterpret_cast<const uint8_t*>(r.q16))));
    return _mm256_sub_epi32(s, _mm256_madd_epi16(q16, off));
  }
};

// Q8_0: the panel holds q + 128 (the AVX-512 kernel's dpbusd layout); here each vector becomes q
// again (one xor, shared by the activation rows) and the products use the sign trick, |q| times
// x with q's sign: |q| <= 128, so a maddubs pair stays within 2·128·127 < 2^15, and every maddubs
// is widened on its own (two pairs could overflow 16 bits):
//   acc[r] += float(Σ_j madd(maddubs(|w_j|, sign(x_j, w_j)), 1)) · d[r] · dx
template <int MR>
void dot_packed_q8_0(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nb = a.K / 32;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* qp = a.w + p * a.row_bytes;
    const uint8_t* sp = qp + nb * 512;
    PanelPrefetch prefetch(qp, a.row_bytes, nb);
    RowAccs<MR> acc(a);
    for (int64_t b = 0; b < nb; ++b, qp += 512) {
      prefetch();
      for (int h = 0; h < 2; ++h) {
        __m256i w[8], w_abs[8];
        for (int j = 0; j < 8; ++j) {
          w[j] = _mm256_xor_si256(load32(qp + 64 * j + 32 * h), flip);
          w_abs[j] = _mm256_abs_epi8(w[j]);
        }
        const __m256 d = f16x8(sp + 32 * b + 16 * h);
        ActRows r(a, b);
        for (int m = 0; m < acc.rows(); ++m, r.next()) {
          const __m256i s = signed_dot32(w, w_abs, r.x);
          acc(m, h) = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_broadcast_ss(r.dx)), acc(m, h));
        }
      }
    }
    acc.store(a, p);
  }
}

// Q4_0 / Q4_1 (kQ5 false) and Q5_0 / Q5_1 (kQ5 true): w = d (q - c) or d q + m.
template <bool kMin, bool kQ5, int MR>
void dot_packed_q4(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nb = a.K / 32;
  constexpr int kScale = kMin ? 64 : 32;
  constexpr int kQuant = kQ5 ? 320 : 256;
  constexpr int kOffsetShift = kQ5 ? 4 : 3;  // c = 16 (Q5_0) or 8 (Q4_0) as a shift
  const __m256i sixteen = _mm256_set1_epi8(16);
  // 5th bits: byte j of each lane spread to the lane's 4 bytes (vpshufb works within 128-bit
  // lanes), then bit t (low nibbles) and bit 4 + t (high nibbles) tested in byte t.
  const __m256i lo_bits = _mm256_set1_epi32(0x08040201), hi_bits = _mm256_set1_epi32(static_cast<int>(0x80402010u));
  const __m256i dword_base = _mm256_set_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0, 0x0C0C0C0C, 0x08080808, 0x04040404, 0);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = a.w + p * a.row_bytes;
    const uint8_t* sp = panel + nb * kQuant;
    PanelPrefetch prefetch(panel, a.row_bytes, nb);
    RowAccs<MR> acc(a);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* qp = panel + b * kQuant;
      prefetch();
      for (int h = 0; h < 2; ++h) {
        __m256i lo[4], hi[4];
        load_nibbles(qp, h, lo, hi);
        if constexpr (kQ5) {
          const __m256i bits = load32(qp + 256 + 32 * h);
          for (int j = 0; j < 4; ++j) {
            const __m256i hj = _mm256_shuffle_epi8(bits, _mm256_add_epi8(_mm256_set1_epi8(static_cast<char>(j)), dword_base));
            lo[j] = _mm256_or_si256(lo[j], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hj, lo_bits), lo_bits), sixteen));
            hi[j] = _mm256_or_si256(hi[j], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hj, hi_bits), hi_bits), sixteen));
          }
        }
        const __m256 d = f16x8(sp + kScale * b + 16 * h);
        const __m256 mn = kMin ? f16x8(sp + kScale * b + 32 + 16 * h) : _mm256_setzero_ps();
        ActRows r(a, b);
        for (int m = 0; m < acc.rows(); ++m, r.next()) {
          const SubBlockProducts prod(lo, hi, r.x);
          __m256i s = kQ5 ? prod.sum5bit() : prod.sum4bit();
          if constexpr (!kMin) s = _mm256_sub_epi32(s, _mm256_slli_epi32(_mm256_set1_epi32(*r.qsum), kOffsetShift));
          const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_broadcast_ss(r.dx)), acc(m, h));
          acc(m, h) = kMin ? _mm256_fmadd_ps(mn, _mm256_broadcast_ss(r.dxq), t) : t;
        }
      }
    }
    acc.store(a, p);
  }
}

// Q4_K super-block panel (packed_weights.cpp): per 32-column sub-block j the Q4_1 nibble
// vectors, 16 rows' 6-bit scale and min (bytes), and per super-block the rows' d and dmin:
//   acc[r] += float(P) · (d sc_j)[r] · dx − (dmin m_j)[r] · (dx qsum)
template <int MR>
void dot_packed_q4_k(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    PanelPrefetch prefetch(u, a.row_bytes, 8 * nsb);
    RowAccs<MR> acc(a);
    for (int64_t i = 0; i < nsb; ++i, u += 2368) {
      for (int j = 0; j < 8; ++j) {
        prefetch();
        for (int h = 0; h < 2; ++h) {
          __m256i lo[4], hi[4];
          load_nibbles(u + 256 * j, h, lo, hi);
          const __m256 sc = _mm256_mul_ps(f16x8(u + 2304 + 16 * h), u8x8(u + 2048 + 16 * j + 8 * h));
          const __m256 mn = _mm256_mul_ps(f16x8(u + 2336 + 16 * h), u8x8(u + 2176 + 16 * j + 8 * h));
          ActRows r(a, 8 * i + j);
          for (int m = 0; m < acc.rows(); ++m, r.next()) {
            const SubBlockProducts prod(lo, hi, r.x);
            const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod.sum4bit()), _mm256_mul_ps(sc, _mm256_broadcast_ss(r.dx)), acc(m, h));
            acc(m, h) = _mm256_fnmadd_ps(mn, _mm256_broadcast_ss(r.dxq), t);  // one store: acc may alias dxq
          }
        }
      }
    }
    acc.store(a, p);
  }
}

// One activation row (decode): both halves of each sub-block in one pass, each half through the
// same operations as dot_packed_q4_k (so a row's result is bitwise the batch's). With a half at a
// time, the out-of-order window held about one half's dependency chain (load, unpack, 8 maddubs,
// their sums, conversion, two FMAs: ~20 cycles); side by side the two halves' chains overlap and
// share the activation broadcasts: one matrix hot in cache, one thread, 18-20% faster.
void dot_packed_q4_k_row(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    PanelPrefetch prefetch(u, a.row_bytes, 8 * nsb);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i, u += 2368) {
      const __m256 d0 = f16x8(u + 2304), d1 = f16x8(u + 2320), dmin0 = f16x8(u + 2336), dmin1 = f16x8(u + 2352);
      for (int j = 0; j < 8; ++j) {
        prefetch();
        __m256i lo0[4], hi0[4], lo1[4], hi1[4];
        load_nibbles(u + 256 * j, 0, lo0, hi0);
        load_nibbles(u + 256 * j, 1, lo1, hi1);
        const ActRows r(a, 8 * i + j);
        SubBlockProducts prod0, prod1;
        SubBlockProducts::both(lo0, hi0, lo1, hi1, r.x, prod0, prod1);
        const __m256i s0 = prod0.sum4bit(), s1 = prod1.sum4bit();
        const __m256 dx = _mm256_broadcast_ss(r.dx), dxq = _mm256_broadcast_ss(r.dxq);
        const __m256 sc0 = _mm256_mul_ps(d0, u8x8(u + 2048 + 16 * j)), sc1 = _mm256_mul_ps(d1, u8x8(u + 2048 + 16 * j + 8));
        const __m256 mn0 = _mm256_mul_ps(dmin0, u8x8(u + 2176 + 16 * j)), mn1 = _mm256_mul_ps(dmin1, u8x8(u + 2176 + 16 * j + 8));
        acc0 = _mm256_fnmadd_ps(mn0, dxq, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(sc0, dx), acc0));
        acc1 = _mm256_fnmadd_ps(mn1, dxq, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(sc1, dx), acc1));
      }
    }
    store_half(a.y, acc0, p, 0, a.rows_total);
    store_half(a.y, acc1, p, 1, a.rows_total);
  }
}

// Q6_K super-block panel: per sub-block j the low-nibble vectors, two vectors of 2-bit highs
// and the rows' int8 scales of its two 16-column groups; per super-block the rows' d.
// Low nibbles are the sub-block's columns 0..15 (group lo), high nibbles 16..31 (group hi). The
// scales are applied in integers, with the madd that widens the 16-bit pair sums (pairs of
// maddubs: 6-bit products fit 16 bits two at a time):
//   S = Σ madd(P16, sc) − madd((q16_lo, q16_hi), (32 sc_lo, 32 sc_hi))   (exact in int32)
//   acc[r] += float(S) · d[r] · dx
template <int MR>
void dot_packed_q6_k(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  const __m256i b45 = _mm256_set1_epi8(0x30);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    PanelPrefetch prefetch(u, a.row_bytes, 8 * nsb);
    RowAccs<MR> acc(a);
    for (int64_t i = 0; i < nsb; ++i, u += 3392) {
      for (int j = 0; j < 8; ++j) {
        prefetch();
        for (int h = 0; h < 2; ++h) {
          __m256i lo[4], hi[4];
          load_nibbles(u + 256 * j, h, lo, hi);
          // The 2-bit highs become bits 4-5: a byte of g holds vector v's lo highs in bits 0-1 and
          // its hi highs in bits 2-3 (v even), bits 4-5 and 6-7 (v odd). Each is shifted into bits
          // 4-5 (16-bit shifts: bits 4-5 of a byte come from the same byte) and masked with 0x30.
          for (int v = 0; v < 4; v += 2) {
            const __m256i g = load32(u + 2048 + 128 * j + 32 * v + 32 * h);
            lo[v] = _mm256_or_si256(lo[v], _mm256_and_si256(_mm256_slli_epi16(g, 4), b45));
            hi[v] = _mm256_or_si256(hi[v], _mm256_and_si256(_mm256_slli_epi16(g, 2), b45));
            lo[v + 1] = _mm256_or_si256(lo[v + 1], _mm256_and_si256(g, b45));
            hi[v + 1] = _mm256_or_si256(hi[v + 1], _mm256_and_si256(_mm256_srli_epi16(g, 2), b45));
          }
          const __m256 d = f16x8(u + 3328 + 16 * h);
          const GroupScales sc(u + 3072 + 32 * j + 8 * h, u + 3072 + 32 * j + 16 + 8 * h, 5);
          ActRows r(a, 8 * i + j);
          for (int m = 0; m < acc.rows(); ++m, r.next()) {
            const SubBlockProducts prod(lo, hi, r.x);
            const __m256i s = _mm256_add_epi32(
                _mm256_add_epi32(_mm256_madd_epi16(prod.lo_pair(0), sc.lo), _mm256_madd_epi16(prod.lo_pair(2), sc.lo)),
                _mm256_add_epi32(_mm256_madd_epi16(prod.hi_pair(0), sc.hi), _mm256_madd_epi16(prod.hi_pair(2), sc.hi)));
            acc(m, h) = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sc.minus_offset(s, r)), _mm256_mul_ps(d, _mm256_broadcast_ss(r.dx)), acc(m, h));
          }
        }
      }
    }
    acc.store(a, p);
  }
}

// Q3_K super-block panel (pack_q3_k): per sub-block j two vectors of 2-bit quants and one of 3rd
// bits become the Q4 nibble vectors of u = q + 4 (0..7); then as Q6_K with the offset 4, the
// scales (-32..31) applied in integers (3-bit products: four maddubs fit a 16-bit sum):
//   S = madd(P16_lo, sc_lo) + madd(P16_hi, sc_hi) − madd((q16_lo, q16_hi), (4 sc_lo, 4 sc_hi))
//   acc[r] += float(S) · d[r] · dx
template <int MR>
void dot_packed_q3_k(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    PanelPrefetch prefetch(u, a.row_bytes, 8 * nsb);
    RowAccs<MR> acc(a);
    for (int64_t i = 0; i < nsb; ++i, u += 1856) {
      for (int j = 0; j < 8; ++j) {
        prefetch();
        const uint8_t* q = u + 192 * j;
        for (int h = 0; h < 2; ++h) {
          const __m256i l0 = load32(q + 32 * h), l1 = load32(q + 64 + 32 * h), h3 = load32(q + 128 + 32 * h);
          __m256i lo[4], hi[4];
          for (int k = 0; k < 4; ++k) {
            lo[k] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 2 * k), three),
                                    _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(h3, k), 2), four));
            hi[k] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 2 * k), three),
                                    _mm256_and_si256(_mm256_srli_epi16(h3, 2 + k), four));
          }
          const __m256 d = f16x8(u + 1792 + 16 * h);
          const GroupScales sc(u + 1536 + 32 * j + 8 * h, u + 1536 + 32 * j + 16 + 8 * h, 2);
          ActRows r(a, 8 * i + j);
          for (int m = 0; m < acc.rows(); ++m, r.next()) {
            const SubBlockProducts prod(lo, hi, r.x);
            const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(prod.lo_sum(), sc.lo), _mm256_madd_epi16(prod.hi_sum(), sc.hi));
            acc(m, h) = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sc.minus_offset(s, r)), _mm256_mul_ps(d, _mm256_broadcast_ss(r.dx)), acc(m, h));
          }
        }
      }
    }
    acc.store(a, p);
  }
}

// IQ4_XS super-block panel (pack_iq4_xs): the nibble vectors become the signed levels with one
// byte shuffle; levels + 128 would saturate maddubs, so the products use the sign trick
// (|w| times x with w's sign, |w| <= 127: a pair stays below 2^15) and every maddubs is widened:
//   acc[r] += float(P) * (d ls_j)[r] * dx
template <int MR>
void dot_packed_iq4_xs(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4nlValues)));
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    PanelPrefetch prefetch(u, a.row_bytes, 8 * nsb);
    RowAccs<MR> acc(a);
    for (int64_t i = 0; i < nsb; ++i, u += 2240) {
      for (int j = 0; j < 8; ++j) {
        prefetch();
        for (int h = 0; h < 2; ++h) {
          __m256i w[8], w_abs[8];
          iq4_levels(u + 256 * j, h, table, w, w_abs);
          const __m256 sc = _mm256_mul_ps(f16x8(u + 2176 + 16 * h), s8x8(u + 2048 + 16 * j + 8 * h));
          ActRows r(a, 8 * i + j);
          for (int m = 0; m < acc.rows(); ++m, r.next()) {
            const __m256i s = signed_dot32(w, w_abs, r.x);
            acc(m, h) = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sc, _mm256_broadcast_ss(r.dx)), acc(m, h));
          }
        }
      }
    }
    acc.store(a, p);
  }
}

// IQ4_NL: the Q4_0 panel, its nibbles the signed levels as in dot_packed_iq4_xs, one d a row:
//   acc[r] += float(P) * d[r] * dx
template <int MR>
void dot_packed_iq4_nl(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nb = a.K / 32;
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4nlValues)));
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* qp = a.w + p * a.row_bytes;
    const uint8_t* sp = qp + nb * 256;
    PanelPrefetch prefetch(qp, a.row_bytes, nb);
    RowAccs<MR> acc(a);
    for (int64_t b = 0; b < nb; ++b, qp += 256) {
      prefetch();
      for (int h = 0; h < 2; ++h) {
        __m256i w[8], w_abs[8];
        iq4_levels(qp, h, table, w, w_abs);
        const __m256 d = f16x8(sp + 32 * b + 16 * h);
        ActRows r(a, b);
        for (int m = 0; m < acc.rows(); ++m, r.next()) {
          const __m256i s = signed_dot32(w, w_abs, r.x);
          acc(m, h) = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_broadcast_ss(r.dx)), acc(m, h));
        }
      }
    }
    acc.store(a, p);
  }
}

// Q2_K super-block panel (pack_q2_k), as the AVX-512 kernel: 2-bit quants, per 16-column group the
// rows' scale|min byte, per super-block d and dmin.
template <int MR>
void dot_packed_q2_k(const DotArgs& a, int64_t p0, int64_t p1) {
  const int64_t nsb = a.K / 256;
  const __m256i three = _mm256_set1_epi8(3), low4 = _mm256_set1_epi32(0xF);
  auto bytes8 = [](const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); };
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* u = a.w + p * a.row_bytes;
    PanelPrefetch prefetch(u, a.row_bytes, 8 * nsb);
    RowAccs<MR> acc(a);
    for (int64_t i = 0; i < nsb; ++i, u += 1344) {
      for (int j = 0; j < 8; ++j) {
        prefetch();
        for (int h = 0; h < 2; ++h) {
          const __m256i l0 = load32(u + 128 * j + 32 * h), l1 = load32(u + 128 * j + 64 + 32 * h);
          __m256i lo[4], hi[4];
          for (int k = 0; k < 4; ++k) {
            lo[k] = _mm256_and_si256(_mm256_srli_epi16(l0, 2 * k), three);
            hi[k] = _mm256_and_si256(_mm256_srli_epi16(l1, 2 * k), three);
          }
          const __m256 d = f16x8(u + 1280 + 16 * h), dmin = f16x8(u + 1312 + 16 * h);
          const __m256i sm_lo = bytes8(u + 1024 + 32 * j + 8 * h), sm_hi = bytes8(u + 1040 + 32 * j + 8 * h);
          const __m256 sc_lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(sm_lo, low4)));
          const __m256 sc_hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(sm_hi, low4)));
          const __m256 mn_lo = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(sm_lo, 4)));
          const __m256 mn_hi = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(sm_hi, 4)));
          ActRows r(a, 8 * i + j);
          for (int m = 0; m < acc.rows(); ++m, r.next()) {
            const SubBlockProducts prod(lo, hi, r.x);
            const int16_t* q16 = r.q16;
            const float dx = *r.dx;
            const __m256 vdx = _mm256_set1_ps(dx);
            __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod.lo6bit()), _mm256_mul_ps(sc_lo, vdx), acc(m, h));
            t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod.hi6bit()), _mm256_mul_ps(sc_hi, vdx), t);
            t = _mm256_fnmadd_ps(mn_lo, _mm256_set1_ps(dx * static_cast<float>(q16[0])), t);
            acc(m, h) = _mm256_fnmadd_ps(mn_hi, _mm256_set1_ps(dx * static_cast<float>(q16[1])), t);
          }
        }
      }
    }
    acc.store(a, p);
  }
}

template <int MR> struct PackedQ8_0 { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q8_0<MR>(a, b, e); } };
template <int MR> struct PackedQ2K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q2_k<MR>(a, b, e); } };
template <int MR> struct PackedIQ4NL { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_iq4_nl<MR>(a, b, e); } };
template <int MR> struct PackedIQ4XS { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_iq4_xs<MR>(a, b, e); } };
template <int MR> struct PackedQ3K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q3_k<MR>(a, b, e); } };
template <int MR> struct PackedQ4K {
  static void run(const DotArgs& a, int64_t b, int64_t e) {
    if constexpr (MR == 1) dot_packed_q4_k_row(a, b, e);
    else dot_packed_q4_k<MR>(a, b, e);
  }
};
template <int MR> struct PackedQ6K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q6_k<MR>(a, b, e); } };

template <bool kMin, bool kQ5> struct PackedQ4 { template <int MR> struct K { static void run(const DotArgs& a, int64_t b, int64_t e) { dot_packed_q4<kMin, kQ5, MR>(a, b, e); } }; };

}  // namespace

void register_avx2_dot_packed(KernelTable& t) {
  t.packed_max_mr = kManyPackedMr;
  t.packed_block_major = true;
  t.dot_packed[kQ8_0] = by_mr_or_many<PackedQ8_0, kMaxPackedMr>;
  t.dot_packed[kQ4_0] = by_mr_or_many<PackedQ4<false, false>::K, kMaxPackedMr>;
  t.dot_packed[kQ4_1] = by_mr_or_many<PackedQ4<true, false>::K, kMaxPackedMr>;
  t.dot_packed[kQ5_0] = by_mr_or_many<PackedQ4<false, true>::K, kMaxPackedMr>;
  t.dot_packed[kQ5_1] = by_mr_or_many<PackedQ4<true, true>::K, kMaxPackedMr>;
  t.dot_packed[kQ4_K] = by_mr_or_many<PackedQ4K, kMaxPackedMr>;
  t.dot_packed[kQ6_K] = by_mr_or_many<PackedQ6K, kMaxPackedMr>;
  t.dot_packed[kQ3_K] = by_mr_or_many<PackedQ3K, kMaxPackedMr>;
  t.dot_packed[kIQ4_XS] = by_mr_or_many<PackedIQ4XS, kMaxPackedMr>;
  t.dot_packed[kIQ4_NL] = by_mr_or_many<PackedIQ4NL, kMaxPackedMr>;
  t.dot_packed[kQ2_K] = by_mr_or_many<PackedQ2K, kMaxPackedMr>;
}

}  // namespace fathom::cpu::detail
