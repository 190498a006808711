#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
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

// Here, not in a kernel file: those are compiled for their ISA, and this runs on every CPU.
bool partial_attention_kt_applies(const PagedKvView& kv) {
  return kv.k_t != nullptr && kv.head_dim % 16 == 0 && kv.block_size % 16 == 0;
}

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

namespace {

// The key chunks a call touches and the work items over them.
struct ChunkPlan {
  int32_t d, group, bs, first_lo, last_pos, n_qblocks, chunk, chunk0, chunk1, n_chunks;
  int64_t scratch_floats, rows_per_item, base_items;
  ChunkPlan(const PagedKvView& kv, const AttentionArgs& a) {
    d = kv.head_dim;
    group = a.n_heads / kv.n_kv_heads;
    bs = kv.block_size;
    last_pos = a.pos0 + a.n_q - 1;
    first_lo = a.window > 0 ? std::max(0, a.pos0 - a.window + 1) : 0;
    n_qblocks = (a.n_q + kQueryBlock - 1) / kQueryBlock;
    chunk = key_chunk_positions(bs);
    chunk0 = first_lo / chunk;
    chunk1 = last_pos / chunk;  // chunks touched, inclusive
    n_chunks = chunk1 - chunk0 + 1;
    scratch_floats = 2 * static_cast<int64_t>(bs) * d + bs;
    rows_per_item = static_cast<int64_t>(std::min(kQueryBlock, a.n_q)) * group;
    base_items = static_cast<int64_t>(n_qblocks) * kv.n_kv_heads;
  }
  // The hint for a call over chunk c of kv head `head` (NextPartial): the chunk's written keys.
  NextPartial next(const PagedKvView& kv, int32_t head, int32_t c) const {
    return {&kv, head, std::max(first_lo, c * chunk), std::min(last_pos, (c + 1) * chunk - 1)};
  }
};

// Partials of every (item, chunk) in [item][chunk][row] slots. Reused across calls (grown, never
// shrunk): a fresh multi-megabyte vector per layer and step cost page faults and zeroing on every
// decode step at long depth. (thread_local: the lambdas below must use these pointers, not the
// names, which would refer to each worker's own instance.)
struct PartialSlots {
  float *acc, *m, *l;
  PartialSlots(int64_t slots, int32_t d) {
    thread_local std::vector<float> acc_buf, m_buf, l_buf;
    if (static_cast<int64_t>(acc_buf.size()) < slots * d) acc_buf.resize(slots * d);
    if (static_cast<int64_t>(m_buf.size()) < slots) {
      m_buf.resize(slots);
      l_buf.resize(slots);
    }
    acc = acc_buf.data();
    m = m_buf.data();
    l = l_buf.data();
  }
};

// Partials of chunks [c_begin, c_end), each read through view_of(c).
template <typename ViewOf>
void run_chunks(PartialAttentionFn kernel, ThreadPool& pool, const ChunkPlan& p, const AttentionArgs& a,
                int32_t c_begin, int32_t c_end, const PartialSlots& out, ViewOf&& view_of) {
  pool.parallel_for(p.base_items * (c_end - c_begin), [&](int64_t begin, int64_t end, int) {
    Rows rows;
    std::vector<float> scratch(p.scratch_floats);
    for (int64_t w = begin; w < end; ++w) {
      // Chunk-major: the kv heads of one key chunk one after the other. A block's tiles of
      // consecutive heads are adjacent in the pool, so the next head's tile is often already
      // on its way (same page, the hardware prefetcher's direction).
      const int64_t item = w % p.base_items;
      const int32_t c = c_begin + static_cast<int32_t>(w / p.base_items);
      const PagedKvView& kv = view_of(c);
      const int32_t qb = static_cast<int32_t>(item / kv.n_kv_heads), head = static_cast<int32_t>(item % kv.n_kv_heads);
      collect_rows(a, head, p.group, p.d, qb * kQueryBlock, std::min(a.n_q, (qb + 1) * kQueryBlock), rows);
      PartialRows pr{static_cast<int32_t>(rows.q.size()), rows.q.data(), rows.lo.data(), rows.hi.data(), {}};
      if (w + 1 < end) {  // this thread's next item
        const int32_t c_next = c_begin + static_cast<int32_t>((w + 1) / p.base_items);
        const PagedKvView& kv_next = view_of(c_next);
        pr.next = p.next(kv_next, static_cast<int32_t>((w + 1) % p.base_items % kv_next.n_kv_heads), c_next);
      }
      const int64_t slot = (item * p.n_chunks + (c - p.chunk0)) * p.rows_per_item;
      kernel(kv, head, pr, c * p.chunk, std::min(p.last_pos + 1, (c + 1) * p.chunk), a.logit_scale(), &out.acc[slot * p.d],
             &out.m[slot], &out.l[slot], scratch.data());
    }
  });
}

// Every row's partials folded in chunk order and normalised into a.out.
void fold_chunks(ThreadPool& pool, const ChunkPlan& p, const PagedKvView& kv, const AttentionArgs& a,
                 const PartialSlots& in) {
  pool.parallel_for(p.base_items, [&](int64_t begin, int64_t end, int) {
    Rows rows;
    for (int64_t item = begin; item < end; ++item) {
      const int32_t qb = static_cast<int32_t>(item / kv.n_kv_heads), head = static_cast<int32_t>(item % kv.n_kv_heads);
      collect_rows(a, head, p.group, p.d, qb * kQueryBlock, std::min(a.n_q, (qb + 1) * kQueryBlock), rows);
      for (size_t r = 0; r < rows.q.size(); ++r) {
        RowState s{a.out + rows.out_row[r] * p.d, -INFINITY, 0.0f};
        for (int32_t c = 0; c < p.n_chunks; ++c) {
          const int64_t slot = (item * p.n_chunks + c) * p.rows_per_item + static_cast<int64_t>(r);
          fold_partial(s, &in.acc[slot * p.d], in.m[slot], in.l[slot], p.d);
        }
        const float l = with_sink(s.l, s.m, a.sinks, static_cast<int32_t>(rows.out_row[r] % a.n_heads));
        for (int32_t x = 0; x < p.d; ++x) s.acc[x] /= l;
      }
    }
  });
}

}  // namespace

