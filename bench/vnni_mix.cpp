// Where the AVX-512 VNNI batched K-quant kernels' time goes (issue 50): timing only, no result is
// checked. One thread; everything in registers or L1, so memory plays no part.
// 1. Ports: 12 independent vpdpbusd chains alone (the dot-product peak, as bench_matmul measures
//    it), then with 6, 12 or 18 instructions of one other kind beside them. An instruction that
//    issues on the dot product's ports slows the loop already at 6 (12 + 6 on two ports is 9
//    cycles instead of 6); one with ports of its own costs nothing until it fills them.
// 2. Op mixes: the sub-block loop of dot_packed_q4_k<8> and dot_packed_q6_k<8>
//    (kernels/cpu/matmul_packed_avx512.cpp) over one L1-resident super-block panel and 8
//    activation rows, with the kernels' operations, and with parts taken out: the float tail of
//    the per-32 activation scales, Q4_K's mins FMA, Q6_K's offset broadcasts, Q6_K's unpacking.
//    Each line is the ceiling of that mix, what a kernel could reach with its weights in L1. (The
//    copies read the activations with embedded broadcasts, where GCC gives the kernels a separate
//    vpbroadcastd on the free ports; and they skip the kernels' prefetch and address arithmetic.)
// 3. Q4_K with one activation scale per 256 columns (the numerics of llama.cpp's Q8_K, a change
//    fathom does not make), sketched on the same VNNI loop: the sub-block scale applied to the
//    int32 sums with vpmulld, the float work and the mins (vpdpwssd of the 8 sub-blocks' mins
//    with the activations' block sums) once per super-block. What that change would buy here.
// 4. The real kernels (the active SIMD level's packed kernel, matmul_kernels.h dot_packed_fn) on
//    one panel of 16 rows x 2,048 columns packed by PackedWeights, 8 activation rows a call (16
//    KB), the call repeated: against part 2, what the kernel's code costs beyond its mix. The
//    Q4_K panel is 19 KB and fits L1 with the activations; Q6_K's (27 KB) and Q8_0's (35 KB) spill
//    part of a call's reads to L2. The kernels prefetch 16 KiB ahead, past the panel, into memory
//    nothing reads.
//   build/vnni_mix
// Prints GOP/s (2 ops a byte product) and the fraction of part 1's peak. Needs AVX-512 VNNI.
// GCC 12 reports _mm512_undefined_* inside intrinsics as (maybe-)uninitialized: a known false
// positive, silenced for this file as in kernels/cpu/matmul_packed_avx512.cpp.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/ggml_type.h"

#define FATHOM_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

