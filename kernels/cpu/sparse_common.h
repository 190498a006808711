#pragma once
// Internals shared by the CPU sparse decode policies (sparq_attention.cpp, hip_attention.cpp,
// swa_attention.cpp): the per-ISA inner loops behind a table of function pointers (run-time
// dispatch, sparse_kernels.inc instantiated per ISA), the chunked multi-threaded gather attention
// every policy ends with, and an exact top-k.
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace fathom::cpu::sparse {

constexpr int32_t kMaxRows = 64;  // query rows that share one kv head in one call (GQA group)
constexpr int32_t kPrefetchAhead = 12;  // rows ahead the gathers prefetch (scattered rows defeat the hardware prefetcher)

// Inner loops over K / V rows, reading f32 / f16 / INT8 in place. Rows are given by element offset
// into kv.k / kv.v (row_offsets: computed once per gather, shared by the K and V passes); an INT8
// row's parameters sit at index offset / head_dim. INT8: q·(s·x + m) = s·(q·x) + m·Σq, so the
// callers pass q_sum[r] = Σ_c q_r[c] (ignored for f32 / f16).
struct Kernels {
  // out[r·ld + i] = scale · q_r·K[row i]          q: [R][head_dim], q_sum: [R]
  // v_next: the caller reads the same rows of V next (a gather's second pass), so they are
  // prefetched alongside the K rows and the two passes' misses overlap instead of following each
  // other. Measured effect small against this VM's noise: in one alternating A/B (same binary) the
  // gathering policies' steps were 15-30% faster at 16k and 0-8% at 64k; in a second, against the
  // previous build, no clear difference.
  void (*key_logits)(const PagedKvView& kv, const float* q, const float* q_sum, int32_t R, const int64_t* rows,
                     int32_t n, float scale, float* out, int64_t ld, bool v_next);
  // acc[r][c] += Σ_i w[r·ld + i] · V[row i][c]     acc: [R][head_dim]
  void (*accumulate_v)(const PagedKvView& kv, int32_t R, const float* w, int64_t ld, const int64_t* rows, int32_t n,
                       float* acc);
  // s[i] = exp(s[i] − shift) for s[i] ≤ shift; returns Σ s[i].
  float (*exp_shifted)(float* s, int32_t n, float shift);
  // *mx = max s[i]; returns Σ exp(s[i] − *mx) (s unchanged; n ≥ 1).
  float (*max_sum_exp)(const float* s, int32_t n, float* mx);
  // max s[i] (n ≥ 1). (std::max_element is a serial scalar chain: ~4 cycles a key, most of
  // sparse::attend's own time.)
  float (*max_of)(const float* s, int32_t n);
  // SparQ step 1 for the positions of logical blocks [b0, b1) below S:
  //   out[j·ld + t] = Σ_{i<r} qr[j·r + i] · K[t][dims[i]]   (qr: [G][r], already scaled)
  //   sum[t] = out[t] + out[ld + t] + … + out[(G−1)·ld + t]   (the group sum, in that order)
  // from kv.k_t (r contiguous dimension rows per tile) when present, else from the K rows. The
  // group sum is taken per tile while its scores are in L1.
  void (*sparq_scores)(const PagedKvView& kv, int32_t g, const int32_t* dims, int32_t r, const float* qr, int32_t G,
                       int32_t b0, int32_t b1, int32_t S, float* out, int64_t ld, float* sum);
  // The indices i < n with order_key(s[i]) >= key, ascending, into out; returns their count.
  // out must hold n + 16 entries (the vector version stores whole vectors).
  int32_t (*indices_at_least)(const float* s, int32_t n, uint32_t key, int32_t* out);
  // The k-th largest of keys[0..m) (1 ≤ k ≤ m), built bit by bit from the top: the largest t
  // with at least k keys ≥ t. 32 counting passes, no data-dependent branches (nth_element
  // mispredicts about every other comparison: ~13 ns a key here).
  uint32_t (*kth_largest_key)(const uint32_t* keys, int32_t m, int32_t k);
  // Online softmax of R rows over the contiguous keys [t0, t1) of kv head `head` (each row's
  // [lo, hi] spanning them), streamed through the transposed K plane like dense decode: the
  // partial (acc [R][head_dim] unnormalised, m [R], l [R]) and the scaled logits at
  // logits[r·ld + t − t0] (nullable). Null for an ISA without it; needs run_streamable(kv, ...).
  void (*run_partial)(const PagedKvView& kv, int32_t head, const PartialRows& rows, int32_t t0, int32_t t1,
                      LogitScale scale, float* acc, float* m, float* l, float* logits, int64_t ld);
};

// Order-preserving unsigned key of a float, branch-free (x + 0 turns −0 into +0: they compare
// equal, so they must share a key).
inline uint32_t order_key(float x) {
  x += 0.0f;
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u ^ ((0u - (u >> 31)) | 0x80000000u);
}

// Element offsets of the rows of positions pos[0..n) of kv head g: rows [n]. A position in a
// host-tier block is read from its cached row (prefetched: see RowPrefetcher).
inline void row_offsets(const PagedKvView& kv, int32_t g, const int32_t* pos, int32_t n, int64_t* rows) {
  const int32_t bs = kv.block_size;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t e = kv.block_table[pos[i] / bs];
    rows[i] = e >= 0 ? kv.tile_offset(pos[i] / bs, g) + static_cast<int64_t>(pos[i] % bs) * kv.head_dim
                     : static_cast<int64_t>(kv.host_rows[(static_cast<int64_t>(-e - 1) * bs + pos[i] % bs) * kv.n_kv_heads + g]) *
                           kv.head_dim;
  }
}

