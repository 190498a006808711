// Batched kQ8 matmul over PackedWeights panels on AMX-INT8 tiles (Sapphire Rapids and later):
// Q4_K and Q6_K (the formats of a Q4_K_M model) and Q8_0, when a call has kAmxMinRows or more
// activation rows (a batched decode step, speculative verification, prefill). Fewer rows go to the AVX-512
// VNNI kernels (matmul_packed_avx512.cpp), which one row's decode streams at memory speed anyway.
//
// Per 32-column sub-block b of a panel (16 weight rows n) and the call's mr activation rows m:
//   A tile: the rows' 32 int8 quants of block b, read in place (row stride DotArgs::ldq)
//   B tile: the panel's 16 rows × 32 quants as unsigned bytes, 8 rows of 64 (the VNNI layout:
//           tile row r holds columns 4r..4r+3 of each n; the panel's nibble vectors are exactly
//           that, so unpacking is the VNNI kernel's load_nibbles and 8 stores)
//   C tile: P[m][n] = Σ_k x[m][k] q[n][k], exact int32 (TDPBSUD: signed A, unsigned B)
// then AVX-512 applies the scales, one 16-lane row of C per activation row.
//
// A row's result is bitwise the VNNI kernel's, whatever the batch: P is the same integer (VNNI
// sums it in two halves, exactly), and the float operations per (m, n) are the same ones in
// the same order:
//   Q4_K: acc += float(P) * (d sc_j · dx);  acc2 += (dmin m_j) · (dx qsum);  y = acc − acc2
//   Q6_K: t = float(P_hi − 32 qsum16_hi) * d sc_hi + float(P_lo − 32 qsum16_lo) * d sc_lo;  acc += t · dx
// (Q6_K's B holds q − 32 as signed bytes, TDPBSSD, so that C is P_h − 32 qsum16_h directly.)
// So batch invariance (decode == prefill == verification, bitwise) holds across the two kernels,
// and MatmulTest.Q8RowsAreBitwiseIndependentOfBatchThreadsAndPosition checks it on AMX hosts.
//
// Per super-block the 8 sub-blocks' B tiles are unpacked first, then the 8 (Q6_K: 16) tile
// products run back to back into C buffers, then the scales go over them row by row: AMX and
// AVX-512 work overlap, and no store is read back right after it was written.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/matmul_avx512_common.h"

namespace fathom::cpu::detail {
namespace {

constexpr int kTileRows = 16;  // activation rows of one tile (the most a call takes)
constexpr int kAmxMinRows = kMaxMr + 1;  // fewer rows: the VNNI kernels

// The VNNI kernels this file hands small calls to (registered before it), by format.
DotFn g_vnni[kFmtCount] = {};

// Tiles 0-1: A (mr rows × kK bytes); 2-3: B (kK / 4 rows × 64 bytes); 4-7: C (mr rows × 16 int32).
template <int kK>
const AmxTileConfig& tile_config(int mr) {
  static const auto configs = [] {
    struct All {
      AmxTileConfig c[kTileRows + 1];
    } all;
    for (int r = 1; r <= kTileRows; ++r) {
      AmxTileConfig& c = all.c[r];
      for (int t = 0; t < 2; ++t) c.rows[t] = static_cast<uint8_t>(r), c.colsb[t] = kK;
      for (int t = 2; t < 4; ++t) c.rows[t] = kK / 4, c.colsb[t] = 64;
      for (int t = 4; t < 8; ++t) c.rows[t] = static_cast<uint8_t>(r), c.colsb[t] = 64;
    }
    return all;
  }();
  return configs.c[mr];
}

// GCC's tile loads and stores are asm statements without a "memory" clobber: a barrier orders
// them against the AVX-512 stores before them and loads after them.
inline void memory_barrier() { asm volatile("" ::: "memory"); }

// The scales of a sub-block's 16 rows: d · float(byte), bytes unsigned (Q4_K) or signed (Q6_K).
inline __m512 scales_u8(__m512 d, const uint8_t* p) {
  return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p)))));
}
inline __m512 scales_i8(__m512 d, const uint8_t* p) {
  return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p)))));
}