namespace {

constexpr long kIters = 2000000;

template <typename Fn>
double best_seconds(Fn&& fn) {
  double best = 1e9;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// ---- 1. ports ------------------------------------------------------------------------------

enum Other { kNone, kFma, kMulPs, kMulLd, kCvt, kShift, kTernlog, kBcast, kAdd };
const char* const kOtherNames[] = {"", "vfmadd231ps", "vmulps", "vpmulld", "vcvtdq2ps", "vpsrlw", "vpternlogd", "vpbroadcastd m32", "vpaddd"};
alignas(64) int32_t g_word[16];

#define FATHOM_DP(i) asm volatile("vpdpbusd %1, %2, %0" : "+v"(c##i) : "v"(w), "v"(x));
#define FATHOM_OTHER(i)                                                                                  \
  if (kOther == kFma) asm volatile("vfmadd231ps %1, %1, %0" : "+v"(f##i) : "v"(g));                    \
  if (kOther == kMulPs) asm volatile("vmulps %1, %1, %0" : "=v"(f##i) : "v"(g));                       \
  if (kOther == kMulLd) asm volatile("vpmulld %1, %2, %0" : "=v"(f##i) : "v"(x), "v"(w));              \
  if (kOther == kCvt) asm volatile("vcvtdq2ps %1, %0" : "=v"(f##i) : "v"(x));                          \
  if (kOther == kShift) asm volatile("vpsrlw $4, %1, %0" : "=v"(f##i) : "v"(x));                       \
  if (kOther == kTernlog) asm volatile("vpternlogd $0xf8, %1, %2, %0" : "+v"(f##i) : "v"(x), "v"(w)); \
  if (kOther == kBcast) asm volatile("vpbroadcastd %1, %0" : "=v"(f##i) : "m"(g_word[i]));            \
  if (kOther == kAdd) asm volatile("vpaddd %1, %2, %0" : "=v"(f##i) : "v"(x), "v"(w));

// ns per loop of 12 vpdpbusd and `count` (0, 6, 12 or 18) instructions of kind kOther.
template <Other kOther>
FATHOM_VNNI double ports(int count) {
  __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
          c9 = c0, c10 = c0, c11 = c0;
  __m512 f0 = _mm512_set1_ps(1.0f), f1 = f0, f2 = f0, f3 = f0, f4 = f0, f5 = f0;
  const __m512 g = _mm512_set1_ps(1.0f);
  const __m512i w = _mm512_set1_epi32(0x01010101), x = _mm512_set1_epi32(0x02020202);
  const double s = best_seconds([&] {
    for (long n = 0; n < kIters; ++n) {
      FATHOM_DP(0) FATHOM_DP(1) FATHOM_DP(2) FATHOM_DP(3) FATHOM_DP(4) FATHOM_DP(5)
      FATHOM_DP(6) FATHOM_DP(7) FATHOM_DP(8) FATHOM_DP(9) FATHOM_DP(10) FATHOM_DP(11)
      for (int k = 0; k < count; k += 6) { FATHOM_OTHER(0) FATHOM_OTHER(1) FATHOM_OTHER(2) FATHOM_OTHER(3) FATHOM_OTHER(4) FATHOM_OTHER(5) }
    }
  });
  asm volatile("" ::"v"(f0), "v"(f1), "v"(f2), "v"(f3), "v"(f4), "v"(f5));
  return s / kIters * 1e9;
}

// ---- 2. and 3. the sub-block loops ----------------------------------------------------------

constexpr int kMr = 8;  // activation rows a call (kMaxPackedMr)
alignas(64) uint8_t g_q4k[2368];  // one Q4_K super-block panel (packed_weights.cpp layout)
alignas(64) uint8_t g_q6k[3392];  // one Q6_K super-block panel
alignas(64) uint8_t g_mins16[256];  // per-256 variant: the 8 sub-blocks' mins as int16 pairs per row
alignas(64) int8_t g_x[kMr][256];  // activations of one super-block, row-major
alignas(64) float g_dx[kMr][8], g_dxq[kMr][8];  // per-32 scale and scale x block sum
alignas(64) int32_t g_off[kMr][16];  // Q6_K: 32 x 16-column sums
alignas(64) int16_t g_bsum[kMr][8];  // per-256 variant: 32-column sums

// p, its value hidden from the compiler (an empty asm that may change it). The timed loops take
// their inputs through it anew each iteration, so no load can be hoisted out of them, and the
// accumulators stay in registers (a memory clobber instead made GCC store them every sub-block).
template <typename T>
inline T* opaque(T* p) {
  asm("" : "+r"(p));
  return p;
}

// acc + dpbusd(w, the 4 bytes at x in every lane), the broadcast embedded in the dpbusd.
FATHOM_VNNI inline __m512i dp4(__m512i acc, __m512i w, const int8_t* x) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
}
FATHOM_VNNI inline void nibbles(const uint8_t* p, __m512i* lo, __m512i* hi) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int v = 0; v < 4; ++v) {
    const __m512i raw = _mm512_load_si512(p + 64 * v);
    lo[v] = _mm512_and_si512(raw, nib);
    hi[v] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
  }
}
FATHOM_VNNI inline void dots(const __m512i* lo, const __m512i* hi, const int8_t* x, __m512i& s0, __m512i& s1) {
  for (int v = 0; v < 4; ++v) {
    s0 = dp4(s0, lo[v], x + 4 * v);
    s1 = dp4(s1, hi[v], x + 16 + 4 * v);
  }
}

enum Cut { kAsRun = 0, kNoTail = 1, kNoMins = 2, kNoOffset = 4, kNoUnpack = 8 };

// dot_packed_q4_k<8>'s sub-block loop, `cut` parts left out; 8 sub-blocks a loop.
template <int kCut>
FATHOM_VNNI void q4_k(float* out) {
  __m512 acc[kMr], acc2[kMr];
  #pragma GCC unroll 8
  for (int m = 0; m < kMr; ++m) acc[m] = acc2[m] = _mm512_setzero_ps();
  const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(g_q4k + 2304)));
  const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(g_q4k + 2336)));
  for (long it = 0; it < kIters; ++it) {
    const uint8_t* u = opaque(g_q4k);
    const auto* x = opaque(g_x);
    const auto* dx = opaque(g_dx);
    const auto* dxq = opaque(g_dxq);
    for (int j = 0; j < 8; ++j) {
      __m512i lo[4], hi[4];
      nibbles(u + 256 * j, lo, hi);
      const __m512 sc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(u + 2048 + 16 * j)))));
      const __m512 mn = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(u + 2176 + 16 * j)))));
      #pragma GCC unroll 8
      for (int m = 0; m < kMr; ++m) {
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        dots(lo, hi, x[m] + 32 * j, s0, s1);
        if constexpr ((kCut & kNoTail) != 0) {
          acc[m] = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(acc[m]), _mm512_add_epi32(s0, s1)));
          continue;
        }
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(sc, _mm512_set1_ps(dx[m][j])), acc[m]);
        if constexpr ((kCut & kNoMins) == 0) acc2[m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(dxq[m][j]), acc2[m]);
      }
    }
  }
  #pragma GCC unroll 8
  for (int m = 0; m < kMr; ++m) _mm512_storeu_ps(out + 16 * m, _mm512_sub_ps(acc[m], acc2[m]));
}

