#pragma once
// The software prefetch of the kQ8 dot kernels' weight streams (any x86 level: prefetch is SSE).
// Internal linkage, each including file its own copy.

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/prefetch.h"

namespace fathom::cpu::detail {
namespace {

// Software prefetch distance along a weight stream (bytes). The hardware prefetcher stops at
// 4 KiB page boundaries and needs a few misses to lock on again, and decode reads weights in
// chunks of ~32 KB handed out to threads first come first served, so without help it is cold a
// good part of the time. Measured on SmolLM2 decode (1 thread, chunks then handed out first come
// first served): 10-15% faster at 2-4 KiB. Since threads stream their own contiguous shares, 8 KiB
// is better at two threads (packed Q4_1 576 to 8192 rows from DRAM: +4-8% GB/s over 4 KiB in three
// alternating runs; SmolLM2 decode median 6.23 -> 5.92 ms over 10 alternating pairs; Gemma even).
// On the Xeon with AMX (2026-12-04) 4 KiB everywhere decoded the 8B shape 1.5-5% faster but SmolLM2
// (packed Q4_1) 10-20% slower, and the 1B shape in Q8_0 the same: see kKQuantPrefetchBytes.
constexpr int kPrefetchBytes = 8192;

// The AVX-512 one-row Q4_K and Q6_K panel kernels' distance. Their super-block panels are read in
// three places at once (nibbles, then the 6-bit scales and the f16 d near its end), and on the
// Xeon with AMX they stream faster 4 KiB ahead: with only those two kernels at 4 KiB, alternating
// three times (docs/performance.md, "A 4 KiB prefetch for the K-quant kernels"), the 8B shape
// 180.7-186.2 -> 174.2-177.1 ms a token, the 1B 31.4-32.4 -> 30.7-31.1, Gemma 3 (Q4_K_M, 270M)
// 9.1-9.5 -> 8.2-9.2. On a Zen 4 EPYC, 4 KiB for every kernel had left Gemma 3 even.
constexpr int kKQuantPrefetchBytes = 4096;

// The AVX-512 VNNI panel kernels' distance for calls of more than one activation row. Such a
// call spends 2-8x a one-row call's time on each panel, and 4-8 KiB ahead left it waiting on
// DRAM: on a Zen 5 EPYC (bench_matmul --batch, 2 threads, three alternating runs), 8 rows a call
// Q6_K 2048x8192 374-427 -> 318-381 us and Q4_K 8192x2048 268-283 -> 247-274 us at 16 KiB; the 1B
// batch-8 decode step 25.6-26.5 -> 22.4-23.5 ms, batch 4 20.4-21.4 -> 17.4-20.6 (8 and 32 KiB did
// as well as 16 on batch 8). Batch 16 even, since its calls find their panels in L2
// (DotArgs::prefetch_bytes); one-row calls keep `own`.
constexpr int64_t kBatchPrefetchBytes = 16384;

// A panel kernel's prefetch distance: DotArgs::prefetch_bytes when run_rows set it, else
// kBatchPrefetchBytes for a call of several rows, else `own` (the kernel's one-row distance).
inline int64_t prefetch_distance(const DotArgs& a, int64_t own) {
  if (a.prefetch_bytes > 0) return a.prefetch_bytes;
  return a.mr > 1 ? kBatchPrefetchBytes : own;
}

// Prefetches `bytes` bytes (whole lines) starting kPrefetchBytes past p, into L1 (T0): the
// stored-layout kernels, which read a row or a few rows at a time.
inline void prefetch_ahead(const uint8_t* p, size_t bytes) {
  prefetch_lines<kIntoL1>(p + kPrefetchBytes, static_cast<int64_t>(bytes));
}

// The PanelPrefetch kernels' stream, into L2 (T1): the PackedWeights panel kernels consume one
// dense stream per thread at up to 512 bytes a step. Into L1 they streamed 20-22 GB/s from DRAM on
// a Zen 4 EPYC (2 threads; packed Q8_0, bench_matmul) against 28-30 into L2, as fast as the stored
// layout; bench_decode, dense at 1k, alternating: Gemma 3 11.3-12.0 -> 9.4-10.1 ms a token,
// SmolLM2 4.8-5.4 -> 4.0-4.1 ms (the Q8_0 output heads are the largest matrices). Stored kernels:
// no difference either way. The Xeon (weights in its L3) was not measured with T1.
//
// A panel of `panel_bytes` is consumed in `steps` steps (its column blocks), and step i
// prefetches its share [i s, (i + 1) s) of the panel, s = ceil(panel_bytes / steps),
// `distance` bytes ahead (kPrefetchBytes unless the kernel names its own): quants and scales
// alike. Prefetching only the quant bytes a step reads (as the kernels did) left each panel's
// scale tail to the hardware prefetcher: 1/5 of a Q4_1 panel, 1/18 of Q8_0's, 320 of Q4_K's 2368
// bytes per super-block. Covering it, packed Q4_1 1536x576 from DRAM (bench_matmul --quick, 3
// alternating runs, Zen 4): 1 thread 15.9-16.0 -> 22.2-25.8 GB/s (67-69% -> 96-107% of the read
// bandwidth measured alongside). The AVX2 and AMX panel kernels use it; the AVX-512 ones use
// StepPrefetch (below).
struct PanelPrefetch {
  const uint8_t* next;  // the panel's first byte + the distance ahead
  int64_t step;
  PanelPrefetch(const uint8_t* panel, size_t panel_bytes, int64_t steps, int64_t distance = kPrefetchBytes)
      : next(panel + distance), step((static_cast<int64_t>(panel_bytes) + steps - 1) / steps) {}
  // Lines holding [next, next + step): whole coverage even when step is not a multiple of 64.
  void operator()() {
    const int64_t into_line = static_cast<int64_t>(reinterpret_cast<uintptr_t>(next) % 64);
    prefetch_lines<kIntoL2>(next - into_line, into_line + step);
    next += step;
  }
};

// PanelPrefetch for a kernel whose step is a compile-time constant of kStepBytes (the AVX-512
// VNNI panel kernels): each step prefetches the same ceil(kStepBytes / 64) lines from the line
// holding the cursor. Consecutive steps start at most that many lines apart, so together they
// leave no line out (a line a step reads only in part may come with the next step's lines, still
// kilobytes ahead of its use). For a step that is a whole number of lines (Q4_1: 320 bytes) the
// cursor stays line-aligned and each line is fetched once, as PanelPrefetch did.
// PanelPrefetch computed each step's count from the alignment (5 or 6 lines a Q4_K step), and that
// cost the batched kernels their time even with the weights in L1: dot_packed_q4_k<8> on one
// L1-resident panel, Zen 5, 601-633 GOP/s with it, 671-684 with this, 683-719 with no prefetch.
// The constant-count loop is kept on purpose (not unrolled): unrolled, the 9 prefetches of a Q8_0
// step went out in one burst, and one-row decode, which streams from DRAM, read 28-29 GB/s against
// 33-39 with the loop (bench_matmul Q8_0, packed, 1 thread, alternating; Gemma 3, whose output
// matrix is Q8_0, decoded 8-55% slower, mostly 10-20%). Unrolled was 1-3% faster in the batched
// calls.
// The cursor is an integer: it runs up to the distance past the end of the weights, which a
// pointer may not (a prefetch never faults).
template <int64_t kStepBytes>
struct StepPrefetch {
  uintptr_t next;  // the step's first byte + the distance ahead
  StepPrefetch(const uint8_t* panel, int64_t distance)
      : next(reinterpret_cast<uintptr_t>(panel) + static_cast<uintptr_t>(distance)) {}
  void operator()() {
    const uintptr_t line = next / 64 * 64;
    #pragma GCC unroll 1
    for (int64_t l = 0; l < (kStepBytes + 63) / 64; ++l)
      __builtin_prefetch(reinterpret_cast<const void*>(line + 64 * l), /*rw=*/0, kIntoL2);
    next += kStepBytes;
  }
};

}  // namespace
}  // namespace fathom::cpu::detail
