#pragma once
// The streaming read of bench_bandwidth: sums of 64-bit words at the widest SIMD level this CPU
// has, shared with the benchmarks that measure the read bandwidth beside what they time
// (bench_sparse_attention's in-run bandwidth).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fathom::bench {

// Sums n 64-bit words (n a multiple of 64, p 64-byte aligned). Integer adds: one-cycle latency,
// no FP exceptions, and the total is checkable. Eight accumulators keep many loads in flight.
__attribute__((target("avx512f"))) inline uint64_t sum_avx512(const uint64_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (size_t i = 0; i < n; i += 64) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 24));
    a4 = _mm512_add_epi64(a4, _mm512_load_si512(p + i + 32));
    a5 = _mm512_add_epi64(a5, _mm512_load_si512(p + i + 40));
    a6 = _mm512_add_epi64(a6, _mm512_load_si512(p + i + 48));
    a7 = _mm512_add_epi64(a7, _mm512_load_si512(p + i + 56));
  }
  a0 = _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)),
                        _mm512_add_epi64(_mm512_add_epi64(a4, a5), _mm512_add_epi64(a6, a7)));
  // Lanes through memory: GCC 12's _mm512_reduce_add_epi64 trips -Wuninitialized in its own header.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, a0);
  uint64_t total = 0;
  for (uint64_t lane : lanes) total += lane;
  return total;
}

__attribute__((target("avx2"))) inline uint64_t sum_avx2(const uint64_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (size_t i = 0; i < n; i += 64) {
    const __m256i* v = reinterpret_cast<const __m256i*>(p + i);
    a0 = _mm256_add_epi64(a0, _mm256_add_epi64(_mm256_load_si256(v + 0), _mm256_load_si256(v + 1)));
    a1 = _mm256_add_epi64(a1, _mm256_add_epi64(_mm256_load_si256(v + 2), _mm256_load_si256(v + 3)));
    a2 = _mm256_add_epi64(a2, _mm256_add_epi64(_mm256_load_si256(v + 4), _mm256_load_si256(v + 5)));
    a3 = _mm256_add_epi64(a3, _mm256_add_epi64(_mm256_load_si256(v + 6), _mm256_load_si256(v + 7)));
    a4 = _mm256_add_epi64(a4, _mm256_add_epi64(_mm256_load_si256(v + 8), _mm256_load_si256(v + 9)));
    a5 = _mm256_add_epi64(a5, _mm256_add_epi64(_mm256_load_si256(v + 10), _mm256_load_si256(v + 11)));
    a6 = _mm256_add_epi64(a6, _mm256_add_epi64(_mm256_load_si256(v + 12), _mm256_load_si256(v + 13)));
    a7 = _mm256_add_epi64(a7, _mm256_add_epi64(_mm256_load_si256(v + 14), _mm256_load_si256(v + 15)));
  }
  a0 = _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)),
                        _mm256_add_epi64(_mm256_add_epi64(a4, a5), _mm256_add_epi64(a6, a7)));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a0);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

inline uint64_t sum_scalar(const uint64_t* p, size_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i < n; i += 4) {
    a0 += p[i];
    a1 += p[i + 1];
    a2 += p[i + 2];
    a3 += p[i + 3];
  }
  return a0 + a1 + a2 + a3;
}

using SumFn = uint64_t (*)(const uint64_t*, size_t);

struct Simd {
  const char* name;
  SumFn fn;
};

inline Simd pick_simd(const std::string& forced) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  if (forced == "avx512" && !avx512) throw std::runtime_error("--simd avx512: the CPU has no AVX-512F");
  if (forced == "avx2" && !avx2) throw std::runtime_error("--simd avx2: the CPU has no AVX2");
  if (forced == "scalar") return {"scalar", sum_scalar};
  if (forced == "avx2") return {"avx2", sum_avx2};
  if (forced == "avx512" || (forced.empty() && avx512)) return {"avx512", sum_avx512};
  if (forced.empty() && avx2) return {"avx2", sum_avx2};
  if (forced.empty()) return {"scalar", sum_scalar};
  throw std::runtime_error("--simd must be avx512, avx2 or scalar, got '" + forced + "'");
}

}  // namespace fathom::bench