// Row m's block b of the activations (either DotArgs layout).
inline const int8_t* act_block(const DotArgs& a, int64_t b) { return a.q + b * a.ldqb; }
inline int64_t act_index(const DotArgs& a, int m, int64_t b) { return m * a.ldqs + b * a.ldsb; }

// Runs a call's (panel, super-block) steps, three stages each: unpack(p, i, h) writes the
// weights' B tiles into buffer h, tiles(p, i, h) runs the tile products from buffer h into the C
// buffers, scales(p, i) applies the scales over them with AVX-512. Step s + 1 is unpacked before
// step s's tiles: a tile load of bytes the vector unit stored just before waits for the stores to
// reach the cache (a loop of store B, load it as a tile, one product: 4× slower than with the
// stores a step ahead).
// unpack also takes the panel's PanelPrefetch, made for `prefetches` calls a step, and calls it as
// it reads (spread over the step: all at the step's start made Q6_K 10% slower).
template <typename Unpack, typename Tiles, typename Scales>
void run_steps(const DotArgs& a, int64_t p0, int64_t p1, int64_t nsb, int prefetches, const Unpack& unpack,
               const Tiles& tiles, const Scales& scales) {
  const int64_t steps = (p1 - p0) * nsb;
  PanelPrefetch prefetch(a.w, a.row_bytes, 1);
  auto ahead = [&](int64_t s) {
    const int64_t p = p0 + s / nsb, i = s % nsb;
    if (i == 0) prefetch = PanelPrefetch(a.w + p * a.row_bytes, a.row_bytes, nsb * prefetches);
    unpack(p, i, static_cast<int>(s & 1), prefetch);
  };
  if (steps > 0) ahead(0);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t p = p0 + s / nsb, i = s % nsb;
    if (s + 1 < steps) ahead(s + 1);
    memory_barrier();
    tiles(p, i, static_cast<int>(s & 1));
    memory_barrier();
    scales(p, i);
    memory_barrier();
  }
}