// Q4_K with per-256 activation scales: int32 sums over the super-block, float work once per it.
FATHOM_VNNI void q4_k_per256(float* out) {
  __m512 acc[kMr];
  #pragma GCC unroll 8
  for (int m = 0; m < kMr; ++m) acc[m] = _mm512_setzero_ps();
  const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(g_q4k + 2304)));
  const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(g_q4k + 2336)));
  for (long it = 0; it < kIters; ++it) {
    const uint8_t* u = opaque(g_q4k);
    const auto* x = opaque(g_x);
    const auto* dx = opaque(g_dx);
    const auto* bsum = opaque(g_bsum);
    const uint8_t* mins16 = opaque(g_mins16);
    __m512i isum[kMr];
    #pragma GCC unroll 8
    for (int m = 0; m < kMr; ++m) isum[m] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      __m512i lo[4], hi[4];
      nibbles(u + 256 * j, lo, hi);
      const __m512i sc = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(u + 2048 + 16 * j)));
      #pragma GCC unroll 8
      for (int m = 0; m < kMr; ++m) {
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        dots(lo, hi, x[m] + 32 * j, s0, s1);
        isum[m] = _mm512_add_epi32(isum[m], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc));
      }
    }
    #pragma GCC unroll 8
    for (int m = 0; m < kMr; ++m) {
      __m512i mins = _mm512_setzero_si512();
      for (int v = 0; v < 4; ++v) {
        int32_t pair;  // two int16 block sums
        std::memcpy(&pair, &bsum[m][2 * v], 4);
        mins = _mm512_dpwssd_epi32(mins, _mm512_load_si512(mins16 + 64 * v), _mm512_set1_epi32(pair));
      }
      const __m512 scale = _mm512_set1_ps(dx[m][0]);  // the row's one scale for these 256 columns
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[m]), _mm512_mul_ps(d, scale), acc[m]);
      acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(dmin, scale), acc[m]);
    }
  }
  #pragma GCC unroll 8
  for (int m = 0; m < kMr; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
}

