// Many rows over one key range on AMX tiles: bifurcated attention's shared segments, where b
// sequences × G query heads (tens to hundreds of rows) read the same keys, so the step is two
// small GEMMs per key chunk and compute-bound on AVX-512 (bench/results/bifurcated.md).
//
// AMX multiplies bf16 tiles (TDPBF16PS: C[16][16] f32 += A[16][32] · B[32][16]; on the
// development VM ~0.9 TFLOP/s per core back to back, ~0.5 with the operand tile loads, against
// ~0.12 for AVX-512 f32 FMAs; each core has its own unit). bf16 keeps 8 significant bits, so
// every operand is split into two bf16 terms, x = hi + lo ("bf16x3"): an f16 K or V element (11 bits) splits exactly,
// a q or p element (f32) to within 2^-17 of itself, and each product is taken as
// hi·hi + hi·lo + lo·hi (the lo·lo term is below 2^-17). Accumulation is f32. The result differs
// from the f32 kernels by ~1e-5 (|v| ~ 1, worst 1.7e-5 at d 256): well inside the f16 rounding of
// the stored K and V (2^-11), and tested against the reference with its own tolerance
// (test_backend_ops: bifurcated on cpu_amx). One thread, 16k keys, d 128: 48 rows 5.4 ms against 8.3 for the AVX-512
// Kᵀ kernel, 192 rows 15.4 against 31.7 (INT8, best of 7 on a busy machine: 4.0 / 8.0 and 12.0 /
// 31.6); below ~32 rows the Kᵀ kernel wins (bifurcated_attention.cpp).
//
// Keys go in pieces of up to 256 (16 sub-tiles of 16 keys at absolute multiples of 16):
//   1. Kᵀ of the piece (from the transposed-K plane) → B tiles, bf16 hi/lo, dims paired
//   2. logits S[r][key] = Σ_c q_r[c] k[c]            AMX, 3 products per (row tile, sub-tile, 32 dims)
//   3. online softmax per row over the piece's live keys (AVX-512), P → A tiles (hi/lo)
//   4. V of the piece → B tiles (keys paired)
//   5. acc[r][c] = corr_r · acc[r][c] + Σ_t p_r[t] v[t][c]   AMX, accumulators as C tiles
// INT8 KV (ALISA's per-row scale and min) takes the same path with fewer products: its codes
// 0-255 are exact in bf16, so K and V need no lo term (hi·x + lo·x, two products); the logit is
// k_scale·(q·x) + k_min·Σq per key, p is stored multiplied by the key's v_scale, and Σ p·v_min is
// added to every output component.
// f16 or INT8 KV with the transposed-K plane and head_dim a multiple of 64; anything else goes to
// the AVX-512 Kᵀ kernel (f32 with the plane) or rows GEMM (no plane). Rows must share one key
// range (the rows contract).
#include "kernels/cpu/simd_avx512.h"  // first: its pragma must wrap <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/attention_partial.h"

namespace fathom::cpu {
namespace {
using simd512::exp_nonpositive;
using simd512::hmax;
using simd512::hsum;
using simd512::load16;
using simd512::load_params16;
using simd512::sum_of;
using simd512::tail_mask;

constexpr int32_t kTile = 16;    // rows of every tile; keys of a logits tile; dims of an output tile
constexpr int32_t kStep = 32;    // bf16 elements along a tile row: the reduction step of one TDPBF16PS
constexpr int32_t kSubs = 16;    // 16-key sub-tiles per piece
constexpr int32_t kPiece = kSubs * kTile;  // 256 keys
constexpr int32_t kTileElems = kTile * kStep;  // bf16 elements of an A or B tile (1 KiB)

// Every tile 16 rows × 64 bytes: A (16 rows × 32 bf16), B (16 pair-rows × 16 columns × 2 bf16),
// C (16 × 16 f32).
const AmxTileConfig& tile_config() {
  static const AmxTileConfig cfg = [] {
    AmxTileConfig c;
    for (int i = 0; i < 8; ++i) {
      c.rows[i] = kTile;
      c.colsb[i] = 64;
    }
    return c;
  }();
  return cfg;
}

// x (f32) → hi = bf16(x) (round to nearest even), lo = bf16(x − hi). Returned as the two bf16
// vectors of 32 lanes of (a, b): lanes 0-15 from a, 16-31 from b.
struct Split {
  __m512i hi, lo;
};
inline __m512 bf16_to_f32(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
inline Split split2(__m512 a, __m512 b) {
  const __m512i hi = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
  const __m512 a_hi = bf16_to_f32(_mm512_castsi512_si256(hi));
  const __m512 b_hi = bf16_to_f32(_mm512_extracti64x4_epi64(hi, 1));
  const __m512i lo = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, b_hi), _mm512_sub_ps(a, a_hi)));
  return {hi, lo};
}

