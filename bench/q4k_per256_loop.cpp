// What per-256 activation scales would buy the AVX2 batched Q4_K loop (issue 50; a numerics change
// not made): timing only, no result is checked. The many-row loop as fathom runs it (8-bit
// activations with one scale per 32 columns, so every sub-block ends in float work: a widening madd
// by 1, a conversion, a scale multiply and two FMAs) against a variant with one scale per 256
// columns, as llama.cpp's Q8_K: the sub-block scale goes into the widening madd, the sums stay
// int32 over the super-block, and the float work (and the mins, one madd of 8 sub-blocks' mins with
// the activations' block sums) happens once per super-block. Same panel layout as
// kernels/cpu/packed_weights.cpp (2368 bytes a 16-row Q4_K super-block), 16 activation rows
// block-major, synthetic bytes, hot in cache, one thread; the two loops' calls alternate.
//   build/q4k_per256_loop [K 2048] [panels 16]
// Prints cycles per activation row, 8-row half and 32-column sub-block (at a nominal 3.2 GHz).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>
#include <random>

#define FATHOM_AVX2 __attribute__((target("avx2,fma,f16c")))
FATHOM_AVX2 static inline __m256i load32(const uint8_t* p) { return _mm256_load_si256((const __m256i*)p); }
FATHOM_AVX2 static inline __m256i bcast4(const int8_t* x) { return _mm256_castps_si256(_mm256_broadcast_ss((const float*)x)); }
FATHOM_AVX2 static inline __m256 f16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
FATHOM_AVX2 static inline __m256 u8x8(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p))); }
FATHOM_AVX2 static inline __m256i pair16(const uint8_t* p) {
  const __m256i s = _mm256_cvtepu16_epi32(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)p)));
  return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
}
constexpr int M = 16;
alignas(32) static __m256 facc[64][2];
alignas(32) static __m256i iacc[64][2];
FATHOM_AVX2 static inline void load_nibbles(const uint8_t* p, int h, __m256i* lo, __m256i* hi) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  for (int v = 0; v < 4; ++v) { const __m256i raw = load32(p + 64 * v + 32 * h); lo[v] = _mm256_and_si256(raw, nib); hi[v] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), nib); }
}
FATHOM_AVX2 static inline __m256i sum8(const __m256i* lo, const __m256i* hi, const int8_t* x) {
  __m256i p[8];
  for (int v = 0; v < 4; ++v) { p[v] = _mm256_maddubs_epi16(lo[v], bcast4(x + 4 * v)); p[4 + v] = _mm256_maddubs_epi16(hi[v], bcast4(x + 16 + 4 * v)); }
  return _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
                          _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])));
}
// panels: 2368 bytes a super-block (as fathom's Q4_K panel); x block-major: block b of row m at x + (b*M + m)*32
FATHOM_AVX2 __attribute__((noinline)) void now(const uint8_t* w, int64_t panels, int64_t nsb, const int8_t* x, const float* dx, const float* dxq, float* y) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t p = 0; p < panels; ++p) {
    const uint8_t* u = w + p * nsb * 2368;
    for (int m = 0; m < M; ++m) facc[m][0] = facc[m][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i, u += 2368)
      for (int j = 0; j < 8; ++j)
        for (int h = 0; h < 2; ++h) {
          __m256i lo[4], hi[4];
          load_nibbles(u + 256 * j, h, lo, hi);
          const __m256 sc = _mm256_mul_ps(f16x8(u + 2304 + 16 * h), u8x8(u + 2048 + 16 * j + 8 * h));
          const __m256 mn = _mm256_mul_ps(f16x8(u + 2336 + 16 * h), u8x8(u + 2176 + 16 * j + 8 * h));
          const int64_t b = 8 * i + j;
          const int8_t* xr = x + b * M * 32; const float* d = dx + b * M; const float* dq = dxq + b * M;
          for (int m = 0; m < M; ++m, xr += 32) {
            const __m256i s = _mm256_madd_epi16(sum8(lo, hi, xr), ones);
            const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(sc, _mm256_broadcast_ss(d + m)), facc[m][h]);
            facc[m][h] = _mm256_fnmadd_ps(mn, _mm256_broadcast_ss(dq + m), t);
          }
        }
    for (int m = 0; m < M; ++m) { _mm256_storeu_ps(y + m * 16 * panels + 16 * p, facc[m][0]); _mm256_storeu_ps(y + m * 16 * panels + 16 * p + 8, facc[m][1]); }
  }
}
// per-256: x scale d256 per (row, super-block); the sub-block scale in the widening madd; int32 sums
// per super-block; mins: Σ_j m_j · bsum_j per super-block as one madd over 8 (j) 16-bit pairs.
FATHOM_AVX2 __attribute__((noinline)) void q8k(const uint8_t* w, int64_t panels, int64_t nsb, const int8_t* x, const float* d256, const int16_t* bsum, float* y) {
  for (int64_t p = 0; p < panels; ++p) {
    const uint8_t* u = w + p * nsb * 2368;
    for (int m = 0; m < M; ++m) facc[m][0] = facc[m][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i, u += 2368) {
      for (int m = 0; m < M; ++m) iacc[m][0] = iacc[m][1] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j)
        for (int h = 0; h < 2; ++h) {
          __m256i lo[4], hi[4];
          load_nibbles(u + 256 * j, h, lo, hi);
          const __m256i sc = pair16(u + 2048 + 16 * j + 8 * h);
          const int8_t* xr = x + (8 * i + j) * M * 32;
          for (int m = 0; m < M; ++m, xr += 32)
            iacc[m][h] = _mm256_add_epi32(iacc[m][h], _mm256_madd_epi16(sum8(lo, hi, xr), sc));
        }
      for (int h = 0; h < 2; ++h) {
        const __m256 d = f16x8(u + 2304 + 16 * h), dmin = f16x8(u + 2336 + 16 * h);
        // mins of the 8 sub-blocks as 16-bit values, 2 a lane pair: a stand-in for the real shuffle
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(u + 2176 + 8 * h)));
        for (int m = 0; m < M; ++m) {
          int64_t b4;
          std::memcpy(&b4, bsum + (i * M + m) * 8, 8);
          const __m256i bs = _mm256_set1_epi64x(b4);
          const __m256 ms = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bs));
          const __m256 dm = _mm256_broadcast_ss(d256 + i * M + m);
          const __m256 t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[m][h]), _mm256_mul_ps(d, dm), facc[m][h]);
          facc[m][h] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dm), ms, t);
        }
      }
    }
    for (int m = 0; m < M; ++m) { _mm256_storeu_ps(y + m * 16 * panels + 16 * p, facc[m][0]); _mm256_storeu_ps(y + m * 16 * panels + 16 * p + 8, facc[m][1]); }
  }
}
int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c")) {
    std::printf("q4k_per256_loop: needs AVX2, FMA and F16C\n");
    return 0;
  }
  const int64_t K = argc > 1 ? atoi(argv[1]) : 2048, panels = argc > 2 ? atoi(argv[2]) : 16, nsb = K / 256;
  std::mt19937 rng(1);
  std::vector<uint8_t, std::allocator<uint8_t>> wv(panels * nsb * 2368 + 64);
  uint8_t* w = (uint8_t*)(((uintptr_t)wv.data() + 63) & ~uintptr_t(63));
  for (int64_t i = 0; i < panels * nsb * 2368; ++i) w[i] = rng() & 0x3F;
  std::vector<int8_t> x(K * M); for (auto& v : x) v = (int8_t)(rng() % 255 - 127);
  std::vector<float> dx(K / 32 * M, 0.01f), dxq(K / 32 * M, 0.5f), d256(nsb * M, 0.01f), y(M * 16 * panels);
  std::vector<int16_t> bsum(nsb * M * 8, 3);
  std::vector<double> t[2];
  for (int it = 0; it < 600; ++it) {
    const int v = it & 1;
    auto t0 = std::chrono::steady_clock::now();
    if (v == 0) now(w, panels, nsb, x.data(), dx.data(), dxq.data(), y.data());
    else q8k(w, panels, nsb, x.data(), d256.data(), bsum.data(), y.data());
    t[v].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double units = double(panels) * 2 * (K / 32) * M;  // row x half x sub-block
  for (int v = 0; v < 2; ++v) {
    std::sort(t[v].begin(), t[v].end());
    printf("%s K=%lld panels=%lld M=%d: p5 %.1f us, median %.1f us; cycles/unit @3.2GHz p5 %.2f median %.2f\n", v ? "per-256" : "per-32 ", (long long)K, (long long)panels, M,
           t[v][t[v].size() / 20] * 1e6, t[v][t[v].size() / 2] * 1e6, t[v][t[v].size() / 20] * 3.2e9 / units, t[v][t[v].size() / 2] * 3.2e9 / units);
  }
  printf("%g\n", y[5]);
}