// Prefetches the head_dim elements of the row at element offset `row` (as row_offsets gives) of
// plane `base` (K or V).
template <int Locality>
inline void prefetch_kv_row(const PagedKvView& kv, const void* base, int64_t row) {
  const int64_t elem = static_cast<int64_t>(kv_dtype_bytes(kv.dtype));
  prefetch_lines<Locality>(static_cast<const char*>(base) + row * elem, elem * kv.head_dim);
}

// Asks for every line of rows[0..n) of `base` (K or V plane) into L2 at once, before a gather
// reads them. Gathered keys come in short runs at scattered places (SWA's heavy hitters: ~15 keys
// a run), so each run starts with a full memory latency that the per-row prefetch a few rows
// ahead (kPrefetchAhead) does not cover; requested all together (a work item's ≤ 256 rows: 64 KiB
// of f16 K and V at d 64, well inside L2) the misses overlap. Measured (bench_decode, SmolLM2 8k,
// 1/8, alternating): SWA 5.6 -> 5.0 ms a token, SparQ 8.5 -> 7.4, HiP 7.5 -> 6.4.
inline void prefetch_rows_l2(const PagedKvView& kv, const void* base, const int64_t* rows, int32_t n) {
  for (int32_t i = 0; i < n; ++i) prefetch_kv_row</*Locality=*/2>(kv, base, rows[i]);
}

// Before a gather kernel reads positions pos[0..n) of kv head g: a tiered view's prefetcher makes
// their host-tier rows readable (no-op otherwise).
inline void prefetch_rows(const PagedKvView& kv, int32_t g, const std::vector<int32_t>& pos, bool need_v) {
  if (kv.prefetcher != nullptr && !pos.empty()) kv.prefetcher->prefetch(g, pos.data(), static_cast<int32_t>(pos.size()), need_v);
}

// The table for this CPU, capped by cpu::simd_level() (FATHOM_SIMD / tests).
const Kernels& kernels();
const Kernels* kernels_portable();
const Kernels* kernels_avx512();  // nullptr when the CPU lacks AVX-512 F/BW/VL
const Kernels* kernels_avx2();    // nullptr when the CPU lacks AVX2 / FMA / F16C