// B-tile row from two rows of 16 values: 32-bit lane n holds (a[n], b[n]) as two bf16 (low half
// a), the pair layout TDPBF16PS reads. For values with at most 16 significant bits (f16 K and V
// have 11) the split is exact with hi = x truncated to bf16 (its top 16 bits) and lo = x − hi
// truncated again: no rounding, and the pairing is bit masking (no lane permutes).
inline void store_pair_row_exact(__m512 a, __m512 b, uint16_t* hi, uint16_t* lo) {
  const __m512i top = _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u));
  const __m512i ai = _mm512_castps_si512(a), bi = _mm512_castps_si512(b);
  const __m512i a_lo = _mm512_castps_si512(_mm512_sub_ps(a, _mm512_castsi512_ps(_mm512_and_si512(ai, top))));
  const __m512i b_lo = _mm512_castps_si512(_mm512_sub_ps(b, _mm512_castsi512_ps(_mm512_and_si512(bi, top))));
  // (b & top) | (a >> 16): vpternlog with imm 0xEA = (A & B) | C over (b, top, a >> 16).
  _mm512_store_si512(hi, _mm512_ternarylogic_epi32(bi, top, _mm512_srli_epi32(ai, 16), 0xEA));
  _mm512_store_si512(lo, _mm512_ternarylogic_epi32(b_lo, top, _mm512_srli_epi32(a_lo, 16), 0xEA));
}

// The same when the values are exact in bf16 (INT8 codes 0-255): the hi row only.
inline void store_pair_row_hi(__m512 a, __m512 b, uint16_t* hi) {
  const __m512i top = _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u));
  _mm512_store_si512(hi, _mm512_ternarylogic_epi32(_mm512_castps_si512(b), top,
                                                    _mm512_srli_epi32(_mm512_castps_si512(a), 16), 0xEA));
}

// A-tile row: 32 consecutive f32 → 32 consecutive bf16 hi and lo.
inline void store_run(const float* x, uint16_t* hi, uint16_t* lo) {
  const Split s = split2(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16));
  _mm512_storeu_si512(hi, s.hi);
  _mm512_storeu_si512(lo, s.lo);
}

// C tiles 0-3 += A · B_j (j = 0..3), each as hi·hi + hi·lo + lo·hi: A's hi/lo tiles (at ah / al,
// row stride a_stride bytes) loaded once into tiles 4-5 and shared by the four; B_j's hi/lo
// (64-byte rows) at bh / bl + j · b_next loaded in turn into tiles 6-7. Four independent
// accumulators keep the TDPBF16PS pipeline full (two run ~3x slower: each product waits for the
// previous one into the same C). Tile numbers are immediates, hence the macro.
#define FATHOM_TDP3_LOADB(c, bh, bl) \
  do {                               \
    _tile_loadd(6, bh, 64);          \
    _tile_loadd(7, bl, 64);          \
    _tile_dpbf16ps(c, 4, 6);         \
    _tile_dpbf16ps(c, 4, 7);         \
    _tile_dpbf16ps(c, 5, 6);         \
  } while (0)
inline void tdp3_times4(const uint16_t* ah, const uint16_t* al, int32_t a_stride, const uint16_t* bh,
                        const uint16_t* bl, int64_t b_next) {
  _tile_loadd(4, ah, a_stride);
  _tile_loadd(5, al, a_stride);
  FATHOM_TDP3_LOADB(0, bh, bl);
  FATHOM_TDP3_LOADB(1, bh + b_next, bl + b_next);
  FATHOM_TDP3_LOADB(2, bh + 2 * b_next, bl + 2 * b_next);
  FATHOM_TDP3_LOADB(3, bh + 3 * b_next, bl + 3 * b_next);
}
#undef FATHOM_TDP3_LOADB
// The same with B exact in bf16 (INT8 codes): hi·B + lo·B, B_j at b + j · b_next.
#define FATHOM_TDP2_LOADB(c, b) \
  do {                          \
    _tile_loadd(6, b, 64);      \
    _tile_dpbf16ps(c, 4, 6);    \
    _tile_dpbf16ps(c, 5, 6);    \
  } while (0)