// Q4_K panel (layout: dot_packed_q4_k in matmul_packed_avx512.cpp). A: tiles 0/1, B: 2/3, C: 4-7.
void amx_q4_k(const DotArgs& a, int64_t p0, int64_t p1) {
  if (a.mr < kAmxMinRows) return g_vnni[kQ4_K](a, p0, p1);
  const int mr = a.mr;
  const int64_t nsb = a.K / 256;
  constexpr size_t kSuper = 2368;               // bytes of a panel's super-block
  alignas(64) uint8_t bt[2][8][512];            // B tiles of a super-block's sub-blocks, two steps
  alignas(64) int32_t ct[8][kTileRows][16];     // their products
  alignas(64) float acc[kTileRows][16], acc2[kTileRows][16];
  for (int m = 0; m < mr; ++m) {
    _mm512_store_ps(acc[m], _mm512_setzero_ps());
    _mm512_store_ps(acc2[m], _mm512_setzero_ps());
  }
  _tile_loadconfig(&tile_config<32>(mr));
  auto unpack = [&](int64_t p, int64_t i, int h, PanelPrefetch& prefetch) {
    const uint8_t* u = a.w + p * a.row_bytes + i * kSuper;
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      prefetch();
      __m512i lo[4], hi[4];
      load_nibbles(u + 256 * j, lo, hi);
      for (int v = 0; v < 4; ++v) {
        _mm512_store_si512(bt[h][j] + 64 * v, lo[v]);
        _mm512_store_si512(bt[h][j] + 256 + 64 * v, hi[v]);
      }
    }
  };
  auto tiles = [&](int64_t, int64_t i, int h) {
    // Tile numbers are immediates: the sub-blocks alternate A and B tiles and take C 4-7.
#define FATHOM_AMX_Q4K_STEP(J, TA, TB, TC)            \
  _tile_loadd(TA, act_block(a, 8 * i + J), a.ldq);    \
  _tile_loadd(TB, bt[h][J], 64);                      \
  _tile_zero(TC);                                     \
  _tile_dpbsud(TC, TA, TB);                           \
  _tile_stored(TC, ct[J], 64)
    FATHOM_AMX_Q4K_STEP(0, 0, 2, 4);
    FATHOM_AMX_Q4K_STEP(1, 1, 3, 5);
    FATHOM_AMX_Q4K_STEP(2, 0, 2, 6);
    FATHOM_AMX_Q4K_STEP(3, 1, 3, 7);
    FATHOM_AMX_Q4K_STEP(4, 0, 2, 4);
    FATHOM_AMX_Q4K_STEP(5, 1, 3, 5);
    FATHOM_AMX_Q4K_STEP(6, 0, 2, 6);
    FATHOM_AMX_Q4K_STEP(7, 1, 3, 7);
#undef FATHOM_AMX_Q4K_STEP
  };
  auto scales = [&](int64_t p, int64_t i) {
    const uint8_t* u = a.w + p * a.row_bytes + i * kSuper;
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 2304)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 2336)));
    __m512 sc[8], mn[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      sc[j] = scales_u8(d, u + 2048 + 16 * j);
      mn[j] = scales_u8(dmin, u + 2176 + 16 * j);
    }
    // qds = dx · float(qsum), the product the VNNI kernel forms (the same rounding).
    const float* qd = a.qd + act_index(a, 0, 8 * i);
    const float* qds = a.qds + act_index(a, 0, 8 * i);
    for (int m = 0; m < mr; ++m, qd += a.ldqs, qds += a.ldqs) {
      __m512 s = _mm512_load_ps(acc[m]), s2 = _mm512_load_ps(acc2[m]);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512 P = _mm512_cvtepi32_ps(_mm512_load_si512(ct[j][m]));
        s = _mm512_fmadd_ps(P, _mm512_mul_ps(sc[j], _mm512_set1_ps(qd[j * a.ldsb])), s);
        s2 = _mm512_fmadd_ps(mn[j], _mm512_set1_ps(qds[j * a.ldsb]), s2);
      }
      if (i + 1 < nsb) {
        _mm512_store_ps(acc[m], s);
        _mm512_store_ps(acc2[m], s2);
      } else {  // the panel's last super-block
        store_panel(a.y + m * a.ldy, _mm512_sub_ps(s, s2), p, a.rows_total);
        _mm512_store_ps(acc[m], _mm512_setzero_ps());
        _mm512_store_ps(acc2[m], _mm512_setzero_ps());
      }
    }
  };
  run_steps(a, p0, p1, nsb, 8, unpack, tiles, scales);
}

