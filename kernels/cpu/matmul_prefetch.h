#pragma once
// The software prefetch of the kQ8 dot kernels' weight streams (any x86 level: _mm_prefetch is
// SSE). Internal linkage, each including file its own copy.
#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

namespace fathom::cpu::detail {
namespace {

// Software prefetch distance along a weight stream (bytes). The hardware prefetcher stops at
// 4 KiB page boundaries and needs a few misses to lock on again, and decode reads weights in
// chunks of ~32 KB handed out to threads first come first served, so without help it is cold a
// good part of the time. Measured on SmolLM2 decode (1 thread, chunks then handed out first come
// first served): 10-15% faster at 2-4 KiB. Since threads stream their own contiguous shares, 8 KiB
// is better at two threads (packed Q4_1 576 to 8192 rows from DRAM: +4-8% GB/s over 4 KiB in three
// alternating runs; SmolLM2 decode median 6.23 -> 5.92 ms over 10 alternating pairs; Gemma even).
constexpr int kPrefetchBytes = 8192;

// Prefetches `bytes` bytes (whole lines) starting kPrefetchBytes past p.
inline void prefetch_ahead(const uint8_t* p, size_t bytes) {
  for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + off), _MM_HINT_T0);
}

}  // namespace
}  // namespace fathom::cpu::detail