inline void tdp2_times4(const uint16_t* ah, const uint16_t* al, int32_t a_stride, const uint16_t* b, int64_t b_next) {
  _tile_loadd(4, ah, a_stride);
  _tile_loadd(5, al, a_stride);
  FATHOM_TDP2_LOADB(0, b);
  FATHOM_TDP2_LOADB(1, b + b_next);
  FATHOM_TDP2_LOADB(2, b + 2 * b_next);
  FATHOM_TDP2_LOADB(3, b + 3 * b_next);
}
#undef FATHOM_TDP2_LOADB

// C tiles 0-3 += A · B_j for KV element type T: three products for f16, two for INT8 codes.
template <typename T>
inline void products_times4(const uint16_t* ah, const uint16_t* al, int32_t a_stride, const uint16_t* bh,
                            const uint16_t* bl, int64_t b_next) {
  if constexpr (std::is_same_v<T, uint8_t>) tdp2_times4(ah, al, a_stride, bh, b_next);
  else tdp3_times4(ah, al, a_stride, bh, bl, b_next);
}

// B-tile pair row of KV element type T: f16 split exactly into hi and lo, INT8 codes hi only.
template <typename T>
inline void store_pair_row(__m512 a, __m512 b, uint16_t* hi, uint16_t* lo) {
  if constexpr (std::is_same_v<T, uint8_t>) store_pair_row_hi(a, b, hi);
  else store_pair_row_exact(a, b, hi, lo);
}

// GCC's _tile_loadd is an asm that takes only the address, without a "memory" clobber: nothing
// tells the compiler that it reads the tiles the AVX-512 code just stored, so the stores could in
// principle be sunk past it. A barrier before each group of tile loads orders them.
inline void compiler_memory_barrier() { asm volatile("" ::: "memory"); }

struct Buffers {  // per thread, reused across calls (sizes grow to the largest call)
  std::vector<uint16_t> qh, ql;    // [Rp][d]
  std::vector<uint16_t> kh, kl;    // [kSubs][d/32] tiles (INT8: kh only)
  std::vector<uint16_t> vh, vl;    // [kSubs/2][d/16] tiles (INT8: vh only)
  std::vector<uint16_t> ph, pl;    // [Rp][kPiece]
  std::vector<float> s;            // [Rp][kPiece] logits
  std::vector<float> acc;          // [Rp][d]
  std::vector<float> m, l, q_sum;  // [Rp]
};

// 64-byte aligned views into a vector (tile loads do not need it, the AVX-512 stores do).
template <typename T>
T* aligned(std::vector<T>& v, size_t n) {
  v.resize(n + 64 / sizeof(T));
  auto p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<T*>((p + 63) & ~uintptr_t{63});
}

