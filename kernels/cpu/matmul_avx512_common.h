#pragma once
// Helpers shared by the AVX-512 matmul kernels (include only from *_avx512.cpp and *_amx.cpp
// files: the code needs AVX-512 BW; everything has internal linkage so no copy leaks to baseline
// code).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/matmul_prefetch.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/ggml_type.h"

namespace fathom::cpu::detail {
namespace {

inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// PackedWeights panels (packed_weights.h), read by the VNNI kernels (matmul_packed_avx512.cpp)
// and the AMX ones (matmul_packed_amx.cpp), which must see the same values.

// Loads the 4 nibble vectors of a 32-column sub-block at p: lo = low nibbles (columns 4v..4v+3
// of vector v), hi = high nibbles (columns 16 + 4v..).
inline void load_nibbles(const uint8_t* p, __m512i* lo, __m512i* hi) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int v = 0; v < 4; ++v) {
    const __m512i raw = _mm512_load_si512(p + 64 * v);
    lo[v] = _mm512_and_si512(raw, nib);
    hi[v] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
  }
}

// Sub-block j of the Q6_K super-block at u: its quants 0..63 in the nibble vectors' layout (lo:
// columns 0..15, hi: 16..31), the low nibbles with the 2-bit highs as bits 4-5.
inline void load_q6_k(const uint8_t* u, int j, __m512i* lo, __m512i* hi) {
  const __m512i b01 = _mm512_set1_epi8(0x03), b23 = _mm512_set1_epi8(0x0C);
  load_nibbles(u + 256 * j, lo, hi);
  for (int v = 0; v < 4; ++v) {
    __m512i g = _mm512_load_si512(u + 2048 + 128 * j + 64 * (v / 2));
    if (v % 2) g = _mm512_srli_epi16(g, 4);
    lo[v] = _mm512_or_si512(lo[v], _mm512_slli_epi16(_mm512_and_si512(g, b01), 4));
    hi[v] = _mm512_or_si512(hi[v], _mm512_slli_epi16(_mm512_and_si512(g, b23), 2));
  }
}

// A panel's 16 results (rows 16 p ..) into y, the rows past rows_total left alone.
inline void store_panel(float* y, __m512 v, int64_t p, int64_t rows_total) {
  const int64_t r0 = p * PackedWeights::kPanelRows;
  const int64_t n = rows_total - r0;
  if (n >= 16) _mm512_storeu_ps(y + r0, v);
  else _mm512_mask_storeu_ps(y + r0, static_cast<__mmask16>((1u << n) - 1), v);
}

#include "kernels/cpu/matmul_by_mr.inc"  // by_mr, each including file's own copy

// Byte layout per format: block stride, qh / qs offsets, constant c and whether a min exists.
template <GgmlType T> struct Q32;
template <> struct Q32<GgmlType::Q4_0> { static constexpr int kStride = 18, kQs = 2, kQh = -1, kOff = 8; static constexpr bool kMin = false; };
template <> struct Q32<GgmlType::Q4_1> { static constexpr int kStride = 20, kQs = 4, kQh = -1, kOff = 0; static constexpr bool kMin = true; };
template <> struct Q32<GgmlType::Q5_0> { static constexpr int kStride = 22, kQs = 6, kQh = 2, kOff = 16; static constexpr bool kMin = false; };
template <> struct Q32<GgmlType::Q5_1> { static constexpr int kStride = 24, kQs = 8, kQh = 4, kOff = 0; static constexpr bool kMin = true; };
template <> struct Q32<GgmlType::Q8_0> { static constexpr int kStride = 34, kQs = 2, kQh = -1, kOff = 128; static constexpr bool kMin = false; };
// IQ4_NL: the levels + 128 (kIq4nlValues as unsigned bytes) where a kernel multiplies unsigned.
template <> struct Q32<GgmlType::IQ4_NL> { static constexpr int kStride = 18, kQs = 2, kQh = -1, kOff = 128; static constexpr bool kMin = false; };

// The f16 scale (and min) of 16 consecutive blocks in one register, without a gather:
// 128-byte chunks of the blocks are loaded and a word permute picks the fields (word i < 16:
// d of block i; word 16 + i: m of block i). chunk[c] marks the output words chunk c supplies.
template <int kStride, bool kMin>
struct ScaleIdx {
  static constexpr int kChunks = (16 * kStride / 2 + 63) / 64;
  __m512i idx;
  __mmask32 chunk[kChunks];
  ScaleIdx() {
    alignas(64) int16_t v[32] = {};
    for (int c = 0; c < kChunks; ++c) chunk[c] = 0;
    for (int i = 0; i < (kMin ? 32 : 16); ++i) {
      const int src = (kStride / 2) * (i % 16) + (i >= 16 ? 1 : 0);
      v[i] = static_cast<int16_t>(src & 63);
      chunk[src / 64] |= (1u << i);
    }
    idx = _mm512_load_si512(v);
  }
};

// Returns the words described at ScaleIdx for blocks [0, gn) starting at blk.
template <GgmlType T>
inline __m512i load_scales16(const uint8_t* blk, int gn, const ScaleIdx<Q32<T>::kStride, Q32<T>::kMin>& si) {
  using F = Q32<T>;
  const int words = gn * F::kStride / 2;
  __m512i r = _mm512_setzero_si512();
  for (int c = 0; c < si.kChunks; ++c) {
    const int w0 = 64 * c;
    if (w0 >= words) break;
    // Masked loads: never read past the last block of the row.
    const int na = words - w0 >= 32 ? 32 : words - w0;
    const int nb2 = words - w0 - 32 >= 32 ? 32 : (words - w0 - 32 > 0 ? words - w0 - 32 : 0);
    const __m512i za = _mm512_maskz_loadu_epi16(na == 32 ? 0xFFFFFFFFu : ((1u << na) - 1), blk + 2 * w0);
    const __m512i zb = _mm512_maskz_loadu_epi16(nb2 == 32 ? 0xFFFFFFFFu : ((1u << nb2) - 1), blk + 2 * w0 + 64);
    r = _mm512_mask_mov_epi16(r, si.chunk[c], _mm512_permutex2var_epi16(za, si.idx, zb));
  }
  return r;
}

}  // namespace
}  // namespace fathom::cpu::detail
