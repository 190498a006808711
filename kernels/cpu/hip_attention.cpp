// HiP decode attention on the CPU (ALGORITHMS.md; spec: kernels/ref/hip.cpp).
// Mask estimation runs the halving iterations in lock step for all masks (one per query head, or
// per kv head): each iteration scores every live (mask, half) over the pool, then each mask keeps
// its best halves. The attention is one sparse::attend task per mask over its merged intervals
// (sinks, blocks, window).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/sparse_common.h"

namespace fathom::cpu {
namespace {

struct Chunk {
  int32_t lo, hi;  // key blocks [lo, hi)
};

struct Interval {
  int32_t lo, hi;  // positions [lo, hi)
};

bool by_lo(const Interval& a, const Interval& b) { return a.lo < b.lo; }

// Sorts and merges intervals in place; returns the number of positions covered.
int64_t merge_intervals(std::vector<Interval>& iv) {
  // Usually already in order (sink, the mask's ascending blocks, window; or merged lists): the
  // check is linear, the sort of ~260 intervals per head cost ~5 µs of serial time per head.
  if (!std::is_sorted(iv.begin(), iv.end(), by_lo)) std::sort(iv.begin(), iv.end(), by_lo);
  size_t o = 0;
  for (const Interval& x : iv) {
    if (x.hi <= x.lo) continue;
    if (o > 0 && x.lo <= iv[o - 1].hi) iv[o - 1].hi = std::max(iv[o - 1].hi, x.hi);
    else iv[o++] = x;
  }
  iv.resize(o);
  int64_t n = 0;
  for (const Interval& x : iv) n += x.hi - x.lo;
  return n;
}

}  // namespace

void hip_estimate_mask(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::HipParams& p,
                       ref::HipMask* mask, ref::HipBytes* bytes) {
  const sparse::Kernels& kern = sparse::kernels();
  const int32_t d = kv.head_dim, G = args.n_heads / kv.n_kv_heads, bs = p.block_size_k, H = args.n_heads;
  mask->dense = true;
  mask->pos = args.pos;
  mask->block_starts.assign(H, {});
  const int32_t t_mid = args.pos - p.window - p.sink;  // T′
  if (t_mid <= p.mask_k) return;
  if (bs <= 0 || p.mask_k < bs) throw std::invalid_argument("hip: need mask_k >= block_size_k > 0");
  mask->dense = false;
  const int32_t n_blocks = (t_mid + bs - 1) / bs, n_keep = p.mask_k / bs, end = p.sink + t_mid;
  const int64_t row_bytes = static_cast<int64_t>(kv_row_bytes(kv.dtype, d));
  // A unit is one mask: a query head (R = 1 query row), or with per_kv_head a kv head (R = G rows,
  // the unit's score the max over them). Unit u reads kv head u / (units per kv head) and query
  // rows [u·R, (u + 1)·R).
  const int32_t R = p.per_kv_head ? G : 1, U = H / R;
  std::vector<float> q_sum(H);
  sparse::row_sums(args.q, H, d, q_sum.data());

  std::vector<std::vector<Chunk>> chunks(U), halves(U);
  std::vector<std::vector<float>> score(U);
  // Halves every chunk of unit u into halves[u] when one spans > 1 block (else halves[u] is left
  // empty: the unit is done). Runs per unit on the pool with the selection below: serial on the
  // calling thread it was ~3% of a HiP decode step at SmolLM2 8k, the other thread spinning.
  auto halve = [&](int32_t u) {
    bool split = false;
    for (const Chunk& c : chunks[u]) split |= c.hi - c.lo > 1;
    halves[u].clear();
    if (!split) return;
    for (const Chunk& c : chunks[u]) {
      const int32_t mid = c.lo + (c.hi - c.lo) / 2;
      if (mid > c.lo) halves[u].push_back({c.lo, mid});
      halves[u].push_back({mid, c.hi});
    }
    score[u].resize(halves[u].size());
  };
  auto centre = [&](const Chunk& c) { return (c.lo + c.hi - 1) / 2; };  // a half's representative block
  auto block_k_bytes = [&](int32_t block) {
    const int32_t t0 = p.sink + block * bs;
    return static_cast<int64_t>(std::min(end, t0 + bs) - t0) * row_bytes;
  };
  const bool one_unit_per_kv_head = U == kv.n_kv_heads;  // no block shared between units to count once
  std::vector<char> seen(bytes != nullptr && !one_unit_per_kv_head ? n_blocks : 0, 0);  // counted this iteration
  pool.parallel_for(U, [&](int64_t begin, int64_t e, int) {
    for (int64_t u = begin; u < e; ++u) {
      for (int32_t i = 0; i < n_keep; ++i)
        chunks[u].push_back({static_cast<int32_t>(static_cast<int64_t>(i) * n_blocks / n_keep),
                             static_cast<int32_t>(static_cast<int64_t>(i + 1) * n_blocks / n_keep)});
      halve(static_cast<int32_t>(u));
    }
  });
  auto kv_head = [&](int32_t u) { return u * R / G; };
  constexpr int32_t kHalvesPerItem = 64;
  for (;;) {
    std::vector<int32_t> live;  // the units with halves to score
    for (int32_t u = 0; u < U; ++u)
      if (!halves[u].empty()) live.push_back(u);
    if (live.empty()) break;
    // Score each half by its centre block: max over its keys (and the unit's query rows) of q·k.
    // The centre blocks' keys of an item's halves go through key_logits in batches of up to
    // kBatch keys, so that its prefetching runs ahead across halves (one call per half of
    // block_size_k = 2 keys left every miss to the out-of-order window: 16k, d 64 refresh ~5x
    // its random-line bound).
    // Over a tiered view the batch's K rows are read into a buffer of the thread's (the host tier
    // in place: RowPrefetcher::read_k_rows), in the same order, so key_logits does the same
    // arithmetic as over the resident view and the hot-row cache keeps the attention's rows.
    std::vector<int64_t> host_bytes(pool.size(), 0);
    auto score_items = [&](const std::vector<std::pair<int32_t, int32_t>>& items) {  // (unit, first half)
      pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t begin, int64_t e, int thread) {
        constexpr int32_t kBatch = 256;
        int32_t pos[kBatch], half[kBatch];
        int64_t rows[kBatch];
        std::vector<float> logit(static_cast<size_t>(R) * kBatch);  // [R][kBatch]
        std::vector<std::byte> buffer(kv.prefetcher != nullptr ? kBatch * static_cast<size_t>(row_bytes) : 0);
        std::vector<KvInt8Row> params(kv.prefetcher != nullptr && kv.dtype == KvDtype::kI8 ? kBatch : 0);
        PagedKvView staged = kv;
        staged.k = buffer.data();
        staged.k_rows = params.data();
        for (int64_t w = begin; w < e; ++w) {
          const int32_t u = items[w].first, g = kv_head(u);
          std::vector<float>& sc = score[u];
          int32_t n = 0;
          auto flush = [&] {
            const PagedKvView* from = &kv;
            if (kv.prefetcher == nullptr) {
              sparse::row_offsets(kv, g, pos, n, rows);
              sparse::prefetch_rows_l2(kv, kv.k, rows, n);
            } else {
              host_bytes[thread] += static_cast<int64_t>(kv.prefetcher->read_k_rows(g, pos, n, buffer.data(), params.data()));
              for (int32_t x = 0; x < n; ++x) rows[x] = static_cast<int64_t>(x) * d;
              from = &staged;
            }
            kern.key_logits(*from, args.q + static_cast<int64_t>(u) * R * d, &q_sum[u * R], R, rows, n, 1.0f, logit.data(),
                            kBatch, /*v_next=*/false);
            for (int32_t r = 0; r < R; ++r)
              for (int32_t x = 0; x < n; ++x) sc[half[x]] = std::max(sc[half[x]], logit[r * kBatch + x]);
            n = 0;
          };
          const int32_t i1 = std::min<int32_t>(static_cast<int32_t>(halves[u].size()), items[w].second + kHalvesPerItem);
          for (int32_t i = items[w].second; i < i1; ++i) {
            const int32_t t0 = p.sink + centre(halves[u][i]) * bs, t1 = std::min(end, t0 + bs);
            sc[i] = -INFINITY;
            for (int32_t t = t0; t < t1; ++t) {
              if (n == kBatch) flush();
              pos[n] = t;
              half[n++] = i;
            }
          }
          if (n > 0) flush();
        }
      });
    };
    auto items_of = [&](int32_t u, std::vector<std::pair<int32_t, int32_t>>& items) {
      for (int32_t i = 0; i < static_cast<int32_t>(halves[u].size()); i += kHalvesPerItem) items.push_back({u, i});
    };
    std::vector<std::pair<int32_t, int32_t>> items;
    for (int32_t u : live) items_of(u, items);
    score_items(items);
    if (kv.prefetcher != nullptr) {
      int64_t moved = 0;
      for (int64_t& b : host_bytes) moved += std::exchange(b, 0);
      kv.prefetcher->count_read(moved);
    }
    // Bytes: distinct K rows per kv head this iteration (a centre block's rows are its own; the
    // units of a kv head may pick the same block: counted once, through `seen`).
    if (bytes != nullptr && !one_unit_per_kv_head) {
      const int32_t per_g = U / kv.n_kv_heads;
      for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
        for (int32_t u = g * per_g; u < (g + 1) * per_g; ++u)
          for (const Chunk& c : halves[u]) {
            if (seen[centre(c)]) continue;
            seen[centre(c)] = 1;
            bytes->k_bytes += block_k_bytes(centre(c));
          }
        for (int32_t u = g * per_g; u < (g + 1) * per_g; ++u)
          for (const Chunk& c : halves[u]) seen[centre(c)] = 0;
      }
    }
    // Keep the best n_keep halves per unit (ties: lower block), in block order, and halve them for
    // the next iteration.
    std::vector<int64_t> unit_bytes(live.size(), 0);
    pool.parallel_for(static_cast<int64_t>(live.size()), [&](int64_t begin, int64_t e, int) {
      std::vector<int32_t> best;
      for (int64_t x = begin; x < e; ++x) {
        const int32_t u = live[x];
        if (bytes != nullptr && one_unit_per_kv_head)  // the halves of different chunks: distinct blocks
          for (const Chunk& c : halves[u]) unit_bytes[x] += block_k_bytes(centre(c));
        const int32_t n = static_cast<int32_t>(score[u].size()), keep = std::min(n_keep, n);
        best.resize(keep);
        sparse::top_k(score[u].data(), n, keep, best.data());  // indices ascending: block order
        chunks[u].clear();
        for (int32_t i : best) chunks[u].push_back(halves[u][i]);
        halve(u);
      }
    });
    if (bytes != nullptr)
      for (int64_t b : unit_bytes) bytes->k_bytes += b;
  }
  for (int32_t h = 0; h < H; ++h)
    for (const Chunk& c : chunks[h / R]) mask->block_starts[h].push_back(p.sink + c.lo * bs);
}