template <typename T>
void rows_amx(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1, float scale_factor,
              float* acc_out, float* m_out, float* l_out) {
  constexpr bool kInt8 = std::is_same_v<T, uint8_t>;
  const int32_t d = kv.head_dim, bs = kv.block_size, R = rows.count;
  const KeyRange keys = start_partial(rows, t0, t1, d, acc_out, m_out, l_out);
  if (keys.hi < keys.lo) return;
  const int32_t n_rt = (R + kTile - 1) / kTile, Rp = n_rt * kTile, n_dc = d / kStep, n_dt = d / kTile;
  thread_local Buffers b;
  uint16_t* qh = aligned(b.qh, static_cast<size_t>(Rp) * d);
  uint16_t* ql = aligned(b.ql, static_cast<size_t>(Rp) * d);
  uint16_t* kh = aligned(b.kh, static_cast<size_t>(kSubs) * n_dc * kTileElems);
  uint16_t* kl = aligned(b.kl, static_cast<size_t>(kSubs) * n_dc * kTileElems);
  uint16_t* vh = aligned(b.vh, static_cast<size_t>(kSubs / 2) * n_dt * kTileElems);
  uint16_t* vl = aligned(b.vl, static_cast<size_t>(kSubs / 2) * n_dt * kTileElems);
  uint16_t* ph = aligned(b.ph, static_cast<size_t>(Rp) * kPiece);
  uint16_t* pl = aligned(b.pl, static_cast<size_t>(Rp) * kPiece);
  float* s = aligned(b.s, static_cast<size_t>(Rp) * kPiece);
  float* acc = aligned(b.acc, static_cast<size_t>(Rp) * d);
  float* m = aligned(b.m, Rp);
  float* l = aligned(b.l, Rp);
  float* q_sum = aligned(b.q_sum, Rp);  // INT8: Σ_c q[c] per row (the K min term)
  if constexpr (kInt8)
    for (int32_t r = 0; r < R; ++r) q_sum[r] = sum_of(rows.q[r], d);

  // Q split once per call; padding rows are zero (their results are dropped).
  for (int32_t r = 0; r < Rp; ++r)
    for (int32_t c = 0; c < d; c += kStep) {
      if (r < R) {
        store_run(rows.q[r] + c, qh + static_cast<int64_t>(r) * d + c, ql + static_cast<int64_t>(r) * d + c);
      } else {
        std::memset(qh + static_cast<int64_t>(r) * d + c, 0, kStep * sizeof(uint16_t));
        std::memset(ql + static_cast<int64_t>(r) * d + c, 0, kStep * sizeof(uint16_t));
      }
    }
  std::fill(acc, acc + static_cast<int64_t>(Rp) * d, 0.0f);
  std::fill(m, m + Rp, -INFINITY);
  std::fill(l, l + Rp, 0.0f);

  const auto* k_t = static_cast<const T*>(kv.k_t);
  const auto* v = static_cast<const T*>(kv.v);
  _tile_loadconfig(&tile_config());
  const int32_t q_stride = d * 2, p_stride = kPiece * 2, s_stride = kPiece * 4, acc_stride = d * 4;  // bytes
  for (int32_t p0 = keys.lo / kTile * kTile; p0 <= keys.hi; p0 += kPiece) {
    const int32_t n_sub = std::min(kSubs, (keys.hi - p0) / kTile + 1);
    const int32_t n_kc = (n_sub + 1) / 2;  // 32-key chunks of the PV product
    const int32_t n_sub4 = (n_sub + 3) / 4 * 4;  // the logits go 4 sub-tiles at a time; the rest are zero
    // 1. Kᵀ → B tiles: tile (u, dc), pair-row i = dims (32 dc + 2i, 32 dc + 2i + 1) of keys j0 .. j0 + 15.
    for (int32_t u = 0; u < n_sub; ++u) {
      const int32_t j0 = p0 + u * kTile, blk = j0 / bs;
      const T* src = k_t + kv.tile_offset(blk, head) + (j0 - blk * bs);
      for (int32_t dc = 0; dc < n_dc; ++dc) {
        uint16_t* th = kh + static_cast<int64_t>(u * n_dc + dc) * kTileElems;
        uint16_t* tl = kl + static_cast<int64_t>(u * n_dc + dc) * kTileElems;
        for (int32_t i = 0; i < kTile; ++i) {
          const int32_t c = dc * kStep + 2 * i;
          store_pair_row<T>(load16(src + static_cast<int64_t>(c) * bs), load16(src + static_cast<int64_t>(c + 1) * bs),
                            th + i * kStep, tl + i * kStep);
        }
      }
    }
    const int64_t k_pad = static_cast<int64_t>(n_sub4 - n_sub) * n_dc * kTileElems;
    std::memset(kh + static_cast<int64_t>(n_sub) * n_dc * kTileElems, 0, k_pad * sizeof(uint16_t));
    if constexpr (!kInt8) std::memset(kl + static_cast<int64_t>(n_sub) * n_dc * kTileElems, 0, k_pad * sizeof(uint16_t));
    // 2. Logits of one row tile for 4 sub-tiles at a time: C in tiles 0-3, Q hi/lo shared.
    compiler_memory_barrier();
    for (int32_t rt = 0; rt < n_rt; ++rt)
      for (int32_t u0 = 0; u0 < n_sub4; u0 += 4) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int32_t dc = 0; dc < n_dc; ++dc) {
          const int64_t a0 = static_cast<int64_t>(rt) * kTile * d + dc * kStep;
          const int64_t b0 = static_cast<int64_t>(u0 * n_dc + dc) * kTileElems;
          products_times4<T>(qh + a0, ql + a0, q_stride, kh + b0, kl + b0, static_cast<int64_t>(n_dc) * kTileElems);
        }
        float* s0 = s + static_cast<int64_t>(rt) * kTile * kPiece + u0 * kTile;
        _tile_stored(0, s0, s_stride);
        _tile_stored(1, s0 + kTile, s_stride);
        _tile_stored(2, s0 + 2 * kTile, s_stride);
        _tile_stored(3, s0 + 3 * kTile, s_stride);
      }
    // 3. Online softmax per row over the piece's live keys; P split into A tiles (keys past
    // n_sub · 16 up to the 32-key chunk are zero).
    __mmask16 live[kSubs];
    for (int32_t u = 0; u < n_sub; ++u) {
      const int32_t j0 = p0 + u * kTile, lo = std::max(j0, keys.lo), hi = std::min(j0 + kTile - 1, keys.hi);
      live[u] = static_cast<__mmask16>(tail_mask(hi - j0 + 1) & ~tail_mask(lo - j0));
    }
    const __m512 vscale = _mm512_set1_ps(scale_factor);
    __m512 k_scale[kSubs], k_min[kSubs], v_scale[kSubs], v_min[kSubs];  // INT8: the sub-tiles' row parameters
    if constexpr (kInt8)
      for (int32_t u = 0; u < n_sub; ++u) {
        const int64_t p = kv.row_index(p0 + u * kTile, head);  // 16 consecutive slots of one block
        load_params16(kv.k_rows + p, k_scale[u], k_min[u]);
        load_params16(kv.v_rows + p, v_scale[u], v_min[u]);
      }
    for (int32_t r = 0; r < Rp; ++r) {
      float* sr = s + static_cast<int64_t>(r) * kPiece;
      uint16_t* phr = ph + static_cast<int64_t>(r) * kPiece;
      uint16_t* plr = pl + static_cast<int64_t>(r) * kPiece;
      if (r >= R) {
        std::memset(phr, 0, n_kc * kStep * sizeof(uint16_t));
        std::memset(plr, 0, n_kc * kStep * sizeof(uint16_t));
        continue;
      }
      // Max over the live logits, then p = exp(logit − m) split straight from registers, 32 keys
      // (one P tile row) at a time. f16: the raw q·k (scale > 0 commutes with max). INT8: the
      // logits are k_scale·(q·x) + k_min·Σq per key, formed here and kept in S; p is stored
      // multiplied by the key's v_scale and Σ p·v_min goes to every output component.
      __m512 mx = _mm512_set1_ps(-INFINITY);
      for (int32_t u = 0; u < n_sub; ++u) {
        __m512 x = _mm512_loadu_ps(sr + u * kTile);
        if constexpr (kInt8) {
          x = _mm512_mul_ps(_mm512_fmadd_ps(k_scale[u], x, _mm512_mul_ps(k_min[u], _mm512_set1_ps(q_sum[r]))), vscale);
          _mm512_storeu_ps(sr + u * kTile, x);
        }
        mx = _mm512_mask_max_ps(mx, live[u], mx, x);
      }
      const float m_new = std::max(m[r], kInt8 ? hmax(mx) : hmax(mx) * scale_factor);
      const float corr = m[r] == -INFINITY ? 0.0f : std::exp(m[r] - m_new);
      const __m512 vm = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps(), pmin = _mm512_setzero_ps();
      for (int32_t u = 0; u < n_kc * 2; u += 2) {
        __m512 e[2];
        for (int32_t h = 0; h < 2; ++h) {
          if (u + h >= n_sub) {
            e[h] = _mm512_setzero_ps();
            continue;
          }
          const __m512 x = _mm512_loadu_ps(sr + (u + h) * kTile);
          e[h] = _mm512_maskz_mov_ps(live[u + h], exp_nonpositive(kInt8 ? _mm512_sub_ps(x, vm) : _mm512_fmsub_ps(x, vscale, vm)));
          sum = _mm512_add_ps(sum, e[h]);
          if constexpr (kInt8) {  // masked: a dead key's parameters may be anything (never written)
            pmin = _mm512_add_ps(pmin, _mm512_maskz_mul_ps(live[u + h], e[h], v_min[u + h]));
            e[h] = _mm512_maskz_mul_ps(live[u + h], e[h], v_scale[u + h]);
          }
        }
        const Split sp = split2(e[0], e[1]);
        _mm512_storeu_si512(phr + u * kTile, sp.hi);
        _mm512_storeu_si512(plr + u * kTile, sp.lo);
      }
      l[r] = l[r] * corr + hsum(sum);
      m[r] = m_new;
      const float bias = kInt8 ? hsum(pmin) : 0.0f;  // Σ p·v_min of this piece, in every component
      if (corr != 1.0f || bias != 0.0f) {
        float* ar = acc + static_cast<int64_t>(r) * d;
        const __m512 vc = _mm512_set1_ps(corr), vb = _mm512_set1_ps(bias);
        for (int32_t c = 0; c < d; c += 16) _mm512_store_ps(ar + c, _mm512_fmadd_ps(_mm512_load_ps(ar + c), vc, vb));
      }
    }
    // 4. V → B tiles: tile (kc, dt), pair-row i = keys (32 kc + 2i, 32 kc + 2i + 1), dims 16 dt ..
    // 16 dt + 15. Dead keys are zero (their p is 0, and rows past the sequence may hold anything).
    for (int32_t kc = 0; kc < n_kc; ++kc)
      for (int32_t i = 0; i < kTile; ++i) {
        const int32_t ja = p0 + kc * kStep + 2 * i, jb = ja + 1;
        const int32_t ua = (ja - p0) / kTile, ub = (jb - p0) / kTile;
        const bool a_live = ua < n_sub && (live[ua] >> (ja - p0 - ua * kTile) & 1);
        const bool b_live = ub < n_sub && (live[ub] >> (jb - p0 - ub * kTile) & 1);
        const T* va = a_live ? v + kv.tile_offset(ja / bs, head) + static_cast<int64_t>(ja % bs) * d : nullptr;
        const T* vb = b_live ? v + kv.tile_offset(jb / bs, head) + static_cast<int64_t>(jb % bs) * d : nullptr;
        for (int32_t dt = 0; dt < n_dt; ++dt) {
          const int64_t t = static_cast<int64_t>(kc * n_dt + dt) * kTileElems + i * kStep;
          store_pair_row<T>(va ? load16(va + dt * kTile) : _mm512_setzero_ps(), vb ? load16(vb + dt * kTile) : _mm512_setzero_ps(),
                            vh + t, vl + t);
        }
      }
    compiler_memory_barrier();
    // 5. acc += P·V for one row tile and 4 column tiles (64 dims) at a time: C in 0-3 (from and
    // back to acc), P hi/lo shared.
    for (int32_t rt = 0; rt < n_rt; ++rt)
      for (int32_t dt0 = 0; dt0 < n_dt; dt0 += 4) {
        float* c0 = acc + static_cast<int64_t>(rt) * kTile * d + dt0 * kTile;
        _tile_loadd(0, c0, acc_stride);
        _tile_loadd(1, c0 + kTile, acc_stride);
        _tile_loadd(2, c0 + 2 * kTile, acc_stride);
        _tile_loadd(3, c0 + 3 * kTile, acc_stride);
        for (int32_t kc = 0; kc < n_kc; ++kc) {
          const int64_t a0 = static_cast<int64_t>(rt) * kTile * kPiece + kc * kStep;
          const int64_t b0 = static_cast<int64_t>(kc * n_dt + dt0) * kTileElems;
          products_times4<T>(ph + a0, pl + a0, p_stride, vh + b0, vl + b0, kTileElems);
        }
        _tile_stored(0, c0, acc_stride);
        _tile_stored(1, c0 + kTile, acc_stride);
        _tile_stored(2, c0 + 2 * kTile, acc_stride);
        _tile_stored(3, c0 + 3 * kTile, acc_stride);
      }
  }
  _tile_release();
  for (int32_t r = 0; r < R; ++r) {
    m_out[r] = m[r];
    l_out[r] = l[r];
    std::copy_n(acc + static_cast<int64_t>(r) * d, d, acc_out + static_cast<int64_t>(r) * d);
  }
}