// dot_packed_q6_k<8>'s sub-block loop, `cut` parts left out.
template <int kCut>
FATHOM_VNNI void q6_k(float* out) {
  __m512 acc[kMr];
  #pragma GCC unroll 8
  for (int m = 0; m < kMr; ++m) acc[m] = _mm512_setzero_ps();
  const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(g_q6k + 3328)));
  const __m512i b01 = _mm512_set1_epi8(0x03), b23 = _mm512_set1_epi8(0x0C);
  for (long it = 0; it < kIters; ++it) {
    const uint8_t* u = opaque(g_q6k);
    const auto* x = opaque(g_x);
    const auto* dx = opaque(g_dx);
    const auto* off = opaque(g_off);
    for (int j = 0; j < 8; ++j) {
      __m512i lo[4], hi[4];
      nibbles(u + 256 * j, lo, hi);
      if constexpr ((kCut & kNoUnpack) == 0) {
        for (int v = 0; v < 4; ++v) {
          __m512i g = _mm512_load_si512(u + 2048 + 128 * j + 64 * (v / 2));
          if (v % 2) g = _mm512_srli_epi16(g, 4);
          lo[v] = _mm512_or_si512(lo[v], _mm512_slli_epi16(_mm512_and_si512(g, b01), 4));
          hi[v] = _mm512_or_si512(hi[v], _mm512_slli_epi16(_mm512_and_si512(g, b23), 2));
        }
      }
      const __m256i sc8 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u + 3072 + 32 * j));
      const __m512 sc_lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(sc8))));
      const __m512 sc_hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(sc8, 1))));
      #pragma GCC unroll 8
      for (int m = 0; m < kMr; ++m) {
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        dots(lo, hi, x[m] + 32 * j, s0, s1);
        if constexpr ((kCut & kNoOffset) == 0) {
          s0 = _mm512_sub_epi32(s0, _mm512_set1_epi32(off[m][2 * j]));
          s1 = _mm512_sub_epi32(s1, _mm512_set1_epi32(off[m][2 * j + 1]));
        }
        if constexpr ((kCut & kNoTail) != 0) {
          acc[m] = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(acc[m]), _mm512_add_epi32(s0, s1)));
          continue;
        }
        const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), sc_hi, _mm512_mul_ps(_mm512_cvtepi32_ps(s0), sc_lo));
        acc[m] = _mm512_fmadd_ps(t, _mm512_set1_ps(dx[m][j]), acc[m]);
      }
    }
  }
  #pragma GCC unroll 8
  for (int m = 0; m < kMr; ++m) _mm512_storeu_ps(out + 16 * m, acc[m]);
}

// ---- 4. the real kernels ------------------------------------------------------------------

// GOP/s of the packed kernel for `type` over one L1-resident panel (16 x kCols), 8 rows a call.
double real_kernel(fathom::GgmlType type) {
  using namespace fathom;
  constexpr int64_t kCols = 2048, kBlocks = kCols / 32;
  std::vector<uint8_t> w(ggml_row_size(type, kCols) * 16, 0x11);  // f16 fields 0x1111: normal numbers
  const cpu::PackedWeights packed(type, w.data(), 16, kCols);
  std::vector<int8_t> q(kMr * kCols, 1);
  std::vector<float> qd(kMr * kBlocks, 0.01f), qds(kMr * kBlocks, 0.3f), y(kMr * 16);
  std::vector<int32_t> qsum(kMr * kBlocks, 30), q16x32(2 * kMr * kBlocks, 480);
  std::vector<int16_t> qsum16(2 * kMr * kBlocks, 15);
  cpu::detail::DotArgs a;
  a.w = packed.data();
  a.row_bytes = packed.panel_bytes();
  a.K = kCols;
  a.mr = kMr;
  a.q = q.data();
  a.ldq = kCols;
  a.qd = qd.data();
  a.qsum = qsum.data();
  a.qsum16 = qsum16.data();
  a.qds = qds.data();
  a.q16x32 = q16x32.data();
  a.ldqs = kBlocks;
  a.y = y.data();
  a.ldy = 16;
  a.rows_total = 16;
  const cpu::detail::DotFn fn = cpu::detail::dot_packed_fn(cpu::detail::fmt_index(type));
  const long calls = kIters / 8;
  const double s = best_seconds([&] {
    for (long c = 0; c < calls; ++c) {
      fn(a, 0, 1);
      asm volatile("" ::: "memory");
    }
  });
  return calls * 2.0 * 16 * kCols * kMr / s * 1e-9;
}

}  // namespace