void hip_sparse_decode(ThreadPool& pool, const PagedKvView& kv, const DecodeArgs& args, const ref::HipParams& p,
                       const ref::HipMask& mask, ref::HipBytes* bytes) {
  const sparse::Kernels& kern = sparse::kernels();
  const int32_t d = kv.head_dim, G = args.n_heads / kv.n_kv_heads, S = args.pos + 1, H = args.n_heads;
  const int32_t win_lo = std::max(0, args.pos - p.window), sink_hi = std::min(p.sink, S);
  const int64_t row_bytes = static_cast<int64_t>(kv_row_bytes(kv.dtype, d));
  // One task per mask: a query head, or with per_kv_head a kv head's G query rows at once (each
  // selected row read once for the group).
  const int32_t R = p.per_kv_head ? G : 1, U = H / R;
  std::vector<std::vector<Interval>> iv(U);
  std::vector<std::vector<int32_t>> pos(U);
  std::vector<sparse::AttendTask> tasks(U);
  for (int32_t u = 0; u < U; ++u) {
    const std::vector<int32_t>& starts = mask.block_starts[u * R];
    if (mask.dense) {
      iv[u] = {{0, S}};
    } else {
      iv[u].reserve(starts.size() + 2);
      iv[u].push_back({0, sink_hi});
      for (int32_t b : starts) iv[u].push_back({std::min(b, S), std::min(b + p.block_size_k, S)});
      iv[u].push_back({win_lo, S});
    }
    pos[u].resize(static_cast<size_t>(merge_intervals(iv[u])));  // serial: runs filled, not pushed one by one
    int32_t* out = pos[u].data();
    for (const Interval& x : iv[u]) {
      std::iota(out, out + (x.hi - x.lo), x.lo);
      out += x.hi - x.lo;
    }
    sparse::AttendTask& t = tasks[u];
    t.g = u * R / G;
    t.R = R;
    t.q = args.q + static_cast<int64_t>(u) * R * d;
    t.out = args.out + static_cast<int64_t>(u) * R * d;
    t.pos = pos[u].data();
    t.n = static_cast<int32_t>(pos[u].size());
  }
  // Over a tiered cache the tasks run one at a time, forward on even positions and backward on
  // odd ones: with the mask cached across steps the tasks' row sets repeat, and a cycle longer
  // than an LRU cache misses on every row; alternating turns it into a stack (the last task's
  // rows are the next step's first).
  sparse::attend_prefetched(pool, kern, kv, args.scale, tasks, /*reverse=*/args.pos % 2 != 0);
  if (bytes != nullptr) {
    const int32_t per_g = U / kv.n_kv_heads;
    if (per_g == 1) {  // one mask per kv head: its merged positions are the rows read
      for (const std::vector<int32_t>& p_u : pos) {
        bytes->k_bytes += static_cast<int64_t>(p_u.size()) * row_bytes;
        bytes->v_bytes += static_cast<int64_t>(p_u.size()) * row_bytes;
      }
      return;
    }
    for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
      std::vector<Interval> all, merged;  // the kv head's units' sorted lists merged in order (no sort)
      for (int32_t u = g * per_g; u < (g + 1) * per_g; ++u) {
        merged.clear();
        std::merge(all.begin(), all.end(), iv[u].begin(), iv[u].end(), std::back_inserter(merged), by_lo);
        all.swap(merged);
      }
      const int64_t rows = merge_intervals(all);
      bytes->k_bytes += rows * row_bytes;
      bytes->v_bytes += rows * row_bytes;
    }
  }
}

}  // namespace fathom::cpu