int32_t key_chunk_positions(int32_t block_size) { return (kKeyChunk + block_size - 1) / block_size * block_size; }

void paged_attention_with(PartialAttentionFn kernel, ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& a) {
  const ChunkPlan p(kv, a);
  // Spread the chunks of a row over threads only when (query block, head) items alone cannot
  // keep every thread busy: decode of long sequences.
  const bool split = p.base_items < 2 * pool.size() && p.n_chunks > 1;
  if (!split) {
    pool.parallel_for(p.base_items, [&](int64_t begin, int64_t end, int) {
      Rows rows;
      std::vector<float> scratch(p.scratch_floats), acc_c(p.rows_per_item * p.d), m_c(p.rows_per_item),
          l_c(p.rows_per_item);
      std::vector<RowState> state;
      for (int64_t w = begin; w < end; ++w) {
        const int32_t qb = static_cast<int32_t>(w / kv.n_kv_heads), head = static_cast<int32_t>(w % kv.n_kv_heads);
        collect_rows(a, head, p.group, p.d, qb * kQueryBlock, std::min(a.n_q, (qb + 1) * kQueryBlock), rows);
        const int32_t R = static_cast<int32_t>(rows.q.size());
        state.clear();
        for (int32_t r = 0; r < R; ++r) state.push_back({a.out + rows.out_row[r] * p.d, -INFINITY, 0.0f});
        PartialRows pr{R, rows.q.data(), rows.lo.data(), rows.hi.data(), {}};
        for (int32_t c = p.chunk0; c <= p.chunk1; ++c) {
          // Next: this item's next chunk, else the next item's first (its rows' own ranges may
          // start later: a hint).
          if (c < p.chunk1) pr.next = p.next(kv, head, c + 1);
          else if (w + 1 < end) pr.next = p.next(kv, static_cast<int32_t>((w + 1) % kv.n_kv_heads), p.chunk0);
          else pr.next = {};
          kernel(kv, head, pr, c * p.chunk, std::min(p.last_pos + 1, (c + 1) * p.chunk), a.logit_scale(), acc_c.data(),
                 m_c.data(), l_c.data(), scratch.data());
          for (int32_t r = 0; r < R; ++r)
            fold_partial(state[r], &acc_c[static_cast<int64_t>(r) * p.d], m_c[r], l_c[r], p.d);
        }
        for (int32_t r = 0; r < R; ++r) {
          RowState& s = state[r];
          const float l = with_sink(s.l, s.m, a.sinks, static_cast<int32_t>(rows.out_row[r] % a.n_heads));
          for (int32_t x = 0; x < p.d; ++x) s.acc[x] /= l;
        }
      }
    });
    return;
  }
  const PartialSlots slots(p.base_items * p.n_chunks * p.rows_per_item, p.d);
  run_chunks(kernel, pool, p, a, p.chunk0, p.chunk1 + 1, slots, [&](int32_t) -> const PagedKvView& { return kv; });
  fold_chunks(pool, p, kv, a, slots);
}

void paged_attention_chunked(ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& a, KeyChunkSource& source) {
  static const PartialAttentionFn kernel = best_partial_attention();
  const ChunkPlan p(kv, a);
  const PartialSlots slots(p.base_items * p.n_chunks * p.rows_per_item, p.d);
  for (int32_t c = p.chunk0; c <= p.chunk1;) {
    const int32_t end = source.prepare(c, p.chunk1 + 1);
    if (end <= c || end > p.chunk1 + 1) throw std::logic_error("KeyChunkSource::prepare made no chunk readable");
    run_chunks(kernel, pool, p, a, c, end, slots, [&](int32_t cc) -> const PagedKvView& { return source.view(cc); });
    c = end;
  }
  fold_chunks(pool, p, kv, a, slots);
}

}  // namespace fathom::cpu