// Q6_K panel (layout: dot_packed_q6_k in matmul_packed_avx512.cpp): per sub-block two 16-column
// halves, each its own A (columns 0-15 / 16-31 of the block), B (4 rows of 64) and C.
void amx_q6_k(const DotArgs& a, int64_t p0, int64_t p1) {
  if (a.mr < kAmxMinRows) return g_vnni[kQ6_K](a, p0, p1);
  const int mr = a.mr;
  const int64_t nsb = a.K / 256;
  constexpr size_t kSuper = 3392;
  alignas(64) uint8_t bt[2][8][2][256];            // per step, sub-block and half: B tile, q − 32 as int8
  alignas(64) int32_t ct[8][2][kTileRows][16];     // their products
  alignas(64) float acc[kTileRows][16];
  for (int m = 0; m < mr; ++m) _mm512_store_ps(acc[m], _mm512_setzero_ps());
  const __m512i c32 = _mm512_set1_epi8(32);
  _tile_loadconfig(&tile_config<16>(mr));
  auto unpack = [&](int64_t p, int64_t i, int h, PanelPrefetch& prefetch) {
    const uint8_t* u = a.w + p * a.row_bytes + i * kSuper;
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      prefetch();
      __m512i lo[4], hi[4];
      load_q6_k(u, j, lo, hi);
      for (int v = 0; v < 4; ++v) {  // − 32: signed bytes, so that C is P − 32 qsum16 directly
        _mm512_store_si512(bt[h][j][0] + 64 * v, _mm512_sub_epi8(lo[v], c32));
        _mm512_store_si512(bt[h][j][1] + 64 * v, _mm512_sub_epi8(hi[v], c32));
      }
    }
  };
  auto tiles = [&](int64_t, int64_t i, int h) {
#define FATHOM_AMX_Q6K_STEP(J, H, TA, TB, TC)                 \
  _tile_loadd(TA, act_block(a, 8 * i + J) + 16 * H, a.ldq);   \
  _tile_loadd(TB, bt[h][J][H], 64);                           \
  _tile_zero(TC);                                             \
  _tile_dpbssd(TC, TA, TB);                                   \
  _tile_stored(TC, ct[J][H], 64)
#define FATHOM_AMX_Q6K_PAIR(J, TC0, TC1) \
  FATHOM_AMX_Q6K_STEP(J, 0, 0, 2, TC0);  \
  FATHOM_AMX_Q6K_STEP(J, 1, 1, 3, TC1)
    FATHOM_AMX_Q6K_PAIR(0, 4, 5);
    FATHOM_AMX_Q6K_PAIR(1, 6, 7);
    FATHOM_AMX_Q6K_PAIR(2, 4, 5);
    FATHOM_AMX_Q6K_PAIR(3, 6, 7);
    FATHOM_AMX_Q6K_PAIR(4, 4, 5);
    FATHOM_AMX_Q6K_PAIR(5, 6, 7);
    FATHOM_AMX_Q6K_PAIR(6, 4, 5);
    FATHOM_AMX_Q6K_PAIR(7, 6, 7);
#undef FATHOM_AMX_Q6K_PAIR
#undef FATHOM_AMX_Q6K_STEP
  };
  auto scales = [&](int64_t p, int64_t i) {
    const uint8_t* u = a.w + p * a.row_bytes + i * kSuper;
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 3328)));
    __m512 sc_lo[8], sc_hi[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      sc_lo[j] = scales_i8(d, u + 3072 + 32 * j);
      sc_hi[j] = scales_i8(d, u + 3072 + 32 * j + 16);
    }
    const float* qd = a.qd + act_index(a, 0, 8 * i);
    for (int m = 0; m < mr; ++m, qd += a.ldqs) {
      __m512 s = _mm512_load_ps(acc[m]);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(ct[j][0][m])), sc_lo[j]);
        const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(ct[j][1][m])), sc_hi[j], lo);
        s = _mm512_fmadd_ps(t, _mm512_set1_ps(qd[j * a.ldsb]), s);
      }
      if (i + 1 < nsb) {
        _mm512_store_ps(acc[m], s);
      } else {
        store_panel(a.y + m * a.ldy, s, p, a.rows_total);
        _mm512_store_ps(acc[m], _mm512_setzero_ps());
      }
    }
  };
  run_steps(a, p0, p1, nsb, 8, unpack, tiles, scales);
}

