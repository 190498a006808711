#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/matmul.h"

namespace fathom::cpu {
namespace {

PartialAttentionFn select_kernel() {
  const std::string level = simd_level();
  if (level == "avx512" && partial_attention_avx512()) return partial_attention_avx512();
  if (level != "portable" && partial_attention_avx2()) return partial_attention_avx2();
  return partial_attention_portable();
}

constexpr int32_t kQueryBlock = 8;  // query tokens that share one pass over a K/V tile

// One work item: a block of query tokens x one kv head x one chunk of keys.
struct WorkItem {
  int32_t q_begin, q_end;  // query token indices
  int32_t head;            // kv head
  int32_t chunk;           // key chunk index
};

}  // namespace

void paged_attention(ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& a) {
  static const PartialAttentionFn kernel = select_kernel();
  paged_attention_with(kernel, pool, kv, a);
}

void paged_attention_with(PartialAttentionFn kernel, ThreadPool& pool, const PagedKvView& kv, const AttentionArgs& a) {
  const int32_t d = kv.head_dim, group = a.n_heads / kv.n_kv_heads, bs = kv.block_size;
  const int32_t last_pos = a.pos0 + a.n_q - 1;
  const int32_t first_lo = a.window > 0 ? std::max(0, a.pos0 - a.window + 1) : 0;
  const int32_t n_qblocks = (a.n_q + kQueryBlock - 1) / kQueryBlock;

  // Split keys into chunks only when there are too few (query block, head) items to keep every
  // thread busy — i.e. decode of long sequences. Chunks are whole blocks, at least 4 of them.
  const int32_t span = last_pos - first_lo + 1;
  int32_t n_chunks = 1;
  const int64_t base_items = static_cast<int64_t>(n_qblocks) * kv.n_kv_heads;
  if (base_items < 4 * pool.size()) {
    const int32_t want = static_cast<int32_t>((4 * pool.size() + base_items - 1) / base_items);
    n_chunks = std::max(1, std::min(want, span / (4 * bs)));
  }
  const int32_t chunk_start = first_lo / bs * bs;  // chunks are block aligned
  const int32_t span_blocks = (last_pos + 1 - chunk_start + bs - 1) / bs;
  const int32_t chunk_blocks = (span_blocks + n_chunks - 1) / n_chunks;

  std::vector<WorkItem> items;
  for (int32_t qb = 0; qb < n_qblocks; ++qb)
    for (int32_t h = 0; h < kv.n_kv_heads; ++h)
      for (int32_t c = 0; c < n_chunks; ++c)
        items.push_back({qb * kQueryBlock, std::min(a.n_q, (qb + 1) * kQueryBlock), h, c});

  // Partial results per (query token, query head, chunk): acc[d], m, l.
  const int64_t rows_total = static_cast<int64_t>(a.n_q) * a.n_heads;
  std::vector<float> acc(rows_total * n_chunks * d), m(rows_total * n_chunks), l(rows_total * n_chunks);
  const int64_t scratch_floats = 2 * static_cast<int64_t>(bs) * d + bs;
  std::vector<float> scratch(scratch_floats * pool.size());

  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t begin, int64_t end, int thread) {
    std::vector<const float*> q_rows;
    std::vector<int32_t> lo, hi;
    std::vector<float> item_acc, item_m, item_l;
    for (int64_t w = begin; w < end; ++w) {
      const WorkItem& it = items[w];
      q_rows.clear();
      lo.clear();
      hi.clear();
      for (int32_t i = it.q_begin; i < it.q_end; ++i) {
        const int32_t pos = a.pos0 + i;
        for (int32_t j = 0; j < group; ++j) {
          const int32_t h = it.head * group + j;
          q_rows.push_back(a.q + (static_cast<int64_t>(i) * a.n_heads + h) * d);
          lo.push_back(a.window > 0 ? std::max(0, pos - a.window + 1) : 0);
          hi.push_back(pos);
        }
      }
      const int32_t R = static_cast<int32_t>(q_rows.size());
      item_acc.resize(static_cast<size_t>(R) * d);
      item_m.resize(R);
      item_l.resize(R);
      const int32_t t0 = chunk_start + it.chunk * chunk_blocks * bs;
      const int32_t t1 = std::min(last_pos + 1, t0 + chunk_blocks * bs);
      PartialRows rows{R, q_rows.data(), lo.data(), hi.data()};
      kernel(kv, it.head, rows, t0, t1, a.scale, item_acc.data(), item_m.data(), item_l.data(),
             scratch.data() + scratch_floats * thread);
      // Scatter into [row][chunk] slots; row = token * n_heads + query head.
      int32_t r = 0;
      for (int32_t i = it.q_begin; i < it.q_end; ++i)
        for (int32_t j = 0; j < group; ++j, ++r) {
          const int64_t row = static_cast<int64_t>(i) * a.n_heads + it.head * group + j;
          const int64_t slot = row * n_chunks + it.chunk;
          std::memcpy(&acc[slot * d], &item_acc[static_cast<size_t>(r) * d], sizeof(float) * d);
          m[slot] = item_m[r];
          l[slot] = item_l[r];
        }
    }
  });

  // Exact log-sum-exp merge of the chunks of each row; a chunk that saw no key has m = -inf, l = 0.
  for (int64_t row = 0; row < rows_total; ++row) {
    float max_m = -INFINITY;
    for (int32_t c = 0; c < n_chunks; ++c) max_m = std::max(max_m, m[row * n_chunks + c]);
    float* out = a.out + row * d;
    std::fill(out, out + d, 0.0f);
    if (max_m == -INFINITY) continue;  // unreachable for causal rows (a row always sees itself)
    float denom = 0;
    for (int32_t c = 0; c < n_chunks; ++c) {
      const int64_t slot = row * n_chunks + c;
      if (m[slot] == -INFINITY) continue;
      const float w = std::exp(m[slot] - max_m);
      denom += w * l[slot];
      for (int32_t x = 0; x < d; ++x) out[x] += w * acc[slot * d + x];
    }
    const float inv = 1.0f / denom;
    for (int32_t x = 0; x < d; ++x) out[x] *= inv;
  }
}

}  // namespace fathom::cpu
