#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/matmul.h"

namespace fathom::cpu {
namespace {

constexpr int32_t kQueryBlock = 8;  // query tokens that share one pass over a K/V tile

// Batch invariance: keys are cut into chunks at fixed absolute positions (multiples of the chunk
// size), every chunk's partial result is computed from a fresh softmax state, and partials are
// folded in chunk order with fold_partial() — whether the chunks ran on one thread or were spread
// over several. A row's output therefore depends only on its own query and keys, not on the
// batch, the number of query tokens in the call, or the thread count.
struct Rows {
  std::vector<const float*> q;
  std::vector<int32_t> lo, hi;
  std::vector<int64_t> out_row;  // index into [n_q * n_heads]
};

// The rows of one (query block, kv head): query tokens x GQA heads.
void collect_rows(const AttentionArgs& a, int32_t head, int32_t group, int32_t d, int32_t q_begin, int32_t q_end,
                  Rows& rows) {
  rows.q.clear();
  rows.lo.clear();
  rows.hi.clear();
  rows.out_row.clear();
  for (int32_t i = q_begin; i < q_end; ++i) {
    const int32_t pos = a.pos0 + i;
    for (int32_t j = 0; j < group; ++j) {
      const int64_t row = static_cast<int64_t>(i) * a.n_heads + head * group + j;
      rows.q.push_back(a.q + row * d);
      rows.lo.push_back(a.window > 0 ? std::max(0, pos - a.window + 1) : 0);
      rows.hi.push_back(pos);
      rows.out_row.push_back(row);
    }
  }
}

}  // namespace

PartialAttentionFn best_partial_attention() {
  const std::string level = simd_level();
  if (level == "avx512" && partial_attention_avx512()) return partial_attention_avx512();
  if (level != "portable" && partial_attention_avx2()) return partial_attention_avx2();
  return partial_attention_portable();
}

void paged_attention(ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& a) {
  static const PartialAttentionFn kernel = best_partial_attention();
  paged_attention_with(kernel, pool, kv, a);
}

void paged_attention_with(PartialAttentionFn kernel, ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& a) {
  const int32_t d = kv.head_dim, group = a.n_heads / kv.n_kv_heads, bs = kv.block_size;
  const int32_t last_pos = a.pos0 + a.n_q - 1;
  const int32_t first_lo = a.window > 0 ? std::max(0, a.pos0 - a.window + 1) : 0;
  const int32_t n_qblocks = (a.n_q + kQueryBlock - 1) / kQueryBlock;
  const int32_t chunk = (kKeyChunk + bs - 1) / bs * bs;
  const int32_t chunk0 = first_lo / chunk, chunk1 = last_pos / chunk;  // chunks touched, inclusive
  const int32_t n_chunks = chunk1 - chunk0 + 1;
  const int64_t scratch_floats = 2 * static_cast<int64_t>(bs) * d + bs;
  const int64_t rows_per_item = static_cast<int64_t>(std::min(kQueryBlock, a.n_q)) * group;

  // Spread the chunks of a row over threads only when (query block, head) items alone cannot
  // keep every thread busy: decode of long sequences.
  const int64_t base_items = static_cast<int64_t>(n_qblocks) * kv.n_kv_heads;
  const bool split = base_items < 2 * pool.size() && n_chunks > 1;

  if (!split) {
    pool.parallel_for(base_items, [&](int64_t begin, int64_t end, int) {
      Rows rows;
      std::vector<float> scratch(scratch_floats), acc_c(rows_per_item * d), m_c(rows_per_item), l_c(rows_per_item);
      std::vector<RowState> state;
      for (int64_t w = begin; w < end; ++w) {
        const int32_t qb = static_cast<int32_t>(w / kv.n_kv_heads), head = static_cast<int32_t>(w % kv.n_kv_heads);
        collect_rows(a, head, group, d, qb * kQueryBlock, std::min(a.n_q, (qb + 1) * kQueryBlock), rows);
        const int32_t R = static_cast<int32_t>(rows.q.size());
        state.clear();
        for (int32_t r = 0; r < R; ++r) state.push_back({a.out + rows.out_row[r] * d, -INFINITY, 0.0f});
        const PartialRows pr{R, rows.q.data(), rows.lo.data(), rows.hi.data()};
        for (int32_t c = chunk0; c <= chunk1; ++c) {
          kernel(kv, head, pr, c * chunk, std::min(last_pos + 1, (c + 1) * chunk), a.scale, acc_c.data(), m_c.data(),
                 l_c.data(), scratch.data());
          for (int32_t r = 0; r < R; ++r) fold_partial(state[r], &acc_c[static_cast<int64_t>(r) * d], m_c[r], l_c[r], d);
        }
        for (RowState& s : state)
          for (int32_t x = 0; x < d; ++x) s.acc[x] /= s.l;
      }
    });
    return;
  }

  // Split: partials per (item, chunk) in [item][chunk][row] slots, folded in chunk order after.
  // Reused across calls (grown, never shrunk): a fresh multi-megabyte vector per layer and step
  // cost page faults and zeroing on every decode step at long depth.
  const int64_t slots = base_items * n_chunks * rows_per_item;
  // (thread_local: the lambdas below must use these pointers, not the names, which would refer
  // to each worker's own instance.)
  thread_local std::vector<float> acc_buf, m_buf, l_buf;
  if (static_cast<int64_t>(acc_buf.size()) < slots * d) acc_buf.resize(slots * d);
  if (static_cast<int64_t>(m_buf.size()) < slots) {
    m_buf.resize(slots);
    l_buf.resize(slots);
  }
  float* const acc = acc_buf.data();
  float* const m = m_buf.data();
  float* const l = l_buf.data();
  pool.parallel_for(base_items * n_chunks, [&](int64_t begin, int64_t end, int) {
    Rows rows;
    std::vector<float> scratch(scratch_floats);
    for (int64_t w = begin; w < end; ++w) {
      // Chunk-major: the kv heads of one key chunk one after the other. A block's tiles of
      // consecutive heads are adjacent in the pool, so the next head's tile is often already
      // on its way (same page, the hardware prefetcher's direction).
      const int64_t item = w % base_items;
      const int32_t c = chunk0 + static_cast<int32_t>(w / base_items);
      const int32_t qb = static_cast<int32_t>(item / kv.n_kv_heads), head = static_cast<int32_t>(item % kv.n_kv_heads);
      collect_rows(a, head, group, d, qb * kQueryBlock, std::min(a.n_q, (qb + 1) * kQueryBlock), rows);
      const PartialRows pr{static_cast<int32_t>(rows.q.size()), rows.q.data(), rows.lo.data(), rows.hi.data()};
      const int64_t slot = (item * n_chunks + (c - chunk0)) * rows_per_item;
      kernel(kv, head, pr, c * chunk, std::min(last_pos + 1, (c + 1) * chunk), a.scale, &acc[slot * d], &m[slot],
             &l[slot], scratch.data());
    }
  });
  pool.parallel_for(base_items, [&](int64_t begin, int64_t end, int) {
    Rows rows;
    for (int64_t item = begin; item < end; ++item) {
      const int32_t qb = static_cast<int32_t>(item / kv.n_kv_heads), head = static_cast<int32_t>(item % kv.n_kv_heads);
      collect_rows(a, head, group, d, qb * kQueryBlock, std::min(a.n_q, (qb + 1) * kQueryBlock), rows);
      for (size_t r = 0; r < rows.q.size(); ++r) {
        RowState s{a.out + rows.out_row[r] * d, -INFINITY, 0.0f};
        for (int32_t c = 0; c < n_chunks; ++c) {
          const int64_t slot = (item * n_chunks + c) * rows_per_item + static_cast<int64_t>(r);
          fold_partial(s, &acc[slot * d], m[slot], l[slot], d);
        }
        for (int32_t x = 0; x < d; ++x) s.acc[x] /= s.l;
      }
    }
  });
}

}  // namespace fathom::cpu