// Q8_0 panel (layout: dot_packed_q8_0 in matmul_packed_avx512.cpp): each 32-column block's 8
// vectors of q + 128 are already a B tile (8 rows × 64 bytes), so tiles load it straight from the
// panel, no unpacking. C = P + 128 qsum; the VNNI kernel's
//   acc += float(P − 128 qsum) * (d · dx)
// takes the same integer. Steps of up to 8 blocks.
void amx_q8_0(const DotArgs& a, int64_t p0, int64_t p1) {
  if (a.mr < kAmxMinRows) return g_vnni[kQ8_0](a, p0, p1);
  const int mr = a.mr;
  const int64_t nb = a.K / 32, steps = (nb + 7) / 8;
  alignas(64) int32_t ct[8][kTileRows][16];
  alignas(64) float acc[kTileRows][16];
  for (int m = 0; m < mr; ++m) _mm512_store_ps(acc[m], _mm512_setzero_ps());
  _tile_loadconfig(&tile_config<32>(mr));
  auto unpack = [](int64_t, int64_t, int, PanelPrefetch& prefetch) {  // nothing to unpack
    for (int j = 0; j < 8; ++j) prefetch();
  };
  auto tiles = [&](int64_t p, int64_t i, int) {
    const uint8_t* qp = a.w + p * a.row_bytes + i * 8 * 512;
    const int n = static_cast<int>(std::min<int64_t>(8, nb - 8 * i));
    for (int j = 0; j < n; ++j) {
      const int8_t* x = act_block(a, 8 * i + j);
      const uint8_t* w = qp + 512 * j;
#define FATHOM_AMX_Q8_STEP(TA, TB, TC) \
  _tile_loadd(TA, x, a.ldq);            \
  _tile_loadd(TB, w, 64);               \
  _tile_zero(TC);                       \
  _tile_dpbsud(TC, TA, TB);             \
  _tile_stored(TC, ct[j], 64)
      switch (j & 3) {
        case 0: FATHOM_AMX_Q8_STEP(0, 2, 4); break;
        case 1: FATHOM_AMX_Q8_STEP(1, 3, 5); break;
        case 2: FATHOM_AMX_Q8_STEP(0, 2, 6); break;
        default: FATHOM_AMX_Q8_STEP(1, 3, 7); break;
      }
#undef FATHOM_AMX_Q8_STEP
    }
  };
  auto scales = [&](int64_t p, int64_t i) {
    const uint8_t* sp = a.w + p * a.row_bytes + nb * 512 + i * 8 * 32;
    const int n = static_cast<int>(std::min<int64_t>(8, nb - 8 * i));
    __m512 d[8];
    for (int j = 0; j < n; ++j) d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + 32 * j)));
    const float* qd = a.qd + act_index(a, 0, 8 * i);
    const int32_t* qs = a.qsum + act_index(a, 0, 8 * i);
    for (int m = 0; m < mr; ++m, qd += a.ldqs, qs += a.ldqs) {
      __m512 s = _mm512_load_ps(acc[m]);
      for (int j = 0; j < n; ++j) {
        const __m512i P = _mm512_sub_epi32(_mm512_load_si512(ct[j][m]), _mm512_set1_epi32(128 * qs[j * a.ldsb]));
        s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(P), _mm512_mul_ps(d[j], _mm512_set1_ps(qd[j * a.ldsb])), s);
      }
      if (8 * (i + 1) < nb) {
        _mm512_store_ps(acc[m], s);
      } else {
        store_panel(a.y + m * a.ldy, s, p, a.rows_total);
        _mm512_store_ps(acc[m], _mm512_setzero_ps());
      }
    }
  };
  run_steps(a, p0, p1, steps, 8, unpack, tiles, scales);
}

}  // namespace

void register_amx_dot_packed(KernelTable& t) {
  const struct {
    int f;
    DotFn amx;
  } kernels[] = {{kQ4_K, amx_q4_k}, {kQ6_K, amx_q6_k}, {kQ8_0, amx_q8_0}};
  for (const auto& k : kernels) {
    if (!t.dot_packed[k.f]) continue;
    g_vnni[k.f] = t.dot_packed[k.f];
    t.dot_packed[k.f] = k.amx;
    t.packed_max_mr_of[k.f] = kTileRows;
  }
}

}  // namespace fathom::cpu::detail