int main(int argc, char**) {
  if (!__builtin_cpu_supports("avx512vnni")) {
    std::printf("vnni_mix: this CPU has no AVX-512 VNNI\n");
    return 0;
  }
  // Every array written at run time (argc-dependent), so that no load can be folded into a
  // constant. All bytes 0x11: every f16 field a normal number (0x1111), as are the floats.
  const int seed = 0x11 + (argc > 99);
  std::memset(g_q4k, seed, sizeof g_q4k);
  std::memset(g_q6k, seed, sizeof g_q6k);
  std::memset(g_mins16, seed, sizeof g_mins16);
  std::memset(g_x, seed, sizeof g_x);
  std::memset(g_dx, seed, sizeof g_dx);
  std::memset(g_dxq, seed, sizeof g_dxq);
  std::memset(g_off, seed, sizeof g_off);
  std::memset(g_bsum, seed, sizeof g_bsum);
  std::memset(g_word, seed, sizeof g_word);
  // Another tenant can slow a whole second of this host: the peak is the best of four readings
  // spread over the run (the first here, the others between the parts).
  double peak_ns = ports<kNone>(0);
  auto peak = [&] { return 12 * 128 / peak_ns; };  // GOP/s: 12 dpbusd of 64 byte products, 2 ops each
  std::printf("1. ports: 12 vpdpbusd chains %.3f ns a loop = %.0f GOP/s (the dot-product peak, one core)\n", peak_ns, peak());
  std::printf("   with N more of:            N=6      N=12     N=18   (ns a loop; 12 dpbusd alone %.3f)\n", peak_ns);
  auto row = [&](Other o, double (*fn)(int)) {
    std::printf("   %-22s %8.3f %8.3f %8.3f\n", kOtherNames[o], fn(6), fn(12), fn(18));
  };
  row(kFma, ports<kFma>);
  row(kMulPs, ports<kMulPs>);
  row(kMulLd, ports<kMulLd>);
  row(kCvt, ports<kCvt>);
  row(kShift, ports<kShift>);
  row(kTernlog, ports<kTernlog>);
  row(kBcast, ports<kBcast>);
  row(kAdd, ports<kAdd>);

  peak_ns = std::min(peak_ns, ports<kNone>(0));
  float out[16 * kMr];
  const double ops = kIters * 8.0 * kMr * 8 * 128;  // sub-blocks x rows x dpbusd x ops
  // Lines are printed at the end, as a fraction of the best peak reading.
  std::vector<std::pair<const char*, double>> lines;
  auto mix = [&](const char* name, void (*fn)(float*)) { lines.push_back({name, ops / best_seconds([&] { fn(out); }) * 1e-9}); };
  lines.push_back({"2. sub-block loops, 16 weight rows x 8 activation rows, in L1:", 0});
  mix("Q4_K as run (per-32 activation scales)", q4_k<kAsRun>);
  mix("Q4_K without the mins FMA", q4_k<kNoMins>);
  mix("Q4_K without the float tail", q4_k<kNoTail>);
  mix("Q6_K as run", q6_k<kAsRun>);
  mix("Q6_K without the offset broadcasts", q6_k<kNoOffset>);
  mix("Q6_K without unpacking the 2-bit highs", q6_k<kNoUnpack>);
  mix("Q6_K without the float tail", q6_k<kNoTail>);
  mix("Q6_K without tail, offset and unpacking", q6_k<kNoTail | kNoOffset | kNoUnpack>);
  lines.push_back({"3. Q4_K with per-256 activation scales (a numerics change, not made):", 0});
  mix("Q4_K per-256 (llama.cpp's Q8_K)", q4_k_per256);
  peak_ns = std::min(peak_ns, ports<kNone>(0));
  lines.push_back({"4. the real kernels (dot_packed_fn), one L1-resident panel, 8 rows a call:", 0});
  for (const fathom::GgmlType t : {fathom::GgmlType::Q4_K, fathom::GgmlType::Q6_K, fathom::GgmlType::Q8_0})
    lines.push_back({fathom::ggml_type_name(t), real_kernel(t)});
  peak_ns = std::min(peak_ns, ports<kNone>(0));
  for (const auto& [name, gops] : lines) {
    if (gops == 0) std::printf("%s\n", name);
    else std::printf("   %-44s %7.0f GOP/s  %3.0f%% of the peak\n", name, gops, 100 * gops / peak());
  }
  std::printf("(the peak: %.0f GOP/s a core, the best of four readings)\n", peak());
  volatile float sink = out[0];  // keeps the loops' results alive
  (void)sink;
  return 0;
}
