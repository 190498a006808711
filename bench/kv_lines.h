#pragma once
// The 64-byte lines of a paged KV view that one decode step of a policy must bring from memory,
// and the fastest this machine reads exactly those lines (bench_sparse_attention's "replay"
// columns).
//
// A policy's byte count (each kernel's own counter) divided by the stream bandwidth is the bound
// of a kernel that reads only whole contiguous runs. Gathers cannot reach it on this memory
// system: a line is the unit of transfer (SparQ's step 1 reads 32-byte halves of lines at
// block size 16, f16), and isolated lines come at the scattered-line rate, not the streamed one
// (bench/results/gather_probe.md). The replay bound asks the memory system directly: the step's
// lines, sorted by address and split between the threads, each thread loading its lines with
// software prefetches ahead and nothing else to do. That is the least time any kernel that reads
// those lines can take here (it ignores that a later read may depend on an earlier one, as
// SparQ's gather depends on its scores: a bound, not a model), so a kernel's share of it says how
// much of the distance to the byte bound is its own and how much is the access pattern's.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/paged_kv.h"

namespace fathom::bench {

class KvLines {
 public:
  explicit KvLines(const PagedKvView& kv) : kv_(kv), elem_(kv_dtype_bytes(kv.dtype)) {}

  // Every line overlapping [p, p + bytes).
  void add(const void* p, size_t bytes) {
    if (bytes == 0) return;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p), first = a / 64, last = (a + bytes - 1) / 64;
    for (uintptr_t l = first; l <= last; ++l) lines_.push_back(l * 64);
  }
  // Every line of another set (of the same view).
  void add(const KvLines& other) { lines_.insert(lines_.end(), other.lines_.begin(), other.lines_.end()); }
  // K row and V row of position t, kv head g (f32 / f16 planes).
  void add_kv_rows(int32_t g, int32_t t) {
    const size_t row = static_cast<size_t>(kv_.head_dim) * elem_;
    const size_t off = static_cast<size_t>(kv_.row_index(t, g)) * row;
    add(static_cast<const char*>(kv_.k) + off, row);
    add(static_cast<const char*>(kv_.v) + off, row);
  }
  // Dimension rows dims[0..r) of the transposed-K tile of logical block b, kv head g, over
  // tile positions [s0, s1) (SparQ's step 1: every position; a streamed run: its part).
  void add_kt_rows(int32_t g, int32_t b, const int32_t* dims, int32_t r, int32_t s0, int32_t s1) {
    const char* tile = static_cast<const char*>(kv_.k_t) + static_cast<size_t>(kv_.tile_offset(b, g)) * elem_;
    for (int32_t i = 0; i < r; ++i)
      add(tile + (static_cast<size_t>(dims[i]) * kv_.block_size + s0) * elem_, static_cast<size_t>(s1 - s0) * elem_);
  }
  // Positions [t0, t1) of kv head g as the dense Kᵀ kernel reads them: every dimension row of
  // each tile over the run's part, and the V rows.
  void add_streamed(int32_t g, int32_t t0, int32_t t1) {
    std::vector<int32_t> all(kv_.head_dim);
    for (int32_t c = 0; c < kv_.head_dim; ++c) all[c] = c;
    const int32_t bs = kv_.block_size;
    for (int32_t b = t0 / bs; b * bs < t1; ++b) {
      const int32_t s0 = std::max(t0 - b * bs, 0), s1 = std::min(t1 - b * bs, bs);
      add_kt_rows(g, b, all.data(), kv_.head_dim, s0, s1);
      const size_t row = static_cast<size_t>(kv_.head_dim) * elem_;
      add(static_cast<const char*>(kv_.v) + static_cast<size_t>(kv_.row_index(b * bs + s0, g)) * row,
          static_cast<size_t>(s1 - s0) * row);
    }
  }

  // Sorted and distinct; the count.
  size_t finish() {
    std::sort(lines_.begin(), lines_.end());
    lines_.erase(std::unique(lines_.begin(), lines_.end()), lines_.end());
    return lines_.size();
  }
  const std::vector<uintptr_t>& lines() const { return lines_; }
  double megabytes() const { return static_cast<double>(lines_.size()) * 64 / 1e6; }

 private:
  PagedKvView kv_;
  size_t elem_;
  std::vector<uintptr_t> lines_;
};

// Loads one word of every line (after finish()), each thread of the pool a contiguous part in
// address order, prefetching `ahead` lines ahead; returns a sum of the words (keep it alive).
inline uint64_t replay_lines(ThreadPool& pool, const std::vector<uintptr_t>& lines, size_t ahead) {
  std::atomic<uint64_t> total{0};
  pool.run_on_all([&](int t, int n) {
    const size_t b = lines.size() * t / n, e = lines.size() * (t + 1) / n;
    uint64_t s = 0;
    for (size_t i = b; i < e; ++i) {
      if (i + ahead < e) _mm_prefetch(reinterpret_cast<const char*>(lines[i + ahead]), _MM_HINT_T0);
      s += *reinterpret_cast<const volatile uint64_t*>(lines[i]);
    }
    total.fetch_add(s, std::memory_order_relaxed);
  });
  return total.load();
}

}  // namespace fathom::bench