void partial_attention_rows_amx_or_avx512(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0,
                                          int32_t t1, LogitScale scale, float* acc, float* m, float* l, float* scratch) {
  const bool fits = kv.k_t != nullptr && kv.head_dim % 64 == 0 && kv.block_size % kTile == 0 && scale.scale > 0.0f &&
                    scale.cap == 0.0f;  // soft-capped logits: the Kᵀ kernel
  if (fits && kv.dtype == KvDtype::kF16)
    rows_amx<uint16_t>(kv, head, rows, t0, t1, scale.scale, acc, m, l);
  else if (fits && kv.dtype == KvDtype::kI8)
    rows_amx<uint8_t>(kv, head, rows, t0, t1, scale.scale, acc, m, l);
  else
    // Not for AMX: the Kᵀ kernel when the plane is there (faster than the rows GEMM at every row
    // count measured), else the rows GEMM.
    (kv.k_t != nullptr ? partial_attention_avx512() : partial_attention_rows_avx512())(kv, head, rows, t0, t1, scale,
                                                                                       acc, m, l, scratch);
}

}  // namespace

PartialAttentionFn partial_attention_rows_amx() {
  return amx_bf16_usable() && partial_attention_rows_avx512() ? &partial_attention_rows_amx_or_avx512 : nullptr;
}

}  // namespace fathom::cpu