// One gather-attention job: R query rows of kv head g over the positions pos[0..n) (distinct;
// ascending gives sequential reads) and the contiguous run [run_begin, run_end) above them (n +
// run length ≥ 1). Exact softmax (online over chunks, merged with the log-sum-exp rule). The run is
// streamed through the transposed K plane (Kernels::run_partial): gathered row by row, a run of
// keys costs ~1.5x as long (d 64, 2 threads, the last 2,048 of 16k keys of 3 kv heads, f16:
// 75 us gathered, 51 us streamed; the cache streamed by both kernels alike, software prefetch
// or not). Callers give a run only where run_streamable().
struct AttendTask {
  int32_t g = 0;
  int32_t R = 0;                 // ≤ kMaxRows
  const float* q = nullptr;      // [R][head_dim]
  float* out = nullptr;          // [R][head_dim] normalised output
  const int32_t* pos = nullptr;  // [n]
  int32_t n = 0;
  int32_t run_begin = 0, run_end = 0;  // the run's positions (empty: none), all above pos[]
  // Optional [R][keys()]: each row's softmax weights exp(logit − lse) over pos[] then the run (the
  // thread that merges the task converts its rows' logits once their lse is known).
  float* weights = nullptr;
  int32_t keys() const { return n + run_end - run_begin; }
};

// Whether positions [t0, t1) of `kv` can be an AttendTask's run with `kern`: the ISA streams runs,
// the view has the transposed K plane in the kernel's shape, and every block of the run is in the
// device tier (a tiered view's host blocks are read only through its hot-row cache).
bool run_streamable(const Kernels& kern, const PagedKvView& kv, int32_t t0, int32_t t1);

// Splits every task into key chunks, spreads the chunks over the pool, merges per task. The
// chunk length (0: attend_chunk(pool, tasks)) fixes the fold order: a task run alone with the
// chunk its whole set would get gives bitwise the same output. With a prefetcher, each task's
// chunks run in batches of at most prefetcher->capacity() keys (last batch first when `reverse`),
// each batch's positions made readable (K and V) just before it: same partials, same merge, the
// same output. A task's run (device blocks only: run_streamable) is not batched: its items run after
// the task's gathered batches, in position order.
// `fill_positions` (optional): writes every task's pos[0..n) (each below its run), run once before
// the first gathered item reads them. Without a prefetcher it runs inside the pool call, on the
// first thread to need it (the calling thread takes it first; the others stream the tasks' runs
// meanwhile), so a caller's selection overlaps the runs' reads; the output is the same as filling
// first (the partials and their merge order do not depend on which thread runs what, or when).
void attend(ThreadPool& pool, const Kernels& kern, const PagedKvView& kv, float scale,
            const std::vector<AttendTask>& tasks, int32_t chunk = 0, RowPrefetcher* prefetcher = nullptr,
            bool reverse = false, const std::function<void()>& fill_positions = {});
// The key chunk length attend() picks for `tasks` on `pool`.
int32_t attend_chunk(const ThreadPool& pool, const std::vector<AttendTask>& tasks);
// attend() for a view that may be tiered: with a prefetcher, the tasks run one at a time, each
// in batches the hot-row cache holds (one chunk at least), so the cache needs room for one batch's
// rows, not for a task's or all of theirs; the key chunks are the all-tasks call's, so the output
// is bitwise attend()'s (unless the cache is smaller than that chunk: then halved until it fits).
// `reverse`: last task first, and each task's batches last first. Without a prefetcher it is
// attend().
void attend_prefetched(ThreadPool& pool, const Kernels& kern, const PagedKvView& kv, float scale,
                       const std::vector<AttendTask>& tasks, bool reverse = false);

// The k indices of the largest score[0..n) under (score descending, index ascending), in
// ascending index order, into out[0..k). Exact (sampled threshold, branch-free filter, the k-th
// candidate key by kth_largest_key; a radix select when the sample misleads).
void top_k(const float* score, int32_t n, int32_t k, int32_t* out);

// Σ_c q[c] per row, for INT8 keys: q [R][d] -> sums [R].
void row_sums(const float* q, int32_t R, int32_t d, float* sums);

}  // namespace fathom::cpu::sparse
